"""Processes: whether one still runs (for files and marks that name their writer's pid),
how many cores this one may run on, and whether work is shared with a second process."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
from typing import Callable


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


def second_core(large: Callable[[], bool], cores_of: Callable[[], int] = cores) -> bool:
    """Whether work is shared with a second process (a build's worker, a merge's helper,
    a large listing's child): ``LNKMEM_WORKER`` ``0`` never, ``1`` always (tests), else
    when there are two cores and the work is ``large()``."""
    how = os.environ.get("LNKMEM_WORKER", "")
    if how == "0":
        return False
    return how == "1" or (cores_of() >= 2 and large())


_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
try:  # looked up here: a forked child calls it, and loads no library after the fork
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def detach(w: int, parent: int, name: bytes) -> None:
    """A forked child's ties: dies with the thread that forked it, deaf to Ctrl-C and
    SIGTERM, no garbage collection (the parent's objects stay as they are), no descriptor
    but ``w`` and the standard streams (on /dev/null); ``name`` as `ps` and `top` show it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
    gc.disable()
    if _prctl is not None:  # else a broken pipe ends it, at its next message
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _prctl(_PR_SET_NAME, name, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request: nobody to work for
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted({w, 0, 1, 2})
    lo = 3
    for fd in keep:
        if fd >= lo:
            os.closerange(lo, fd)
            lo = fd + 1
    os.closerange(lo, 1 << 20)
