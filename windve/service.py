"""The running service: model, tokenizer, device plan, instances and the queue manager.

`Runtime` is what both `windve serve` (behind HTTP) and `windve calibrate` (in-process
profiling) stand on, so calibration measures exactly the path that serves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

import devices
from estimator import Calibration, CalibrationError, fingerprint_mismatch, load_calibration
from estimator.calibration import from_dict as calibration_from_dict
from queue_manager.manager import QueueManager
from queue_manager.protocol import Instance
from windve.depths import PROBE_TOKENS, DepthSource, depth_from_calibration, probe_depth
from windve.engines import create_engine, resolve_dtype
from windve.instances import EngineInstance
from windve.model import ModelSpec, load_model_spec
from windve.settings import Settings
from windve.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

class Runtime:
    def __init__(
        self,
        settings: Settings,
        spec: ModelSpec,
        tokenizer: TextTokenizer,
        hardware: devices.Hardware,
        plan: devices.Plan,
        instances: dict[str, list[Instance]],
    ) -> None:
        self.settings = settings
        self.spec = spec
        self.tokenizer = tokenizer
        self.hardware = hardware
        self.plan = plan
        self.instances = instances
        self.dtype = resolve_dtype(settings.dtype, "cpu")
        self.queue_manager: QueueManager | None = None
        self.depths: dict[str, DepthSource] = {}
        self.calibration: Calibration | None = None
        self.calibration_origin: str | None = None
        self.watcher = None  # windve.calibration_store.CalibrationWatcher when Redis is set
        self.started_at = time.time()
        self.ready = False

    # ---- construction ----------------------------------------------------------------

    @classmethod
    async def start(cls, settings: Settings) -> "Runtime":
        """Load the model, plan the devices, start every instance, set the queue depths."""
        spec = load_model_spec(settings.model, settings.revision, settings.trust_remote_code)
        tokenizer = TextTokenizer(spec, settings.max_input_tokens)
        hardware = devices.detect_hardware(settings.sysfs_root)
        plan = make_plan(settings, hardware)
        log.info("device plan:\n%s", devices.render_plan(plan, hardware.topology.is_arm))
        instances = {
            pool.name: [build_instance(settings, spec, hardware, inst) for inst in pool.instances]
            for pool in plan.pools
        }
        runtime = cls(settings, spec, tokenizer, hardware, plan, instances)
        if settings.calibration_file is not None:
            runtime.apply_calibration(load_calibration(settings.calibration_file), str(settings.calibration_file))
        await runtime._start_queue_manager()
        return runtime

    async def _start_queue_manager(self) -> None:
        settings = self.settings
        pools = [(name, 1, members) for name, members in self.instances.items()]
        qm = QueueManager(
            pools,
            heterogeneous=self.plan.heterogeneous,
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
        )
        self.queue_manager = qm
        try:
            await qm.start()
            await self._follow_shared_calibration()
            await self._set_depths()
        except BaseException:
            await self.close()
            raise
        self.ready = True

    async def _follow_shared_calibration(self) -> None:
        """With Redis, take the newest calibration for this model and hardware, now and later."""
        if not self.settings.redis_url:
            return
        from windve.calibration_store import CalibrationWatcher, calibration_key

        current = None
        if self.calibration is not None:
            from estimator.calibration import to_dict

            current = to_dict(self.calibration)
        key = calibration_key(self.spec.revision, self.hardware_fingerprint)
        self.watcher = CalibrationWatcher(self.settings.redis_url, key, self._on_shared_calibration, current=current)
        await self.watcher.start()

    def _on_shared_calibration(self, data: dict) -> None:
        try:
            self.apply_calibration(calibration_from_dict(data, "calibration from Redis"), "redis")
        except CalibrationError as error:
            log.error("ignoring a calibration from Redis: %s", error)

    def apply_calibration(self, calibration: Calibration, origin: str) -> None:
        """Take depths from `calibration`; live when the pools already run (no restart)."""
        for warning in fingerprint_mismatch(calibration, self.spec.revision, self.hardware_fingerprint):
            log.warning("%s: %s", origin, warning)
        self.calibration, self.calibration_origin = calibration, origin
        if self.queue_manager is None or not self.depths:
            return
        for name in self.instances:
            if self._configured_depth(name) is None:
                source = depth_from_calibration(calibration, name, self.settings.slo_seconds, f"calibration ({origin})")
                if source is not None:
                    self._use_depth(source)

    async def _set_depths(self) -> None:
        for name in self.instances:
            self._use_depth(await self._depth_for(name))

    def _use_depth(self, source: DepthSource) -> None:
        self.depths[source.pool] = source
        self.queue_manager.set_depth(source.pool, source.depth, source.token_budget, source.token_charge)
        log.info("pool %s: depth %d (%s)", source.pool, source.depth, source.source)

    def _configured_depth(self, pool: str) -> int | None:
        return {"accelerator": self.settings.accelerator_depth, "cpu": self.settings.cpu_depth}.get(pool)

    async def _depth_for(self, pool: str) -> DepthSource:
        configured = self._configured_depth(pool)
        if configured:
            return DepthSource(pool, configured, "setting")
        if self.calibration is not None:
            source = depth_from_calibration(
                self.calibration, pool, self.settings.slo_seconds, f"calibration ({self.calibration_origin})"
            )
            if source is not None:
                return source
        batch = self.settings.max_batch_size * len(self.instances[pool])
        return await probe_depth(
            pool, self.pool_submitter(pool), self.make_query(PROBE_TOKENS), batch, self.settings.slo_seconds
        )

    # ---- what the estimator and the HTTP layer use ----------------------------------

    @property
    def pool_names(self) -> list[str]:
        return list(self.instances)

    def pool_submitter(self, pool: str) -> Callable[[Sequence[np.ndarray]], Awaitable[np.ndarray]]:
        return self.queue_manager.pool_submitter(pool)

    def make_query(self, tokens: int) -> np.ndarray:
        return self.tokenizer.make_query(tokens)

    @property
    def hardware_fingerprint(self) -> str:
        return hardware_fingerprint(self.hardware, self.plan)

    async def close(self) -> None:
        self.ready = False
        if self.watcher is not None:
            await self.watcher.stop()
        if self.queue_manager is not None:
            await self.queue_manager.close()

    def info(self) -> dict[str, Any]:
        qm = self.queue_manager.snapshot() if self.queue_manager else {}
        pools = []
        for pool in qm.get("pools", []):
            source = self.depths.get(pool["name"])
            for entry, instance in zip(pool["instances"], self.instances[pool["name"]]):
                describe = getattr(instance, "info", None)
                entry.update(describe() if describe else {})
            pools.append(
                pool
                | {
                    "depth_source": source.source if source else None,
                    "fit": source.detail if source else None,
                }
            )
        return {
            "calibration": None if self.calibration is None else {
                "origin": self.calibration_origin,
                "created": self.calibration.created,
                "slos": list(self.calibration.slos),
                "hardware_fingerprint": self.calibration.hardware_fingerprint,
            },
            "heterogeneous": qm.get("heterogeneous"),
            "draining": qm.get("draining"),
            "pools": pools,
            "plan": self.plan.to_dict(),
            "hardware": self.hardware.to_dict(),
            "hardware_fingerprint": self.hardware_fingerprint,
        }


def check_plan(settings: Settings) -> devices.Plan:
    """Fail fast, before the server starts, on a missing model or an impossible plan."""
    load_model_spec(settings.model, settings.revision, settings.trust_remote_code)
    return make_plan(settings, devices.detect_hardware(settings.sysfs_root))


def make_plan(settings: Settings, hardware: devices.Hardware) -> devices.Plan:
    explicit = [inst.model_dump() for inst in settings.plan] if settings.plan else None
    return devices.make_plan(
        hardware,
        device=settings.device,
        heterogeneous=settings.heterogeneous,
        cpu_layout="explicit" if explicit else settings.cpu_layout,
        reserved_cores=settings.reserved_cores,
        explicit=explicit,
        engine=settings.engine,
    )


def build_instance(
    settings: Settings, spec: ModelSpec, hardware: devices.Hardware, inst: devices.InstanceSpec
) -> Instance:
    engine = inst.engine or settings.engine
    # Accelerator-pool instances run in the service process, fed by one thread, even when an
    # explicit plan puts a CPU engine there: that is the accelerator path, run on this CPU.
    if inst.device == "cpu" and inst.pool == "cpu" and settings.cpu_worker_processes:
        from windve.engine_process.instance import CpuWorkerInstance

        by_node = hardware.topology.cores_by_node(inst.cores)
        return CpuWorkerInstance(
            spec,
            name=inst.name,
            rank_cores=[list(cores) for cores in by_node.values()],
            numa_nodes=list(by_node),
            engine=engine,
            dtype=resolve_dtype(settings.dtype, "cpu"),
            max_batch_tokens=settings.max_batch_tokens,
            onnx_cache_dir=settings.onnx_cache_dir,
        )

    def make_engine():
        if inst.device == "cpu" and inst.threads:
            import torch

            torch.set_num_threads(inst.threads)
        return create_engine(spec, engine, inst.device, settings.dtype, settings.onnx_cache_dir)

    return EngineInstance(inst.name, make_engine, cores=inst.cores)


def hardware_fingerprint(hardware: devices.Hardware, plan: devices.Plan) -> str:
    """Stable across restarts of the same machine type and plan; changes with either."""
    topology = hardware.topology
    described = {
        "arch": topology.arch,
        "nodes": [len(node.usable) for node in topology.cpu_nodes],
        "accelerators": [acc.to_dict().get("name") for acc in hardware.accelerators],
        "plan": [
            [(inst.device, len(inst.cores), inst.tp, inst.engine) for inst in pool.instances]
            for pool in plan.pools
        ],
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
