"""The dispatcher's runtime: model, device plan, engine processes and the queue manager.

`Runtime` is what the dispatcher (in the `windve serve` parent, or inside the only front
end) and `windve calibrate --in-process` stand on. Every instance runs in its own engine
process; a watchdog kills one that misses its heartbeat, and the queue manager fails its
work over and restarts it.

A pool with no depth from a setting or a calibration gets one from the warm-up probe. The
service starts with `probe_later`: the runtime admits queries at provisional depths but is
not ready (/health 503) until `finish_start` has probed through the service's own front end
(windve.probe); embedded without one (tests, the estimator), it probes in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

import devices
from estimator import Calibration, CalibrationError, fingerprint_mismatch, load_calibration
from estimator.calibration import from_dict as calibration_from_dict
from queue_manager.manager import QueueManager
from queue_manager.protocol import Instance
from windve.depths import PROBE_TOKENS, DepthSource, depth_from_calibration, probe_depth, probe_room
from windve.engines import resolve_dtype
from windve.model import ModelSpec, load_model_spec
from windve.probe import Address, ProbeFailed, exact_length_texts, probe_over_http
from windve.prompts import default_prompt
from windve.settings import Settings
from windve.thread_switches import shorten_for_accelerators
from windve.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

WATCHDOG_SECONDS = 0.5  # how often the heartbeats of idle engine processes are read


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
        self.dtype = resolve_dtype(settings.dtype, "cpu", settings.engine)
        self.queue_manager: QueueManager | None = None
        self.depths: dict[str, DepthSource] = {}
        self.calibration: Calibration | None = None
        self.calibration_origin: str | None = None
        self.calibration_warnings: list[str] = []  # why its depths may not hold here (/info)
        self.watcher = None  # windve.calibration_store.CalibrationWatcher when Redis is set
        self.started_at = time.time()
        self.accepting = False  # the queue manager admits queries (at provisional depths while warming up)
        self.ready = False  # every pool has its depth: /health may say ok
        self._watchdog: asyncio.Task | None = None

    # ---- construction ----------------------------------------------------------------

    @classmethod
    async def start(
        cls, settings: Settings, *, probe_later: bool = False, allowed_cpus: Iterable[int] | None = None
    ) -> "Runtime":
        """Load the model, plan the devices, start every instance, set the queue depths.

        With `probe_later`, pools that need the warm-up probe get provisional depths: the runtime
        accepts queries but is not ready until the caller, once its front end listens, has called
        `finish_start`. `allowed_cpus`: the CPUs to plan over (default: this process's affinity)."""
        spec = load_spec(settings)
        tokenizer = TextTokenizer(spec, settings.max_input_tokens)
        hardware = devices.detect_hardware(settings.sysfs_root, allowed_cpus=allowed_cpus)
        plan = make_plan(settings, hardware)
        log.info("device plan:\n%s", devices.render_plan(plan, hardware.topology.is_arm))
        for note in hardware.topology.notes:  # what the plan leaves out or cannot trust, a CPU quota among them
            log.warning("CPU topology: %s", note)
        instances = {
            pool.name: [build_instance(settings, spec, hardware, inst) for inst in pool.instances]
            for pool in plan.pools
        }
        # The instances' threads in this process carry every batch to and from its engine: to an
        # accelerator's, they should not wait out the loop's 5 ms for the interpreter lock.
        shorten_for_accelerators(inst.device for pool in plan.pools for inst in pool.instances)
        runtime = cls(settings, spec, tokenizer, hardware, plan, instances)
        if settings.calibration_file is not None:
            runtime.apply_calibration(load_calibration(settings.calibration_file), str(settings.calibration_file))
        await runtime._start_queue_manager(probe_later)
        return runtime

    async def _start_queue_manager(self, probe_later: bool) -> None:
        settings = self.settings
        pools = [(name, 1, members) for name, members in self.instances.items()]
        qm = QueueManager(
            pools,
            heterogeneous=self.plan.heterogeneous,
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            batch_limits={name: batch_limits(settings, name) for name in self.instances},
            depth_control=settings.depth_control,
            depth_cap=settings.depth_cap,
            slo=settings.slo_seconds,
            bulk_share=settings.bulk_share,
        )
        self.queue_manager = qm
        try:
            await qm.start()
            # Watched from here on: a probe runs on these engines for seconds.
            self._watchdog = asyncio.create_task(self._watch_heartbeats(), name="engine-watchdog")
            from windve.engine_process.usage import watch_engines

            watch_engines(self, self._engine_processes)
            await self._follow_shared_calibration()
            unprobed = [name for name in self.instances if self._needs_probe(name)]
            if probe_later and unprobed:
                for name in self.instances:
                    # Until finish_start, one query per instance in every pool: a depth that any SLO
                    # one query can meet allows. The probe's pinned depths, then the settled ones,
                    # replace it.
                    qm.set_depth(name, len(self.instances[name]))
            else:
                await self._settle_depths(None)
        except BaseException:
            await self.close()
            raise
        self.accepting = True

    def _engine_processes(self) -> list[tuple[str, int, int]]:
        return [
            (instance.name, rank, pid)
            for members in self.instances.values()
            for instance in members
            for rank, pid in getattr(instance, "processes", list)()
        ]

    async def _watch_heartbeats(self) -> None:
        """Kill idle engine processes that stopped beating; busy ones are watched by their own wait."""
        while True:
            await asyncio.sleep(WATCHDOG_SECONDS)  # a watch period, not a wait for a condition
            for members in self.instances.values():
                for instance in members:
                    check = getattr(instance, "check_heartbeats", None)
                    if check is not None and not check():
                        self.queue_manager.instance_down(instance, instance.failure or "it missed its heartbeat")

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
        warnings = fingerprint_mismatch(calibration, self.spec.revision, self.hardware_fingerprint)
        if missing := [name for name in self.instances if name not in calibration.pools]:
            lacks = _pools_missing(calibration, missing)
            warnings.append(f"it {lacks}: those pools keep the probe's or the setting's depth")
        # A depth setting wins over any calibration: /info had shown the calibration "in force" alone.
        for name in self.instances:
            if name in calibration.pools and (setting := self._configured_depth(name)) is not None:
                warnings.append(f"pool {name} keeps its setting {name}_depth ({setting}), not this calibration's depth")
        for warning in warnings:
            log.warning("%s: %s", origin, warning)
        self.calibration, self.calibration_origin, self.calibration_warnings = calibration, origin, warnings
        if not self.ready:
            return  # the depths are still being set: _settle_depths takes it
        updated = {
            name: source
            for name in self.instances
            if self._configured_depth(name) is None and (source := self._known_depth(name)) is not None
        }
        # Only what the calibration moved is set again: setting a pool's depth reseeds its control,
        # which would put a pool the calibration does not name back at its start's depth.
        merged = self.depths | updated
        for name, source in self._somewhere_to_serve(merged).items():
            if name in updated or source is not merged[name]:
                self._use_depth(source)

    async def finish_start(self, address: Address | None) -> None:
        """Probe the pools that `start(probe_later=True)` left without a depth, then be ready.

        `address`: where this service's front end listens, for the probe over HTTP on loopback;
        None where no HTTP server listens for it (the runtime is embedded): the probe runs in
        this process, as it does where the HTTP one fails."""
        if not self.ready:
            await self._settle_depths(address)

    async def _settle_depths(self, address: Address | None) -> None:
        calibration = self.calibration
        sources = {name: self._known_depth(name) for name in self.instances}
        for name, source in sources.items():
            if source is None:
                sources[name] = await self._probe(name, address)
        if self.calibration is not calibration:  # one from Redis came while a probe ran: it wins, as live
            sources = {name: self._known_depth(name) or source for name, source in sources.items()}
        for source in self._somewhere_to_serve(sources).values():
            self._use_depth(source)
        self.ready = self.queue_manager.serving = True

    def _somewhere_to_serve(self, sources: dict[str, DepthSource]) -> dict[str, DepthSource]:
        """`sources`, unless every pool would take no queries: then each serves one query per instance.

        A calibration gives depth 0 to a pool that cannot meet the SLO, so that an accelerator's
        excess is not sent to a CPU pool that would answer it late. With no pool left, the service
        said healthy and refused every request (a calibration at 0.3 s read at a 0.01 s SLO); a late
        answer is better, as the warm-up probe has it."""
        if any(source.depth > 0 for source in sources.values()):
            return sources
        warning = (
            f"no pool meets the {self.settings.slo_seconds:g} s SLO by this calibration: each serves one "
            "query per instance, over the SLO; set slo_seconds to what the pools hold, or calibrate again"
        )
        log.warning(warning)
        if warning not in self.calibration_warnings:
            self.calibration_warnings = [*self.calibration_warnings, warning]
        return {
            name: dataclasses.replace(source, depth=len(self.instances[name]), source=f"{source.source}, floor")
            for name, source in sources.items()
        }

    def _use_depth(self, source: DepthSource) -> None:
        self.depths[source.pool] = source
        self.queue_manager.set_depth(source.pool, source.depth, source.token_budget, source.token_charge)
        log.info("pool %s: depth %d (%s)", source.pool, source.depth, source.source)

    def _configured_depth(self, pool: str) -> int | None:
        return {"accelerator": self.settings.accelerator_depth, "cpu": self.settings.cpu_depth}.get(pool)

    def _needs_probe(self, pool: str) -> bool:
        """No setting and no calibration gives `pool` a depth: `_known_depth` finds none."""
        calibration = self.calibration
        return not self._configured_depth(pool) and (calibration is None or pool not in calibration.pools)

    def _known_depth(self, pool: str) -> DepthSource | None:
        """The depth from a setting or a calibration; None when the pool needs the probe."""
        if self._needs_probe(pool):
            return None
        if configured := self._configured_depth(pool):
            return DepthSource(pool, configured, "setting")
        return depth_from_calibration(
            self.calibration, pool, self.settings.slo_seconds, f"calibration ({self.calibration_origin})"
        )

    def _probe_batch(self, pool: str) -> int:
        """A full batch of probe queries per instance, as the pool's batch limits form them: on an
        accelerator the token budget's worth (218 at 16,384 tokens), not the CPU pool's 32, whose
        batches are launch-bound on a GPU and would read its drain rate at a third."""
        queries, tokens = batch_limits(self.settings, pool)
        return max(1, min(queries, tokens // PROBE_TOKENS)) * len(self.instances[pool])

    async def _probe(self, pool: str, address: Address | None) -> DepthSource:
        """The warm-up probe over HTTP where the front end listens, else (or if that fails) in-process."""
        batch, slo = self._probe_batch(pool), self.settings.slo_seconds
        failure = None
        # A pool that admission never picks (heterogeneous computing off) cannot be reached over HTTP.
        if address is not None and pool in [eligible.name for eligible in self.queue_manager.eligible_pools()]:
            try:
                texts = exact_length_texts(self.spec.path)  # ValueError: no exact-length texts for this tokenizer
                with self._pinned(pool):
                    return await probe_over_http(pool, address, texts, batch, slo, self.settings.api_key)
            except (ProbeFailed, ValueError) as error:
                log.warning("pool %s: the warm-up probe over HTTP failed (%s); probing in-process", pool, error)
                failure = str(error)
        source = await probe_depth(pool, self.pool_submitter(pool), self.make_query(PROBE_TOKENS), batch, slo)
        if failure:
            source.detail["http_error"] = failure
        return source

    @contextmanager
    def _pinned(self, pool: str) -> Iterator[None]:
        """Room in `pool` only, so that the front end's admission sends the probe's requests there.

        Room for twice the probe's most in flight (`probe_room`).
        Adaptive depth control holds still meanwhile, or it would move these depths; _settle_depths
        sets every pool's depth after."""
        qm = self.queue_manager
        control, qm.depth_control = qm.depth_control, "static"
        try:
            for name in self.instances:
                qm.set_depth(name, probe_room(self._probe_batch(pool)) if name == pool else 0)
            yield
        finally:
            qm.depth_control = control

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
        return hardware_fingerprint(self.hardware, self.plan, self.settings)

    async def close(self) -> None:
        self.accepting = self.ready = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        from windve.engine_process.usage import forget_engines

        forget_engines(self)
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
                "warnings": self.calibration_warnings,
            },
            "heterogeneous": qm.get("heterogeneous"),
            "draining": qm.get("draining"),
            "pools": pools,
            "plan": self.plan.to_dict(),
            "hardware": self.hardware.to_dict(),
            "hardware_fingerprint": self.hardware_fingerprint,
        }


def check_plan(settings: Settings) -> devices.Plan:
    """Fail fast, before the server starts, on a missing model, a prompt setting the model does not
    have, an impossible plan, or a calibration file that cannot be read or has a depth for none of
    the plan's pools."""
    spec = load_spec(settings)
    try:
        default_prompt(spec, settings)
    except ValueError as error:
        setting = "default_prompt" if settings.default_prompt is not None else "default_prompt_name"
        raise ValueError(f"setting {setting}: {error}") from None
    plan = make_plan(settings, devices.detect_hardware(settings.sysfs_root))
    if settings.calibration_file is not None:
        try:
            calibration = load_calibration(settings.calibration_file)
        except CalibrationError as error:
            raise CalibrationError(f"setting calibration_file: {error}") from None
        pools = [pool.name for pool in plan.pools]
        if not set(pools) & set(calibration.pools):
            missing = _pools_missing(calibration, pools)
            raise CalibrationError(f"setting calibration_file: {settings.calibration_file} {missing}")
    return plan


def _pools_missing(calibration: Calibration, pools: Sequence[str]) -> str:
    """What a calibration lacks for `pools`, and what to do about a whole server's profile."""
    said = f"has depths for {', '.join(calibration.pools) or 'no pool'}, not for {', '.join(pools)}"
    if "server" in calibration.pools:  # windve calibrate --url: one depth for a whole server
        said += " (`windve calibrate --url` profiles a whole server: set its depth with cpu_depth or accelerator_depth)"
    return said


def make_plan(settings: Settings, hardware: devices.Hardware) -> devices.Plan:
    # `plan: []` is an explicit plan too, and refused as empty, not read as no plan at all.
    explicit = None if settings.plan is None else [inst.model_dump() for inst in settings.plan]
    # A `plan:` list replaces the layout; one that was set (not the default) gets a note saying so.
    given = explicit is None or "cpu_layout" in settings.model_fields_set
    return devices.make_plan(
        hardware,
        device=settings.device,
        heterogeneous=settings.heterogeneous,
        cpu_layout=settings.cpu_layout if given else "explicit",
        reserved_cores=settings.reserved_cores,
        explicit=explicit,
        engine=settings.engine,
    )


def batch_limits(settings: Settings, pool: str) -> tuple[int, int]:
    """(queries, padded tokens) per batch: a token budget on accelerators, both limits on CPUs."""
    if pool == "accelerator":
        return settings.accelerator_max_batch_size, settings.accelerator_max_batch_tokens
    return settings.max_batch_size, settings.max_batch_tokens


def load_spec(settings: Settings) -> ModelSpec:
    return load_model_spec(
        settings.model, settings.revision, settings.trust_remote_code, matryoshka_dims=settings.matryoshka_dims
    )


def build_instance(
    settings: Settings, spec: ModelSpec, hardware: devices.Hardware, inst: devices.InstanceSpec
) -> Instance:
    """An engine process for any device: a CPU instance gets one TP rank per NUMA node it
    spans; an accelerator instance one process pinned to its feeding core(s)."""
    from windve.engine_process.instance import PIPELINE, EngineProcessInstance

    topology = hardware.topology
    if inst.device == "cpu":
        by_node = topology.cores_by_node(inst.cores or topology.usable)
        rank_cores, nodes = [list(cores) for cores in by_node.values()], list(by_node)
    else:
        rank_cores = [list(inst.cores)]
        nodes = [topology.node_of(inst.cores[0]) if inst.cores else 0]
    accelerator_pool = inst.pool == "accelerator"
    engine, dtype = _engine_and_dtype(settings, inst)
    return EngineProcessInstance(
        spec,
        name=inst.name,
        pool=inst.pool,
        rank_cores=rank_cores,
        numa_nodes=nodes,
        engine=engine,
        dtype=dtype,
        max_batch_tokens=settings.accelerator_max_batch_tokens if accelerator_pool else settings.max_batch_tokens,
        onnx_cache_dir=settings.onnx_cache_dir,
        device=inst.device,
        heartbeat_timeout=settings.heartbeat_timeout_seconds,
        pipeline=settings.accelerator_pipeline if accelerator_pool else PIPELINE,
        threads=inst.threads,
    )


def hardware_fingerprint(hardware: devices.Hardware, plan: devices.Plan, settings: Settings) -> str:
    """The machine type, the plan and what else sets a pool's speed (each instance's engine and
    dtype, each pool's batch limits): stable across restarts of one set-up, changed by any of
    them. A calibration in Redis is keyed by it: one measured in fp16 on the CPU pool (depth 8)
    had been taken by replicas serving bf16 there (the probe found 79)."""
    topology = hardware.topology
    described = {
        "arch": topology.arch,
        "nodes": [len(node.usable) for node in topology.cpu_nodes],
        "accelerators": [acc.to_dict().get("name") for acc in hardware.accelerators],
        "plan": [
            [(inst.device, len(inst.cores), inst.tp, inst.engine) for inst in pool.instances]
            for pool in plan.pools
        ],
        "serving": {
            pool.name: {
                "engines": [_engine_and_dtype(settings, inst) for inst in pool.instances],
                "batch": batch_limits(settings, pool.name),
            }
            for pool in plan.pools
        },
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def _engine_and_dtype(settings: Settings, inst: devices.InstanceSpec) -> tuple[str, str]:
    engine = inst.engine or settings.engine
    return engine, resolve_dtype(settings.dtype, inst.device, engine)
