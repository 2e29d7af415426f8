"""The running service: model, tokenizer, device plan, instances and the queue manager.

`Runtime` is what both `windve serve` (behind HTTP) and `windve calibrate` (in-process
profiling) stand on, so calibration measures exactly the path that serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import devices
from queue_manager.manager import QueueManager
from queue_manager.protocol import Instance
from windve.engines import create_engine, resolve_dtype
from windve.instances import EngineInstance
from windve.model import ModelSpec, load_model_spec
from windve.settings import Settings
from windve.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

PROBE_TOKENS = 75  # the paper's query length, used by the warm-up depth probe


@dataclass
class DepthSource:
    """Where a pool's depth came from, for /info and the start-up log."""

    pool: str
    depth: int
    source: str  # setting | calibration | warm-up probe
    token_budget: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


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
        self.calibration: dict | None = None
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
            await self._set_depths()
        except BaseException:
            await qm.close()
            raise
        self.ready = True

    async def _set_depths(self) -> None:
        for name in self.instances:
            source = await self._depth_for(name)
            self.depths[name] = source
            self.queue_manager.set_depth(name, source.depth, source.token_budget)
            log.info("pool %s: depth %d (%s)", name, source.depth, source.source)

    async def _depth_for(self, pool: str) -> DepthSource:
        configured = {"accelerator": self.settings.accelerator_depth, "cpu": self.settings.cpu_depth}
        if configured.get(pool):
            return DepthSource(pool, configured[pool], "setting")
        from_calibration = self._depth_from_calibration(pool)
        if from_calibration is not None:
            return from_calibration
        return await self._probe_depth(pool)

    def _depth_from_calibration(self, pool: str) -> DepthSource | None:
        return None

    async def _probe_depth(self, pool: str) -> DepthSource:
        """A two-point estimate of `latency = alpha*C + beta` until `windve calibrate` runs.

        One query alone gives beta; a full batch per instance gives the drain rate, whose
        inverse is alpha. Cheap (a few rounds), and measured rather than guessed. A first,
        unmeasured round lets the kernels meet these shapes before the clock runs.
        """
        submit = self.pool_submitter(pool)
        query = self.make_query(PROBE_TOKENS)
        batch = self.settings.max_batch_size * len(self.instances[pool])

        async def closed_loop_round(concurrency: int) -> float:
            started = time.perf_counter()
            await asyncio.gather(*(submit([query]) for _ in range(concurrency)))
            return time.perf_counter() - started

        await closed_loop_round(batch)
        beta = min([await closed_loop_round(1) for _ in range(3)])
        alpha = await closed_loop_round(batch) / batch
        slo = self.settings.slo_seconds
        depth = max(1, int((slo - beta) / alpha)) if slo > beta else 1
        return DepthSource(
            pool, depth, "warm-up probe", detail={"alpha": alpha, "beta": beta, "query_tokens": PROBE_TOKENS}
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
    if inst.device == "cpu" and settings.cpu_worker_processes:
        from windve.cpu.instance import CpuWorkerInstance

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

    return EngineInstance(inst.name, make_engine)


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
