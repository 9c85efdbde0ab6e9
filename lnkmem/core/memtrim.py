"""Giving freed memory back to the system (glibc), so that one process serving
many agents does not keep each agent's indexing peak for ever.

Indexing a batch holds its text and word counts at once; glibc keeps what is
freed in per-thread arenas. Capping the arenas and trimming after each
indexing pass returns it. Elsewhere than glibc these are no-ops.
"""

from __future__ import annotations

import os
from typing import Optional

from lnkmem.core.libc import libc as c_library

M_ARENA_MAX = -8

try:
    _libc = c_library()
    _trim = _libc.malloc_trim
    _mallopt = _libc.mallopt
except (OSError, AttributeError):
    _trim = _mallopt = None


def tune(arenas: int = 2) -> None:
    """The process's allocator, set at start before any thread: at most ``arenas``
    arenas, however many threads (each tool thread's arena kept what its searches
    had freed: at 1.27M passages `serve`'s anonymous memory after the corpus
    queries and ten changes went down by a third or more). A fixed mmap threshold
    (large arrays unmapped when freed) saved a little more but cost the searches'
    p99 over MCP: each fresh mapping is faulted in anew (docs/BENCHMARKS.md)."""
    if _mallopt is not None:
        _mallopt(M_ARENA_MAX, arenas)


def trim() -> None:
    """Return free heap memory to the system."""
    if _trim is not None:
        _trim(0)


def resident() -> Optional[tuple[int, int]]:
    """This process's resident memory in bytes: (not backed by a file, backed by one:
    LMDB's map, the libraries); None without /proc."""
    try:
        with open("/proc/self/statm", "rb") as f:
            v = f.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        return (int(v[1]) - int(v[2])) * page, int(v[2]) * page
    except (OSError, ValueError, IndexError):
        return None
