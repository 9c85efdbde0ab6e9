"""The snapshot's refs: every file's ref once, by its id (``Snapshot.refid``).

At 120k files a list of str and a dict from ref to id held ~18 MiB (a str object
a ref, a dict entry a ref). Here the refs are one UTF-8 blob with each ref's end,
and a ref's id is found by its hash: the sorted hashes (Python's own ``hash`` of
the str: this process only, never stored) and the id of each. ~7 MiB for the
same refs. A table never changes: a commit that brings new refs makes a new one
(:meth:`Refs.extended`, O(refs) copies of flat arrays, no str a ref), so that a
search holding an older snapshot keeps its own.
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Iterable, Iterator, Sequence

import numpy as np


class Refs(Sequence[str]):
    """Refs by id (0 .. len-1), and each ref's id (:meth:`find`)."""

    __slots__ = ("_blob", "_bounds", "_at", "_hashes", "_ids")

    def __init__(self, blob: bytes, ends: np.ndarray, hashes: np.ndarray, ids: np.ndarray):
        self._blob = blob  # every ref's UTF-8, one after the other
        # int64: 0, then where each ref's bytes end in the blob (ref i: bounds[i] to bounds[i+1])
        self._bounds = np.concatenate((np.zeros(1, np.int64), ends))
        self._at = memoryview(self._bounds)  # the same, read as Python ints: a ref by id in
        # ~0.3 us (numpy scalars: ~1.3 us; the ranking sorts its top hits by ref)
        self._hashes = hashes  # int64, ascending: hash(ref) of every ref
        self._ids = ids  # int32: the id of the ref whose hash is at the same place

    @property
    def _ends(self) -> np.ndarray:
        return self._bounds[1:]

    @classmethod
    def of(cls, refs: Iterable[str]) -> "Refs":
        """A table of ``refs`` (distinct), their ids in the order given."""
        return cls._empty().extended(refs)

    @classmethod
    def _empty(cls) -> "Refs":
        return cls(b"", np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32))

    def extended(self, fresh: Iterable[str]) -> "Refs":
        """A new table: these refs, then ``fresh`` (none of them here already, each once)."""
        fresh = list(fresh)
        if not fresh:
            return self
        data = [r.encode("utf-8", "surrogatepass") for r in fresh]
        ends = np.fromiter(map(len, data), np.int64, len(data))
        np.cumsum(ends, out=ends)
        ends += len(self._blob)
        hashes = np.fromiter(map(hash, fresh), np.int64, len(fresh))
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        ids = (order + len(self)).astype(np.int32)
        at = np.searchsorted(self._hashes, hashes)
        return Refs(self._blob + b"".join(data), np.concatenate((self._ends, ends)),
                    np.insert(self._hashes, at, hashes), np.insert(self._ids, at, ids))

    def kept(self, used: np.ndarray) -> "Refs":
        """A new table of the refs where ``used`` (bool by id) is set, in their order."""
        return Refs.of(r for r, u in zip(self, used.tolist()) if u)

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        n = len(self._bounds) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("ref id out of range")
        at = self._at
        return self._blob[at[i]:at[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        blob, a = self._blob, 0
        for b in self._ends.tolist():
            yield blob[a:b].decode("utf-8", "surrogatepass")
            a = b

    def __contains__(self, ref) -> bool:
        return isinstance(ref, str) and self.find(ref) >= 0

    def find(self, ref: str) -> int:
        """The id of ``ref``; -1 when it is not here."""
        h = hash(ref)
        hashes = self._hashes
        i = int(np.searchsorted(hashes, h))
        while i < len(hashes) and hashes[i] == h:
            rid = int(self._ids[i])
            if self[rid] == ref:
                return rid
            i += 1
        return -1

    def find_all(self, refs: Sequence[str]) -> np.ndarray:
        """The id of each of ``refs`` (int32; -1 where one is not here)."""
        out = np.full(len(refs), -1, np.int32)
        if not len(refs) or not len(self):
            return out
        hashes = np.fromiter(map(hash, refs), np.int64, len(refs))
        at = np.searchsorted(self._hashes, hashes)
        hit = at < len(self._hashes)
        hit[hit] = self._hashes[at[hit]] == hashes[hit]
        for j in np.flatnonzero(hit).tolist():  # the hash matches: the ref decides (a collision is looked past)
            rid = int(self._ids[at[j]])
            out[j] = rid if self[rid] == refs[j] else self.find(refs[j])
        return out

    def starting(self, prefix: str) -> np.ndarray:
        """Bool by id: whether the ref starts with ``prefix``."""
        p = prefix.encode("utf-8", "surrogatepass")
        b = self._bounds
        return np.fromiter(map(self._blob.startswith, repeat(p), b[:-1].tolist(), b[1:].tolist()), bool, len(self))

    def nbytes(self) -> int:
        return len(self._blob) + self._bounds.nbytes + self._hashes.nbytes + self._ids.nbytes

    def __repr__(self) -> str:
        return f"Refs({len(self)} refs, {self.nbytes()} bytes)"
