"""The C library, opened once for the process.

The running program's own symbols (``dlopen(NULL)``) hold libc's on glibc and musl alike,
so nothing is searched for: ``ctypes.util.find_library`` runs ``ldconfig`` in a child
process each time it is called, which every start of the engine paid for, once for each
module that needed a libc function."""

from __future__ import annotations

import ctypes
import threading
from typing import Optional

_lock = threading.Lock()
_libc: Optional[ctypes.CDLL] = None


def libc() -> Optional[ctypes.CDLL]:
    """The C library (errno kept for ``ctypes.get_errno``), None where it cannot be opened."""
    global _libc
    with _lock:
        if _libc is None:
            try:
                _libc = ctypes.CDLL(None, use_errno=True)
            except OSError:
                return None
        return _libc
