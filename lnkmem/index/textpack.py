"""One passage as the bytes stored under its id (issue 12: compressed text).

The only module that knows that layout: the store packs a passage's msgpack
bytes with :class:`Packer` and reads them back with :func:`unpack`; the copy
carries the stored bytes as they are, with the index's dictionary in its table.

A stored value is one tag byte, then:

- ``0``: the msgpack bytes as they are (when deflate does not make them shorter);
- ``1``: raw deflate with the index's preset dictionary (``meta`` ``zdict``);
- ``2``: raw deflate without one (passages written before the index had one).

The dictionary is made once, from the text of the first commit that holds at
least :data:`DICT_MIN` bytes of passages (samples spread over it, the last
:data:`DICT_SIZE` bytes kept: deflate's window), and never changes: every passage
written with it names it by its tag. Per passage, a dictionary saves about a
fifth of plain per-passage deflate (measured on bench/corpus.py text and SciFact:
docs/SCALE-NOTES.md), and one passage stays one key: ids are reused one by one,
and a snippet reads only its own passage.
"""

from __future__ import annotations

import zlib
from typing import Optional

LEVEL = 3  # deflate level: 6 saves 3% more for twice the time (measured)
DICT_SIZE = 32768  # deflate's window: a longer dictionary is not used
DICT_MIN = 65536  # bytes of passages a commit needs before the dictionary is made from it
RAW, DICT, PLAIN = 0, 1, 2


def make_dict(raws: list[bytes]) -> Optional[bytes]:
    """A preset dictionary from passages' bytes (samples spread evenly over them), or
    None when they are fewer than DICT_MIN bytes."""
    total = sum(map(len, raws))
    if total < DICT_MIN:
        return None
    # about DICT_SIZE bytes of whole passages, evenly spaced, in their order
    step = max(1, total // DICT_SIZE)
    picked, size = [], 0
    i = 0
    while i < len(raws) and size < DICT_SIZE * 2:
        picked.append(raws[i])
        size += len(raws[i])
        i += max(1, step)
    return b"".join(picked)[-DICT_SIZE:]


class Packer:
    """Packs passages for one write: a deflate state primed with the dictionary
    once, copied per passage (priming costs more than a passage's deflate)."""

    def __init__(self, zdict: Optional[bytes]):
        self.tag = bytes((DICT if zdict else PLAIN,))
        if zdict:
            self.base = zlib.compressobj(LEVEL, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict)
        else:
            self.base = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)

    def pack(self, raw: bytes) -> bytes:
        c = self.base.copy()
        z = c.compress(raw) + c.flush()
        if len(z) >= len(raw):
            return b"\x00" + raw
        return self.tag + z


def unpack(v, zdict: Optional[bytes], limit: int = 0) -> bytes:
    """A stored value's msgpack bytes. ValueError when it is not a value
    :class:`Packer` makes, needs a dictionary the index does not have, or (with
    ``limit``) would be longer than ``limit`` bytes."""
    if not len(v):
        raise ValueError("an empty passage value")
    tag = v[0]
    if tag == RAW:
        raw = bytes(v[1:])
        if limit and len(raw) > limit:
            raise ValueError("a passage longer than allowed")
        return raw
    if tag == DICT:
        if not zdict:
            raise ValueError("a passage needs a dictionary the index does not have")
        d = zlib.decompressobj(-15, zdict=zdict)
    elif tag == PLAIN:
        d = zlib.decompressobj(-15)
    else:
        raise ValueError(f"a passage value of unknown kind {tag}")
    try:
        raw = d.decompress(memoryview(v)[1:], limit) if limit else d.decompress(memoryview(v)[1:])
    except zlib.error as e:
        raise ValueError(f"a passage does not decompress: {e}") from None
    if d.unconsumed_tail:
        raise ValueError("a passage longer than allowed")
    if not d.eof or d.unused_data:
        raise ValueError("a passage is truncated or has bytes after its end")
    return raw
