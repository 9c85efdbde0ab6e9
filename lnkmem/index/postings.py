"""One term's postings in one segment, as the bytes stored under its key.

The only module that knows their layout: the store writes them with :func:`pack`
and reads them with :func:`unpack`; the copy checks them with :func:`count`.
Today: every passage id as u32 LE, then every term frequency as u16 LE.
:func:`pack` takes the pids of one list strictly ascending (a writer that
concatenates lists, as a merge does, sorts them first).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

_WIDTH = 6  # bytes a posting: u32 pid + u16 tf


def pack(pids: np.ndarray, tfs: np.ndarray) -> bytes:
    """The stored form of (pids, tfs); tfs above 65535 are held at 65535."""
    t = np.minimum(np.asarray(tfs, np.int64), 65535) if len(tfs) and int(np.max(tfs)) > 65535 else tfs
    return np.asarray(pids, "<u4").tobytes() + np.asarray(t, "<u2").tobytes()


def pack_many(pids: np.ndarray, tfs: np.ndarray, starts: list[int], ends: list[int]) -> list[bytes]:
    """:func:`pack` of many lists at once (a commit's: one conversion of the
    whole columns, then slices): list i is ``pids[starts[i]:ends[i]]`` with its tfs."""
    pb = np.asarray(pids, "<u4").tobytes()
    tb = np.minimum(np.asarray(tfs, np.int64), 65535).astype("<u2").tobytes()
    return [pb[4 * a:4 * b] + tb[2 * a:2 * b] for a, b in zip(starts, ends)]


def unpack(v) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32, tfs u16) of a stored value (read-only views where it can)."""
    n = len(v) // _WIDTH
    return np.frombuffer(v, "<u4", n), np.frombuffer(v, "<u2", n, 4 * n)


def count(v) -> Optional[int]:
    """How many postings a stored value holds, or None when its length is broken."""
    if len(v) % _WIDTH:
        return None
    return len(v) // _WIDTH
