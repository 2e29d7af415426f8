"""The kernel's CPU-list format (`0-3,8-11`), as in sysfs `cpulist` files and cpusets."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> set[int]:
    """Parse `0-3,8,10-11` into {0,1,2,3,8,10,11}; raise ValueError naming the bad part."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"bad CPU list item {part!r} in {text.strip()!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r} in {text.strip()!r}")
        cpus.update(range(first, last + 1))
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """Inverse of parse_cpulist: {0,1,2,5} -> `0-2,5`."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)
