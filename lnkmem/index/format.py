"""The index's records as stored: their Structs, keys and codecs.

Layout (one LMDB environment, ``<state>/index/``), named databases:

``meta``      format, generation, next passage id, next segment id, model,
              ``zdict`` (the passages' dictionary, zstd or deflate: :mod:`textpack`),
              the sums (``crc``, ``pcrc``, ``fcrc``) below
``files``     ref -> FileRec: the version seen and the passages made of it (keys: :func:`file_key`)
``passages``  pid (4 bytes, big-endian: :func:`id_key`) -> Passage: ref, lines, text, thread...
              (msgpack, compressed: :mod:`lnkmem.index.codec.textpack`)
``postings``  segment (4 bytes BE) + term -> pids and tfs in compressed blocks
              (:mod:`lnkmem.index.codec.postings`)
``segments``  segment -> SegMeta: its pids, their lengths and refs (as runs: SegStored)
``dead``      pid -> b"": passages replaced or deleted, still in a segment
``vectors``   pid -> int8 embedding + float32 scale (meta ``model``: whose; :func:`quantize`)
``vec_pending`` pid -> b"": vectors made since the copy was last written

The one place these are defined: the store, the commit, the merge and the copy all
encode and decode through this module.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import Optional

import msgspec
import numpy as np

from lnkmem.core.errors import DamagedIndex
from lnkmem.core.wire import SOURCES  # (defined once, with the wire contract that names them)

FORMAT = b"lnkmem-index-5"  # 5: long lines cut at word boundaries (issue 35); 4: postings in bit-packed blocks, passages deflated (issue 12)
LOADING = b"loading"  # a meta key: a load of the copy committed in steps, not finished (wiped at open)
SOURCE_CODE = {s: i for i, s in enumerate(SOURCES)}


class FileRec(msgspec.Struct, array_like=True):
    version: str
    size: int
    pids: list[int]
    kind: str = "text"  # "text" | "name" (by name only: no converter) | "name-failed" (the converter failed)
    mtime: Optional[str] = None  # modification time (RFC 3339), for the after/before filters


class Passage(msgspec.Struct, array_like=True, omit_defaults=True):
    ref: str
    first: int
    last: int
    text: str
    thread: Optional[str] = None
    role: Optional[str] = None
    at: Optional[str] = None



class SegMeta(msgspec.Struct, array_like=True):
    pids: bytes  # u32 LE
    lens: bytes  # u32 LE
    refs: list[str]  # one per pid



class FileHead(msgspec.Struct, array_like=True):
    """A FileRec's first fields only (the rest of its array is skipped, not built)."""

    version: str
    size: int


class FileKind(msgspec.Struct, array_like=True):
    """A FileRec's head and kind: its passage ids left as the raw bytes they are."""

    version: str
    size: int
    pids: msgspec.Raw
    kind: str = "text"


encoder = msgspec.msgpack.Encoder()
file_decoder = msgspec.msgpack.Decoder(FileRec)
head_decoder = msgspec.msgpack.Decoder(FileHead)
kind_decoder = msgspec.msgpack.Decoder(FileKind)
passage_decoder = msgspec.msgpack.Decoder(Passage)


class SegStored(msgspec.Struct, array_like=True):
    """A SegMeta as stored: its refs as runs (a file's passages are consecutive in a
    segment), each ref once: a few bytes a passage less (docs/BENCHMARKS.md)."""

    pids: bytes  # u32 LE
    lens: bytes  # u32 LE
    names: list[str]  # each run's ref
    runs: bytes  # u32 LE: how many consecutive passages each run has


class SegCodec:
    """SegMeta to and from its stored bytes (:class:`SegStored`)."""

    _dec = msgspec.msgpack.Decoder(SegStored)

    def encode(self, m: SegMeta) -> bytes:
        names: list[str] = []
        runs: list[int] = []
        for r in m.refs:
            if names and names[-1] == r:
                runs[-1] += 1
            else:
                names.append(r)
                runs.append(1)
        return self.encode_runs(m.pids, m.lens, names, np.asarray(runs))

    def encode_runs(self, pids: bytes, lens: bytes, names: list[str], runs: np.ndarray) -> bytes:
        """Stored bytes of a segment whose refs are given as runs (``names[i]``, ``runs[i]`` times)."""
        return encoder.encode(SegStored(pids, lens, names, runs.astype("<u4").tobytes()))

    def decode(self, v) -> SegMeta:
        s, runs = self.stored(v)
        names = s.names
        return SegMeta(s.pids, s.lens, [names[i] for i, c in enumerate(runs.tolist()) for _ in range(c)])

    def stored(self, v) -> tuple[SegStored, np.ndarray]:
        """The stored form, checked, and its runs (u32): no list a passage."""
        s = self._dec.decode(v)
        n = len(s.pids) // 4
        if len(s.runs) % 4 or len(s.runs) // 4 != len(s.names) or len(s.lens) != len(s.pids) or len(s.pids) % 4:
            raise ValueError("a segment's refs are broken")
        runs = np.frombuffer(s.runs, "<u4")
        if int(runs.sum(dtype=np.int64)) != n:  # before any list is made of them
            raise ValueError("a segment's refs do not match its passages")
        return s, runs


seg_codec = SegCodec()


def id_key(n: int) -> bytes:
    return n.to_bytes(4, "big")


# --- the files table's keys ------------------------------------------------------------
#
# LMDB takes keys of at most 511 bytes (MDB_BAD_VALSIZE beyond: before this, one ref that
# long stopped a whole indexing pass), but a ref is as long as a path may be (4,096 bytes
# and more). A ref of up to KEY_MAX bytes is its own key, as it always was (an index made
# before holds no other kind: no format change, nothing rebuilt); a longer one is keyed by
# its first bytes, a NUL (which no ref holds) and a BLAKE2b digest of the whole ref, and
# its value is the pair (ref, record): the ref is read back from the value, never from
# the key. Prefix scans stay scans of key ranges (the first bytes are kept).

KEY_MAX = 511  # LMDB's key limit (mdb_env_get_maxkeysize of its default build)
_REF_DIGEST = 16
REF_HEAD = KEY_MAX - 1 - _REF_DIGEST  # bytes of a long ref kept at the front of its key
_dec_long_file = msgspec.msgpack.Decoder(tuple[str, bytes])


def file_key(ref: str) -> bytes:
    """The ``files`` table's key of ``ref`` (at most KEY_MAX bytes whatever its length)."""
    b = ref.encode()
    if len(b) <= KEY_MAX:
        return b
    return b[:REF_HEAD] + b"\0" + hashlib.blake2b(b, digest_size=_REF_DIGEST).digest()


def file_value(ref: str, rec: bytes) -> bytes:
    """What the ``files`` table holds for ``ref`` whose record's bytes are ``rec``."""
    return rec if len(ref.encode()) <= KEY_MAX else encoder.encode((ref, rec))


def file_entry(key, value) -> tuple[str, bytes]:
    """(ref, its record's bytes) of one item of the ``files`` table."""
    key = bytes(key)
    if b"\0" in key:
        ref, rec = _dec_long_file.decode(value)
        if file_key(ref) != key:
            raise DamagedIndex("a long ref's record names another ref")
        return ref, rec
    return key.decode(), bytes(value)


def file_get(txn, db, ref: str) -> Optional[bytes]:
    """The record's bytes of ``ref`` in the ``files`` table ``db``, or None."""
    key = file_key(ref)
    v = txn.get(key, db=db)
    if v is None or len(key) == len(ref.encode()):
        return v
    got, rec = _dec_long_file.decode(v)
    return rec if got == ref else None


# --- a segment's postings, summed ---------------------------------------------------------
#
# LMDB keeps no checksum of a page: a bit flipped in a posting list's bytes decodes to
# other ids or tfs and is served (3 of 60 single flips changed answers, none detected).
# A segment's postings never change once written, so each listed segment has, in
# ``meta`` under ``crc`` + its key, the sum (mod 2**64) and count of CRC-32s of its
# items (key then value): order-free (a merge writes its two halves as they come), and
# a single flipped bit always changes its item's CRC. Checked whenever the index is
# read through whole (the deep check, in a child: an index not closed whole, or changed
# since its seal); a segment without one (written by a copy's load, or by an engine
# before) is not.

CRC = b"crc"
CRC_SUM = struct.Struct("<QI")
# the same of each segment's live passages (pid key, stored value): the passages table is
# not a segment's alone (a passage is deleted when it dies), so a commit takes a dying
# passage's CRC out of its segment's sum, and a merge's segment sums its segments' sums
PCRC = b"pcrc"
_MASK64 = 0xFFFFFFFFFFFFFFFF


# and of the whole files table (key, stored value), kept by every commit (a record
# replaced: its old CRC out, its new one in), stamped with the generation it was made at:
# valid only while that is the index's generation (a merge carries it on; a copy's load
# does not, and leaves it stale: then it is not checked)
FCRC = b"fcrc"
FILES_SUM = struct.Struct("<QQI")


def crc_of(key, value) -> int:
    return zlib.crc32(value, zlib.crc32(key))


def take_from_sum(txn, db, key: bytes, crcs: list[int]) -> None:
    """Take ``crcs`` (items gone) out of the sum under ``key`` in ``db`` (if it has one)."""
    v = txn.get(key, db=db)
    if v is None:
        return
    total, n = CRC_SUM.unpack(v) if len(v) == CRC_SUM.size else (0, -1)
    if n < len(crcs):  # (broken, or not what was summed: no sum is better than a wrong one)
        txn.delete(key, db=db)
        return
    txn.put(key, CRC_SUM.pack((total - sum(crcs)) & _MASK64, n - len(crcs)), db=db)


class PostingsSum:
    """The sum and count of CRC-32s of a segment's postings items, as they are written."""

    __slots__ = ("total", "n")

    def __init__(self) -> None:
        self.total = 0
        self.n = 0

    def add(self, key, value) -> None:
        self.total = (self.total + zlib.crc32(value, zlib.crc32(key))) & _MASK64
        self.n += 1

    def take(self, crc: int) -> None:
        self.total = (self.total - crc) & _MASK64
        self.n -= 1

    def add_sum(self, stored: Optional[bytes]) -> bool:
        """Add a sum as stored; False when there is none (then this one means nothing)."""
        if stored is None or len(stored) != CRC_SUM.size:
            return False
        total, n = CRC_SUM.unpack(stored)
        self.total = (self.total + total) & _MASK64
        self.n += n
        return True

    def over(self, items):
        """``items`` ((key, value) pairs) passed on, each added."""
        add = self.add
        for k, v in items:
            add(k, v)
            yield k, v

    def value(self) -> bytes:
        return CRC_SUM.pack(self.total, self.n)


def source_of(ref: str) -> str:
    return ref.split("/", 1)[0]



def quantize_rows(vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row) of float vectors: row i is about
    ``q[i] * scale[i]``; the largest component maps to ±127."""
    v = np.asarray(vecs, np.float32)
    if v.ndim == 1:
        v = v[None, :]
    m = np.abs(v).max(axis=1).astype(np.float64) if v.shape[1] else np.zeros(len(v))
    m[m == 0] = 1.0
    scale = (m / 127.0).astype(np.float32)
    return np.round(v / scale[:, None]).astype(np.int8), scale


def quantize(v: np.ndarray) -> bytes:
    """int8 components and one float32 scale: 4x smaller than float32."""
    q, scale = quantize_rows(v)
    return q[0].tobytes() + scale[:1].astype("<f4").tobytes()


def vector_rows(pids: list[int], rows: list[bytes], dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raw = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), dim + 4)
    q = np.ascontiguousarray(raw[:, :dim]).view(np.int8)
    scale = np.ascontiguousarray(raw[:, dim:]).view("<f4").reshape(len(rows)).astype(np.float32)
    return np.asarray(pids, np.int64), q, scale

