"""The parent of a multi-process `windve serve`: the dispatcher, and its front ends' keeper.

It opens one listening socket per front end, all on the service's port (SO_REUSEPORT, so that
the kernel spreads new connections evenly), keeps them for the service's life, starts N front-end
processes at once (they answer /health 503 while the engines load), then loads the engines
and runs the dispatcher on its own loop. A pool that needs the warm-up probe is probed from
here once every front end serves, over HTTP on that port (windve.probe); /health says ok
after. A front end that dies is replaced, and the queries it had admitted are cancelled; no other
front end's query is touched. So is one that serves and then stops stamping its heartbeat board
for `frontend_heartbeat_timeout_seconds` (a stalled event loop, a SIGSTOP), or that does not
serve within `frontend_start_timeout_seconds` of its start (a hung import or file system): it is
killed first. Replacements follow a back-off, which starts afresh after one that lived a minute.
Its listening socket stays here, so the connections the kernel hashed to it wait for its
replacement rather than for ever. SIGTERM drains: the
board says draining (new requests get BUSY), every front end finishes what it admitted and
exits, then the engines stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from windve.dispatcher import messages
from windve.dispatcher.board import StateBoard
from windve.dispatcher.server import DispatcherServer
from windve.dispatcher.workdir import Workdir, remove_stale_workdirs
from windve.gc_tuning import tune_gc_for_serving
from windve.heartbeat import HeartbeatBoard
from windve.listeners import STARTUP_FAILURE, cannot_listen, open_listeners
from windve.malloc_tuning import return_large_buffers
from windve.probe import loopback
from windve.service import Runtime, load_spec
from windve.settings import Settings

log = logging.getLogger("windve.dispatcher")

RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0)
STABLE_SECONDS = 60.0  # a front end that lived this long before it exited starts the back-off afresh
FRONT_ENDS_START_SECONDS = 60.0  # the warm-up probe waits this long at most for every front end to serve
WATCH_SECONDS = 0.25  # how often the keeper of a front end looks at its heartbeat


def front_ends_niceness(setting: int | None, own_cores: bool) -> int:
    """The niceness of front ends beside a dispatcher of their own: 0 on service cores of their own
    (they compete with no engine), else `setting`, or 0 where it is unset. Niced beside two engines
    on 2 cores, two front ends held their requests for 0.4 s before the hand-over and more after
    the answer under a storm, and 52-56 % of the 200s at 10x the depth answered past a 1 s SLO,
    against 3-7 % at 0 (bench/SERVED.md)."""
    if own_cores:
        return 0
    return 0 if setting is None else setting


def failures_after(failures: int, lived: float) -> int:
    """The count of failures in a row once a front end that lived `lived` seconds exited: one that
    ran for a while starts a new series (its replacement starts at the first back-off), as a
    crash a day after the last is not one more in a loop of them."""
    return 1 if lived >= STABLE_SECONDS else failures + 1


class Supervisor:
    def __init__(self, settings: Settings, workers: int, cores: tuple[int, ...], drain_seconds: int) -> None:
        self.settings = settings.model_copy(
            update={"frontend_nice": front_ends_niceness(settings.frontend_nice, own_cores=bool(cores))}
        )
        self.workers = workers
        self.cores = cores  # front ends and the dispatcher share the service cores
        self.drain_seconds = drain_seconds
        self.runtime: Runtime | None = None
        self.stopping = False
        self.failed: str | None = None
        self._fronts: dict[int, asyncio.subprocess.Process] = {}
        self._stop = asyncio.Event()

    def run(self) -> int:
        return asyncio.run(self._main())

    async def _main(self) -> int:
        try:
            listeners = open_listeners(self.settings.host, self.settings.port, self.workers)
        except OSError as error:  # the port in use, a host that is not this machine's: as uvicorn says it
            return cannot_listen(self.settings.host, self.settings.port, error)
        try:
            remove_stale_workdirs()
            shared = Workdir()
        except OSError as error:  # a read-only root with no writable /tmp: say what must be writable
            for listener in listeners:
                listener.close()
            print(
                f"windve serve: several front ends need a writable temporary folder (TMPDIR, else /tmp) "
                f"for their dispatcher's socket and metrics: {error}",
                file=sys.stderr,
            )
            return STARTUP_FAILURE
        workdir = shared.path
        # The engines are planned over the CPUs this process had before it moved onto the service
        # cores: planned after the move, every engine would be squeezed onto those few cores.
        allowed_cpus = frozenset(os.sched_getaffinity(0))
        if self.cores:
            os.sched_setaffinity(0, self.cores)
        (workdir / "settings.json").write_text(self.settings.model_dump_json())
        # The spec `windve serve` checked (its weights hash kept while their stat holds): front ends
        # read it rather than hash the weights again, a second per GB each, and name the same model
        # the engines load should its files change while the service runs.
        (workdir / "spec.json").write_text(json.dumps(load_spec(self.settings).to_dict()))
        (workdir / "metrics").mkdir()
        board = StateBoard(workdir / "board", create=True)
        server = DispatcherServer(str(workdir / "dispatcher.sock"), board, lambda: self.runtime, self._front_end_pids)
        server.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._begin_stop)
        keepers = [
            asyncio.create_task(self._keep_front_end(index, workdir, sock, server))
            for index, sock in enumerate(listeners)
        ]
        log.info("%d front-end processes on %s:%d", self.workers, self.settings.host, self.settings.port)
        starting = asyncio.create_task(self._start_engines(server, loopback(listeners[0].getsockname()), allowed_cpus))
        await self._stop.wait()
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await self._drain(server, listeners)
        for keeper in keepers:
            keeper.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)
        if self.runtime is not None:
            await self.runtime.close()
        await server.close()
        board.close()
        shared.remove()
        if self.failed:
            print(f"windve serve: could not start: {self.failed}", file=sys.stderr)
            return 1
        return 0

    async def _start_engines(
        self, server: DispatcherServer, address: tuple[str, int], allowed_cpus: frozenset[int]
    ) -> None:
        try:
            # Accepting (the probe's requests reach it through the front ends) but not ready yet.
            self.runtime = await Runtime.start(self.settings, probe_later=True, allowed_cpus=allowed_cpus)
            if not self.runtime.ready:
                await self._front_ends_serve(server)
                await self.runtime.finish_start(address)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - reported, then the service exits
            log.exception("the engines could not start")
            self.failed = f"{type(error).__name__}: {error}"
            self._begin_stop()
            return
        tune_gc_for_serving()  # as a front end does once it serves
        return_large_buffers()  # a large request's vectors pass through here too
        log.info("dispatcher ready: pools %s", ", ".join(self.runtime.pool_names))

    async def _front_ends_serve(self, server: DispatcherServer) -> None:
        """Until every front end answers /embed: the kernel hands the probe's connections to any of them."""
        deadline = time.monotonic() + FRONT_ENDS_START_SECONDS
        while (remaining := deadline - time.monotonic()) > 0:
            server.serving_changed.clear()
            pids = self._front_end_pids()
            if len(pids) == self.workers and all(messages.front_end_identity(pid) in server.serving for pid in pids):
                return
            # A front end that says it serves wakes this; one that dies is replaced by one that will.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.serving_changed.wait(), remaining)
        log.warning("not every front end serves after %.0f s: probing through those that do", FRONT_ENDS_START_SECONDS)

    def _front_end_pids(self) -> list[int]:
        return [process.pid for process in self._fronts.values() if process.returncode is None]

    def _begin_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self.runtime is not None and self.runtime.queue_manager is not None:
            self.runtime.queue_manager.draining = True  # BUSY from now on, on the board too
        self._stop.set()

    async def _drain(self, server: DispatcherServer, listeners: list[socket.socket]) -> None:
        """Front ends finish the requests they admitted (windve.frontend.server), then exit. No
        front end is replaced from now on, so the listening sockets are theirs alone: each closes
        its own once it stops accepting, and a connection comes to a front end still accepting,
        or is refused, rather than waiting in a socket no one accepts from."""
        server.publish_now()
        for listener in listeners:
            listener.close()
        for process in self._fronts.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        waits = [process.wait() for process in self._fronts.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.drain_seconds + 5)
        except asyncio.TimeoutError:
            for process in self._fronts.values():
                if process.returncode is None:
                    process.kill()

    async def _keep_front_end(self, index: int, workdir: Path, listener: socket.socket, server: DispatcherServer):
        failures = 0
        heartbeat = HeartbeatBoard()
        try:
            while not self.stopping:
                heartbeat.reset()
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "windve.frontend.process",
                    "--fd", str(listener.fileno()),
                    "--settings", str(workdir / "settings.json"),
                    "--spec", str(workdir / "spec.json"),
                    "--dispatcher", str(workdir / "dispatcher.sock"),
                    "--board", str(workdir / "board"),
                    "--drain-seconds", str(self.drain_seconds),
                    "--heartbeat-fd", str(heartbeat.fd),
                    "--parent", str(os.getpid()),
                    pass_fds=(listener.fileno(), heartbeat.fd),
                    env=os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(workdir / "metrics")},
                )
                self._fronts[index] = process
                started = time.monotonic()
                code = await self._watch(index, process, heartbeat, server)
                if self.stopping:
                    return
                failures = failures_after(failures, lived=time.monotonic() - started)
                await self._replace(index, process, code, failures, workdir, server)
        finally:
            heartbeat.close()

    async def _watch(
        self, index: int, process: asyncio.subprocess.Process, heartbeat: HeartbeatBoard, server: DispatcherServer
    ) -> int:
        """Until the front end exits (its code). One that serves and stops beating is killed, and so
        is one that does not serve within its start bound. Its heartbeat is not read before it
        serves, since a start (imports, the tokenizer) may hold its loop for seconds on a busy
        host; neither bound holds while the service drains, which has its own."""
        identity = messages.front_end_identity(process.pid)
        timeout = self.settings.frontend_heartbeat_timeout_seconds
        start_bound = time.monotonic() + self.settings.frontend_start_timeout_seconds
        exited = asyncio.ensure_future(process.wait())
        killed = False
        try:
            while True:
                done, _ = await asyncio.wait({exited}, timeout=WATCH_SECONDS)
                if done:
                    return exited.result()
                if killed or self.stopping:
                    continue
                if identity not in server.serving:
                    if time.monotonic() <= start_bound:
                        continue
                    log.error("front end %d (pid %d) does not serve %g s after its start "
                              "(frontend_start_timeout_seconds): killed",
                              index, process.pid, self.settings.frontend_start_timeout_seconds)
                elif (silent := heartbeat.age()) > timeout:
                    log.error("front end %d (pid %d) silent for %.1f s (frontend_heartbeat_timeout_seconds %g): killed",
                              index, process.pid, silent, timeout)
                else:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                killed = True
        finally:
            exited.cancel()  # done already, unless the keeper itself is cancelled

    async def _replace(
        self, index: int, process: asyncio.subprocess.Process, code: int, failures: int, workdir: Path,
        server: DispatcherServer,
    ) -> None:
        """Cancel what the front end that exited had admitted, then wait out a back-off before its
        replacement starts."""
        cancelled = server.forget_client(messages.front_end_identity(process.pid))
        _mark_metrics_dead(process.pid, workdir / "metrics")
        delay = RESTART_BACKOFF[min(failures - 1, len(RESTART_BACKOFF) - 1)]
        log.error(
            "front end %d (pid %d) exited with %s; %d of its requests cancelled; restarting in %.1f s",
            index, process.pid, code, cancelled, delay,
        )
        await asyncio.sleep(delay)  # back-off before a restart, not a wait for a condition


def _mark_metrics_dead(pid: int, directory: Path) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, str(directory))
