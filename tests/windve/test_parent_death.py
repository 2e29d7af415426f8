"""The parent-death signal: asked of the kernel, and a refusal said, not swallowed."""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest

from windve.parent_death import signal_at_parent_death

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")


def test_a_refused_request_is_logged_and_the_parent_still_checked(caplog):
    with caplog.at_level(logging.WARNING, logger="windve.parent_death"):
        assert signal_at_parent_death(os.getppid(), 999)  # not a signal: the kernel says EINVAL
    assert "prctl(PR_SET_PDEATHSIG) failed: Invalid argument" in caplog.text


def test_a_parent_that_is_not_ours_any_more_is_said(caplog):
    with caplog.at_level(logging.WARNING, logger="windve.parent_death"):
        assert not signal_at_parent_death(os.getppid() + 1_000_000, signal.SIGTERM)
        assert signal_at_parent_death(os.getppid(), 0)  # 0 clears the request: the kernel takes it
    assert not caplog.text
