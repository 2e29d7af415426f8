"""The parent's keeper of a front end: when it kills one, and how long it waits before a replacement.

The processes are real (a `sleep` in place of a front end that hangs before it serves); the
dispatcher server is only the set of front ends that said they serve, which is all the keeper reads.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from types import SimpleNamespace

from windve.dispatcher import messages
from windve.dispatcher.supervisor import RESTART_BACKOFF, STABLE_SECONDS, Supervisor, failures_after
from windve.heartbeat import HeartbeatBoard
from windve.settings import Settings


async def _watched(settings: Settings, serving: bool, run_for: float) -> int | None:
    """The keeper watches a process that never exits by itself; its exit code, or None if it was
    still running after `run_for` seconds (then it is stopped here)."""
    supervisor = Supervisor(settings, 1, (), 30)
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(600)")
    server = SimpleNamespace(serving={messages.front_end_identity(process.pid)} if serving else set())
    heartbeat = HeartbeatBoard()
    try:
        return await asyncio.wait_for(supervisor._watch(0, process, heartbeat, server), run_for)
    except asyncio.TimeoutError:
        return None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        heartbeat.close()


def test_a_front_end_that_never_serves_is_killed_at_its_start_bound(caplog):
    settings = Settings(frontend_start_timeout_seconds=1.0)
    with caplog.at_level(logging.ERROR, logger="windve.dispatcher"):
        code = asyncio.run(_watched(settings, serving=False, run_for=60))
    assert code == -signal.SIGKILL
    assert "does not serve 1 s after its start (frontend_start_timeout_seconds): killed" in caplog.text


def test_the_start_bound_does_not_apply_to_one_that_serves():
    # It serves and its heartbeat is fresh (the board was just reset): nothing kills it.
    settings = Settings(frontend_start_timeout_seconds=0.5, frontend_heartbeat_timeout_seconds=600)
    assert asyncio.run(_watched(settings, serving=True, run_for=2.0)) is None


def test_the_back_off_starts_afresh_after_a_front_end_that_lived_a_while():
    failures = 0
    for _ in range(6):  # a crash loop climbs to the longest back-off and stays there
        failures = failures_after(failures, lived=0.2)
    assert RESTART_BACKOFF[min(failures - 1, len(RESTART_BACKOFF) - 1)] == RESTART_BACKOFF[-1]
    assert failures_after(failures, lived=STABLE_SECONDS) == 1  # then a day of serving: the first


def test_no_writable_temporary_folder_is_one_line_and_frees_the_port(monkeypatch, capsys):
    """A read-only root with no writable /tmp (`docker run --read-only`) had ended in a traceback
    after the port was bound."""
    import tempfile

    from tests.servers import free_port
    from windve.listeners import STARTUP_FAILURE, listen

    def no_folder(**_: object) -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp']")

    monkeypatch.setattr(tempfile, "mkdtemp", no_folder)
    port = free_port()
    assert Supervisor(Settings(host="127.0.0.1", port=port), 2, (), 30).run() == STARTUP_FAILURE
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "writable temporary folder (TMPDIR" in error, error
    listen("127.0.0.1", port).close()  # the port is free again
