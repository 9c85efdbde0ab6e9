"""One term's postings in one segment, as the bytes stored under its key.

The only module that knows their layout: the store writes them with :func:`pack`
and reads them with :func:`unpack`; the copy checks them with :func:`count` and
:func:`check`; :func:`max_tf` reads a list's largest tf from its headers alone
(with the shortest passage, an upper bound of the list's BM25 scores); a merge
joins terms' lists of several segments with :func:`join_many`.
:func:`pack` takes the distinct pids of one list, ascending or not (a list that
is not, as a merge's concatenation of segments may be, is sorted first), and
:func:`unpack` gives them ascending.

Layout (little-endian), n postings in blocks of :data:`BLOCK` (the last may be
shorter):

- n, a varint (LEB128); an empty list is that one byte;
- one 7-byte header per block: its last pid (u32), its largest tf (u16), the bit
  width of its pid gaps (u8);
- then each block's body: its pid gaps, ``p[i+1] - p[i] - 1`` for each but its
  last posting (whose pid is the header's) and 0 for that one, then its tfs less
  one (as wide as the header's largest tf less one needs): each a bit-packed
  run, LSB first. So a list of one posting is its count and header alone when
  its tf is 1.

Widths are 0-8, 10, 12, 14, 16, 20, 24, 28 or 32 bits (a width is rounded up to
the next of these), so that a run is made of whole *units* of at most 64 bits: 8
values of up to 8 bits, 4 of 10-16, 2 of 20-32 (a run is padded with zeros to a
whole unit; a full block's run of width w is 16·w bytes). A list decodes as a
(blocks, 128) array in a few dozen numpy calls whatever its widths, never a
Python loop per posting or per block: runs of up to 8 bits (nearly all) one
gather of an unaligned 64-bit word per unit of 8 values, shifted out into 8 rows
and transposed; wider ones one gather per value, a shift and a mask; then a
cumulative sum back from each block's last pid. A lookup gathers only its blocks'
words. Lists of up to :data:`SMALL` postings are read, and
lists of one block packed, with Python integers (numpy's fixed cost is more at
that size). tfs are held in [1, 65535]. :class:`Decoded` keeps decoded lists for
searches (a segment's lists never change).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterator, Optional

import numpy as np

BLOCK = 128
SMALL = 12  # lists this short are read with Python integers (numpy's fixed cost is more)
_HDR = np.dtype([("last", "<u4"), ("maxtf", "<u2"), ("w", "u1")])
_HS = _HDR.itemsize  # 7
_EMPTY = (np.empty(0, np.uint32), np.empty(0, np.uint16))
# bit width needed -> width used; width used -> values a unit
_ROUND = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 10, 12, 12, 14, 14, 16, 16,
                   20, 20, 20, 20, 24, 24, 24, 24, 28, 28, 28, 28, 32, 32, 32, 32], np.int64)
_ROUND_L = _ROUND.tolist()
_UNIT = np.zeros(33, np.int64)
_UNIT[1:9], _UNIT[9:17], _UNIT[17:] = 8, 4, 2
_UNIT[[9, 11, 13, 15, 17, 18, 19, 21, 22, 23, 25, 26, 27, 29, 30, 31]] = 0  # widths never used
_UNIT_L = _UNIT.tolist()
_VALID = np.zeros(256, bool)  # a width byte that names a width used
_VALID[sorted(set(_ROUND_L))] = True  # (not np.unique: it imports numpy.ma, ~15-40 ms at start)
_WT = np.concatenate(([-1], _ROUND[np.frexp(np.arange(65535, dtype=np.float64))[1]]))  # largest tf -> tf width


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(v) -> tuple[int, int]:
    """(value, bytes used); (-1, 0) when broken or longer than 5 bytes."""
    n = shift = 0
    for i in range(min(len(v), 5)):
        b = v[i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i + 1
        shift += 7
    return -1, 0


def _run_bytes(n: int, w: int) -> int:
    """Bytes of a run of n values w bits wide (whole units)."""
    g = _UNIT_L[w]
    return (n + g - 1) // g * (g * w >> 3) if w else 0


def _bits(values, w: int) -> bytes:
    if not w:
        return b""
    acc = 0
    for i, x in enumerate(values):
        acc |= x << (i * w)
    return acc.to_bytes(_run_bytes(len(values), w), "little")


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
    wp = _ROUND_L[max(gaps).bit_length()]
    mt = max(t)
    wt = _ROUND_L[(mt - 1).bit_length()]
    return (_varint(n) + p[-1].to_bytes(4, "little") + mt.to_bytes(2, "little") + bytes((wp,))
            + _bits(gaps, wp) + _bits([x - 1 for x in t], wt))


# lists packed together at a time by pack_many: its work arrays (a dozen int64 a
# posting) are bounded by this many postings, not by a commit's
_WINDOW = 1 << 14


def pack_many(pids: np.ndarray, tfs: np.ndarray, starts, ends) -> Iterator[bytes]:
    """:func:`pack` of many lists at once (a commit's), one by one: list i is
    ``pids[starts[i]:ends[i]]`` with its tfs, its pids ascending and distinct, the
    lists in column order (``ends`` ascending). The lists of a window of the columns
    are packed together with a few dozen numpy calls whatever their number
    (:func:`_pack_lists`: a commit's are ~50,000, most of one or two postings); a list
    longer than the window alone, a chunk at a time."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    i, k = 0, len(starts)
    while i < k:
        first = int(starts[i])
        j = max(int(np.searchsorted(ends, first + _WINDOW, side="right")), i + 1)
        s, e = starts[i:j], ends[i:j]
        n = e - s
        if j == i + 1 and n[0] > _WINDOW:
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
    total = vl + _HS * nb + lb
    off = np.cumsum(total) - total
    out = np.zeros(int(total.sum()), np.uint8)
    for k in range(int(vl.max())):
        sel = vl > k
        out[off[sel] + k] = ((n[sel] >> (7 * k)) & 0x7F) | np.where(vl[sel] > k + 1, 0x80, 0)
    at = off + vl  # the headers'
    own = np.arange(len(m)) - np.repeat(fb, nb)  # a block's place in its list
    out[(np.repeat(at, nb) + _HS * own)[:, None] + np.arange(_HS)] = hdr.view(np.uint8).reshape(-1, _HS)
    at += _HS * nb  # the bodies'
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
    wp = _ROUND[_bitlen(np.maximum.reduceat(g, bs))]
    mt = np.maximum.reduceat(t, bs)
    wt = _ROUND[_bitlen(mt - 1)]
    gb, gbytes = _pack_runs(g, wp, m, bs)
    tb, tbytes = _pack_runs(t - 1, wt, m, bs)
    size = gb + tb
    at = np.cumsum(size) - size
    body = np.zeros(int(size.sum()), np.uint8)
    for runs, rb in ((gbytes, gb), (tbytes, tb)):
        if len(runs):
            body[np.repeat(at - (np.cumsum(rb) - rb), rb) + np.arange(len(runs))] = runs
        at = at + rb
    hdr = np.empty(len(m), _HDR)
    hdr["last"], hdr["maxtf"], hdr["w"] = p[be], mt, wp
    return hdr, size, body


def _units(n: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(units, bytes a unit) of runs of ``n`` values ``w`` bits wide (none for width 0):
    :func:`_run_bytes` of many runs is their product."""
    g = _UNIT[w]
    return np.where(w > 0, (n + g - 1) // np.maximum(g, 1), 0), g * w >> 3


def _pack_runs(vals: np.ndarray, w: np.ndarray, n: np.ndarray, ls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a run, the runs' bytes one after another) of runs given one after another
    (run i: the ``n[i]`` values of ``vals`` from ``ls[i]``, ``w[i]`` bits each): units of
    64 bits at most (``_UNIT[w]`` values), each the sum of its values shifted into
    place (their bits never overlap), its first ``_UNIT[w]·w/8`` bytes kept."""
    g = _UNIT[w]
    units, ub = _units(n, w)
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


def _shape(n: int, wp: np.ndarray, wt: np.ndarray):
    """(postings a block, gap run offsets, tf run offsets, body size), offsets from
    the body's start. A full block's run of width w is 16·w bytes (128 values)."""
    nb = len(wp)
    m = np.full(nb, BLOCK, np.int64)
    k = n - BLOCK * (nb - 1)
    m[-1] = k
    gb, tb = wp * (BLOCK // 8), wt * (BLOCK // 8)
    if k < BLOCK:
        gb[-1], tb[-1] = _run_bytes(k, int(wp[-1])), _run_bytes(k, int(wt[-1]))
    size = gb + tb
    ends = np.cumsum(size)
    go = ends - size
    return m, go, go + gb, int(ends[-1])


# postings packed with numpy at a time (whole blocks): a list's int64 work arrays are
# bounded by this, not by its length (a merge's list of the commonest word at 1.27M
# passages took ~60 MiB packed at once)
_PACK_CHUNK = BLOCK * 512


def _pack_np(p: np.ndarray, t: np.ndarray) -> bytes:
    """The stored form of a list of more than one block, pids ascending: its blocks
    are packed a chunk at a time (each block stands alone: its header, then its runs),
    headers and runs joined in block order."""
    n = len(p)
    parts = []
    for a in range(0, n, _PACK_CHUNK):
        k = min(n - a, _PACK_CHUNK)
        m = np.full((k + BLOCK - 1) // BLOCK, BLOCK, np.int64)
        m[-1] = k - BLOCK * (len(m) - 1)
        hdr, _, body = _pack_blocks(p[a:a + k], t[a:a + k], m)
        parts.append((hdr.tobytes(), body.tobytes()))
    return _varint(n) + b"".join(h for h, _ in parts) + b"".join(b for _, b in parts)


def _layout(v):
    """(n, body offset, headers, tf widths, shape) of a stored value, or None when
    its lengths are broken. Work bounded by len(v)."""
    n, used = _read_varint(v)
    if n < 0:
        return None
    if n == 0:
        return (0, used, None, None, None) if len(v) == used else None
    nb = (n + BLOCK - 1) // BLOCK
    if used + nb * _HS > len(v):
        return None
    hdr = np.frombuffer(v, _HDR, nb, used)
    wp = hdr["w"].astype(np.int64)
    wt = _WT[hdr["maxtf"]]  # -1 for a largest tf of 0
    if not _VALID[wp].all() or wt.min() < 0:
        return None
    shape = _shape(n, wp, wt)
    body = used + nb * _HS
    if body + shape[3] != len(v):
        return None
    return n, body, hdr, wt, shape


def count(v) -> Optional[int]:
    """How many postings a stored value holds, or None when its lengths are broken."""
    lay = _layout(v)
    return None if lay is None else lay[0]


def max_tf(v) -> int:
    """The largest tf of a stored value (0 when empty), from its headers alone."""
    n, used = _read_varint(v)
    if n <= 0:
        return 0
    nb = (n + BLOCK - 1) // BLOCK
    if nb == 1:
        return int.from_bytes(v[used + 4:used + 6], "little")
    return int(np.frombuffer(v, _HDR, nb, used)["maxtf"].max())


def _window(v, at: int) -> np.ndarray:
    """An unaligned little-endian 64-bit word at every byte of ``v[at:]``, with slack
    enough for a short last block read as a full one."""
    buf = bytes(v[at:]) + bytes(_SLACK)
    return np.ndarray((len(buf) - 7,), "<u8", buf, 0, (1,))


_SLACK = BLOCK * 32 // 8 + 8
_MASK = np.array([(1 << w) - 1 for w in range(33)], np.uint64)
_J = np.arange(BLOCK, dtype=np.int64)
_UNITS = BLOCK // 8  # units of a full run of width <= 8 (8 values a unit)
_U = np.arange(_UNITS, dtype=np.int64)
_K8 = np.arange(8, dtype=np.uint64)


# value j of a run w bits wide: at byte _BYTE[w, j] of the run, bit _SHIFT[w, j] of that byte
_BYTE = (np.arange(33)[:, None] * _J) >> 3
_SHIFT = ((np.arange(33)[:, None] * _J) & 7).astype(np.uint64)


def _runs(win: np.ndarray, first: np.ndarray, w: np.ndarray, kind=np.int64) -> np.ndarray:
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
            # sent every block of a list through the gather a value, ~4x slower)
            out = np.empty((nb, BLOCK), kind)
            narrow = ~wide
            out[narrow] = _runs(win, first[narrow], w[narrow], kind)
            out[wide] = _runs(win, first[wide], w[wide], kind)
            return out
    if (w0 if one else int(w.max())) <= 8:
        # a run of width <= 8 is 16 units of 8 values, each unit w bytes: one 64-bit
        # word gathered a unit (an eighth of the gathers), its 8 values shifted out of
        # it into 8 rows, turned to value order by one transposing copy
        if one:
            word = win[(first[:, None] + _U * w0).ravel()]
            shift, mask = _K8 * np.uint64(w0), _MASK[w0]
        else:
            word = win[(first[:, None] + _U * w[:, None]).ravel()]
            wu = np.repeat(w, _UNITS).astype(np.uint64)
            shift, mask = _K8[:, None] * wu, np.repeat(_MASK[w], _UNITS)
        rows = np.empty((8, len(word)), np.uint64)
        for k in range(8):
            np.right_shift(word, shift[k], out=rows[k])
        rows &= mask
        return rows.T.astype(kind, order="C").reshape(nb, BLOCK)
    if one:  # one width (most tf runs): its offsets broadcast
        at, shift, mask = first[:, None] + _BYTE[w0], _SHIFT[w0], _MASK[w0]
    else:
        at, shift, mask = first[:, None] + _BYTE[w], _SHIFT[w], _MASK[w][:, None]
    word = win[at] >> shift
    word &= mask
    return word.astype(kind)


def _one_block(v, n: int, used: int) -> tuple[int, int, int, int, int, int]:
    """(its runs' offset, last pid, gap width, tf width, gap run bytes, tf run bytes)
    of a list of one block of ``n`` postings whose header starts at ``used``;
    ValueError when its lengths are broken."""
    o = used + _HS
    if len(v) < o:
        raise ValueError("a posting list has a broken length")
    last = int.from_bytes(v[used:used + 4], "little")
    mt = int.from_bytes(v[used + 4:used + 6], "little")
    wp = v[used + 6]
    wt = _ROUND_L[(mt - 1).bit_length()] if mt >= 1 else 0
    if mt < 1 or wp > 32 or _ROUND_L[wp] != wp:
        raise ValueError("a posting list has a broken length")
    gb, tb = _run_bytes(n, wp), _run_bytes(n, wt)
    if o + gb + tb != len(v):
        raise ValueError("a posting list has a broken length")
    return o, last, wp, wt, gb, tb


def unpack(v) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32, tfs u16) of a stored value, pids ascending; ValueError when its
    lengths are broken."""
    n, used = _read_varint(v)
    if n == 0 and len(v) == 1:
        return _EMPTY
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
        win = _window(v, o)
        j = _J[:n]
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
    lay = _layout(v)
    if lay is None:
        raise ValueError("a posting list has a broken length")
    return _decode(v, *lay)


def blocks(v, blk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pids, tfs) of the blocks ``blk`` (ascending, each below the list's block count)
    of a stored value, only those decoded; ValueError when its lengths are broken."""
    lay = _layout(v)
    if lay is None:
        raise ValueError("a posting list has a broken length")
    if lay[0] == 0 or not len(blk):
        return _EMPTY
    return _decode(v, *lay, blk=np.asarray(blk, np.int64))


def join_many(groups: list, dead: Optional[np.ndarray] = None) -> list:
    """For each group of stored lists (a merge's lists of one term in several segments,
    each list's pids apart from every other's of its group), the stored form of their
    postings together less the pids the mask ``dead`` (by pid; None: none) marks, or
    None when none is left. ValueError when a list's lengths are broken. Every block of
    every list is decoded at once (:func:`_blocks`; a block stands alone) and the groups
    packed at once (:func:`_pack_lists`): a few dozen numpy calls whatever the number of
    groups and lists (a merge's are mostly of one or two postings)."""
    flat = []  # (count, count's bytes, value) of each list not empty, a group's by last pid
    counts = []  # postings a group, for the groups not empty
    some = []  # which groups those are
    for gi, parts in enumerate(groups):
        heads = []
        total = 0
        for v in parts:
            n = v[0] if len(v) else 0x80
            used = 1
            if n >= 0x80:
                n, used = _read_varint(v)
            if n <= 0:
                if n == 0 and len(v) == used:
                    continue
                raise ValueError("a posting list has a broken length")
            at = used + (n - 1) // BLOCK * _HS  # the last block's header
            if len(v) < at + _HS:
                raise ValueError("a posting list has a broken length")
            heads.append((int.from_bytes(v[at:at + 4], "little"), n, used, v))
            total += n
        if heads:
            heads.sort()  # by last pid (no two alike): by first pid too, unless they interleave
            flat += [h[1:] for h in heads]
            counts.append(total)
            some.append(gi)
    out: list = [None] * len(groups)
    if not flat:
        return out
    ps, ts = [], []  # decoded a window of postings at a time (work arrays ~40 B a posting)
    i = 0
    while i < len(flat):
        j, k = i, 0
        while j < len(flat) and (k + flat[j][0] <= _WINDOW or j == i):
            k += flat[j][0]
            j += 1
        a, b = _blocks(flat[i:j])
        ps.append(a)
        ts.append(b)
        i = j
    p, t = (ps[0], ts[0]) if len(ps) == 1 else (np.concatenate(ps), np.concatenate(ts))
    del ps, ts
    n = np.array(counts, np.int64)
    gs = np.cumsum(n) - n  # a group's first posting
    up = p[1:] > p[:-1]
    up[gs[1:] - 1] = True  # (from one group to the next)
    if not up.all():  # some group's ids interleave: each group sorted by pid
        order = np.lexsort((p, np.repeat(np.arange(len(n)), n)))
        p, t = p[order], t[order]
    if dead is not None:
        inside = p < len(dead)
        drop = np.zeros(len(p), bool)
        drop[inside] = dead[p[inside]]
        if drop.any():
            keep = ~drop
            n = np.add.reduceat(keep.astype(np.int64), gs)
            p, t = p[keep], t[keep]
            some = [g for g, k in zip(some, (n > 0).tolist()) if k]
            n = n[n > 0]
            if not len(n):
                return out
    gs = np.cumsum(n) - n
    for g, v in zip(some, pack_many(p, t, gs, gs + n)):
        out[g] = v
    return out


def _blocks(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32, tfs u16) of stored values (each given as (count, count's bytes, value),
    none empty), one after another: every block of all of them decoded at once from their
    bodies joined (a block stands alone: its header's last pid, then its runs), so the
    numpy calls are a few dozen whatever the number of values. ValueError when one's
    lengths are broken."""
    hs, bodies, ns = [], [], []
    for n, used, v in parts:
        b = used + (n + BLOCK - 1) // BLOCK * _HS
        hs.append(v[used:b])
        bodies.append(v[b:])
        ns.append(n)
    hdr = np.frombuffer(b"".join(hs), _HDR)
    ns = np.array(ns, np.int64)
    nbs = (ns + BLOCK - 1) // BLOCK
    wp = hdr["w"].astype(np.int64)
    wt = _WT[hdr["maxtf"]]  # -1 for a largest tf of 0
    if not _VALID[wp].all() or wt.min() < 0:
        raise ValueError("a posting list has a broken length")
    m = np.full(len(hdr), BLOCK, np.int64)  # postings a block: the last of each value's short
    m[np.cumsum(nbs) - 1] = ns - BLOCK * (nbs - 1)
    gb, tb = np.multiply(*_units(m, wp)), np.multiply(*_units(m, wt))
    size = gb + tb
    ends = np.cumsum(size)
    lens = np.fromiter(map(len, bodies), np.int64, len(bodies))
    if not (ends[np.cumsum(nbs) - 1] == np.cumsum(lens)).all():
        raise ValueError("a posting list has a broken length")
    go = ends - size
    win = _window(b"".join(bodies), 0)
    total = int(ns.sum())
    first = np.cumsum(m) - m  # a block's first posting
    d = np.empty(total, np.int64)  # gaps, then gaps + 1 (0 at a block's last)
    f = np.empty(total, np.int64)  # tfs less one
    full = m == BLOCK
    if full.any():  # whole blocks: a 64-bit word a unit of 8 values (_runs)
        fb = np.flatnonzero(full)
        at = (first[fb][:, None] + _J).ravel()
        d[at] = _runs(win, go[fb], wp[fb]).ravel()
        f[at] = _runs(win, go[fb] + gb[fb], wt[fb]).ravel()
    if not full.all():  # short ones (most of a merge's): a word a value, only their values
        sb = np.flatnonzero(~full)
        ms = m[sb]
        blk = np.repeat(sb, ms)
        j = np.arange(int(ms.sum())) - np.repeat(np.cumsum(ms) - ms, ms)  # place in its block
        at = first[blk] + j
        for out, w, o in ((d, wp, go), (f, wt, go + gb)):
            wv = w[blk]
            bit = j * wv
            out[at] = (win[o[blk] + (bit >> 3)] >> (bit & 7).astype(np.uint64)) & _MASK[wv]
    d += 1
    last = first + m - 1
    d[last] = 0  # a block's last pid is its header's
    # id j of a block: its last id less (gaps + 1) from j on, i.e. with c the running sum
    # of d, c[j] - d[j] - (c[its last] - its last id)
    c = np.cumsum(d)
    pids = c - d
    pids -= np.repeat(c[last] - hdr["last"].astype(np.int64), m)
    f += 1
    np.minimum(f, 65535, out=f)
    return pids.astype(np.uint32), f.astype(np.uint16)


def _decode(v, n, body, hdr, wt, shape, full: bool = False, blk: Optional[np.ndarray] = None):
    """Every block at once (or the blocks ``blk``, ascending), as a (blocks, BLOCK)
    array (a short last block read as a full one, its tail dropped): a gather of one
    64-bit window per value."""
    m, go, to, _ = shape
    sel = slice(None) if blk is None else blk
    ends = blk is None or blk[-1] == len(m) - 1  # the list's last block among them
    count = n if blk is None else len(blk) * BLOCK - (BLOCK - int(m[-1]) if ends else 0)
    win = _window(v, body)
    # full: int64, so that ids past 32 bits show (check); else u32 throughout: a sum that
    # wraps past 2**32 comes back, since every id of a list made by pack is below it
    kind = np.int64 if full else np.uint32
    d = _runs(win, go[sel], hdr["w"].astype(np.int64)[sel], kind)
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
    tfs = _runs(win, to[sel], wts, np.uint16 if narrow else kind if full else np.uint32)
    tfs += 1
    if not narrow:
        np.minimum(tfs, 65535, out=tfs)
    pids, tfs = pids.ravel()[:count], tfs.ravel()[:count]
    if full:
        return pids, tfs
    return pids, tfs.astype(np.uint16, copy=False)


def _stated(v) -> tuple[int, int]:
    """(postings its count states, bytes of the count) of a stored value; -1 postings when
    the count is broken or leaves no room for its blocks' headers."""
    n, used = _read_varint(v)
    if n > 0 and len(v) < used + (n + BLOCK - 1) // BLOCK * _HS:
        return -1, used
    return n, used


def stated_count(v) -> int:
    """The postings a stored value's count states (:func:`count` checks its lengths too):
    -1 when the count is broken or leaves no room for its blocks' headers."""
    return _stated(v)[0]


def head(v) -> tuple[int, int]:
    """(postings, largest tf) of a stored value, from its count and headers alone;
    (-1, 0) when its count is broken."""
    n, used = _stated(v)
    if n <= 0:
        return n, 0
    nb = (n + BLOCK - 1) // BLOCK
    if nb == 1:
        return n, int.from_bytes(v[used + 4:used + 6], "little")
    return n, int(np.frombuffer(v, _HDR, nb, used)["maxtf"].max())


def block_tf(v, want: np.ndarray) -> np.ndarray:
    """For each pid of ``want`` (ascending), the largest tf of the block of a stored value
    that may hold it (0 past its last pid): a bound on its tf from the headers alone
    (block-max, for pruning). ValueError when the value's lengths are broken."""
    out = np.zeros(len(want), np.int64)
    n, used = _read_varint(v)
    if n <= 0 or not len(want):
        return out
    nb = (n + BLOCK - 1) // BLOCK
    if len(v) < used + nb * _HS:
        raise ValueError("a posting list has a broken length")
    hdr = np.frombuffer(v, _HDR, nb, used)
    blk = np.searchsorted(hdr["last"], want)
    inside = blk < nb
    out[inside] = hdr["maxtf"][blk[inside]]
    return out


def lookup(v, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pids, tfs) of the blocks of a stored value that may hold any pid of
    ``want`` (ascending): a block's header gives its last pid, so ``want`` is
    placed among the blocks with one search and only those blocks are decoded.
    A superset of the postings asked for (the caller keeps those it wants);
    ValueError when the value's lengths are broken."""
    n, used = _read_varint(v)
    if not len(want):
        return _EMPTY
    if n <= BLOCK or len(want) * 8 > n:  # short, or most blocks anyway: all at once
        return unpack(v)
    lay = _layout(v)
    if lay is None:
        raise ValueError("a posting list has a broken length")
    n, body, hdr, wt, shape = lay
    last = hdr["last"].astype(np.int64)
    blk = np.searchsorted(last, want)  # ascending, as ``want`` is
    blk = blk[np.concatenate(([True], blk[1:] != blk[:-1]))]
    blk = blk[blk < len(last)]
    if not len(blk):
        return _EMPTY
    if len(blk) * 2 > len(last):
        return _decode(v, *lay)
    return _decode(v, *lay, blk=blk)


def check(v) -> Optional[str]:
    """Why a stored value is not one :func:`pack` makes (ids within 32 bits and
    ascending, each block's last pid and largest tf those of its header), or None.
    Work and memory bounded by len(v)."""
    lay = _layout(v)
    if lay is None:
        return "a posting list has a broken length"
    n, _, hdr, _, shape = lay
    if n == 0:
        return None
    p, t = _decode(v, *lay, full=True)
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
    n[(n > 0) & (lens < used + (n + BLOCK - 1) // BLOCK * _HS)] = -1
    return n


def check_many(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32 of every list one after another, each list's count) of stored values
    that are each one :func:`pack` makes -- what :func:`check` asks of one, asked of
    all of them at once in a few dozen numpy calls (a copy's segment holds ~10^5
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
    body0 = starts + used + nb * _HS
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
    hp = (starts + used)[lst] + _HS * bi  # its header
    last = (raw[hp].astype(np.int64) | raw[hp + 1].astype(np.int64) << 8
            | raw[hp + 2].astype(np.int64) << 16 | raw[hp + 3].astype(np.int64) << 24)
    maxtf = raw[hp + 4].astype(np.int64) | raw[hp + 5].astype(np.int64) << 8
    wp = raw[hp + 6].astype(np.int64)
    wt = _WT[maxtf]
    if not _VALID[wp].all() or wt.min() < 0:
        raise ValueError("a posting list has a broken length")
    m = np.full(total_b, BLOCK, np.int64)
    lastb = bfirst + nb - 1
    lastb = lastb[nb > 0]
    m[lastb] = n[nb > 0] - BLOCK * (nb[nb > 0] - 1)
    gb, tb = np.multiply(*_units(m, wp)), np.multiply(*_units(m, wt))
    size = gb + tb
    cs = np.cumsum(size)
    within = cs - size - (cs - size)[bfirst[lst]]  # a block's body from its list's body
    go = body0[lst] + within
    if not (body0[nb > 0] + (cs[lastb] - (cs - size)[bfirst[nb > 0]]) == ends[nb > 0]).all():
        raise ValueError("a posting list has a broken length")
    win = _window(buf, 0)
    tot = int(m.sum())
    first = np.cumsum(m) - m
    d = np.empty(tot, np.int64)
    f = np.empty(tot, np.int64)
    full = m == BLOCK
    if full.any():
        fb = np.flatnonzero(full)
        at = (first[fb][:, None] + _J).ravel()
        d[at] = _runs(win, go[fb], wp[fb]).ravel()
        f[at] = _runs(win, go[fb] + gb[fb], wt[fb]).ravel()
    if not full.all():
        sb = np.flatnonzero(~full)
        ms = m[sb]
        blk = np.repeat(sb, ms)
        j = np.arange(int(ms.sum())) - np.repeat(np.cumsum(ms) - ms, ms)
        at = first[blk] + j
        for out, w, o in ((d, wp, go), (f, wt, go + gb)):
            wv = w[blk]
            bit = j * wv
            out[at] = ((win[o[blk] + (bit >> 3)] >> (bit & 7).astype(np.uint64)) & _MASK[wv]).astype(np.int64)
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


class Decoded:
    """Lists decoded, kept within :data:`CACHE_BYTES` (arrays plus :data:`ENTRY` a
    list): a segment's lists never change (a merge writes a new segment under a new
    key), so a term searched again is not decoded again. Its arrays are read-only.

    Which lists stay: while there is room, every one; once full, a list is let in
    only if it was asked for more often lately than each list it would push out,
    the least recently used first (frequency-gated admission, as TinyLFU: counts of
    every key asked for, halved every :data:`AGE_EVERY` lookups so that old habits
    fade). Plain LRU kept nothing when searches cycle through more lists than it
    holds (bench_scale's 200 queries at 4x ask for 20 MiB: every pass decoded
    every list again), and one search of common words flushed the lists that
    every other search uses."""

    # (16 MiB held bench_scale's 200 queries at 1x but not at 4x: a pass decoded most long
    # lists again, p50 0.94-0.96 ms against 0.67-0.72 at 32 MiB; an index's cache never
    # holds more than its lists, so a small agent's stays small)
    CACHE_BYTES = 32 << 20
    ENTRY = 256  # bytes of a cached list beside its arrays (key, tuple, array headers)
    AGE_EVERY = 4096  # lookups between two halvings of every count

    def __init__(self, budget: Optional[int] = None):
        if budget is not None:
            self.CACHE_BYTES = budget
        self.lists: OrderedDict = OrderedDict()
        self.size = 0
        self.asked: dict[bytes, int] = {}  # lookups of each key lately (bounded by the halvings)
        self.maxtf: dict[bytes, int] = {}  # of kept lists, their largest tf once asked (:meth:`max_tf`)
        self._lookups = 0
        self.lock = threading.Lock()

    def _bytes(self, pair) -> int:
        return pair[0].nbytes + pair[1].nbytes + self.ENTRY

    def get(self, key: bytes):
        with self.lock:
            self.asked[key] = self.asked.get(key, 0) + 1
            self._lookups += 1
            if self._lookups >= self.AGE_EVERY:
                self._lookups = 0
                self.asked = {k: c >> 1 for k, c in self.asked.items() if c > 1}
            got = self.lists.get(key)
            if got is not None:
                self.lists.move_to_end(key)
            return got

    def of(self, key: bytes, v) -> tuple[np.ndarray, np.ndarray]:
        """The list under ``key`` as kept, else its stored value ``v`` decoded now (and let in
        if it may: :meth:`put`)."""
        got = self.get(key)
        return got if got is not None else self.put(key, unpack(v))

    def max_tf(self, key: bytes, pair: tuple[np.ndarray, np.ndarray]) -> int:
        """The largest tf of ``pair`` (the list under ``key``), kept while the list is: a
        search's bound reads it for every long list of its words (~5 us a list of 10k)."""
        m = self.maxtf.get(key)
        if m is None:
            m = int(pair[1].max()) if len(pair[1]) else 0
            with self.lock:
                if self.lists.get(key) is pair:
                    self.maxtf[key] = m
        return m

    def put(self, key: bytes, pair: tuple[np.ndarray, np.ndarray]):
        """Keep ``pair`` (if it is let in); returns it, read-only, either way."""
        if not self.CACHE_BYTES:
            return pair
        for a in pair:
            a.flags.writeable = False
        n = self._bytes(pair)
        with self.lock:
            if key in self.lists or n > self.CACHE_BYTES:
                return pair
            want = self.asked.get(key, 0)
            out, room = [], self.CACHE_BYTES - self.size
            for old in self.lists:  # least recently used first
                if room >= n:
                    break
                if self.asked.get(old, 0) >= want:
                    return pair  # not let in: what it would push out is asked for as often
                out.append(old)
                room += self._bytes(self.lists[old])
            for old in out:
                self.size -= self._bytes(self.lists.pop(old))
                self.maxtf.pop(old, None)
            self.lists[key] = pair
            self.size += n
        return pair


def joined(pids: list, tfs: list, dtype) -> tuple[np.ndarray, np.ndarray]:
    """One term's (pids, tfs) from its segments' lists (pids of ``dtype`` when none)."""
    if not pids:
        return np.empty(0, dtype), np.empty(0, np.uint16)
    if len(pids) == 1:
        return pids[0], tfs[0]
    return np.concatenate(pids), np.concatenate(tfs)
