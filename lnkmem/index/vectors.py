"""Embeddings held in memory for brute-force cosine search (numpy).

The LMDB store keeps them (int8 + scale); this keeps a float32 matrix whose
row ``pid`` is that passage's unit vector, with a flag per row saying whether
it has one. A query is one matrix-vector product over the live rows.
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from lnkmem.index.store import Store


class VectorIndex:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.matrix = np.zeros((0, 0), np.float32)
        self.has = np.zeros(0, bool)

    def load(self, store: Store) -> None:
        pids, vecs = store.all_vectors()
        with self.lock:
            self.matrix = np.zeros((0, 0), np.float32)
            self.has = np.zeros(0, bool)
        if len(pids):
            self.add(pids, vecs)

    def add(self, pids, vecs: np.ndarray) -> None:
        pids = np.asarray(pids, np.int64)
        if not len(pids):
            return
        with self.lock:
            dim = vecs.shape[1]
            need = int(pids.max()) + 1
            m, has = self.matrix, self.has
            if m.shape[1] != dim:  # the first vectors, or another model's: start over
                m, has = np.zeros((0, dim), np.float32), np.zeros(0, bool)
            if need > m.shape[0]:
                cap = max(need, int(m.shape[0] * 1.5) + 1024)
                grown = np.zeros((cap, dim), np.float32)
                grown[: m.shape[0]] = m
                hg = np.zeros(cap, bool)
                hg[: len(has)] = has
                m, has = grown, hg
            m[pids] = vecs
            has[pids] = True
            self.matrix, self.has = m, has

    def missing(self, alive: np.ndarray, limit: int) -> list[int]:
        """Live passages without a vector, oldest first."""
        has = self.has
        n = len(alive)
        mask = alive.copy()
        k = min(n, len(has))
        mask[:k] &= ~has[:k]
        return [int(p) for p in np.flatnonzero(mask)[:limit]]

    def count(self) -> int:
        return int(self.has.sum())

    def search(self, store: Store, q: np.ndarray, k: int, sources=None, under: Optional[str] = None) -> list[tuple[int, float]]:
        """Best (pid, cosine) pairs among live passages that have a vector."""
        m, has = self.matrix, self.has
        snap = store.snapshot
        n = min(len(has), len(snap.alive))
        if n == 0 or m.shape[1] != len(q):
            return []
        cand = snap.keep(np.flatnonzero(has[:n] & snap.alive[:n]), sources, under)
        if not len(cand):
            return []
        sims = m[cand] @ q if len(cand) < n // 2 else (m[:n] @ q)[cand]
        if len(cand) > k:
            top = np.argpartition(-sims, k - 1)[:k]
        else:
            top = np.arange(len(cand))
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(int(cand[i]), float(sims[i])) for i in top]
