"""The plan's values: instances, pools and the plan itself; frozen and JSON-ready via to_dict()."""

from __future__ import annotations

from dataclasses import dataclass

POOLS = ("accelerator", "cpu")  # dispatch priority order
ENGINE_CHOICES = ("torch", "onnx")

@dataclass(frozen=True)
class InstanceSpec:
    """One model instance.

    `cores`: for a CPU instance, every logical CPU it is pinned to, in the order its threads
    take them (highest index first on ARM); for an accelerator instance, the service core its
    feeding thread is pinned to (empty = unpinned). `numa_nodes`: nodes of those cores, one
    TP rank per node. `threads`: compute threads (one per physical core for CPU instances).
    """

    name: str
    pool: str  # accelerator | cpu
    device: str  # cpu | cuda:N | npu:N
    cores: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    tp: int
    engine: str  # torch | onnx
    threads: int

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "pool": self.pool,
            "device": self.device,
            "cores": list(self.cores),
            "numa_nodes": list(self.numa_nodes),
            "tp": self.tp,
            "engine": self.engine,
            "threads": self.threads,
        }


@dataclass(frozen=True)
class PoolSpec:
    name: str  # accelerator | cpu
    instances: tuple[InstanceSpec, ...]

    def to_dict(self) -> dict:
        return {"name": self.name, "instances": [instance.to_dict() for instance in self.instances]}


@dataclass(frozen=True)
class Plan:
    pools: tuple[PoolSpec, ...]  # priority order: accelerator, then cpu
    reserved_cores: tuple[int, ...]  # for HTTP, tokenization and accelerator feeding threads
    heterogeneous: bool  # True exactly when both pools are planned
    notes: tuple[str, ...] = ()
    layout: str = "per-node"  # per-node | tp | explicit

    def pool(self, name: str) -> PoolSpec | None:
        return next((pool for pool in self.pools if pool.name == name), None)

    @property
    def instances(self) -> tuple[InstanceSpec, ...]:
        return tuple(instance for pool in self.pools for instance in pool.instances)

    def to_dict(self) -> dict:
        return {
            "pools": [pool.to_dict() for pool in self.pools],
            "reserved_cores": list(self.reserved_cores),
            "heterogeneous": self.heterogeneous,
            "layout": self.layout,
            "notes": list(self.notes),
        }
