"""How nice front ends run: one process (the dispatcher inside) yields to the engines by default;
front ends beside a dispatcher of their own do not, unless told to; on cores of their own never."""

from __future__ import annotations

import os
import threading

import pytest

from windve.dispatcher.supervisor import Supervisor, front_ends_niceness
from windve.frontend.priority import SINGLE_PROCESS_NICE, loop_niceness, lower_this_thread
from windve.settings import Settings


@pytest.mark.parametrize(
    ("setting", "own_cores", "niceness"),
    [(None, False, 0), (7, False, 7), (0, False, 0), (None, True, 0), (7, True, 0)],
)
def test_front_ends_beside_their_dispatcher_run_at_the_setting_or_0(setting, own_cores, niceness):
    assert front_ends_niceness(setting, own_cores) == niceness


def test_the_supervisor_hands_its_front_ends_a_resolved_niceness():
    assert Supervisor(Settings(), 2, (), 30).settings.frontend_nice == 0
    assert Supervisor(Settings(frontend_nice=5), 2, (), 30).settings.frontend_nice == 5
    assert Supervisor(Settings(frontend_nice=5), 2, (0, 1), 30).settings.frontend_nice == 0


def test_one_process_yields_to_the_engines_by_default_and_only_its_loops_thread_is_niced():
    assert loop_niceness(Settings().frontend_nice) == SINGLE_PROCESS_NICE
    assert loop_niceness(0) == 0
    seen: dict[str, int] = {}

    def loop_thread() -> None:
        before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        lower_this_thread(3)
        seen["raised by"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) - before
        seen["could rise"] = min(3, 19 - before)  # the kernel caps it at 19

    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join()
    assert seen["raised by"] == seen["could rise"]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before  # others keep theirs
