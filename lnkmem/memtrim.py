"""Giving freed memory back to the system (glibc), so that one process serving
many agents does not keep each agent's indexing peak for ever.

Indexing a batch holds its text and word counts at once; glibc keeps what is
freed in per-thread arenas. Capping the arenas and trimming after each
indexing pass returns it. Elsewhere than glibc these are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_ARENA_MAX = -8

try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _trim = _libc.malloc_trim
    _mallopt = _libc.mallopt
except (OSError, AttributeError):
    _trim = _mallopt = None


def cap_arenas(n: int = 2) -> None:
    """At most ``n`` malloc arenas, however many threads (call before threads start)."""
    if _mallopt is not None:
        _mallopt(M_ARENA_MAX, n)


def trim() -> None:
    """Return free heap memory to the system."""
    if _trim is not None:
        _trim(0)
