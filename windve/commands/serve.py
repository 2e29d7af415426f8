"""`windve serve`: start the HTTP service on the detected (or configured) devices.

One front end (the default on machines without an accelerator): the front end, the
dispatcher and the engine processes' owner share one process. Several (`http_workers`,
by default one per reserved service core but one, with an accelerator): this process is
the dispatcher and starts the front-end processes (windve.dispatcher.supervisor).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import uvicorn

from windve.commands.settings_flags import add_settings_flags, settings_from_args
from windve.frontend.server import FrontEndServer
from windve.open_files import raise_open_files

if TYPE_CHECKING:
    from devices.specs import Plan
    from windve.probe import Listening
    from windve.settings import Settings

log = logging.getLogger("windve.serve")

DRAIN_SECONDS = 30  # how long SIGTERM waits for admitted requests before closing
# The dispatcher spends ~0.1 ms of CPU per request and a front end ~1 ms (H200 host, 75-token
# texts, bench/SERVED.md 2026-11-27): past about a dozen front ends the one dispatcher is the limit.
MAX_AUTO_WORKERS = 12


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="run the embedding service", description=__doc__)
    add_settings_flags(parser)


class DrainingServer(FrontEndServer):
    """On SIGTERM/SIGINT, stop admitting (BUSY) at once; the front end's server then lets admitted
    requests finish (windve.frontend.server).

    Once it listens, it tells `listening` where: the warm-up probe goes there."""

    def __init__(self, config: uvicorn.Config, listening: Listening | None = None) -> None:
        super().__init__(config)
        self.listening = listening

    async def startup(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        await super().startup(sockets)
        if self.started and self.listening is not None:
            self.listening.bound(self.servers[0].sockets[0].getsockname())

    def handle_exit(self, sig, frame) -> None:  # noqa: ANN001 - signal handler signature
        front_end = self.config.app.state.runtime
        runtime = getattr(getattr(front_end, "dispatcher", None), "runtime", None)
        if runtime is not None and runtime.queue_manager is not None:
            runtime.queue_manager.draining = True
        super().handle_exit(sig, frame)


def front_end_processes(settings: Settings, plan: Plan) -> tuple[int, tuple[int, ...]]:
    """How many front-end processes, and the service cores they (and the dispatcher) share.

    The service cores are the reserved ones less the accelerators' feeding cores. Without an
    accelerator one process is fastest (tokenizing costs a few percent of inferring on a
    CPU); with one, the host path is the bottleneck: one front end per service core but one
    (the dispatcher's)."""
    feeding = {core for pool in plan.pools for inst in pool.instances if inst.device != "cpu" for core in inst.cores}
    service = tuple(core for core in plan.reserved_cores if core not in feeding) or tuple(plan.reserved_cores)
    if settings.http_workers is not None:
        return settings.http_workers, service
    has_accelerator = any(inst.device != "cpu" for pool in plan.pools for inst in pool.instances)
    if not has_accelerator:
        return 1, service
    return max(1, min(MAX_AUTO_WORKERS, len(service) - 1)), service


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, "windve serve")
    logging.getLogger().setLevel(settings.log_level.upper())
    from devices import DeviceError
    from windve.service import check_plan

    try:
        plan = check_plan(settings)
    except (ValueError, DeviceError) as error:  # PlanError, ModelError are ValueErrors
        print(f"windve serve: {error}", file=sys.stderr)
        return 2
    raise_open_files()  # a descriptor per client connection; the processes started here inherit it
    workers, cores = front_end_processes(settings, plan)
    if workers > 1:
        from windve.dispatcher.supervisor import Supervisor

        return Supervisor(settings, workers, cores, DRAIN_SECONDS).run()
    return _serve_in_one_process(settings)


@contextlib.contextmanager
def _drain_is_a_clean_exit(server: uvicorn.Server) -> Iterator[None]:
    """Exit 0 after the drain that SIGTERM or SIGINT began, as the multi-process mode does.

    uvicorn restores the handlers it found once it has drained, then raises the signal again
    "for the expected behaviour": with the defaults that killed the process (-15, 143 in a
    container, which Kubernetes shows as Error on every rollout). The handlers it finds are
    these; they also stop the server should a signal come before uvicorn's own are in place."""

    def stop(signum: int, frame: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_in_one_process(settings: Settings) -> int:
    from windve.frontend.app import create_app
    from windve.frontend.process import uvicorn_config
    from windve.listeners import cannot_listen, listen
    from windve.probe import Listening

    try:
        sock = listen(settings.host, settings.port)
    except OSError as error:  # the port in use, a host that is not this machine's: before any engine starts
        return cannot_listen(settings.host, settings.port, error)
    fatal: list[str] = []
    server: DrainingServer | None = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    listening = Listening()
    app = create_app(settings, on_fatal=on_fatal, listening=listening)
    server = DrainingServer(uvicorn_config(app, settings, DRAIN_SECONDS), listening)
    with _drain_is_a_clean_exit(server), sock:
        server.run(sockets=[sock])
    if fatal:
        print(f"windve serve: could not start: {fatal[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="windve serve")
    add_settings_flags(_parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(_parser.parse_args()))
