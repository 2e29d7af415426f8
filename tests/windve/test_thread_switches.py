"""The interpreter's switch interval: shortened only in a process that feeds an accelerator."""

from __future__ import annotations

import sys

import pytest

from windve.thread_switches import HANDOFF_SWITCH_SECONDS, shorten_for_accelerators


@pytest.fixture
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(before)


def test_cpu_engines_keep_the_default_interval(default_interval):
    assert shorten_for_accelerators(["cpu", "cpu"]) is False
    assert sys.getswitchinterval() == default_interval


def test_an_accelerator_instance_shortens_it(default_interval):
    assert shorten_for_accelerators(device for device in ("cpu", "cuda:0")) is True
    assert sys.getswitchinterval() == pytest.approx(HANDOFF_SWITCH_SECONDS)
    assert HANDOFF_SWITCH_SECONDS < default_interval
