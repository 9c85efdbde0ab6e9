"""An approximate nearest-neighbour index over the int8 vectors (usearch HNSW),
used past a measured threshold of vectors held (``THRESHOLD``; below it the
exact search of ``VectorIndex`` stays, docs/BENCHMARKS.md "Approximate
search").

Keys are passage ids; the vectors are the int8 rows as stored (cosine does not
depend on a row's scale). The index is only a cache of LMDB's vectors: it is
built in the background from what ``VectorIndex`` holds, kept up to date by its
adds and forgets, and saved under ``<state>`` (``vectors.ann`` and its header
``vectors.ann.json``, never part of a bound memory's copy). The header carries
the file's size and BLAKE2b digest, checked *before* usearch reads the file, so
a truncated, damaged or foreign file is never handed to the library (it is
rebuilt instead). After a load the index is reconciled with the vectors held
(ids dropped, rows changed, rows added), so a file older than LMDB is only a
head start.

A search takes ``count`` neighbours from the graph and the caller re-scores
them exactly (``VectorIndex.similarities``), so scores are the exact ones and
only membership of the top is approximate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
from typing import Optional

import numpy as np

from lnkmem.core import atomic, procs
from lnkmem.core.knobs import knobs

log = logging.getLogger("lnkmem")

FORMAT = 1
# Vectors held from which searches use the approximate index: where the exact int8 search's p50
# grows past what a search may take on a 2-core machine (bench/bench_ann.py,
# docs/BENCHMARKS.md). LNKMEM_ANN_THRESHOLD overrides it (tests lower it; 0 turns it off).
THRESHOLD = 150_000
CONNECTIVITY = 16  # graph degree (usearch's default)
EXPANSION_ADD = 128  # build-time breadth
# search breadth, at least the neighbours asked: 256 against 128 raised recall@100 and
# recall@10 at 291k real MiniLM vectors for a fraction of a millisecond a search
# (bench/bench_ann.py, docs/BENCHMARKS.md)
EXPANSION_SEARCH = 256
CHUNK = 2048  # rows added per lock hold while building
SAVE_EVERY = 5000  # changes after which the file is saved again (or a tenth of the index)


def threshold() -> int:
    return THRESHOLD if knobs().ann_threshold is None else knobs().ann_threshold


def available() -> bool:
    try:
        import usearch.index  # noqa: F401
    except ImportError:
        return False
    return True


def _digest(path: str) -> tuple[int, str]:
    h = hashlib.blake2b(digest_size=32)
    size = 0
    # (never through a link, never waiting on a FIFO: what is not a plain file is no saved index)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a file")
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            size += len(b)
            h.update(b)
    return size, h.hexdigest()


class Ann:
    """A usearch index of int8 rows keyed by passage id, under one lock."""

    def __init__(self, dim: int, path: Optional[str] = None) -> None:
        from usearch.index import Index
        self.dim = dim
        self.path = path
        self.lock = threading.Lock()
        self.index = Index(ndim=dim, metric="cos", dtype="i8", connectivity=CONNECTIVITY,
                           expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)
        self.changes = 0  # since the last save
        self.loaded_from_file = False

    def __len__(self) -> int:
        return len(self.index)

    # --- the file ------------------------------------------------------------

    def header_path(self) -> str:
        return self.path + ".json"

    def try_load(self) -> Optional[str]:
        """Load the saved file when its header vouches for it; the reason when not (None: loaded)."""
        if not self.path:
            return "no path"
        self._clean_temps()
        try:
            raw = atomic.read_file(self.header_path(), 4096)  # (no link followed, no FIFO waited on)
            if raw is None:
                return "missing"
            head = json.loads(raw)
            if not isinstance(head, dict) or head.get("format") != FORMAT:
                return "unknown format"
            if head.get("dim") != self.dim or head.get("dtype") != "i8" or head.get("metric") != "cos":
                return "another shape"
            size, digest = _digest(self.path)
            if size != head.get("size") or digest != head.get("blake2b"):
                return "damaged (size or digest differs from its header)"
        except FileNotFoundError:
            return "missing"
        except (OSError, ValueError) as e:
            return f"unreadable header: {e}"
        try:
            self.index.load(self.path)
        except Exception as e:  # vouched for by its digest, yet refused: rebuilt
            from usearch.index import Index
            self.index = Index(ndim=self.dim, metric="cos", dtype="i8", connectivity=CONNECTIVITY,
                               expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)
            return f"refused by usearch: {e}"
        if self.index.ndim != self.dim:
            return "another shape"
        self.index.expansion_search = EXPANSION_SEARCH
        self.loaded_from_file = True
        return None

    def _clean_temps(self) -> None:
        """Remove the temp files of a save that a killed process left (``<file>.<pid>.tmp``, an
        older version's names; :func:`atomic.new_temp`'s are cleared by it)."""
        folder, base = os.path.split(self.path)
        try:
            names = os.listdir(folder or ".")
        except OSError:
            return
        for name in names:
            for stem in (base + ".", base + ".json."):
                rest = name[len(stem):-len(".tmp")] if name.startswith(stem) and name.endswith(".tmp") else ""
                if rest.isdigit() and int(rest) != os.getpid() and not procs.alive(int(rest)):
                    try:
                        os.unlink(os.path.join(folder, name))
                    except OSError:
                        pass

    def save(self) -> None:
        """Write the file and then its header, each to a temp name and renamed: a header
        that names the file's digest only ever follows the file it describes."""
        if not self.path:
            return
        tmp = atomic.new_temp(self.path)  # a name of its own, made here (usearch writes it by name)
        try:
            with self.lock:
                self.index.save(tmp)
                self.changes = 0
            size, digest = _digest(tmp)
            atomic.remove(self.header_path())  # the old header no longer describes the file
            atomic.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        atomic.write_file(self.header_path(), json.dumps({
            "format": FORMAT, "dim": self.dim, "dtype": "i8", "metric": "cos",
            "size": size, "blake2b": digest, "count": len(self.index)}).encode())

    # --- changes -------------------------------------------------------------

    def put(self, pids: np.ndarray, rows: np.ndarray) -> None:
        """Add (or replace) rows; caller holds ``lock``."""
        pids = np.asarray(pids, np.uint64)
        if not len(pids):
            return
        present = np.fromiter((self.index.contains(int(p)) for p in pids), bool, len(pids))
        if present.any():
            self.index.remove(pids[present])
        self.index.add(pids, np.ascontiguousarray(rows, np.int8), threads=1)
        self.changes += len(pids)

    def drop(self, pids: np.ndarray) -> None:
        """Remove ids (those absent are ignored); caller holds ``lock``."""
        pids = np.asarray(pids, np.uint64)
        if len(pids):
            present = np.fromiter((self.index.contains(int(p)) for p in pids), bool, len(pids))
            if present.any():
                self.index.remove(pids[present])
                self.changes += int(present.sum())

    def reconcile(self, held, stop: threading.Event) -> None:
        """Make the index hold exactly the rows ``held`` has (``held`` read again per chunk:
        adds and forgets meanwhile go to both)."""
        with self.lock:
            keys = np.asarray(self.index.keys, np.int64) if len(self.index) else np.zeros(0, np.int64)
        # rows in the index that are gone or changed
        for a in range(0, len(keys), CHUNK * 4):
            if stop.is_set():
                return
            with self.lock:
                m, _, has = held()
                k = keys[a:a + CHUNK * 4]
                ok = k < len(has)
                ok[ok] = has[k[ok]]
                gone = k[~ok]
                if len(gone):
                    self.drop(gone)
                kk = k[ok]
                if len(kk):
                    got = self.index.get(kk.astype(np.uint64), dtype=np.int8)
                    got = np.stack([g if g is not None else np.zeros(self.dim, np.int8) for g in got])
                    diff = np.flatnonzero((got != m[kk]).any(axis=1))
                    if len(diff):
                        self.put(kk[diff], m[kk[diff]])
        # rows held that the index lacks
        for a in range(0, len(held()[2]), CHUNK):
            if stop.is_set():
                return
            with self.lock:
                m, _, has = held()
                idx = np.flatnonzero(has[a:a + CHUNK]) + a
                if len(idx):
                    lack = np.fromiter((not self.index.contains(int(p)) for p in idx), bool, len(idx))
                    if lack.any():
                        self.index.add(idx[lack].astype(np.uint64), np.ascontiguousarray(m[idx[lack]]), threads=1)
                        self.changes += int(lack.sum())

    def neighbours(self, q8: np.ndarray, count: int, timeout: float = 0.05) -> Optional[np.ndarray]:
        """Up to ``count`` ids nearest ``q8``; None when the index is busy longer than
        ``timeout`` (being saved or built a chunk): the caller searches exactly."""
        if not self.lock.acquire(timeout=timeout):
            return None
        try:
            if count > self.index.expansion_search:
                self.index.expansion_search = count
            elif self.index.expansion_search != max(count, EXPANSION_SEARCH):
                self.index.expansion_search = max(count, EXPANSION_SEARCH)
            m = self.index.search(q8, count, threads=1)
            return np.asarray(m.keys, np.int64)
        finally:
            self.lock.release()
