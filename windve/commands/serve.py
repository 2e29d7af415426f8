"""`windve serve`: start the HTTP service on the detected (or configured) devices."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from windve.commands.settings_flags import add_settings_flags, settings_from_args

log = logging.getLogger("windve.serve")

DRAIN_SECONDS = 30  # how long SIGTERM waits for admitted requests before closing


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="run the embedding service", description=__doc__)
    add_settings_flags(parser)


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT, stop admitting (BUSY) at once; uvicorn then lets admitted requests finish."""

    def handle_exit(self, sig, frame) -> None:  # noqa: ANN001 - signal handler signature
        runtime = self.config.app.state.runtime
        if runtime is not None and runtime.queue_manager is not None:
            runtime.queue_manager.draining = True
        super().handle_exit(sig, frame)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, "windve serve")
    logging.getLogger().setLevel(settings.log_level.upper())
    from devices import DeviceError
    from windve.frontend.app import create_app
    from windve.service import check_plan

    try:
        check_plan(settings)
    except (ValueError, DeviceError) as error:  # PlanError, ModelError are ValueErrors
        print(f"windve serve: {error}", file=sys.stderr)
        return 2
    fatal: list[str] = []
    server: DrainingServer | None = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=DRAIN_SECONDS,
    )
    server = DrainingServer(config)
    server.run()
    if fatal:
        print(f"windve serve: could not start: {fatal[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="windve serve")
    add_settings_flags(_parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(run(_parser.parse_args()))
