"""What a stored posting list's count and block headers tell without decoding its runs:
its count (:func:`count`, with its lengths checked; :func:`stated_count` as stated), its
largest tf (:func:`max_tf`, :func:`head`: with the shortest passage, an upper bound of the
list's BM25 scores) and each block's (:func:`block_tf`: block-max, for pruning).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from lnkmem.index.codec.postings.layout import BLOCK, HEADER, HEADER_BYTES, layout_of, read_varint


def count(v) -> Optional[int]:
    """How many postings a stored value holds, or None when its lengths are broken."""
    lay = layout_of(v)
    return None if lay is None else lay[0]


def _stated(v) -> tuple[int, int]:
    """(postings its count states, bytes of the count) of a stored value; -1 postings when
    the count is broken or leaves no room for its blocks' headers."""
    n, used = read_varint(v)
    if n > 0 and len(v) < used + (n + BLOCK - 1) // BLOCK * HEADER_BYTES:
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
    return n, int(np.frombuffer(v, HEADER, nb, used)["maxtf"].max())


def max_tf(v) -> int:
    """The largest tf of a stored value (0 when empty), from its headers alone."""
    n, used = read_varint(v)
    if n <= 0:
        return 0
    nb = (n + BLOCK - 1) // BLOCK
    if nb == 1:
        return int.from_bytes(v[used + 4:used + 6], "little")
    return int(np.frombuffer(v, HEADER, nb, used)["maxtf"].max())


def block_tf(v, want: np.ndarray) -> np.ndarray:
    """For each pid of ``want`` (ascending), the largest tf of the block of a stored value
    that may hold it (0 past its last pid): a bound on its tf from the headers alone
    (block-max, for pruning). ValueError when the value's lengths are broken."""
    out = np.zeros(len(want), np.int64)
    n, used = read_varint(v)
    if n <= 0 or not len(want):
        return out
    nb = (n + BLOCK - 1) // BLOCK
    if len(v) < used + nb * HEADER_BYTES:
        raise ValueError("a posting list has a broken length")
    hdr = np.frombuffer(v, HEADER, nb, used)
    blk = np.searchsorted(hdr["last"], want)
    inside = blk < nb
    out[inside] = hdr["maxtf"][blk[inside]]
    return out
