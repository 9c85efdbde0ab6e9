"""Stored posting lists read back: :func:`unpack` a whole list (pids ascending),
:func:`blocks` some of its blocks, :func:`lookup` only the blocks that may hold some pids.
Lists of up to :data:`~.layout.SMALL` postings are read with Python integers (numpy's fixed
cost is more at that size), one block's header so too and its runs with numpy, longer lists
every block at once (:func:`.runs.decode_blocks`).
"""

from __future__ import annotations

import numpy as np

from lnkmem.index.codec.postings.layout import (BLOCK, EMPTY, HEADER_BYTES, ROUND_L, SMALL, layout_of, read_varint,
                                                run_bytes)
from lnkmem.index.codec.postings.runs import J, decode_blocks, words_at


def _one_block(v, n: int, used: int) -> tuple[int, int, int, int, int, int]:
    """(its runs' offset, last pid, gap width, tf width, gap run bytes, tf run bytes)
    of a list of one block of ``n`` postings whose header starts at ``used``;
    ValueError when its lengths are broken."""
    o = used + HEADER_BYTES
    if len(v) < o:
        raise ValueError("a posting list has a broken length")
    last = int.from_bytes(v[used:used + 4], "little")
    mt = int.from_bytes(v[used + 4:used + 6], "little")
    wp = v[used + 6]
    wt = ROUND_L[(mt - 1).bit_length()] if mt >= 1 else 0
    if mt < 1 or wp > 32 or ROUND_L[wp] != wp:
        raise ValueError("a posting list has a broken length")
    gb, tb = run_bytes(n, wp), run_bytes(n, wt)
    if o + gb + tb != len(v):
        raise ValueError("a posting list has a broken length")
    return o, last, wp, wt, gb, tb


def unpack(v) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32, tfs u16) of a stored value, pids ascending; ValueError when its
    lengths are broken."""
    n, used = read_varint(v)
    if n == 0 and len(v) == 1:
        return EMPTY
    if 0 < n <= SMALL:
        o, last, wp, wt, gb, tb = _one_block(v, n, used)
        gi = int.from_bytes(v[o:o + gb], "little")
        ti = int.from_bytes(v[o + gb:o + gb + tb], "little")
        mp, mk = (1 << wp) - 1, (1 << wt) - 1
        p = last
        ps = [p] * n
        for j in range(n - 2, -1, -1):
            p -= ((gi >> (j * wp)) & mp) + 1
            ps[j] = p
        return (np.array(ps, np.int64).astype(np.uint32),
                np.array([((ti >> (j * wt)) & mk) + 1 for j in range(n)], np.uint16))
    if 0 < n <= BLOCK:  # one block: its header read with Python integers, its runs with numpy
        o, last, wp, wt, gb, tb = _one_block(v, n, used)
        win = words_at(v, o)
        j = J[:n]
        if wp:
            bit = j * wp
            d = ((np.take(win, bit >> 3) >> (bit & 7).astype(np.uint64)) & np.uint64((1 << wp) - 1)).astype(np.int64)
            d += 1
            d[-1] = 0
            pids = last - np.cumsum(d[::-1])[::-1]
        else:
            pids = np.arange(last - n + 1, last + 1, dtype=np.int64)
        if wt:
            bit = j * wt + 8 * gb
            tfs = ((np.take(win, bit >> 3) >> (bit & 7).astype(np.uint64)) & np.uint64((1 << wt) - 1)).astype(np.int64)
            tfs = np.minimum(tfs + 1, 65535).astype(np.uint16)
        else:
            tfs = np.ones(n, np.uint16)
        return pids.astype(np.uint32), tfs
    lay = layout_of(v)
    if lay is None:
        raise ValueError("a posting list has a broken length")
    return decode_blocks(v, *lay)


def blocks(v, blk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pids, tfs) of the blocks ``blk`` (ascending, each below the list's block count)
    of a stored value, only those decoded; ValueError when its lengths are broken."""
    lay = layout_of(v)
    if lay is None:
        raise ValueError("a posting list has a broken length")
    if lay[0] == 0 or not len(blk):
        return EMPTY
    return decode_blocks(v, *lay, blk=np.asarray(blk, np.int64))


def lookup(v, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pids, tfs) of the blocks of a stored value that may hold any pid of
    ``want`` (ascending): a block's header gives its last pid, so ``want`` is
    placed among the blocks with one search and only those blocks are decoded.
    A superset of the postings asked for (the caller keeps those it wants);
    ValueError when the value's lengths are broken."""
    n, used = read_varint(v)
    if not len(want):
        return EMPTY
    if n <= BLOCK or len(want) * 8 > n:  # short, or most blocks anyway: all at once
        return unpack(v)
    lay = layout_of(v)
    if lay is None:
        raise ValueError("a posting list has a broken length")
    n, body, hdr, wt, shape = lay
    last = hdr["last"].astype(np.int64)
    blk = np.searchsorted(last, want)  # ascending, as ``want`` is
    blk = blk[np.concatenate(([True], blk[1:] != blk[:-1]))]
    blk = blk[blk < len(last)]
    if not len(blk):
        return EMPTY
    if len(blk) * 2 > len(last):
        return decode_blocks(v, *lay)
    return decode_blocks(v, *lay, blk=blk)
