"""Processes: whether one still runs (for files and marks that name their writer's pid),
and how many cores this one may run on."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while ``pid`` names a process, ours or another user's (EPERM: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def cores() -> int:
    """The cores this process may run on (its affinity; else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
