"""The two ways the detector refuses: the machine cannot be read, or a plan cannot run on it."""

from __future__ import annotations


class DeviceError(RuntimeError):
    """The hardware description cannot be read (a sysfs file is missing or malformed).

    The message names the file and what was wrong with it.
    """


class PlanError(ValueError):
    """A requested plan cannot run on this hardware; the message names the offending part."""
