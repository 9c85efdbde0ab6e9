"""Decoded posting lists kept for searches (:class:`Decoded`): a segment's lists never
change, so a term searched again is not decoded again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

import numpy as np

from lnkmem.index.codec.postings.decode import unpack


class Decoded:
    """Lists decoded, kept within :data:`CACHE_BYTES` (arrays plus :data:`ENTRY` a
    list): a segment's lists never change (a merge writes a new segment under a new
    key), so a term searched again is not decoded again. Its arrays are read-only.

    Which lists stay: while there is room, every one; once full, a list is let in
    only if it was asked for more often lately than each list it would push out,
    the least recently used first (frequency-gated admission, as TinyLFU: counts of
    every key asked for, halved every :data:`AGE_EVERY` lookups so that old habits
    fade). Plain LRU kept nothing when searches cycle through more lists than it
    holds (bench_scale's queries at 4x: every pass decoded every list again;
    docs/BENCHMARKS.md), and one search of common words flushed the lists that
    every other search uses."""

    # (half of it held bench_scale's queries at 1x but not at 4x: a pass decoded most long
    # lists again; docs/BENCHMARKS.md. An index's cache never holds more than its lists, so
    # a small agent's stays small)
    CACHE_BYTES = 32 << 20
    ENTRY = 256  # bytes of a cached list beside its arrays (key, tuple, array headers)
    AGE_EVERY = 4096  # lookups between two halvings of every count

    def __init__(self, budget: Optional[int] = None):
        if budget is not None:
            self.CACHE_BYTES = budget
        self.lists: OrderedDict = OrderedDict()
        self.size = 0
        self.asked: dict[bytes, int] = {}  # lookups of each key lately (bounded by the halvings)
        self.maxtf: dict[bytes, int] = {}  # of kept lists, their largest tf once asked (:meth:`max_tf`)
        self._lookups = 0
        self.lock = threading.Lock()

    def _bytes(self, pair) -> int:
        return pair[0].nbytes + pair[1].nbytes + self.ENTRY

    def get(self, key: bytes):
        with self.lock:
            self.asked[key] = self.asked.get(key, 0) + 1
            self._lookups += 1
            if self._lookups >= self.AGE_EVERY:
                self._lookups = 0
                self.asked = {k: c >> 1 for k, c in self.asked.items() if c > 1}
            got = self.lists.get(key)
            if got is not None:
                self.lists.move_to_end(key)
            return got

    def of(self, key: bytes, v) -> tuple[np.ndarray, np.ndarray]:
        """The list under ``key`` as kept, else its stored value ``v`` decoded now (and let in
        if it may: :meth:`put`)."""
        got = self.get(key)
        return got if got is not None else self.put(key, unpack(v))

    def max_tf(self, key: bytes, pair: tuple[np.ndarray, np.ndarray]) -> int:
        """The largest tf of ``pair`` (the list under ``key``), kept while the list is: a
        search's bound reads it for every long list of its words."""
        m = self.maxtf.get(key)
        if m is None:
            m = int(pair[1].max()) if len(pair[1]) else 0
            with self.lock:
                if self.lists.get(key) is pair:
                    self.maxtf[key] = m
        return m

    def put(self, key: bytes, pair: tuple[np.ndarray, np.ndarray]):
        """Keep ``pair`` (if it is let in); returns it, read-only, either way."""
        if not self.CACHE_BYTES:
            return pair
        for a in pair:
            a.flags.writeable = False
        n = self._bytes(pair)
        with self.lock:
            if key in self.lists or n > self.CACHE_BYTES:
                return pair
            want = self.asked.get(key, 0)
            out, room = [], self.CACHE_BYTES - self.size
            for old in self.lists:  # least recently used first
                if room >= n:
                    break
                if self.asked.get(old, 0) >= want:
                    return pair  # not let in: what it would push out is asked for as often
                out.append(old)
                room += self._bytes(self.lists[old])
            for old in out:
                self.size -= self._bytes(self.lists.pop(old))
                self.maxtf.pop(old, None)
            self.lists[key] = pair
            self.size += n
        return pair
