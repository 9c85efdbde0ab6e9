"""The stored form of one term's postings in one segment: the only module that knows its
layout, and the lengths that follow from it. :mod:`.encode` writes it, :mod:`.decode` and
:mod:`.headers` read it, :mod:`.checks` checks it.

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
whole unit; a full block's run of width w is 16·w bytes). tfs are held in
[1, 65535]. Pids are the distinct ids of one list, ascending.
"""

from __future__ import annotations


import numpy as np


BLOCK = 128
SMALL = 12  # lists this short are read with Python integers (numpy's fixed cost is more)
HEADER = np.dtype([("last", "<u4"), ("maxtf", "<u2"), ("w", "u1")])
HEADER_BYTES = HEADER.itemsize  # 7
EMPTY = (np.empty(0, np.uint32), np.empty(0, np.uint16))
# bit width needed -> width used; width used -> values a unit
ROUND = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 10, 12, 12, 14, 14, 16, 16,
                   20, 20, 20, 20, 24, 24, 24, 24, 28, 28, 28, 28, 32, 32, 32, 32], np.int64)
ROUND_L = ROUND.tolist()
UNIT = np.zeros(33, np.int64)
UNIT[1:9], UNIT[9:17], UNIT[17:] = 8, 4, 2
UNIT[[9, 11, 13, 15, 17, 18, 19, 21, 22, 23, 25, 26, 27, 29, 30, 31]] = 0  # widths never used
UNIT_L = UNIT.tolist()
VALID_WIDTH = np.zeros(256, bool)  # a width byte that names a width used
VALID_WIDTH[sorted(set(ROUND_L))] = True  # (not np.unique: it imports numpy.ma, slow at start)
TF_WIDTH = np.concatenate(([-1], ROUND[np.frexp(np.arange(65535, dtype=np.float64))[1]]))  # largest tf -> tf width


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(v) -> tuple[int, int]:
    """(value, bytes used); (-1, 0) when broken or longer than 5 bytes."""
    n = shift = 0
    for i in range(min(len(v), 5)):
        b = v[i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i + 1
        shift += 7
    return -1, 0


def run_bytes(n: int, w: int) -> int:
    """Bytes of a run of n values w bits wide (whole units)."""
    g = UNIT_L[w]
    return (n + g - 1) // g * (g * w >> 3) if w else 0


def run_units(n: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(units, bytes a unit) of runs of ``n`` values ``w`` bits wide (none for width 0):
    :func:`run_bytes` of many runs is their product."""
    g = UNIT[w]
    return np.where(w > 0, (n + g - 1) // np.maximum(g, 1), 0), g * w >> 3


def _shape(n: int, wp: np.ndarray, wt: np.ndarray):
    """(postings a block, gap run offsets, tf run offsets, body size), offsets from
    the body's start. A full block's run of width w is 16·w bytes (128 values)."""
    nb = len(wp)
    m = np.full(nb, BLOCK, np.int64)
    k = n - BLOCK * (nb - 1)
    m[-1] = k
    gb, tb = wp * (BLOCK // 8), wt * (BLOCK // 8)
    if k < BLOCK:
        gb[-1], tb[-1] = run_bytes(k, int(wp[-1])), run_bytes(k, int(wt[-1]))
    size = gb + tb
    ends = np.cumsum(size)
    go = ends - size
    return m, go, go + gb, int(ends[-1])


def layout_of(v):
    """(n, body offset, headers, tf widths, shape) of a stored value, or None when
    its lengths are broken. Work bounded by len(v)."""
    n, used = read_varint(v)
    if n < 0:
        return None
    if n == 0:
        return (0, used, None, None, None) if len(v) == used else None
    nb = (n + BLOCK - 1) // BLOCK
    if used + nb * HEADER_BYTES > len(v):
        return None
    hdr = np.frombuffer(v, HEADER, nb, used)
    wp = hdr["w"].astype(np.int64)
    wt = TF_WIDTH[hdr["maxtf"]]  # -1 for a largest tf of 0
    if not VALID_WIDTH[wp].all() or wt.min() < 0:
        return None
    shape = _shape(n, wp, wt)
    body = used + nb * HEADER_BYTES
    if body + shape[3] != len(v):
        return None
    return n, body, hdr, wt, shape
