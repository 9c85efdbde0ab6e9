"""One term's postings in one segment, as the bytes stored under its key.

The only module that knows their layout: the store writes them with :func:`pack`
and reads them with :func:`unpack`; the copy checks them with :func:`count` and
:func:`check`; :func:`max_tf` reads a list's largest tf from its headers alone
(with the shortest passage, an upper bound of the list's BM25 scores); a merge
joins one term's lists of several segments with :func:`join`.
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
_VALID[np.unique(_ROUND)] = True
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


# postings made Python integers at a time by pack_many (a window of the columns, not
# all of a commit's: at 4 MB of text, ~400k postings were ~15 MiB of int objects)
_WINDOW = 1 << 14


def pack_many(pids: np.ndarray, tfs: np.ndarray, starts: list[int], ends: list[int]) -> Iterator[bytes]:
    """:func:`pack` of many lists at once (a commit's), one by one: list i is
    ``pids[starts[i]:ends[i]]`` with its tfs, its pids ascending and distinct, the
    lists in column order. A list of one block is packed from slices of the
    columns made Python integers a window at a time, a longer one with numpy."""
    tfs = np.clip(np.asarray(tfs), 1, 65535)
    w0 = w1 = 0
    pl: list = []
    tl: list = []
    for a, b in zip(starts, ends):
        n = b - a
        if n == 0:
            yield b"\x00"
        elif n <= BLOCK:
            if b > w1 or a < w0:
                w0, w1 = a, max(b, a + _WINDOW)
                pl, tl = pids[w0:w1].tolist(), tfs[w0:w1].tolist()
            yield _pack_ints(pl[a - w0:b - w0], tl[a - w0:b - w0])
        else:
            yield _pack_np(pids[a:b], tfs[a:b])


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


def _groups(m: np.ndarray, w: np.ndarray):
    """(blocks, width, values a block): full blocks by width, the last alone when short."""
    nb = len(m)
    full = nb if m[-1] == BLOCK else nb - 1
    out = []
    if full:
        wf = w[:full]
        first = int(wf[0])
        if (wf == first).all():
            out.append((np.arange(full), first, BLOCK))
        else:
            for x in np.unique(wf).tolist():
                out.append((np.flatnonzero(wf == x), x, BLOCK))
    if full < nb:
        out.append((np.array([nb - 1]), int(w[-1]), int(m[-1])))
    return out


def _put(out: np.ndarray, vals: np.ndarray, m, offs, w: np.ndarray) -> None:
    """Pack ``vals`` (BLOCK a block, the last m[-1]; padded to whole blocks) into
    ``out`` at each block's run offset."""
    for blocks, x, cnt in _groups(m, w):
        if not x:
            continue
        g = _UNIT_L[x]
        units = (cnt + g - 1) // g
        ub = g * x >> 3
        v = vals[blocks[:, None] * BLOCK + np.arange(units * g)].astype(np.uint64).reshape(-1, g)
        word = np.bitwise_or.reduce(v << (np.arange(g, dtype=np.uint64) * np.uint64(x)), axis=1)
        rows = word.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :ub].reshape(len(blocks), units * ub)
        out[offs[blocks][:, None] + np.arange(units * ub)] = rows


# postings packed with numpy at a time (whole blocks): a list's int64 work arrays are
# bounded by this, not by its length (a merge's list of the commonest word at 1.27M
# passages took ~60 MiB packed at once)
_PACK_CHUNK = BLOCK * 512


def _pack_np(p: np.ndarray, t: np.ndarray) -> bytes:
    """The stored form of a list of more than one block, pids ascending (tfs clipped
    here): its blocks are packed a chunk at a time (each block stands alone: its
    header, then its runs), headers and runs joined in block order."""
    n = len(p)
    parts = [_pack_blocks(np.asarray(p[a:a + _PACK_CHUNK], np.int64),
                          np.clip(np.asarray(t[a:a + _PACK_CHUNK], np.int64), 1, 65535))
             for a in range(0, n, _PACK_CHUNK)]
    return _varint(n) + b"".join(h for h, _ in parts) + b"".join(b for _, b in parts)


def _pack_blocks(p: np.ndarray, t: np.ndarray) -> tuple[bytes, bytes]:
    """(headers, runs) of the blocks of (p, t), every block full but the last."""
    n = len(p)
    nb = (n + BLOCK - 1) // BLOCK
    starts = np.arange(nb, dtype=np.int64) * BLOCK
    g = np.zeros(nb * BLOCK, np.int64)
    g[:n - 1] = np.diff(p) - 1
    m = np.minimum(starts + BLOCK, n) - starts
    g[starts + m - 1] = 0  # a block's last pid is in its header
    tt = np.zeros(nb * BLOCK, np.int64)
    tt[:n] = t - 1
    wp = _ROUND[_bitlen(np.maximum.reduceat(g[:n], starts))]
    maxtf = np.maximum.reduceat(t, starts)
    wt = _ROUND[_bitlen(maxtf - 1)]
    m, go, to, size = _shape(n, wp, wt)
    body = np.zeros(size, np.uint8)
    _put(body, g, m, go, wp)
    _put(body, tt, m, to, wt)
    hdr = np.empty(nb, _HDR)
    hdr["last"], hdr["maxtf"], hdr["w"] = p[starts + m - 1], maxtf, wp
    return hdr.tobytes(), body.tobytes()


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


def _ints(v, n: int, used: int) -> tuple[list, list]:
    """(pids, tfs) of a list of one block of ``n`` postings, as Python integers;
    ValueError when its lengths are broken."""
    o = used + _HS  # (_one_block's reading and checks, inline: a merge calls this a part)
    last = int.from_bytes(v[used:used + 4], "little")
    mt = int.from_bytes(v[used + 4:used + 6], "little")
    wp = v[used + 6] if len(v) >= o else 255
    if mt < 1 or wp > 32 or _ROUND_L[wp] != wp:
        raise ValueError("a posting list has a broken length")
    wt = _ROUND_L[(mt - 1).bit_length()]
    gb, tb = _run_bytes(n, wp), _run_bytes(n, wt)
    if o + gb + tb != len(v):
        raise ValueError("a posting list has a broken length")
    if wp:
        gi = int.from_bytes(v[o:o + gb], "little")
        mp = (1 << wp) - 1
        ps = [last] * n
        p = last
        for j in range(n - 2, -1, -1):
            p -= ((gi >> (j * wp)) & mp) + 1
            ps[j] = p
    else:
        ps = list(range(last - n + 1, last + 1))
    if wt:
        ti = int.from_bytes(v[o + gb:o + gb + tb], "little")
        mk = (1 << wt) - 1
        ts = [min(((ti >> (j * wt)) & mk) + 1, 65535) for j in range(n)]
    else:
        ts = [1] * n
    return ps, ts


def join(parts: list, dead: Optional[np.ndarray] = None) -> Optional[bytes]:
    """The stored form of several stored lists together, each list's pids apart from
    every other's (a merge's segments' lists of one term), less the pids the mask
    ``dead`` (by pid; None: none) marks; None when no posting is left. ValueError when a
    part's lengths are broken. When all of them together fit one block they are read
    and packed with Python integers; else every block of every part is decoded at once
    (:func:`_blocks`): a merge's many short lists never cost numpy calls each."""
    heads = []  # (last pid, count, count's bytes, value) of each part not empty
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
    if not heads:
        return None
    heads.sort()  # by last pid (no two alike): by first pid too, unless they interleave
    if total <= BLOCK:  # one block: Python integers throughout
        p, t = [], []
        for last, n, used, v in heads:
            if n == 1:  # (most parts) its tf is its header's largest
                mt = int.from_bytes(v[used + 4:used + 6], "little")
                if not mt or v[used + 6] or len(v) != used + _HS + _run_bytes(1, _ROUND_L[(mt - 1).bit_length()]):
                    raise ValueError("a posting list has a broken length")
                p.append(last)
                t.append(mt)
                continue
            ps, ts = _ints(v, n, used)
            p += ps
            t += ts
        if any(a >= b for a, b in zip(p, p[1:])):  # their ids interleave
            order = sorted(range(len(p)), key=p.__getitem__)
            p, t = [p[i] for i in order], [t[i] for i in order]
        if dead is not None:
            top = len(dead)
            keep = [i for i, x in enumerate(p) if x >= top or not dead[x]]
            if len(keep) < len(p):
                if not keep:
                    return None
                p, t = [p[i] for i in keep], [t[i] for i in keep]
        return _pack_ints(p, t)
    p, t = _blocks([(n, used, v) for _, n, used, v in heads])
    if not (p[1:] > p[:-1]).all():  # their ids interleave: one sort
        order = np.argsort(p, kind="stable")
        p, t = p[order], t[order]
    if dead is not None:
        inside = p < len(dead)
        drop = np.zeros(len(p), bool)
        drop[inside] = dead[p[inside]]
        if drop.any():
            p, t = p[~drop], t[~drop]
    return pack(p, t) if len(p) else None


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

    def run_bytes(w):
        g = _UNIT[w]
        return np.where(w > 0, (m + g - 1) // np.maximum(g, 1) * (g * w >> 3), 0)

    gb, tb = run_bytes(wp), run_bytes(wt)
    size = gb + tb
    ends = np.cumsum(size)
    lens = np.fromiter(map(len, bodies), np.int64, len(bodies))
    if not (ends[np.cumsum(nbs) - 1] == np.cumsum(lens)).all():
        raise ValueError("a posting list has a broken length")
    go = ends - size
    win = _window(b"".join(bodies), 0)  # (a short block read as a full one reads on: masked)
    d = _runs(win, go, wp, np.uint32)
    d += 1
    d[_J >= (m - 1)[:, None]] = 0  # a block's last pid is its header's
    pids = np.cumsum(d, axis=1, dtype=np.uint32)
    pids -= d
    pids += (hdr["last"].astype(np.uint32) - pids[:, -1])[:, None]
    narrow = int(wt.max()) < 16
    tfs = _runs(win, go + gb, wt, np.uint16 if narrow else np.uint32)
    tfs += 1
    if not narrow:
        np.minimum(tfs, 65535, out=tfs)
    keep = _J < m[:, None]
    return pids[keep], tfs[keep].astype(np.uint16, copy=False)


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


def head(v) -> tuple[int, int]:
    """(postings, largest tf) of a stored value, from its count and headers alone;
    (-1, 0) when its count is broken."""
    n, used = _read_varint(v)
    if n <= 0:
        return n, 0
    nb = (n + BLOCK - 1) // BLOCK
    if len(v) < used + nb * _HS:
        return -1, 0
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

    CACHE_BYTES = 16 << 20
    ENTRY = 256  # bytes of a cached list beside its arrays (key, tuple, array headers)
    AGE_EVERY = 4096  # lookups between two halvings of every count

    def __init__(self, budget: Optional[int] = None):
        if budget is not None:
            self.CACHE_BYTES = budget
        self.lists: OrderedDict = OrderedDict()
        self.size = 0
        self.asked: dict[bytes, int] = {}  # lookups of each key lately (bounded by the halvings)
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
            self.lists[key] = pair
            self.size += n
        return pair
