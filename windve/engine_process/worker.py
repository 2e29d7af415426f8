"""The main function of an engine process: one per instance (one per TP rank on CPUs).

Every instance runs in its own process, accelerator instances included: the process is
pinned to the instance's cores (an accelerator's: its feeding cores), so nothing on the
HTTP side can hold the interpreter lock that feeds the device. A heartbeat thread stamps
a shared board so that the dispatcher notices a stopped or stuck process.

Started as `python -m windve.engine_process.worker <fd> <parent pid>`: a fresh interpreter, like multiprocessing's
spawn, but without spawn's re-import of the parent's __main__ (the service's console
script would pull torch into the child before it could pin itself). The plan arrives as
JSON on the socket `fd`; the same socket then carries the binary messages of wire.py.

Order matters and is why this module imports only the standard library at the top:
pin the CPU set and export the thread-count variables, bind memory to the rank's NUMA
node, and only then import numpy/torch (their thread pools size themselves from the
environment and the affinity mask at load) and load the weights (first touch on the
bound node). No per-thread binding (OMP_PROC_BIND / GOMP_CPU_AFFINITY): libgomp would
re-pin the main thread to a single CPU; the process mask already keeps every thread on
the rank's cores.

G = 1: the plain engine (torch or onnx) answers EMBED messages on its socket. A read-ahead
thread receives, pads and stages (on a GPU: copies) batch N+1 while batch N runs; the dispatcher
keeps two batches handed over for that (windve.engine_process.instance).
G > 1: rank 0 receives each request straight into the shared input buffer, publishes it
to the other ranks and answers; every rank runs its shard of the forward pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from windve.cpu.layout import GroupLayout
from windve.cpu.numa import bind_memory
from windve.engine_process.heap import HeapTrimmer
from windve.model import ModelSpec, pad_token_id
from windve.parent_death import signal_at_parent_death

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np
    import torch

    from windve.cpu.allreduce import GroupComm
    from windve.engine_process.wire import Buffer

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class RankPlan:
    spec: ModelSpec
    instance: str
    rank: int
    world: int
    cores: tuple[int, ...]
    numa_node: int
    engine: str
    dtype: str
    onnx_cache_dir: str | None = None
    segment_path: str | None = None
    layout: GroupLayout | None = None
    reduce_timeout: float = 10.0
    device: str = "cpu"  # cpu | cuda:N | npu:N
    heartbeat_fd: int | None = None  # inherited memfd (windve.heartbeat)
    threads: int | None = None  # compute threads; None: one per CPU the rank may run on

    def compute_threads(self) -> int:
        """The rank's intra-op threads, once it is pinned."""
        return self.threads or len(os.sched_getaffinity(0))

    def to_json(self) -> bytes:
        fields = dataclasses.asdict(self)
        fields["spec"] = self.spec.to_dict()
        return json.dumps(fields).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankPlan:
        fields = json.loads(data)
        spec = fields.pop("spec")
        layout = fields.pop("layout")
        return cls(
            spec=ModelSpec(**spec),
            layout=GroupLayout(**layout) if layout else None,
            cores=tuple(fields.pop("cores")),
            **fields,
        )


def pin_process(plan: RankPlan) -> int:
    """Pin to the plan's cores and size the OpenMP/BLAS pools; the threads, for torch's pool too."""
    if plan.cores:  # an explicit accelerator instance may name none: it keeps the parent's mask
        os.sched_setaffinity(0, plan.cores)
    threads = plan.compute_threads()
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(threads)
    return threads


def rank_main(plan: RankPlan, conn: Connection) -> None:
    # The parent stops its engines (STOP, its pipe's end, SIGKILL) once their queries are answered.
    # A signal to the whole process group (Ctrl-C in a terminal, systemd's stop of the unit's
    # cgroup) had killed them mid-batch: admitted queries failed with 503 and the drain restarted them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    imported_early = sorted(name for name in ("numpy", "torch") if name in sys.modules)
    threads = pin_process(plan)
    membind = bind_memory(plan.numa_node)
    if plan.heartbeat_fd is not None:
        from windve.heartbeat import start_beating

        start_beating(plan.heartbeat_fd)
    from windve.engine_process import wire

    try:
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        server = EngineServer(plan, conn) if plan.world == 1 else RankServer(plan, conn)
    except BaseException as error:  # report why, then die: the parent raises it from start()
        _report(conn, wire.encode_json(wire.ERROR, 0, {"message": _describe(error), "fatal": True}))
        sys.exit(1)
    info = {
        "rank": plan.rank,
        "pid": os.getpid(),
        "cores": list(plan.cores),
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "numa_node": plan.numa_node,
        "device": plan.device,
        "membind": membind,
        "imported_before_pinning": imported_early,
        "dim": server.dim,
    }
    conn.send_bytes(wire.encode_json(wire.READY, 0, info))
    server.serve()


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _report(conn: Connection, message: bytes) -> None:
    with contextlib.suppress(OSError):  # the parent is gone; nobody to tell
        conn.send_bytes(message)


def _pad_id(model_dir: Path) -> int:
    try:
        return pad_token_id(json.loads((model_dir / "config.json").read_text()))
    except (OSError, ValueError):
        return 0


class EngineServer:
    """G = 1: the unmodified engine behind a pipe."""

    def __init__(self, plan: RankPlan, conn: Connection) -> None:
        from windve.engines.factory import create_engine

        self.conn = conn
        self.pad_id = _pad_id(plan.spec.path)
        cache = Path(plan.onnx_cache_dir) if plan.onnx_cache_dir else None
        # torch's intra-op pool was sized by rank_main; onnxruntime sizes its own.
        threads = plan.compute_threads()
        self.engine = create_engine(plan.spec, plan.engine, plan.device, plan.dtype, cache, threads=threads)
        self.dim = self.engine.dim

    def serve(self) -> None:
        """Answer staged batches in order until STOP or the parent goes away."""
        from windve.engine_process import wire

        staged: queue.Queue = queue.Queue(maxsize=1)  # one batch ready beside the one running
        threading.Thread(target=self._read_ahead, args=(staged,), name="engine-read-ahead", daemon=True).start()
        heap = HeapTrimmer()
        while (item := staged.get()) is not None:
            request_id, batch, problem = item
            if problem is None:
                try:
                    started = time.perf_counter()
                    embeddings = self.engine.run(batch)
                    reply = wire.encode_result(request_id, embeddings, time.perf_counter() - started)
                except Exception as error:  # a bad batch; the engine itself is still fine
                    problem = _describe(error)
            if problem is not None:
                reply = wire.encode_json(wire.ERROR, request_id, {"message": problem, "fatal": False})
            self.conn.send_bytes(reply)
            heap.after_batch()

    def _read_ahead(self, staged: queue.Queue) -> None:
        """Receive and stage each batch; None on the queue once STOP came or the pipe closed."""
        from windve.engine_process import wire

        while True:
            try:
                message = self.conn.recv_bytes()
            except (EOFError, OSError):
                break
            kind, request_id = wire.message_kind(message)
            if kind == wire.STOP:
                break
            try:
                lengths, ids = wire.decode_request(message)
                staged.put((request_id, self.engine.stage(*wire.pad_ids(lengths, ids, self.pad_id)), None))
            except Exception as error:  # a bad batch: answered as such, in its turn
                staged.put((request_id, None, _describe(error)))
        staged.put(None)


def _torch_all_reduce(comm: GroupComm) -> Callable[[torch.Tensor], torch.Tensor]:
    import torch

    def all_reduce(partial: torch.Tensor) -> torch.Tensor:
        flat = partial.float().contiguous()
        total = torch.empty_like(flat)
        comm.all_reduce(flat.numpy(), total.numpy())
        return total if partial.dtype == torch.float32 else total.to(partial.dtype)

    return all_reduce


class RankServer:
    """G > 1: one tensor-parallel rank."""

    def __init__(self, plan: RankPlan, conn: Connection) -> None:
        from windve.cpu.allreduce import GroupComm
        from windve.cpu.tp_bert import ShardedBert

        self.plan = plan
        self.conn = conn
        self.comm = GroupComm(Path(plan.segment_path), plan.layout, plan.rank, plan.reduce_timeout)
        self.model = ShardedBert(
            plan.spec.path,
            plan.rank,
            plan.world,
            _torch_all_reduce(self.comm),
            plan.spec.pooling,
            plan.dtype,
        )
        self.dim = self.model.dim

    def serve(self) -> None:
        try:
            self._serve_rank0() if self.plan.rank == 0 else self._serve_peer()
        except Exception as error:  # the group is out of step now: tell the parent and die
            from windve.engine_process import wire

            _report(self.conn, wire.encode_json(wire.ERROR, 0, {"message": _describe(error), "fatal": True}))
            sys.exit(1)

    def _embed(self, buffer: Buffer) -> np.ndarray:
        from windve.engine_process import wire

        lengths, ids = wire.decode_request(buffer)
        return self.model.embed(*wire.pad_ids(lengths, ids, self.model.shapes.pad_id))

    def _invalid(self, buffer: Buffer) -> str | None:
        """Checked before the broadcast, so a bad batch fails alone and the group stays in step."""
        from windve.engine_process import wire

        lengths, ids = wire.decode_request(buffer)
        shapes = self.model.shapes
        if lengths.size == 0:
            return "empty batch"
        if int(lengths.max()) > shapes.max_tokens:
            longest = int(lengths.max())
            return f"a sequence of {longest} tokens exceeds the model's {shapes.max_tokens} positions"
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= shapes.vocab):
            return f"token ids must lie in [0, {shapes.vocab})"
        return None

    def _serve_rank0(self) -> None:
        from windve.engine_process import wire

        heap = HeapTrimmer()
        while True:
            buffer = self.comm.next_input()
            try:
                size = self.conn.recv_bytes_into(buffer)
            except (EOFError, OSError):
                return
            kind, request_id = wire.message_kind(buffer)
            if kind == wire.STOP:
                self.comm.publish_input()
                return
            problem = self._invalid(buffer[:size])
            if problem:
                self.conn.send_bytes(
                    wire.encode_json(wire.ERROR, request_id, {"message": problem, "fatal": False})
                )
                continue
            started = time.perf_counter()
            self.comm.publish_input()
            embeddings = self._embed(buffer[:size])
            self.conn.send_bytes(wire.encode_result(request_id, embeddings, time.perf_counter() - started))
            heap.after_batch()

    def _serve_peer(self) -> None:
        from windve.engine_process import wire

        parent = os.getppid()
        heap = HeapTrimmer()
        while True:
            # An orphaned rank (parent SIGKILLed) notices within a second and exits.
            buffer = self.comm.wait_input(lambda: os.getppid() == parent)
            if buffer is None:
                return
            kind, _ = wire.message_kind(buffer)
            if kind == wire.STOP:
                return
            self._embed(buffer)
            heap.after_batch()


def main(argv: list[str]) -> None:
    # SIGKILL: an engine ignores SIGTERM (rank_main), and one stopped or stuck when its parent is
    # killed never reads its socket's EOF.
    if not signal_at_parent_death(int(argv[2]), signal.SIGKILL):
        sys.exit(1)
    conn = Connection(int(argv[1]))
    try:
        plan = RankPlan.from_json(conn.recv_bytes())
    except (EOFError, OSError):
        sys.exit(1)  # the parent went away before sending the plan
    rank_main(plan, conn)


if __name__ == "__main__":
    main(sys.argv)
