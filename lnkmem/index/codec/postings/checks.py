"""Stored posting lists from outside (a copy's segments, read by ``replica.load``) checked
to be what :func:`.encode.pack` makes before they are used: lengths whole, ids within 32
bits and ascending, each block's last pid and largest tf those of its header. :func:`check`
one list, :func:`check_many` many at once (with their pids, which the load needs),
:func:`stated_counts` the counts they state. Work and memory bounded by the values' bytes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from lnkmem.index.codec.postings.layout import BLOCK, HEADER_BYTES, TF_WIDTH, VALID_WIDTH, layout_of, run_units
from lnkmem.index.codec.postings.runs import block_values, decode_blocks, words_at


def check(v) -> Optional[str]:
    """Why a stored value is not one :func:`pack` makes (ids within 32 bits and
    ascending, each block's last pid and largest tf those of its header), or None.
    Work and memory bounded by len(v)."""
    lay = layout_of(v)
    if lay is None:
        return "a posting list has a broken length"
    n, _, hdr, _, shape = lay
    if n == 0:
        return None
    p, t = decode_blocks(v, *lay, full=True)
    if int(p[0]) < 0 or (len(p) > 1 and not (np.diff(p) > 0).all()):
        return "a posting list's ids do not ascend from 0"
    m = shape[0]
    starts = np.arange(len(m), dtype=np.int64) * BLOCK
    if not (np.maximum.reduceat(t, starts) == hdr["maxtf"]).all():
        return "a posting list's largest tfs disagree with its headers"
    return None


def _counts(values: list, buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(stated counts, bytes of each count, starts, lengths) of stored values joined in
    ``buf``: their varints read all at once; a count that is broken, or over 32 bits, -1."""
    k = len(values)
    lens = np.fromiter(map(len, values), np.int64, k)
    starts = np.cumsum(lens) - lens
    raw = np.frombuffer(buf + bytes(8), np.uint8)
    n = np.zeros(k, np.int64)
    used = np.zeros(k, np.int64)
    for i in range(5):  # varints of at most 5 bytes
        todo = np.flatnonzero(used == 0)
        if not len(todo):
            break
        b = raw[starts[todo] + i].astype(np.int64)
        n[todo] |= (b & 0x7F) << (7 * i)
        used[todo[b < 0x80]] = i + 1
    n[(used == 0) | (used > lens) | (n >= 1 << 32)] = -1
    return n, used, starts, lens


def stated_counts(values: list) -> np.ndarray:
    """:func:`stated_count` of each stored value, read all at once: -1 where the count is
    broken or leaves no room for its blocks' headers."""
    if not values:
        return np.empty(0, np.int64)
    n, used, _, lens = _counts(values, b"".join(values))
    n[(n > 0) & (lens < used + (n + BLOCK - 1) // BLOCK * HEADER_BYTES)] = -1
    return n


def check_many(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32 of every list one after another, each list's count) of stored values
    that are each one :func:`pack` makes -- what :func:`check` asks of one, asked of
    all of them at once in a few dozen numpy calls (a copy's segment holds many
    lists: one call each cost a cold load more than reading the data). ValueError
    naming what is wrong otherwise. Work and memory bounded by the values' claimed
    postings, each list's bounded by its bytes (at most 128 postings a 7-byte header)."""
    k = len(values)
    if not k:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    buf = b"".join(values)
    n, used, starts, lens = _counts(values, buf)
    ends = starts + lens
    raw = np.frombuffer(buf + bytes(8), np.uint8)
    if (n < 0).any():
        raise ValueError("a posting list has a broken length")
    nb = (n + BLOCK - 1) // BLOCK
    body0 = starts + used + nb * HEADER_BYTES
    if (body0 > ends).any():
        raise ValueError("a posting list has a broken length")
    empty = n == 0
    if empty.any():
        if (lens[empty] != used[empty]).any():
            raise ValueError("a posting list has a broken length")
    total_b = int(nb.sum())
    if not total_b:
        return np.empty(0, np.uint32), n
    lst = np.repeat(np.arange(k), nb)  # the list of each block
    bfirst = np.cumsum(nb) - nb  # each list's first block
    bi = np.arange(total_b) - bfirst[lst]  # place of a block in its list
    hp = (starts + used)[lst] + HEADER_BYTES * bi  # its header
    last = (raw[hp].astype(np.int64) | raw[hp + 1].astype(np.int64) << 8
            | raw[hp + 2].astype(np.int64) << 16 | raw[hp + 3].astype(np.int64) << 24)
    maxtf = raw[hp + 4].astype(np.int64) | raw[hp + 5].astype(np.int64) << 8
    wp = raw[hp + 6].astype(np.int64)
    wt = TF_WIDTH[maxtf]
    if not VALID_WIDTH[wp].all() or wt.min() < 0:
        raise ValueError("a posting list has a broken length")
    m = np.full(total_b, BLOCK, np.int64)
    lastb = bfirst + nb - 1
    lastb = lastb[nb > 0]
    m[lastb] = n[nb > 0] - BLOCK * (nb[nb > 0] - 1)
    gb, tb = np.multiply(*run_units(m, wp)), np.multiply(*run_units(m, wt))
    size = gb + tb
    cs = np.cumsum(size)
    within = cs - size - (cs - size)[bfirst[lst]]  # a block's body from its list's body
    go = body0[lst] + within
    if not (body0[nb > 0] + (cs[lastb] - (cs - size)[bfirst[nb > 0]]) == ends[nb > 0]).all():
        raise ValueError("a posting list has a broken length")
    win = words_at(buf, 0)
    first = np.cumsum(m) - m
    d, f = block_values(win, m, first, go, gb, wp, wt)
    d += 1
    bl = first + m - 1
    d[bl] = 0
    c = np.cumsum(d)
    pids = c - d
    pids -= np.repeat(c[bl] - last, m)
    # ids ascend from 0 within each list: each block's first above the block before it
    # (within a block they ascend by construction), each list's first at least 0
    lfirst = first[bfirst[nb > 0]]
    if int(pids[lfirst].min()) < 0:
        raise ValueError("a posting list's ids do not ascend from 0")
    inner = bi[1:] > 0  # blocks that follow another of their list
    if inner.any() and not (pids[first[1:][inner]] > last[:-1][inner]).all():
        raise ValueError("a posting list's ids do not ascend from 0")
    f += 1
    if not (np.maximum.reduceat(f, first) == maxtf).all():
        raise ValueError("a posting list's largest tfs disagree with its headers")
    return pids.astype(np.uint32), n
