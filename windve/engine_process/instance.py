"""An instance = pinned engine processes (one per TP rank; accelerators have one), seen by
the queue manager as one `Instance`.

The parent owns everything that must be cleaned up: the processes, their sockets and the
shared-memory segment (unlinked as soon as every rank mapped it). Blocking IPC runs on
the instance's own thread, never on the event loop. Every wait for a worker watches every
rank (socket EOF, pidfd) and has a deadline, so a dead or stuck rank fails the batch with
InstanceFailed instead of hanging it (a rank stuck inside an all-reduce is reported by its
peers' reduce timeout); the instance then stays failed, its processes killed, until
restart(). Each rank also stamps a heartbeat board: a rank silent for `heartbeat_timeout`
seconds (SIGSTOPped, deadlocked) is killed like a dead one, whether or not it is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
from prometheus_client import Histogram

from queue_manager.metrics import LATENCY_BUCKETS
from queue_manager.protocol import InstanceFailed
from windve.cpu.allreduce import create_group_segment, read_counters
from windve.cpu.bert_shapes import check_tp_degree, read_bert_shapes
from windve.cpu.layout import GroupLayout
from windve.cpu.shm import Segment
from windve.engine_process import wire
from windve.engine_process.launch import RankProcess
from windve.engine_process.worker import RankPlan
from windve.engines.factory import resolve_dtype
from windve.heartbeat import HeartbeatBoard
from windve.model import ModelSpec

WARMUP = np.arange(1, 9, dtype=np.int32)  # valid ids for any vocabulary
REDUCE_SLOT_FLOATS = 1 << 21  # 8 MiB per slot; a batch-32 x 75-token MiniLM layer needs 0.9 M
DEFAULT_BATCH_TOKENS = 16384
STOP_GRACE_SECONDS = 5.0
WATCH_SECONDS = 0.25  # how often a wait for an answer looks at the heartbeats
PIPELINE = 2  # batches in flight: one computing, the next waiting in the engine's pipe
# On CPUs the batch waiting in the pipe is sent once half a full batch is queued: a CPU engine's
# time per query falls with the batch (MiniLM bf16 on one core: 98 q/s at batch 1, 139 at 2,
# 254 at 32, bench/engines.py) and its batches take long enough (~130 ms for 32) that the queries
# arriving meanwhile fill the next one; sent at once, batches of one or two queries kept the next
# arrivals out (bench/SERVED.md, 2026-11-26). Accelerators hand it over at once: their batches take
# a few milliseconds, and a hand-over as long would idle the device (not yet measured apart there).
CPU_AHEAD_FILL = 0.5

# The engine's own clock around a batch (no pipe, no queue, no dispatcher): with
# windve_inference_seconds, the dispatcher's view of the same batches, it says where a batch's
# time goes.
ENGINE_COMPUTE = Histogram(
    "windve_engine_compute_seconds",
    "Time an engine process spent running one batch, by its own clock",
    ["pool", "engine"],
    buckets=LATENCY_BUCKETS,
)


def split_threads(threads: int | None, rank_cores: list[list[int]]) -> list[int | None]:
    """An instance's compute threads over its ranks, in proportion to their CPUs (at least one
    each); None leaves every rank one thread per CPU it may run on.

    The plan's count is one per physical core: on an SMT host a rank pinned to both siblings of
    its cores would otherwise run two threads a core, fighting over the same FMA units."""
    if threads is None:
        return [None] * len(rank_cores)
    total = sum(len(cores) for cores in rank_cores)
    if total == 0:  # an accelerator instance that names no core
        return [threads] * len(rank_cores)
    return [max(1, round(threads * len(cores) / total)) for cores in rank_cores]


class EngineProcessInstance:
    """Embeds batches in pinned engine processes on `device`; G = len(rank_cores) TP ranks (CPU only)."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        name: str,
        pool: str = "",
        rank_cores: list[list[int]],
        numa_nodes: list[int],
        engine: str = "torch",
        dtype: str = "fp32",
        max_batch_tokens: int | None = None,
        onnx_cache_dir: str | Path | None = None,
        start_timeout: float = 120,
        reduce_timeout: float = 10.0,
        batch_timeout: float = 300.0,
        device: str = "cpu",
        heartbeat_timeout: float = 5.0,
        pipeline: int = PIPELINE,
        threads: int | None = None,
    ) -> None:
        world = len(rank_cores)
        if world < 1 or (device == "cpu" and any(not cores for cores in rank_cores)):
            raise ValueError(f"instance {name}: every rank needs at least one core, got {rank_cores}")
        if world > 1 and device != "cpu":
            raise ValueError(f"instance {name}: tensor parallelism runs on CPUs only, not on {device}")
        if len(numa_nodes) != world:
            raise ValueError(f"instance {name}: {world} ranks but {len(numa_nodes)} NUMA nodes {numa_nodes}")
        if engine not in ("torch", "onnx"):
            raise ValueError(f"instance {name}: unknown engine {engine!r} (torch or onnx)")
        if world > 1 and engine != "torch":
            raise ValueError(
                f"instance {name}: tensor parallelism over {world} ranks runs the torch engine only; "
                f"engine {engine!r} needs one rank (a single core set)"
            )
        self.name = name
        self.pool = pool or name.rsplit("-", 1)[0]  # for /metrics: instances are named <pool>-<n> by default
        self.pipeline = pipeline
        self.ahead_fill = CPU_AHEAD_FILL if device == "cpu" else 0.0
        self.spec = spec
        self.world = world
        self.rank_cores = [sorted(set(cores)) for cores in rank_cores]
        self.rank_threads = split_threads(threads, self.rank_cores)
        self.numa_nodes = list(numa_nodes)
        self.engine = engine
        self.device = device
        self.dtype = resolve_dtype(dtype, device, engine)
        self.dim = spec.dim
        self.onnx_cache_dir = str(onnx_cache_dir) if onnx_cache_dir else None
        self.start_timeout = start_timeout
        self.reduce_timeout = reduce_timeout
        self.batch_timeout = batch_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self._boards: list[HeartbeatBoard] = []
        self._killed_for: str | None = None  # why the heartbeat watch killed the group, if it did
        self._layout: GroupLayout | None = None
        if world > 1:
            shapes = read_bert_shapes(spec.path)
            check_tp_degree(shapes, world)
            tokens = max(max_batch_tokens or DEFAULT_BATCH_TOKENS, shapes.max_positions)
            self._layout = GroupLayout(
                world=world,
                reduce_elems=min(tokens * shapes.hidden, REDUCE_SLOT_FLOATS),
                input_bytes=wire.HEADER.size + 8 * tokens,  # 4 bytes per id + up to 4 per length
            )
        self._processes: list[RankProcess] = []
        self._segment: Segment | None = None
        self._ranks: list[dict] = []
        self._failure: str | None = "not started"
        self._request_id = 0
        self.last_compute_seconds = 0.0  # rank 0's own time for the last request (bench: IPC overhead)
        self._executor: ThreadPoolExecutor | None = None  # starts, and sends batches in order
        self._receiver: ThreadPoolExecutor | None = None  # waits for answers in the same order
        self._send_lock = threading.Lock()  # one writer of rank 0's pipe at a time (embed vs. stop)
        self._io_lock = threading.Lock()  # one reader of the ranks' pipes at a time (embed vs. close)
        self._arrived: dict[int, bytes] = {}  # answers read while waiting for an earlier one
        # start and stop exclude each other (close during a start waits for it, then stops)
        self._life_lock = threading.RLock()

    # --- Instance protocol ---

    async def start(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cpu-{self.name}")
            self._receiver = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cpu-{self.name}-recv")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._start_now)

    def submit(self, sequences: Sequence[np.ndarray]) -> Future:
        """Start a batch now, from the event loop's thread: its send is queued on the instance's sender
        thread and its receive on its receiver thread. Up to `pipeline` batches may overlap; each
        executor has one thread, so the receives run in the order of the sends, which is the order
        the engine answers in."""
        sender, receiver = self._executor, self._receiver
        if sender is None or receiver is None:
            raise InstanceFailed(f"instance {self.name} is not running")
        sent = sender.submit(self._send_batch, sequences)
        return receiver.submit(self._receive_sent, sent)

    async def embed(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        return await asyncio.wrap_future(self.submit(sequences))

    def _receive_sent(self, sent: Future) -> np.ndarray:
        ids = sent.result()
        if not ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = self._receive_batch(ids)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def restart(self) -> None:
        await asyncio.to_thread(self._stop_now, True)
        await self.start()

    async def close(self) -> None:
        # Not on the instance's own thread: an embed may be blocking it; killing the
        # ranks is what releases that embed.
        await asyncio.to_thread(self._stop_now, True)
        executors = (self._executor, self._receiver)
        self._executor = self._receiver = None
        for executor in executors:
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)

    def info(self) -> dict:
        statuses = [rank.get("membind", "unknown") for rank in self._ranks]
        if statuses and len(set(statuses)) == 1:
            membind = statuses[0]
        else:
            membind = "; ".join(f"rank {i}: {status}" for i, status in enumerate(statuses)) or "unknown"
        return {
            "kind": "engine-process",
            "name": self.name,
            "device": self.device,
            "engine": self.engine,
            "dtype": self.dtype,
            "tp": self.world,
            "pids": [rank["pid"] for rank in self._ranks],
            "cores": self.rank_cores,
            "numa_nodes": self.numa_nodes,
            "threads": sum(rank.get("torch_threads", 0) for rank in self._ranks),
            "membind": membind,
            "ranks": self._ranks,
            "running": self._failure is None,
            "failure": self._failure,
        }

    # --- introspection (tests, diagnostics) ---

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self._processes]

    def reduce_rounds(self) -> list[int]:
        """Each rank's last published all-reduce round (G > 1 and running), else []."""
        if self._segment is None or self._layout is None:
            return []
        return read_counters(self._segment, self._layout)

    # --- blocking side (instance thread) ---

    def _start_now(self) -> None:
        with self._life_lock:
            self._stop_now(graceful=True)
            self._spawn_and_warm_up()

    def _spawn_and_warm_up(self) -> None:
        try:
            if self._layout is not None:
                self._segment = create_group_segment(self._layout)
            self._boards = [HeartbeatBoard() for _ in self.rank_cores]
            for rank, cores in enumerate(self.rank_cores):
                self._processes.append(RankProcess(self._plan(rank, cores)))
            self._ranks = self._await_ready(time.monotonic() + self.start_timeout)
            if self._segment is not None:
                self._segment.unlink()  # every rank has it mapped; nothing can leak it now
            self.dim = int(self._ranks[0]["dim"])
            self._failure = None
            self._killed_for = None
            self._roundtrip([WARMUP, WARMUP[:5]])
        except BaseException:
            self._stop_now(graceful=False)
            raise

    def _plan(self, rank: int, cores: list[int]) -> RankPlan:
        return RankPlan(
            spec=self.spec,
            instance=self.name,
            rank=rank,
            world=self.world,
            cores=tuple(cores),
            numa_node=self.numa_nodes[rank],
            engine=self.engine,
            dtype=self.dtype,
            onnx_cache_dir=self.onnx_cache_dir,
            segment_path=str(self._segment.path) if self._segment else None,
            layout=self._layout,
            reduce_timeout=self.reduce_timeout,
            device=self.device,
            heartbeat_fd=self._boards[rank].fd,
            threads=self.rank_threads[rank],
        )

    def _await_ready(self, deadline: float) -> list[dict]:
        ready: dict[int, dict] = {}
        while len(ready) < self.world:
            rank, message = self._next_message(deadline, "starting", self.start_timeout)
            kind, _ = wire.message_kind(message)
            if kind == wire.READY:
                ready[rank] = wire.decode_json(message)
            elif kind == wire.ERROR:
                error = wire.decode_json(message)["message"]
                raise InstanceFailed(f"instance {self.name}: rank {rank} failed to start: {error}")
        return [ready[rank] for rank in range(self.world)]

    def _send_batch(self, sequences: Sequence[np.ndarray]) -> list[int]:
        """Write the batch (in chunks if it would not fit the shared input buffer) to rank 0; the
        request ids to wait for. Blocks only while rank 0's pipe is full (it computes)."""
        self._check_running()
        if not sequences:
            return []
        return [self._send(chunk) for chunk in self._chunks(sequences)]

    def _check_running(self) -> None:
        if self._failure is not None:
            raise InstanceFailed(f"instance {self.name} is down ({self._failure}); restart it")

    def _receive_batch(self, ids: list[int]) -> list[np.ndarray]:
        """The answers of a served batch's chunks, in order (one thread receives them all)."""
        answers, seconds = [], 0.0
        for request_id in ids:
            answers.append(self._receive(request_id))
            seconds += self.last_compute_seconds
        if ids:
            ENGINE_COMPUTE.labels(self.pool, self.name).observe(seconds)
        return answers

    def _chunks(self, sequences: Sequence[np.ndarray]) -> list[Sequence[np.ndarray]]:
        """Split a batch whose request would not fit the shared input buffer (TP only)."""
        if self._layout is None or wire.request_size(sequences) <= self._layout.input_bytes:
            return [sequences]
        chunks, start, size = [], 0, wire.HEADER.size
        for index, seq in enumerate(sequences):
            grown = size + 4 + 4 * len(seq)
            if grown > self._layout.input_bytes and index > start:
                chunks.append(sequences[start:index])
                start, grown = index, wire.HEADER.size + 4 + 4 * len(seq)
            size = grown
        chunks.append(sequences[start:])
        return chunks

    def _roundtrip(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        return self._receive(self._send(sequences))

    def _send(self, sequences: Sequence[np.ndarray]) -> int:
        with self._send_lock:
            self._check_running()
            self._request_id += 1
            request_id = self._request_id
            try:
                self._processes[0].conn.send_bytes(wire.encode_request(request_id, sequences))
            except (OSError, ValueError, IndexError) as error:
                raise self._fail(f"cannot send to rank 0: {error}") from None
            return request_id

    def _receive(self, request_id: int) -> np.ndarray:
        with self._io_lock:
            deadline = time.monotonic() + self.batch_timeout
            while True:
                message = self._arrived.pop(request_id, None)
                if message is not None:
                    self.last_compute_seconds = wire.result_compute_seconds(message)
                    return wire.decode_result(message)
                self._check_running()
                rank, message = self._next_message(deadline, "embedding", self.batch_timeout)
                kind, answered = wire.message_kind(message)
                if kind == wire.RESULT:
                    self._arrived[answered] = message
                elif kind == wire.ERROR:
                    error = wire.decode_json(message)
                    if error.get("fatal", True):
                        raise self._fail(f"rank {rank}: {error['message']}")
                    raise InstanceFailed(f"instance {self.name}: {error['message']}")

    def _next_message(self, deadline: float, doing: str, limit: float) -> tuple[int, bytes]:
        """The next message from any rank; InstanceFailed when a rank dies, misses its
        heartbeat (once running) or time runs out."""
        owner = {handle: process for process in self._processes for handle in process.handles()}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(f"no answer within {limit:g} s while {doing}")
            if doing != "starting":
                self._check_heartbeats(doing)
            try:
                ready = wait(list(owner), min(remaining, WATCH_SECONDS))
            except (OSError, ValueError) as error:  # pipes closed under us by close()
                raise self._fail(f"closed while {doing}: {error}") from None
            # Messages first: a rank's last words explain its exit better than its exit code.
            for handle in sorted(ready, key=lambda h: isinstance(h, int)):
                process = owner[handle]
                if handle is process.conn:
                    try:
                        return process.rank, process.conn.recv_bytes()
                    except (EOFError, OSError):
                        pass
                # Killed for a missed heartbeat (by the watchdog's thread): say that, not the signal.
                exited = f"rank {process.rank} (pid {process.pid}) {process.describe_exit()} while {doing}"
                raise self._fail(self._killed_for or exited)

    @property
    def failure(self) -> str | None:
        """Why the instance is down (None while it runs)."""
        return self._failure

    def silent_for(self) -> float:
        """Seconds since the quietest rank last beat (0 when not running)."""
        boards = self._boards
        if self._failure is not None or not boards:
            return 0.0
        try:
            return max(board.age() for board in boards)
        except ValueError:  # closed by a stop on the instance's thread meanwhile
            return 0.0

    def check_heartbeats(self) -> bool:
        """Kill a running group whose rank missed its heartbeat; True while it is alive.

        Called by the dispatcher's watchdog, so that an idle stuck process is noticed too; the
        next batch then fails over at once and the queue manager restarts the instance."""
        try:
            self._check_heartbeats("idle")
        except InstanceFailed:
            return False
        return self._failure is None

    def _check_heartbeats(self, doing: str) -> None:
        silent = self.silent_for()
        if silent > self.heartbeat_timeout:
            self._killed_for = f"no heartbeat for {silent:.1f} s while {doing} (stopped or stuck)"
            raise self._fail(self._killed_for)

    def processes(self) -> list[tuple[int, int]]:
        """(rank, pid) of every running engine process, for per-process metrics."""
        return [(process.rank, process.pid) for process in self._processes]

    def _fail(self, reason: str) -> InstanceFailed:
        """The group cannot go on: remember why, free its cores at once, build the error."""
        self._failure = reason
        self._kill_processes()
        return InstanceFailed(f"instance {self.name}: {reason}")

    def _kill_processes(self) -> None:
        for process in self._processes:
            process.kill()

    def _stop_now(self, graceful: bool) -> None:
        """Stop every rank (politely when idle), close sockets, drop the segment. Idempotent."""
        if not graceful or not self._life_lock.acquire(blocking=False):
            # A start is running (or a failure path): kill first, so an embed blocked on
            # the ranks returns, then wait for the start to give up the lifecycle.
            self._kill_processes()
            self._life_lock.acquire()
        try:
            self._stop_locked(graceful)
        finally:
            self._life_lock.release()

    def _stop_locked(self, graceful: bool) -> None:
        if graceful and self._processes and self._failure is None and self._send_lock.acquire(timeout=0.1):
            try:
                self._processes[0].conn.send_bytes(wire.encode_stop())
            except (OSError, ValueError):
                pass
            finally:
                self._send_lock.release()
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for process in self._processes:
                with contextlib.suppress(subprocess.TimeoutExpired):  # killed below
                    process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        if self._failure is None:
            self._failure = "stopped"
        self._kill_processes()
        # An embed still reading or writing the pipes has seen the deaths by now.
        with self._send_lock, self._io_lock:
            for process in self._processes:
                process.close()
            self._processes, self._ranks = [], []
            self._arrived.clear()
        segment, self._segment = self._segment, None
        if segment is not None:
            segment.unlink()
            segment.close()
        boards, self._boards = self._boards, []
        for board in boards:
            board.close()
