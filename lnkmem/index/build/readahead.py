"""The files a build is about to read, asked of the kernel ahead of their reads.

A first build reads a tree the page cache does not hold: each of its reads waits on
the disk while its core idles (the bench's 1x tree: 1-2 s of a 9-11 s build, the
build's two processes each reading one file at a time). :class:`Readahead` keeps a
thread a few files ahead of where the build reads: it opens each of the next files
beneath its place's root and tells the kernel it will be read (``posix_fadvise``
WILLNEED: the reads start and the call returns), so the build's own read finds it in
memory. The build reads from one end of its list or from both (the worker from the
first entry on, the indexing thread from the last on): ``fronts`` says where each is.

It reads nothing itself and opens only what :meth:`LocalPlace.advise` opens (regular
files, beneath the root, openat2); where a place cannot (no openat2, a bridge's
place) its files are simply not advised. A file the build never reads (the two met
first) costs the page cache a few pages, nothing else.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Callable, Mapping, Optional

# how far ahead of each front: files, and bytes of them (the page cache a build asks for
# ahead is at most twice this); a large file is not advised (its own read is read ahead by
# the kernel as it goes)
AHEAD_FILES = 64
AHEAD_BYTES = 16 << 20
LARGE = 4 << 20


def enabled() -> bool:
    """``LNKMEM_READAHEAD``: ``0`` off (a comparison's other side), else on."""
    return os.environ.get("LNKMEM_READAHEAD", "") != "0"


class Readahead:
    """A thread advising ``items`` ((source, entry) pairs) ahead of ``fronts()``: (lo, hi),
    the next entry read going up (lo) and going down (hi - 1); nothing left when lo >= hi.
    ``down``: whether anything reads going down (else only ahead of lo is advised)."""

    def __init__(self, items: list, places: Mapping[str, object], fronts: Callable[[], tuple[int, int]],
                 down: bool = True):
        self.items, self.places, self.fronts, self.down = items, places, fronts, down
        self.roots: dict[str, Optional[int]] = {}
        self.done = threading.Event()
        self.advised = 0
        self.sizes: list[int] = []
        self.thread: Optional[threading.Thread] = None

    def start(self) -> "Readahead":
        self.thread = threading.Thread(target=self._run, name="lnkmem-readahead", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def _root(self, source: str) -> Optional[int]:
        if source not in self.roots:
            place = self.places.get(source)
            self.roots[source] = place.open_root() if place is not None else None
        return self.roots[source]

    def _advise(self, i: int) -> None:
        source, entry = self.items[i]
        if not 0 < self.sizes[i]:
            return
        root = self._root(source)
        if root is not None and self.places[source].advise(root, entry.path):
            self.advised += 1

    def _run(self) -> None:
        try:
            # bytes each entry would ask of the page cache (0: not advised), and their running sum
            self.sizes = [0 if e.size is not None and e.size > LARGE else max(e.size or 0, 1) for _, e in self.items]
            cum = [0, *itertools.accumulate(self.sizes)]
            up, down = self.fronts()  # advised so far: [first lo, up) and [down, first hi)
            while not self.done.is_set():
                lo, hi = self.fronts()
                if lo >= hi:
                    return
                up, down = max(up, lo), min(down, hi)
                moved = False
                # ahead of each front: at most AHEAD_FILES files and AHEAD_BYTES (always the next one)
                if up < min(lo + AHEAD_FILES, down) and (up == lo or cum[up + 1] - cum[lo] <= AHEAD_BYTES):
                    self._advise(up)
                    up += 1
                    moved = True
                if self.down and down > max(hi - AHEAD_FILES, up) \
                        and (down == hi or cum[hi] - cum[down - 1] <= AHEAD_BYTES):
                    down -= 1
                    self._advise(down)
                    moved = True
                if not moved:
                    self.done.wait(0.02)
        finally:
            for fd in self.roots.values():
                if fd is not None:
                    os.close(fd)
            self.roots = {}
