"""Reading the bit-packed runs of posting lists (:mod:`.layout`): a list decodes as a
(blocks, 128) array in a few dozen numpy calls whatever its widths, never a Python loop per
posting or per block: runs of up to 8 bits (nearly all) one gather of an unaligned 64-bit word
per unit of 8 values, shifted out into 8 rows and transposed; wider ones one gather per
value, a shift and a mask; then a cumulative sum back from each block's last pid. A lookup
gathers only its blocks' words.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from lnkmem.index.codec.postings.layout import BLOCK


def words_at(v, at: int) -> np.ndarray:
    """An unaligned little-endian 64-bit word at every byte of ``v[at:]``, with slack
    enough for a short last block read as a full one."""
    buf = bytes(v[at:]) + bytes(_SLACK)
    return np.ndarray((len(buf) - 7,), "<u8", buf, 0, (1,))


_SLACK = BLOCK * 32 // 8 + 8
MASK = np.array([(1 << w) - 1 for w in range(33)], np.uint64)
J = np.arange(BLOCK, dtype=np.int64)
_UNITS = BLOCK // 8  # units of a full run of width <= 8 (8 values a unit)
_U = np.arange(_UNITS, dtype=np.int64)
_K8 = np.arange(8, dtype=np.uint64)


# value j of a run w bits wide: at byte _BYTE[w, j] of the run, bit _SHIFT[w, j] of that byte
_BYTE = (np.arange(33)[:, None] * J) >> 3
_SHIFT = ((np.arange(33)[:, None] * J) & 7).astype(np.uint64)


def read_runs(win: np.ndarray, first: np.ndarray, w: np.ndarray, kind=np.int64) -> np.ndarray:
    """(blocks, BLOCK) values (of dtype ``kind``): block b's run starts at byte ``first[b]``,
    ``w[b]`` bits a value. Gathers by fancy index, which reads only the words asked for
    (``np.take`` on this strided view copies all of it first: a lookup of a few blocks
    of a long list paid for the whole list, 8 bytes a byte)."""
    nb = len(first)
    w0 = int(w[0]) if nb else 0
    one = bool((w == w0).all())
    if not one:
        wide = w > 8
        if wide.any() and not wide.all():
            # runs of both kinds: each kind its own way (one block of tf 300 or one gap of 300
            # sent every block of a list through the slower gather a value)
            out = np.empty((nb, BLOCK), kind)
            narrow = ~wide
            out[narrow] = read_runs(win, first[narrow], w[narrow], kind)
            out[wide] = read_runs(win, first[wide], w[wide], kind)
            return out
    if (w0 if one else int(w.max())) <= 8:
        # a run of width <= 8 is 16 units of 8 values, each unit w bytes: one 64-bit
        # word gathered a unit (an eighth of the gathers), its 8 values shifted out of
        # it into 8 rows, turned to value order by one transposing copy
        if one:
            word = win[(first[:, None] + _U * w0).ravel()]
            shift, mask = _K8 * np.uint64(w0), MASK[w0]
        else:
            word = win[(first[:, None] + _U * w[:, None]).ravel()]
            wu = np.repeat(w, _UNITS).astype(np.uint64)
            shift, mask = _K8[:, None] * wu, np.repeat(MASK[w], _UNITS)
        rows = np.empty((8, len(word)), np.uint64)
        for k in range(8):
            np.right_shift(word, shift[k], out=rows[k])
        rows &= mask
        return rows.T.astype(kind, order="C").reshape(nb, BLOCK)
    if one:  # one width (most tf runs): its offsets broadcast
        at, shift, mask = first[:, None] + _BYTE[w0], _SHIFT[w0], MASK[w0]
    else:
        at, shift, mask = first[:, None] + _BYTE[w], _SHIFT[w], MASK[w][:, None]
    word = win[at] >> shift
    word &= mask
    return word.astype(kind)


def block_values(win: np.ndarray, m: np.ndarray, first: np.ndarray, go: np.ndarray, gb: np.ndarray,
                 wp: np.ndarray, wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gaps, tfs less one), int64, of blocks of many lists given one after another: block i
    holds ``m[i]`` postings (placed from ``first[i]``), its gap run at byte ``go[i]`` of
    ``win`` (``wp[i]`` bits a value, ``gb[i]`` bytes), its tf run after it (``wt[i]`` bits).
    Whole blocks a 64-bit word a unit of 8 values (:func:`read_runs`); short ones (most of a
    merge's) a word a value, only their values."""
    tot = int(m.sum())
    d = np.empty(tot, np.int64)
    f = np.empty(tot, np.int64)
    full = m == BLOCK
    if full.any():
        fb = np.flatnonzero(full)
        at = (first[fb][:, None] + J).ravel()
        d[at] = read_runs(win, go[fb], wp[fb]).ravel()
        f[at] = read_runs(win, go[fb] + gb[fb], wt[fb]).ravel()
    if not full.all():
        sb = np.flatnonzero(~full)
        ms = m[sb]
        blk = np.repeat(sb, ms)
        j = np.arange(int(ms.sum())) - np.repeat(np.cumsum(ms) - ms, ms)  # place in its block
        at = first[blk] + j
        for out, w, o in ((d, wp, go), (f, wt, go + gb)):
            wv = w[blk]
            bit = j * wv
            out[at] = (win[o[blk] + (bit >> 3)] >> (bit & 7).astype(np.uint64)) & MASK[wv]
    return d, f


def decode_blocks(v, n, body, hdr, wt, shape, full: bool = False, blk: Optional[np.ndarray] = None):
    """Every block at once (or the blocks ``blk``, ascending), as a (blocks, BLOCK)
    array (a short last block read as a full one, its tail dropped): a gather of one
    64-bit window per value."""
    m, go, to, _ = shape
    sel = slice(None) if blk is None else blk
    ends = blk is None or blk[-1] == len(m) - 1  # the list's last block among them
    count = n if blk is None else len(blk) * BLOCK - (BLOCK - int(m[-1]) if ends else 0)
    win = words_at(v, body)
    # full: int64, so that ids past 32 bits show (check); else u32 throughout: a sum that
    # wraps past 2**32 comes back, since every id of a list made by pack is below it
    kind = np.int64 if full else np.uint32
    d = read_runs(win, go[sel], hdr["w"].astype(np.int64)[sel], kind)
    d += 1
    d[:, -1] = 0  # a block's last pid is its header's
    if ends:
        d[-1, m[-1] - 1:] = 0
    # id j of a block: its last id less the gaps from j on, i.e. its first id (the last less
    # all its gaps) plus the gaps before j
    pids = np.cumsum(d, axis=1, dtype=kind)
    pids -= d
    pids += (hdr["last"][sel].astype(kind) - pids[:, -1])[:, None]
    wts = wt[sel]
    narrow = not full and int(wts.max()) < 16  # every tf - 1 below 2**14: u16 holds tf
    tfs = read_runs(win, to[sel], wts, np.uint16 if narrow else kind if full else np.uint32)
    tfs += 1
    if not narrow:
        np.minimum(tfs, 65535, out=tfs)
    pids, tfs = pids.ravel()[:count], tfs.ravel()[:count]
    if full:
        return pids, tfs
    return pids, tfs.astype(np.uint16, copy=False)
