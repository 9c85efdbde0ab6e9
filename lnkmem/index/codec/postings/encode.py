"""Posting lists packed into their stored form (:mod:`.layout`): :func:`pack` one list,
:func:`pack_many` a commit's lists at once. :func:`pack` takes the distinct pids of one list,
ascending or not (a list that is not, as a merge's concatenation of segments may be, is
sorted first); lists of one block are packed with Python integers (numpy's fixed cost is
more at that size), longer ones with numpy a chunk at a time.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from lnkmem.index.codec.postings.layout import (BLOCK, HEADER, HEADER_BYTES, ROUND, ROUND_L, UNIT, run_bytes, run_units,
                                                varint)


def _bits(values, w: int) -> bytes:
    if not w:
        return b""
    acc = 0
    for i, x in enumerate(values):
        acc |= x << (i * w)
    return acc.to_bytes(run_bytes(len(values), w), "little")


def _bitlen(x: np.ndarray) -> np.ndarray:
    """bit_length of each value (0 <= x < 2**53)."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def pack(pids, tfs) -> bytes:
    """The stored form of (pids, tfs); tfs are held in [1, 65535]."""
    n = len(pids)
    if n == 0:
        return b"\x00"
    if n <= BLOCK:  # one block: Python integers
        p = pids.tolist() if isinstance(pids, np.ndarray) else [int(x) for x in pids]
        t = tfs.tolist() if isinstance(tfs, np.ndarray) else [int(x) for x in tfs]
        if min(t) < 1 or max(t) > 65535:
            t = [min(max(x, 1), 65535) for x in t]
        if any(a >= b for a, b in zip(p, p[1:])):
            order = sorted(range(n), key=p.__getitem__)
            p, t = [p[i] for i in order], [t[i] for i in order]
        return _pack_ints(p, t)
    p, t = np.asarray(pids), np.asarray(tfs)
    if p.dtype.kind not in "iu":
        p = p.astype(np.int64)
    if not (p[1:] > p[:-1]).all():
        order = np.argsort(p, kind="stable")
        p, t = p[order], t[order]
    return _pack_np(p, t)


def _pack_ints(p: list, t: list) -> bytes:
    """The stored form of one block's postings as Python integers: ``p`` ascending and
    distinct, ``t`` in [1, 65535], 1 to BLOCK of them."""
    n = len(p)
    gaps = [b - a - 1 for a, b in zip(p, p[1:])]
    gaps.append(0)
    wp = ROUND_L[max(gaps).bit_length()]
    mt = max(t)
    wt = ROUND_L[(mt - 1).bit_length()]
    return (varint(n) + p[-1].to_bytes(4, "little") + mt.to_bytes(2, "little") + bytes((wp,))
            + _bits(gaps, wp) + _bits([x - 1 for x in t], wt))


# lists packed together at a time by pack_many: its work arrays (a dozen int64 a
# posting) are bounded by this many postings, not by a commit's
WINDOW = 1 << 14


def pack_many(pids: np.ndarray, tfs: np.ndarray, starts, ends) -> Iterator[bytes]:
    """:func:`pack` of many lists at once (a commit's), one by one: list i is
    ``pids[starts[i]:ends[i]]`` with its tfs, its pids ascending and distinct, the
    lists in column order (``ends`` ascending). The lists of a window of the columns
    are packed together with a few dozen numpy calls whatever their number
    (:func:`_pack_lists`: a commit's are many, most of one or two postings); a list
    longer than the window alone, a chunk at a time."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    i, k = 0, len(starts)
    while i < k:
        first = int(starts[i])
        j = max(int(np.searchsorted(ends, first + WINDOW, side="right")), i + 1)
        s, e = starts[i:j], ends[i:j]
        n = e - s
        if j == i + 1 and n[0] > WINDOW:
            yield pack(pids[first:int(e[0])], tfs[first:int(e[0])])
        elif (n > 0).all() and (s[1:] == e[:-1]).all():  # (a commit's: one after another)
            yield from _pack_lists(pids[first:int(e[-1])], tfs[first:int(e[-1])], n)
        else:
            some = n > 0
            sn = n[some]
            if len(sn):
                at = np.repeat(s[some] - np.cumsum(sn) + sn, sn) + np.arange(int(sn.sum()))
                packed = iter(_pack_lists(pids[at], tfs[at], sn))
            for x in some.tolist():
                yield next(packed) if x else b"\x00"
        i = j


def _pack_lists(p: np.ndarray, t: np.ndarray, n: np.ndarray) -> list[bytes]:
    """The stored forms of lists given one after another: list i is the next ``n[i]``
    (> 0) of (p, t), pids ascending and distinct. The same bytes as :func:`pack`
    makes of each: its count, its blocks' headers, their bodies."""
    nb = (n + BLOCK - 1) // BLOCK  # blocks a list
    fb = np.cumsum(nb) - nb  # a list's first block
    m = np.full(int(nb.sum()), BLOCK, np.int64)
    m[fb + nb - 1] = n - BLOCK * (nb - 1)
    hdr, size, body = _pack_blocks(p, t, m)
    vl = 1 + (n >= 1 << 7) + (n >= 1 << 14) + (n >= 1 << 21) + (n >= 1 << 28)  # the count's varint
    lb = np.add.reduceat(size, fb)  # a list's bodies
    total = vl + HEADER_BYTES * nb + lb
    off = np.cumsum(total) - total
    out = np.zeros(int(total.sum()), np.uint8)
    for k in range(int(vl.max())):
        sel = vl > k
        out[off[sel] + k] = ((n[sel] >> (7 * k)) & 0x7F) | np.where(vl[sel] > k + 1, 0x80, 0)
    at = off + vl  # the headers'
    own = np.arange(len(m)) - np.repeat(fb, nb)  # a block's place in its list
    hb = HEADER_BYTES
    out[(np.repeat(at, nb) + hb * own)[:, None] + np.arange(hb)] = hdr.view(np.uint8).reshape(-1, hb)
    at += HEADER_BYTES * nb  # the bodies'
    out[np.repeat(at - (np.cumsum(lb) - lb), lb) + np.arange(len(body))] = body
    b = out.tobytes()
    return [b[o:o + z] for o, z in zip(off.tolist(), total.tolist())]


def _pack_blocks(p: np.ndarray, t: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(headers, body bytes a block, bodies one after another) of blocks given one after
    another: block i is the next ``m[i]`` (1 to BLOCK) of (p, t), pids ascending within
    it. A block's body: its pid gaps, then its tfs less one, each a run."""
    p = np.asarray(p, np.int64)
    t = np.clip(np.asarray(t, np.int64), 1, 65535)
    bs = np.cumsum(m) - m  # a block's first posting
    be = bs + m - 1  # and last
    g = np.zeros(len(p), np.int64)
    g[:-1] = np.diff(p) - 1
    g[be] = 0  # a block's last pid is in its header
    wp = ROUND[_bitlen(np.maximum.reduceat(g, bs))]
    mt = np.maximum.reduceat(t, bs)
    wt = ROUND[_bitlen(mt - 1)]
    gb, gbytes = _pack_runs(g, wp, m, bs)
    tb, tbytes = _pack_runs(t - 1, wt, m, bs)
    size = gb + tb
    at = np.cumsum(size) - size
    body = np.zeros(int(size.sum()), np.uint8)
    for runs, rb in ((gbytes, gb), (tbytes, tb)):
        if len(runs):
            body[np.repeat(at - (np.cumsum(rb) - rb), rb) + np.arange(len(runs))] = runs
        at = at + rb
    hdr = np.empty(len(m), HEADER)
    hdr["last"], hdr["maxtf"], hdr["w"] = p[be], mt, wp
    return hdr, size, body


def _pack_runs(vals: np.ndarray, w: np.ndarray, n: np.ndarray, ls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a run, the runs' bytes one after another) of runs given one after another
    (run i: the ``n[i]`` values of ``vals`` from ``ls[i]``, ``w[i]`` bits each): units of
    64 bits at most (``UNIT[w]`` values), each the sum of its values shifted into
    place (their bits never overlap), its first ``UNIT[w]·w/8`` bytes kept."""
    g = UNIT[w]
    units, ub = run_units(n, w)
    nb = units * ub
    on = w > 0
    if not on.any():
        return nb, np.zeros(0, np.uint8)
    if not on.all():
        keep = np.repeat(on, n)
        vals, n, w, g, units, ub = vals[keep], n[on], w[on], g[on], units[on], ub[on]
        ls = np.cumsum(n) - n
    j = np.arange(len(vals)) - np.repeat(ls, n)  # place in its run
    k = j % np.repeat(g, n)  # place in its unit
    word = np.add.reduceat(vals.astype(np.uint64) << (k * np.repeat(w, n)).astype(np.uint64),
                           np.flatnonzero(k == 0))
    wb = word.astype("<u8").view(np.uint8).reshape(-1, 8)
    return nb, wb[np.arange(8) < np.repeat(ub, units)[:, None]]


# postings packed with numpy at a time (whole blocks): a list's int64 work arrays are
# bounded by this, not by its length (a merge's list of the commonest word at 10x was
# too large to pack at once; docs/BENCHMARKS.md)
PACK_CHUNK = BLOCK * 512


def _pack_np(p: np.ndarray, t: np.ndarray) -> bytes:
    """The stored form of a list of more than one block, pids ascending: its blocks
    are packed a chunk at a time (each block stands alone: its header, then its runs),
    headers and runs joined in block order."""
    n = len(p)
    parts = []
    for a in range(0, n, PACK_CHUNK):
        k = min(n - a, PACK_CHUNK)
        m = np.full((k + BLOCK - 1) // BLOCK, BLOCK, np.int64)
        m[-1] = k - BLOCK * (len(m) - 1)
        hdr, _, body = _pack_blocks(p[a:a + k], t[a:a + k], m)
        parts.append((hdr.tobytes(), body.tobytes()))
    return varint(n) + b"".join(h for h, _ in parts) + b"".join(b for _, b in parts)
