"""Processes: whether one still runs (for files and marks that name their writer's pid),
how many cores this one may run on, and whether work is shared with a second process."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import signal
import struct
from typing import Callable, Optional

from lnkmem.core.knobs import knobs


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
    how = knobs().worker
    if how == "0":
        return False
    return how == "1" or (cores_of() >= 2 and large())


_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
try:  # looked up here: a forked child calls it, and loads no library after the fork
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def tie_to_parent(name: Optional[bytes] = None) -> None:
    """A helper process's ties: deaf to Ctrl-C, SIGTERM, SIGHUP and SIGQUIT (its parent
    stops it), killed when the thread that started it ends (where prctl is; else a broken
    pipe ends it, at its next message); ``name`` as `ps` and `top` show it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if name is not None:
            _prctl(_PR_SET_NAME, name, 0, 0, 0)


def detach(w: int, parent: int, name: bytes) -> None:
    """A forked child's ties (:func:`tie_to_parent`), no garbage collection (the parent's
    objects stay as they are), no descriptor but ``w`` and the standard streams (on
    /dev/null)."""
    tie_to_parent(name)
    gc.disable()
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


def fork_sharing(run: Callable[[int, int, mmap.mmap], None], tail: int) -> Optional[tuple[int, int, mmap.mmap]]:
    """Fork a child that runs ``run(w, parent, shm)`` and leaves with ``os._exit`` (``w``: its
    end of a pipe to this process; ``shm``: 16 bytes both see, the claims of work shared
    from both ends: ``head`` at 0, the child's next; ``tail`` at 8, this process's lowest,
    ``tail`` at first). Here: (its pid, the pipe's read end, ``shm``), or None when it
    cannot start (nothing started, nothing left open)."""
    try:
        shm = mmap.mmap(-1, 16)
    except OSError:
        return None
    ctypes.c_int64.from_buffer(shm, 8).value = tail
    try:
        r, w = os.pipe()
    except OSError:
        shm.close()
        return None
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        shm.close()
        return None
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(r)
            run(w, parent, shm)
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    os.close(w)
    return pid, r, shm


_FRAME = struct.Struct("<Q")


def write_framed(w: int, body: bytes) -> None:
    """One message on a pipe: its length, then its bytes (:func:`read_msg` reads it)."""
    view = memoryview(_FRAME.pack(len(body)) + body)
    while view:
        view = view[os.write(w, view):]


def read_msg(pipe, decoder):
    """The next message :func:`write_framed` wrote on ``pipe`` (a file object), decoded by
    ``decoder`` (a msgspec decoder); None at its end or when it is not one it reads."""
    head = _read_exact(pipe, _FRAME.size)
    body = _read_exact(pipe, _FRAME.unpack(head)[0]) if head is not None else None
    if body is None:
        return None
    import msgspec
    try:
        return decoder.decode(body)
    except msgspec.DecodeError:
        return None


def _read_exact(pipe, n: int) -> Optional[bytearray]:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = pipe.readinto(view[got:])
        if not k:
            return None
        got += k
    return buf
