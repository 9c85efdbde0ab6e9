"""A SIGBUS in an index's map made survivable (issue 34).

LMDB reads ``data.mdb`` through a shared map. A file cut shorter than the pages a
reader touches (another process truncating it: a person, a tool, a disk-full copy)
makes that touch a SIGBUS, whose default action ends the whole process: in
``serve-many`` every agent's sessions with it. The checks before each store call
(:meth:`lnkmem.index.store.Store.guard`) find a short file, but a cut landing between
the check and a read cannot be checked for: a signal must be caught.

Python's own handlers cannot catch it (they run later, between bytecodes: the faulting
instruction would fault again for ever), so this installs a C-level handler
(``sigaction`` through ctypes, ``SA_SIGINFO``) whose body is a ctypes callback. For a
fault inside a watched map it maps, in place of the page the file no longer holds, an
anonymous page that LMDB reads as an empty leaf (so a search or a cursor ends rather
than wanders), marks the map faulted, and returns: the read goes on, finds nothing or
fails, and the store turns the fault into "damaged" for that call (the index is then
rebuilt: a faulted map is never used again). A fault anywhere else is left as it was:
the handler puts the default action back and returns, so the fault recurs and ends the
process as it would have.

Only where it can be done soundly: Linux on 64-bit x86 or ARM with glibc (the layouts
of ``struct sigaction`` and ``siginfo_t`` below). Elsewhere :func:`install` says False
and nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import sys
import threading
from typing import Optional

from lnkmem.core.libc import libc as c_library

_lock = threading.Lock()
_maps: dict[int, list] = {}  # token -> [start, end, faulted, LMDB's page size]
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_ranges: tuple = ()  # (start, end, token) of every watched map (read by the handler)
_tokens = iter(range(1, 1 << 62))
_installed: Optional[bool] = None
_libc = None
_handler = None  # the ctypes callback (kept alive while installed)

PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x02, 0x10, 0x20
SA_SIGINFO, SA_ONSTACK, SA_NODEFER = 0x4, 0x08000000, 0x40000000
P_LEAF = 0x02
PAGEHDRSZ = 16  # LMDB's page header on a 64-bit build: pgno u64, pad u16, flags u16, lower u16, upper u16


class _Sigaction(ctypes.Structure):
    # glibc's struct sigaction on Linux x86_64 and aarch64
    _fields_ = [("sa_handler", ctypes.c_void_p), ("sa_mask", ctypes.c_ulong * 16),
                ("sa_flags", ctypes.c_int), ("sa_restorer", ctypes.c_void_p)]


def _supported() -> bool:
    return (sys.platform.startswith("linux") and sys.maxsize > 2 ** 32
            and platform.machine() in ("x86_64", "aarch64", "arm64")
            and platform.libc_ver()[0] == "glibc")


def _on_sigbus(signo, info, context) -> None:  # runs on the faulting thread, in the signal's frame
    try:
        addr = ctypes.c_void_p.from_address(info + 16).value or 0  # siginfo_t.si_addr
        for start, end, token in _ranges:
            if start <= addr < end:
                m = _maps.get(token)
                if m is None:
                    break
                page = _PAGE
                base = addr - (addr - start) % page
                got = _libc.mmap(ctypes.c_void_p(base), ctypes.c_size_t(page), PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, ctypes.c_long(0))
                if got != base:
                    break
                psize = m[3]
                # an empty leaf at each LMDB page this OS page begins (its upper bound: the page's end)
                for at in range(base, base + page, psize if psize and psize <= page else page):
                    n = (at - start) // (psize or page)
                    ctypes.memmove(at, struct.pack("=QHHHH", n, 0, P_LEAF, PAGEHDRSZ,
                                                   min(psize or page, 0xFFFF)), PAGEHDRSZ)
                _libc.mprotect(ctypes.c_void_p(base), ctypes.c_size_t(page), PROT_READ)
                m[2] = True
                return
        _default()  # not ours: as if never caught (the fault recurs, with the default action)
    except BaseException:
        _default()


def _default() -> None:
    act = _Sigaction()
    act.sa_handler = 0  # SIG_DFL
    _libc.sigaction(signal.SIGBUS, ctypes.byref(act), None)


def install() -> bool:
    """Catch SIGBUS in watched maps from now on (once a process); False where it cannot."""
    global _installed, _libc, _handler
    with _lock:
        if _installed is not None:
            return _installed
        _installed = False
        if not _supported() or os.environ.get("LNKMEM_NO_MAPGUARD"):
            return False
        try:
            libc = c_library()
            if libc is None:
                return False
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
            _libc = libc
            _handler = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(_on_sigbus)
            act = _Sigaction()
            act.sa_handler = ctypes.cast(_handler, ctypes.c_void_p).value
            act.sa_flags = SA_SIGINFO | SA_NODEFER
            if libc.sigaction(signal.SIGBUS, ctypes.byref(act), None) != 0:
                return False
        except (OSError, AttributeError, TypeError):
            return False
        _installed = True
        return True


def _mapped(path: str) -> list[tuple[int, int]]:
    """The address ranges of this process's maps of the file at ``path``."""
    try:
        st = os.stat(path)
        real = os.path.realpath(path)
        out = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or int(parts[4]) != st.st_ino:
                    continue
                name = parts[5].rstrip("\n")
                if name == real:
                    a, b = parts[0].split("-")
                    out.append((int(a, 16), int(b, 16)))
        return out
    except (OSError, ValueError):
        return []


def watch(path: str, psize: int, token: Optional[int] = None) -> Optional[int]:
    """Watch this process's map of ``path`` (a data.mdb; LMDB's page size ``psize``), or
    watch it anew after the map moved (``token``: the watch it had); its token, or None
    when SIGBUS cannot be caught here."""
    if not install():
        return None
    global _ranges
    ranges = _mapped(path)
    with _lock:
        if token is None:
            token = next(_tokens)
        m = _maps.get(token)
        faulted = bool(m and m[2])
        lo = min((a for a, _ in ranges), default=0)
        hi = max((b for _, b in ranges), default=0)
        _maps[token] = [lo, hi, faulted, psize]
        _ranges = tuple(r for r in _ranges if r[2] != token) + tuple((a, b, token) for a, b in ranges)
    return token


def forget(token: Optional[int]) -> None:
    """Stop watching (before the map is let go of: its addresses may be mapped again)."""
    global _ranges
    if token is None:
        return
    with _lock:
        _maps.pop(token, None)
        _ranges = tuple(r for r in _ranges if r[2] != token)


def faulted(token: Optional[int]) -> bool:
    """Whether a read through the watched map met a page its file no longer holds."""
    m = _maps.get(token) if token is not None else None
    return bool(m and m[2])
