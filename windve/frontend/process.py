"""A front-end process of a multi-process `windve serve`: uvicorn on a listening socket the parent
opened for it (one per front end, all on the service's port with SO_REUSEPORT), talking to the
parent's dispatcher.

Started by the parent as `python -m windve.frontend.process --fd N --settings FILE --spec FILE
--dispatcher ADDRESS --board FILE [--heartbeat-fd M] [--parent PID]` (the spec: the model as the
parent read it, windve.model.ModelSpec.to_dict); the parent's environment sets
PROMETHEUS_MULTIPROC_DIR, so that /metrics adds up every front end's counters. The event loop
stamps the heartbeat board M (windve.heartbeat) while it turns: the parent kills a front end
that serves and falls silent, and starts another.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from windve.parent_death import signal_at_parent_death
from windve.settings import Settings

log = logging.getLogger("windve.frontend")

def uvicorn_config(app: ASGIApp, settings: Settings, drain_seconds: int, **where) -> uvicorn.Config:
    """The one uvicorn set-up of every front end.

    The asyncio loop, not uvloop: under a storm of retries uvloop let new connections wait
    seconds in the listen queue (/health among them), asyncio's loop did not. It is asyncio's
    selector loop with the ready time of each step noted (event_loop.py), from which a request's
    time to answer is counted. The overload
    gate answers BUSY before the framework and calls the embedding routes without it; the HTTP
    protocol answers its parser's errors in JSON."""
    from windve.frontend.gate import OverloadGate
    from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
    from windve.frontend.routes import DIRECT_ROUTES

    return uvicorn.Config(
        OverloadGate(app, DIRECT_ROUTES),
        loop="windve.frontend.event_loop:new_event_loop",
        http=JsonErrorHttpToolsProtocol,
        # No WebSocket routes: with uvicorn's "auto" (websockets is installed beside it) a POST asking
        # to upgrade was handed to the WebSocket protocol, never answered, and failed the drain.
        ws="none",
        backlog=4096,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=drain_seconds,
        **where,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="windve front end")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--settings", type=Path, required=True)
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--dispatcher", required=True)
    parser.add_argument("--board", type=Path, required=True)
    parser.add_argument("--drain-seconds", type=int, default=30)
    parser.add_argument("--heartbeat-fd", type=int, default=None)
    parser.add_argument("--parent", type=int, default=None, help="the dispatcher's pid: this process ends with it")
    args = parser.parse_args(argv)
    if args.parent is not None and not signal_at_parent_death(args.parent, signal.SIGTERM):
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings(**json.loads(args.settings.read_text()))
    logging.getLogger().setLevel(settings.log_level.upper())

    from windve.frontend.app import create_app
    from windve.frontend.context import remote_front_end_factory
    from windve.frontend.server import FrontEndServer
    from windve.model import ModelSpec

    fatal: list[str] = []
    app = create_app(
        settings,
        remote_front_end_factory(args.dispatcher, args.board, ModelSpec(**json.loads(args.spec.read_text()))),
        on_fatal=fatal.append,
        heartbeat_fd=args.heartbeat_fd,
    )
    FrontEndServer(uvicorn_config(app, settings, args.drain_seconds, fd=args.fd)).run()
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
