"""Large buffers a serving process frees go back to the system (windve/malloc_tuning.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# Answers of 9 MB, each followed by a small allocation that lives on (as a request's state does),
# five waves of thirty; prints how far the process's resident memory stayed above where it began.
WAVES = """
import sys
from windve.malloc_tuning import return_large_buffers

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20

if sys.argv[1] == "tuned":
    assert return_large_buffers()
first = bytes(9_600_000)
del first  # glibc's own threshold follows the first large block freed
base, kept = resident_mib(), []
for wave in range(5):
    answers = []
    for _ in range(30):
        answers.append(b"x" * 9_000_000)
        kept.append(bytearray(64 * 1024))
    del answers
print(resident_mib() - base)
"""


def _retained_mib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", WAVES, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_answers_do_not_stay_in_the_process() -> None:
    untuned, tuned = _retained_mib("plain"), _retained_mib("tuned")
    if untuned <= 100:
        pytest.skip(f"this glibc kept only {untuned} MiB of freed answers untuned: nothing to compare")
    assert tuned < 40, f"{tuned} MiB of freed answers stayed in the process"
