"""One passage as the bytes stored under its id (issue 12: compressed text).

The only module that knows that layout: the store packs a passage's msgpack
bytes with :class:`Packer` and reads them back with :func:`unpack`; the copy
carries the stored bytes as they are, with the index's dictionary in its table.

A stored value is one tag byte, then:

- ``0``: the msgpack bytes as they are (when compressing does not make them shorter);
- ``1``: raw deflate with the index's preset dictionary (``meta`` ``zdict``: indexes
  made before zstd; they go on packing new passages so);
- ``2``: raw deflate without one (passages written before the index had one);
- ``3``: one zstd frame (no magic number, content size, checksum or dictionary id)
  with the index's zstd dictionary.

The dictionary is made once, from the passages of the first commit that holds at
least :data:`DICT_MIN` bytes of them (a build makes it from a sample of its files
before its worker starts), and never changes: every passage written with it names
it by its tag. Since issue 12's last step it is a zstd dictionary trained on those
passages (fastCOVER with fixed parameters: ~30 ms; a search of its parameters took
0.7-4.6 s for no gain). Measured against deflate (level 3, a 32 KiB preset
dictionary of sampled passages), per passage, on the bench corpus and SciFact:
5x faster to pack (7 vs 34 us), 3-10% shorter (docs/SCALE-NOTES.md). Its kind
is in its bytes: a zstd dictionary starts with zstd's dictionary magic number;
a deflate one (``zdict`` of an index made before) is the tail of passages' msgpack
bytes, and a value's tag, not the dictionary, says how the value is read. One
passage stays one key: ids are reused one by one, and a snippet reads only its own
passage.
"""

from __future__ import annotations

import threading
import zlib
from typing import Optional

LEVEL = 3  # deflate level: 6 saves 3% more for twice the time (measured)
DICT_SIZE = 32768  # a deflate dictionary, at most: deflate's window
ZSTD_LEVEL = 3  # zstd level: 1 is 4% longer, 6 2% shorter for 3x the time (measured)
ZSTD_DICT_SIZE = 65536  # trained: 112 KiB was 0.7% shorter, 32 KiB 1% longer (measured)
ZSTD_DICT_MAX = 1 << 17  # a copy's dictionary longer than this is not one the engine makes
_ZSTD_DICT_MAGIC = b"\x37\xa4\x30\xec"
DICT_MIN = 65536  # bytes of passages a commit needs before the dictionary is made from it
MAX_RAW = 1 << 20  # a passage's msgpack bytes, at most (chunk.LIMIT characters: ~10 KB)
RAW, DICT, PLAIN, ZSTD = 0, 1, 2, 3


def make_dict(raws: list[bytes]) -> Optional[bytes]:
    """A zstd dictionary trained on passages' bytes (samples spread evenly over them),
    or None when they are fewer than DICT_MIN bytes or too few to train on."""
    total = sum(map(len, raws))
    if total < DICT_MIN:
        return None
    import zstandard

    # about 16x the dictionary of whole passages, evenly spaced, in their order
    step = max(1, total // (ZSTD_DICT_SIZE * 16))
    picked = raws[::step]
    try:  # fastCOVER with fixed k and d: no search of its parameters (seconds)
        d = zstandard.train_dictionary(ZSTD_DICT_SIZE, picked, k=200, d=8, level=ZSTD_LEVEL, threads=1)
    except zstandard.ZstdError:
        return None
    return d.as_bytes()


def is_zstd_dict(zdict: Optional[bytes]) -> bool:
    """Whether an index's dictionary is a zstd one (else a deflate one, or none)."""
    return bool(zdict) and zdict[:4] == _ZSTD_DICT_MAGIC


class _Zstd:
    """A zstd dictionary as one thread uses it: its compressor and decompressor (made on
    first use; neither may be used by two threads at once: each thread has its own,
    :func:`_zstd`) over the dictionary digested once for the process (:func:`_digested`)."""

    def __init__(self, zdict: bytes):
        import zstandard as z

        self.loaded = _digested(zdict)
        self.error = z.ZstdError
        self._compress = None
        self._decompressor = None

    @property
    def compress(self):
        if self._compress is None:
            self._compress = _compressor(self.loaded).compress
        return self._compress

    @property
    def decompressor(self):
        if self._decompressor is None:
            import zstandard as z
            self._decompressor = z.ZstdDecompressor(dict_data=self.loaded, format=z.FORMAT_ZSTD1_MAGICLESS)
        return self._decompressor


def _compressor(loaded):
    """A compressor of the stored form: one magicless frame, no size, checksum or dictionary id."""
    import zstandard as z
    params = z.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, format=z.FORMAT_ZSTD1_MAGICLESS, write_content_size=0, write_checksum=0, write_dict_id=0)
    return z.ZstdCompressor(dict_data=loaded, compression_params=params)


_digests: "dict[bytes, object]" = {}  # a dictionary's bytes -> it digested (most recently used last)
_digests_lock = threading.Lock()
_DIGESTS = 64  # dictionaries digested at once: one an index (serve-many: one an agent)


def _digested(zdict: bytes):
    """``zdict`` digested for compressing and decompressing (~0.4 ms: its tables built),
    once for the process: zstd's digested dictionaries are read-only, shared by every
    thread. A thread's own compressor and decompressor over it cost ~10 us. (Each thread
    digesting its own, four at most, made every search of serve-many over ten agents
    digest one again, ~0.3 ms, and its p99 under 50 sessions several times worse.)"""
    with _digests_lock:
        got = _digests.pop(zdict, None)
        if got is None:
            import zstandard as z
            try:
                got = z.ZstdCompressionDict(zdict, dict_type=z.DICT_TYPE_FULLDICT)
                got.precompute_compress(level=ZSTD_LEVEL)  # parses it: raises when it is not one
                # the decompression tables built now, under the lock (the library makes them on
                # a first decompression, which two threads could race to)
                frame = _compressor(got).compress(b"lnkmem")
                z.ZstdDecompressor(dict_data=got, format=z.FORMAT_ZSTD1_MAGICLESS).decompress(frame, max_output_size=64)
            except z.ZstdError as e:
                raise ValueError(f"the passage dictionary is not a zstd dictionary the engine makes ({e})") from None
            while len(_digests) >= _DIGESTS:
                del _digests[next(iter(_digests))]
        _digests[zdict] = got
        return got


_loaded = threading.local()  # each thread's last zstd dictionaries: [(bytes, _Zstd)]
_LOADED = 16


def _zstd(zdict: bytes) -> _Zstd:
    """This thread's ``zdict`` (comparing the bytes, ~1 us, none when it is the object last
    asked with: each read of the index's meta gives a new one, then used for every passage
    of that read)."""
    held = getattr(_loaded, "held", None)
    if held is None:
        held = _loaded.held = []
    for i, (b, z) in enumerate(held):
        if b == zdict:  # (the same object: at once)
            if i or b is not zdict:
                del held[i]
                held.insert(0, (zdict, z))
            return z
    z = _Zstd(zdict)
    held.insert(0, (zdict, z))
    del held[_LOADED:]
    return z


def check_dict(zdict: Optional[bytes]) -> None:
    """ValueError unless ``zdict`` is a dictionary the engine makes (a copy's, read)."""
    if zdict is None:
        return
    if is_zstd_dict(zdict):
        if len(zdict) > ZSTD_DICT_MAX:
            raise ValueError("a zstd dictionary longer than the engine makes")
        _zstd(zdict)
    elif not 0 < len(zdict) <= DICT_SIZE:
        raise ValueError("a deflate dictionary empty or longer than deflate's window")


class Packer:
    """Packs passages for one write: with the index's zstd dictionary when it has one;
    else deflate (with the deflate dictionary of an index made before zstd, or none):
    a deflate state primed with it once, copied per passage (priming costs more than
    a passage's deflate)."""

    def __init__(self, zdict: Optional[bytes]):
        self.zstd = _zstd(zdict) if is_zstd_dict(zdict) else None
        if self.zstd is not None:
            self.tag = bytes((ZSTD,))
        elif zdict:
            self.tag = bytes((DICT,))
            self.base = zlib.compressobj(LEVEL, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict)
        else:
            self.tag = bytes((PLAIN,))
            self.base = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)

    def pack(self, raw: bytes) -> bytes:
        if self.zstd is not None:
            z = self.zstd.compress(raw)
        else:
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
    if tag == ZSTD:
        if not is_zstd_dict(zdict):
            raise ValueError("a passage needs a zstd dictionary the index does not have")
        return _unzstd(_zstd(zdict), memoryview(v)[1:], limit)
    if tag == DICT:
        if not zdict or is_zstd_dict(zdict):
            raise ValueError("a passage needs a deflate dictionary the index does not have")
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


_BLOCK_MAX = 1 << 17  # zstd's largest block: a compressed one decompresses to at most this
_WINDOW_MAX = 1 << 20  # the window a frame the engine makes can ask for (its passages are smaller)


def frame_bound(body) -> Optional[int]:
    """The most bytes one magicless zstd frame can decompress to, read from its block
    headers alone (a compressed block at most 128 KiB or its window, a raw or RLE one
    its stated size); None when its header asks for more than a frame the engine makes
    (a window over 1 MiB). ValueError when its blocks do not end exactly where ``body``
    does (truncated, or bytes after its end). Costs ~1 us: no byte of the content is read."""
    n = len(body)
    if not n:
        raise ValueError("a passage is truncated or has bytes after its end")
    desc = body[0]
    single, dict_id, checksum = desc >> 5 & 1, desc & 3, desc >> 2 & 1
    if desc & 0x18:  # the reserved bit, or the unused one
        raise ValueError("a passage does not decompress: a frame header of unknown kind")
    pos = 1
    if single:
        window = None
    else:
        if n < 2:
            raise ValueError("a passage is truncated or has bytes after its end")
        wd = body[1]
        base = 1 << (10 + (wd >> 3))
        window = base + (base >> 3) * (wd & 7)
        if window > _WINDOW_MAX:
            return None
        pos = 2
    pos += (0, 1, 2, 4)[dict_id]
    fcs = (1 if single else 0, 2, 4, 8)[desc >> 6]
    if fcs and pos + fcs <= n:
        size = int.from_bytes(body[pos:pos + fcs], "little") + (256 if fcs == 2 else 0)
        if window is None:
            window = size
    pos += fcs
    block_max = _BLOCK_MAX if window is None else min(_BLOCK_MAX, window)
    bound = 0
    while True:
        if pos + 3 > n:
            raise ValueError("a passage is truncated or has bytes after its end")
        head = body[pos] | body[pos + 1] << 8 | body[pos + 2] << 16
        kind, size = head >> 1 & 3, head >> 3
        if kind == 3:
            raise ValueError("a passage does not decompress: a block of reserved kind")
        pos += 3 + (1 if kind == 1 else size)
        bound += size if kind < 2 else block_max
        if head & 1:
            break
    pos += 4 if checksum else 0
    if pos != n:
        raise ValueError("a passage is truncated or has bytes after its end")
    return bound


class BadPassage(ValueError):
    """A value of :func:`unpack_many` that is not one the engine makes; ``index``: which."""

    def __init__(self, index: int, why: str):
        super().__init__(why)
        self.index = index


def unpack_many(values: list, zdict: Optional[bytes], room: int) -> list[bytes]:
    """Each stored value's msgpack bytes (a copy's, read once), what :func:`unpack` gives
    one at a time with ``room`` bytes shared among them all: the values of one file of a
    copy (~10^4 of them) in one loop, with the dictionary looked up once (a cold load of
    10^6 passages spent half its time in unpack's per-call overhead). BadPassage naming
    the first value that is not one :class:`Packer` makes, or that passes the room left."""
    out = []
    append = out.append
    z = _zstd(zdict) if is_zstd_dict(zdict) else None
    for i, v in enumerate(values):
        try:
            if z is not None and len(v) and v[0] == ZSTD:  # (unpack's own path, its lookups done once)
                raw = _unzstd(z, memoryview(v)[1:], max(room, 1))
            else:
                raw = unpack(v, zdict, max(room, 1))
        except ValueError as e:
            raise BadPassage(i, str(e)) from None
        room -= len(raw)
        append(raw)
    return out


def _unzstd(z: _Zstd, body, limit: int) -> bytes:
    """One frame's bytes, at most ``limit`` (0: MAX_RAW); nothing may follow it. The
    frame's block headers bound what it can become before any of it is decompressed
    (:func:`frame_bound`): a frame that cannot pass the limit is decompressed by a
    stream (~3 us); only one that might (or a header the engine never writes) takes
    the bounded one-shot path, whose output buffer is the limit (~15 us: it is
    allocated whole each time)."""
    most = min(limit, MAX_RAW) if limit else MAX_RAW
    try:
        bound = frame_bound(body)
        if bound is not None and bound <= most:
            d = z.decompressor.decompressobj()
            raw = d.decompress(body)
            if not d.eof:
                raise ValueError("a passage is truncated or has bytes after its end")
            return raw
        raw = z.decompressor.decompress(body, max_output_size=most)
        if limit:  # a copy's value (read once): nothing after its frame either
            d = z.decompressor.decompressobj()
            d.decompress(body)
            if not d.eof or d.unused_data:
                raise ValueError("a passage is truncated or has bytes after its end")
    except z.error as e:
        why = "longer than allowed or truncated" if "full frame" in str(e) else f"does not decompress: {e}"
        raise ValueError(f"a passage {why}") from None
    return raw
