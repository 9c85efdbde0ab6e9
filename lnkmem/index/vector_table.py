"""The index's stored vectors: each live passage's unit vector, quantized (int8 with a float32
scale: :func:`format.quantize`), in the ``vectors`` table by passage id, with the model that
made them in ``meta``; read back whole or in chunks for the vectors ranking
(:mod:`lnkmem.index.rank.vectors`, :mod:`lnkmem.index.rank.ann`).

Each function takes the :class:`~lnkmem.index.store.Store` they are asked through (its tables,
its write lock, its map's room); the store's methods of the same names are the door callers
use, and its guard stands around them.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

from lnkmem.index.codec import textpack
from lnkmem.index.format import encoder, id_key, quantize, vector_rows


def count(store) -> int:
    """How many passages have a stored vector (one read of the vectors table's size)."""
    with store.env.begin() as txn:
        return txn.stat(store.vectors)["entries"]


def use_model(store, model: str) -> bool:
    """Record whose vectors the index holds; another model's are dropped.
    Returns True when vectors were dropped."""
    with store.write_lock, store.env.begin(write=True) as txn:
        old = txn.get(b"model", db=store.meta)
        if old == model.encode():
            return False
        txn.drop(store.vectors, delete=False)
        txn.drop(store.vec_pending, delete=False)
        txn.put(b"model", model.encode(), db=store.meta)
        return old is not None


def put(store, pids: list[int], vecs: np.ndarray, passages: Optional[list] = None) -> list[int]:
    """Store unit vectors (int8 with a scale) of passages still live and, when
    ``passages`` are given, still the passages embedded; returns those stored."""
    expect = [encoder.encode(p) for p in passages] if passages is not None else None

    def write() -> list[int]:
        stored = []
        with store.env.begin(write=True) as txn:
            zdict = txn.get(b"zdict", db=store.meta)
            for i, (pid, v) in enumerate(zip(pids, vecs)):
                now = txn.get(id_key(pid), db=store.passages)
                if now is None or (expect is not None and textpack.unpack(now, zdict) != expect[i]):
                    continue  # replaced meanwhile
                txn.put(id_key(pid), quantize(v), db=store.vectors)
                txn.put(id_key(pid), b"", db=store.vec_pending)
                stored.append(pid)
        return stored

    stored = store.with_map_room(write)
    if stored:
        store.changed()
    return stored


def shape(store) -> tuple[int, int]:
    """(largest pid with a vector + 1, dimension) of the stored vectors; (0, 0) when none."""
    with store.env.begin() as txn:
        cur = txn.cursor(db=store.vectors)
        if not cur.first():
            return 0, 0
        dim = len(cur.value()) - 4  # the first row's, as iter_rows keeps
        cur.last()
        return int.from_bytes(cur.key(), "big") + 1, dim


def iter_rows(store, chunk: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every stored vector, as it is stored, in chunks of ``chunk`` rows:
    (pids int64, int8 rows, float32 scales); rows of another length than
    the first are skipped. Only one chunk is held at a time besides LMDB's map."""
    with store.env.begin() as txn:
        dim = None
        pids: list[int] = []
        rows: list[bytes] = []
        for k, v in txn.cursor(db=store.vectors):
            if dim is None:
                dim = len(v) - 4
            if len(v) != dim + 4:
                continue
            pids.append(int.from_bytes(k, "big"))
            rows.append(v)
            if len(rows) >= chunk:
                yield vector_rows(pids, rows, dim)
                pids, rows = [], []
        if rows:
            yield vector_rows(pids, rows, dim)


def all_rows(store) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pids, int8 matrix, float32 scales) of every stored vector; a row's
    vector is ``matrix[i] * scales[i]``."""
    parts = list(iter_rows(store))
    if not parts:
        return np.empty(0, np.int64), np.empty((0, 0), np.int8), np.empty(0, np.float32)
    return tuple(np.concatenate(x) for x in zip(*parts))  # type: ignore[return-value]
