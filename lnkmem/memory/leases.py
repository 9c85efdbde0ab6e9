"""File leases (``fcntl`` ``F_SETLEASE``): whether anyone holds the notes open for writing,
told exactly by the kernel between a change's re-check and its rename (§2.2)."""

from __future__ import annotations

import errno
import fcntl
import signal
import threading
from typing import Optional

# Leases (fcntl F_SETLEASE) tell exactly whether anyone opened the notes for
# writing between the re-check and the rename. A lease break signals SIGIO,
# whose default action ends the process: leases are used only where SIGIO is
# ignored (set here when this module is first imported by the main thread).
if threading.current_thread() is threading.main_thread():
    try:
        if signal.getsignal(signal.SIGIO) == signal.SIG_DFL:
            signal.signal(signal.SIGIO, signal.SIG_IGN)
    except (ValueError, OSError, AttributeError):
        pass


def usable() -> bool:
    """Whether leases can be taken here (the call exists, and SIGIO is ignored)."""
    return hasattr(fcntl, "F_SETLEASE") and signal.getsignal(signal.SIGIO) == signal.SIG_IGN


def try_lease(fd: int) -> str:
    """Take a read lease: "ok"; "busy" when someone holds the file open for
    writing; "no" where leases do not work (another owner, the filesystem)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        return "ok"
    except OSError as e:
        return "busy" if e.errno == errno.EAGAIN else "no"


def writer_holds(fd: int) -> Optional[bool]:
    """Whether anyone holds the file open for writing now; None where leases cannot tell."""
    if not usable():
        return None
    got = try_lease(fd)
    if got == "ok":
        drop(fd)
        return False
    return True if got == "busy" else None


def take(fd: int) -> bool:
    """Take a read lease on ``fd``; False where it cannot be had."""
    return try_lease(fd) == "ok"


def held(fd: int) -> int:
    """The lease ``fd`` holds now (``fcntl.F_UNLCK`` where none, or where it cannot tell)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE)
    except OSError:
        return fcntl.F_UNLCK


def drop(fd: int) -> None:
    """Give up the lease on ``fd``."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass
