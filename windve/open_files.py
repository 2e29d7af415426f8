"""The open-file limit: every client connection, and every connection of the probe or `windve
calibrate`, holds a descriptor.

Hosts often start processes with a soft limit of 1,024 and a hard one far higher (systemd gives
524,288): with the soft one a front end stopped accepting at ~1,000 clients. `windve serve` and
`windve calibrate` raise theirs, and the processes they start inherit it, as Go's runtime does.
"""

from __future__ import annotations

import resource


def raise_open_files(wanted: int | None = None) -> int | None:
    """Raise this process's soft open-file limit to `wanted` (None: the hard limit), never above
    the hard limit nor lowering it; the soft limit now, None where it is unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    if hard == resource.RLIM_INFINITY:
        if wanted is None:  # no finite ceiling to reach for (Linux allows none for descriptors)
            return soft
        target = wanted
    else:
        target = hard if wanted is None else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft
