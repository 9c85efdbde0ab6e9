"""Whether a process still runs (for files and marks that name their writer's pid)."""

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
