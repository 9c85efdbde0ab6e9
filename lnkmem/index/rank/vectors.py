"""Embeddings held in memory for brute-force cosine search (numpy).

The LMDB store keeps them as int8 with a float32 scale per vector; so does
this, 4x less memory than float32: row ``pid`` of an int8 matrix and of a
scale column is that passage's unit vector (``matrix[pid] * scales[pid]``),
with a flag per row saying whether it has one. A query widens the matrix a
block of rows at a time into a small float32 buffer (one per thread), takes
one dot product a row in the calling thread, then multiplies by the scales:
the scores are those of the widened matrix (float32 rounding aside), but the
whole matrix is never widened, and a query reads 4x fewer bytes.
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from lnkmem.index.format import SOURCE_CODE, quantize_rows
from lnkmem.index.store import Store

BLOCK = 1024  # rows widened at a time: 1.5 MiB of float32 at 384 dimensions (stays in cache)


def _rows_dot(w: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """``out = w @ q`` in the calling thread. Not a BLAS matrix-vector product: OpenBLAS wakes
    its threads for each block, and on a busy machine their spinning between blocks made a
    search many times slower; one dot product a row (``vecdot``; numpy 2) or numpy's einsum loop
    stays in this thread."""
    if _vecdot is not None:
        _vecdot(w, q, out=out)
    else:
        np.einsum("ij,j->i", w, q, out=out)


_vecdot = getattr(np, "vecdot", None)
_local = threading.local()


def _buffer(dim: int) -> np.ndarray:
    """This thread's float32 block buffer, shared by every index it searches (a process
    serving many agents holds one per searching thread, not one per agent and thread)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape != (BLOCK, dim):
        buf = _local.buf = np.empty((BLOCK, dim), np.float32)
    return buf


def _grown(held, cap: int):
    """(matrix, scales, has) with ``cap`` rows, the rows held copied."""
    m, sc, has = held
    gm = np.zeros((cap, m.shape[1]), np.int8)
    gm[: len(m)] = m
    gs = np.zeros(cap, np.float32)
    gs[: len(sc)] = sc
    gh = np.zeros(cap, bool)
    gh[: len(has)] = has
    return gm, gs, gh


class VectorIndex:
    def __init__(self, ann_path: Optional[str] = None) -> None:
        self.lock = threading.Lock()
        # (int8 matrix, float32 scales, has) replaced together, read once by a search
        self.held = (np.zeros((0, 0), np.int8), np.zeros(0, np.float32), np.zeros(0, bool))
        # past ann.threshold() vectors: an approximate index (lnkmem/index/rank/ann.py), a cache
        # kept in ``ann_path``; built on a thread of its own, searched once ``ann_ready``
        self.ann_path = ann_path
        self.ann = None
        self.ann_ready = False
        self._ann_thread: Optional[threading.Thread] = None
        self._ann_again = False
        self._ann_saving = False
        self._stop = threading.Event()

    @property
    def matrix(self) -> np.ndarray:
        return self.held[0]

    @property
    def scales(self) -> np.ndarray:
        return self.held[1]

    @property
    def has(self) -> np.ndarray:
        return self.held[2]

    @property
    def nbytes(self) -> int:
        """Memory held by the vectors (matrix, scales and flags)."""
        return sum(a.nbytes for a in self.held)

    def load(self, store: Store) -> None:
        """Hold every vector the store has, replacing what was held: the matrix is
        sized once and filled a chunk at a time (no second copy of all the rows)."""
        rows, dim = store.vector_shape()
        m = np.zeros((rows, dim), np.int8)
        sc = np.zeros(rows, np.float32)
        has = np.zeros(rows, bool)
        for pids, q, s in store.iter_vectors():
            if q.shape[1] != dim:
                continue
            if len(pids) and pids.max() >= len(m):  # stored meanwhile (the embed loop runs)
                m, sc, has = _grown((m, sc, has), int(pids.max()) + 1)
            m[pids] = q
            sc[pids] = s
            has[pids] = True
        with self.lock:
            self.held = (m, sc, has)
        self._ann_update(rebuild=True)

    def add(self, pids, vecs: np.ndarray) -> None:
        """Hold float vectors, quantised as the store keeps them."""
        if not len(pids):  # e.g. every passage embedded was replaced meanwhile
            return
        q, s = quantize_rows(np.asarray(vecs, np.float32).reshape(len(pids), -1))
        self.add_quantized(pids, q, s)

    def add_quantized(self, pids, q: np.ndarray, scales: np.ndarray) -> None:
        pids = np.asarray(pids, np.int64)
        if not len(pids):
            return
        with self.lock:
            dim = q.shape[1]
            need = int(pids.max()) + 1
            m, sc, has = self.held
            if m.shape[1] != dim:  # the first vectors, or another model's: start over
                m, sc, has = np.zeros((0, dim), np.int8), np.zeros(0, np.float32), np.zeros(0, bool)
            if need > m.shape[0]:
                m, sc, has = _grown((m, sc, has), max(need, int(m.shape[0] * 1.5) + 1024))
            m[pids] = q  # rows no search reads yet: their flags are set last
            sc[pids] = scales
            has[pids] = True
            self.held = (m, sc, has)
        ann = self.ann
        if ann is not None and ann.dim == q.shape[1]:
            with ann.lock:
                ann.put(pids, q)
        self._ann_update()

    def forget(self, pids) -> None:
        """Passage ids given to new passages (ids are reused): the vectors held for
        them are no longer theirs."""
        p = np.asarray(pids, np.int64)
        with self.lock:
            m, sc, has = self.held
            p = p[p < len(has)]
            if len(p) and has[p].any():
                has = has.copy()
                has[p] = False
                self.held = (m, sc, has)
        ann = self.ann
        if ann is not None and len(p):
            with ann.lock:
                ann.drop(p)
            self._ann_update()

    # --- the approximate index ------------------------------------------------

    def _ann_update(self, rebuild: bool = False) -> None:
        """Start the approximate index once enough vectors are held (or reconcile it with
        a matrix loaded anew), and save it after enough changes; on its own thread."""
        from lnkmem.index.rank import ann as annmod
        limit = annmod.threshold()
        if not limit or self._stop.is_set():
            return
        m, _, has = self.held
        ann = self.ann
        if ann is not None and ann.dim != m.shape[1]:  # another model's vectors: start over
            self.ann, self.ann_ready, ann = None, False, None
        if ann is None and self.count() < limit:
            return
        if ann is not None and not rebuild:
            if self.ann_ready and ann.changes >= max(annmod.SAVE_EVERY, len(ann) // 10):
                self._background(self._ann_save)
            return
        if not annmod.available():
            if not getattr(self, "_ann_warned", False):
                self._ann_warned = True
                import logging
                logging.getLogger("lnkmem").warning("usearch is not installed: vectors are searched exactly")
            return
        self._background(self._ann_build)

    def _background(self, work) -> None:
        with self.lock:
            t = self._ann_thread
            if t is not None and t.is_alive():
                self._ann_again = True
                return
            self._ann_again = False
            t = self._ann_thread = threading.Thread(target=self._ann_work, args=(work,), name="lnkmem-ann", daemon=True)
        t.start()

    def _ann_work(self, work) -> None:
        import logging
        try:
            work()
            while self._ann_again and not self._stop.is_set():
                self._ann_again = False
                self._ann_build()
        except Exception as e:  # the exact search serves meanwhile
            logging.getLogger("lnkmem").warning("approximate vector index failed: %s; searching exactly", e)
            self.ann, self.ann_ready = None, False

    def _ann_build(self) -> None:
        """Load the saved index (when its header vouches for it) or start an empty one,
        then make it hold exactly the rows held."""
        import logging
        from lnkmem.index.rank.ann import Ann
        m = self.held[0]
        ann = self.ann
        if ann is None or ann.dim != m.shape[1]:
            ann = Ann(m.shape[1], self.ann_path)
            why = ann.try_load()
            if why and why != "missing" and why != "no path":
                logging.getLogger("lnkmem").info("approximate vector index rebuilt: the saved one is %s", why)
            self.ann = ann
        ann.reconcile(lambda: self.held, self._stop)
        if self._stop.is_set():
            return
        self.ann_ready = True
        if ann.changes:
            self._ann_save()

    def _ann_save(self) -> None:
        """Save the graph; a folder that refuses it (read-only, full) costs only the head
        start of the next process: the graph in memory stays and keeps serving."""
        ann = self.ann
        if ann is not None and self.ann_ready:
            try:
                ann.save()
            except OSError as e:
                import logging
                logging.getLogger("lnkmem").warning("could not save the approximate vector index: %s", e)

    def close(self) -> None:
        """Stop the approximate index's thread and save it when it changed."""
        self._stop.set()
        t = self._ann_thread
        if t is not None:
            t.join(timeout=30)
        ann = self.ann
        if ann is not None and ann.changes:
            self._ann_save()

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

    def similarities(self, q: np.ndarray, rows: Optional[np.ndarray] = None, n: Optional[int] = None,
                     held=None) -> np.ndarray:
        """Cosine of ``q`` with the given rows (or with rows 0..n-1), block by block."""
        m, sc, _ = held or self.held
        q = np.asarray(q, np.float32)
        buf = _buffer(m.shape[1])
        total = len(rows) if rows is not None else (n if n is not None else m.shape[0])
        out = np.empty(total, np.float32)
        for a in range(0, total, BLOCK):
            b = min(total, a + BLOCK)
            block = m[rows[a:b]] if rows is not None else m[a:b]
            w = buf[: b - a]
            np.copyto(w, block, casting="unsafe")
            _rows_dot(w, q, out[a:b])
        out *= sc[rows] if rows is not None else sc[:total]
        return out

    def cosines(self, q: np.ndarray, pids) -> np.ndarray:
        """Cosine of ``q`` with each of ``pids`` (float32, in their order); NaN for a
        passage with no vector held (not embedded yet) or of another width."""
        held = self.held
        m, _, has = held
        pids = np.asarray(pids, np.int64).reshape(-1)
        out = np.full(len(pids), np.nan, np.float32)
        ok = (pids >= 0) & (pids < len(has))
        ok[ok] = has[pids[ok]]
        if ok.any() and m.shape[1] == len(q):
            out[ok] = self.similarities(q, rows=pids[ok], held=held)
        return out

    def search(self, store: Store, q: np.ndarray, k: int, sources=None, under: Optional[str] = None) -> list[tuple[int, float]]:
        """Best (pid, cosine) pairs among live passages that have a vector."""
        held = self.held
        m, _, has = held
        snap = store.snapshot
        n = min(len(has), len(snap.alive))
        if n == 0 or m.shape[1] != len(q):
            return []
        ann = self.ann
        if self.ann_ready and ann is not None and ann.dim == m.shape[1] and k < n:
            found = self._search_ann(ann, snap, held, n, q, k, sources, under)
            if found is not None:
                return found
        cand = snap.keep(np.flatnonzero(has[:n] & snap.alive[:n]), sources, under)
        if not len(cand):
            return []
        if len(cand) < n // 2:
            sims = self.similarities(q, rows=cand, held=held)
        else:
            sims = self.similarities(q, n=n, held=held)[cand]
        if len(cand) > k:
            top = np.argpartition(-sims, k - 1)[:k]
        else:
            top = np.arange(len(cand))
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(int(cand[i]), float(sims[i])) for i in top]

    def _search_ann(self, ann, snap, held, n: int, q: np.ndarray, k: int, sources, under):
        """The best ``k`` by the approximate index, re-scored exactly; None when the exact
        search should answer instead: a filter that leaves fewer rows than the threshold
        (searched exactly, in time proportional to them), too few neighbours passing the
        filters after over-fetching, or the index busy."""
        from lnkmem.index.rank import ann as annmod
        m, _, has = held
        ok = has[:n] & snap.alive[:n]
        filtered = (sources is not None and set(sources) != set(SOURCE_CODE)) or bool(under)
        passing = int(ok.sum())
        if filtered:
            cand = snap.keep(np.flatnonzero(ok), sources, under)
            if len(cand) < max(annmod.threshold(), 1) or len(cand) <= k:
                return None
            ok = np.zeros(n, bool)
            ok[cand] = True
            passing = len(cand)
        if passing <= k:
            return None
        # over-fetch by the share of the graph's rows that pass (dead passages and filters)
        over = min(2 * -(-len(ann) // passing), 64)
        count = min(n, max(k * over, k + 32))
        q8, _ = quantize_rows(np.asarray(q, np.float32))
        keys = ann.neighbours(q8[0], count)
        if keys is None:
            return None
        keys = keys[(keys >= 0) & (keys < n)]
        keys = keys[ok[keys]]
        if len(keys) < k:
            return None
        sims = self.similarities(q, rows=keys, held=held)
        top = np.argsort(-sims, kind="stable")[:k]
        return [(int(keys[i]), float(sims[i])) for i in top]
