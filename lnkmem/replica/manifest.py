"""The index copy's files and manifest (§7.2, §7.3; docs/ARCHITECTURE.md "The copy"): their
names, formats and bounds, what every other module of the copy reads and writes.

A copy is a set of immutable, content-addressed files plus one small manifest,
made for a bucket: no file is larger than :data:`MAX_BLOB` (64 MiB) whatever
the index's size, and a small change sends about what changed.

``manifest.json``          which files make this version (its bridge version is
                           the copy's version)
``seg-<hash>-<size>.bin``  a part of one index segment: passages (ids, lengths,
                           refs, the stored passages) and then postings (terms and
                           their lists, as the index stores them: codec/postings); a
                           segment is one or more parts, its passages before its
                           postings, each part at most :func:`part_bytes`
``page-<hash>-<size>.bin`` one page of the file table: the files whose ref hashes
                           (crc32) to the page's number among the pages
``head-<hash>-<size>.bin`` dead passages, the next passage id, the model, whose
                           copy it is
``dict-<hash>-<size>.bin`` the passages' dictionary (textpack: zstd, or deflate)
``vec-<hash>-<size>.bin``  a chunk of passage embeddings (int8 + scale)

A name says its file's length, so a file over the bound is refused before it
is fetched. Files are written before the manifest that names them, and never
changed, so a reader that fetches a manifest and then its files sees exactly
one version. A write-back after one changed file sends one small segment, a
vector chunk, one page, the head and the manifest. :func:`export` makes the
files one at a time (a generator the write-back sends as they come);
:func:`load_copy` fetches, checks and writes them into the cache one at a time.
A cache being served is replaced in one LMDB write transaction, so its readers
see one version; an empty one (a cold start: the common and large case) is
written in transactions of :data:`LOAD_STEP` bytes, marked as loading until the
last commit (a load cut short is never taken for an index: the store wipes
it), so memory holds about one file and one step, whatever the copy's size.

The copy is untrusted input (§7.2 rev. 2): every check -- names against
content hashes and lengths, decompressed sizes against the compressed ones,
counts, lengths and ids against each other (posting lists all at once,
:func:`postings.check_many`), refs against this memory's sources, vector
widths, whose copy it is -- passes before the transaction commits; a copy that
fails is :class:`CopyDamaged`, and nothing of it is kept. The previous format
(``lnkmem-copy-3``: one segment a file, one table) is read once and written
back in this one."""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from typing import Optional

import msgspec

from lnkmem.core.knobs import knobs
from lnkmem.index.format import (KEY_MAX, encoder)


FORMAT = "lnkmem-copy-4"  # -4: bounded files, a paged table, the head and dictionary apart (issue 33)
OLD_FORMAT = "lnkmem-copy-3"  # read once, then written back as FORMAT
MANIFEST = "manifest.json"

# bounds on what a copy may make the engine hold (§7.2: never trusted to size an allocation)
MAX_MANIFEST = 1 << 20
MAX_BLOB = 64 << 20  # a file of the copy, at most (rev. 3)
OLD_MAX_BLOB = 1 << 30  # a file of an lnkmem-copy-3 copy (one segment a file), at most
PART_BYTES = 4 << 20  # what a write-back puts in one file (`LNKMEM_COPY_PART` for tests)
RATIO = 32  # decompressed bytes per compressed byte, at most (plus SLACK)
SLACK = 1 << 20
MAX_FILES = 100_000  # files one manifest may name
MAX_DIM = 16384
MAX_TERM = KEY_MAX - 4  # a posting's key is its segment (4 bytes) and its term: LMDB keys no more
NAME_RE = re.compile(r"(seg|page|head|dict|vec)-[0-9a-f]{40}-([0-9]{1,12})\.bin")
OLD_NAME_RE = re.compile(r"(seg|table|vec)-[0-9a-f]{40}\.bin")


def part_bytes() -> int:
    """The bytes a write-back puts in one file of the copy, aimed at (`LNKMEM_COPY_PART`,
    for tests; never over :data:`MAX_BLOB`)."""
    return min(knobs().copy_part or PART_BYTES, MAX_BLOB // 2)


def is_copy_file(name: str) -> bool:
    """Whether ``name`` is the name of a file of a copy (this format's or the previous one's)."""
    return bool(NAME_RE.fullmatch(name) or OLD_NAME_RE.fullmatch(name))


class CopyDamaged(ValueError):
    """The copy fails a check: it is never loaded, and is replaced at the next write-back."""


class Manifest(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    segments: list[list[str]]  # each segment's parts, in order
    pages: list[str]  # the file table's pages, by number
    head: str
    dict: Optional[str] = None
    vectors: list[str] = msgspec.field(default_factory=list)
    model: Optional[str] = None
    made: Optional[str] = None
    of: Optional[str] = None  # whose memory: "agent <owner>/<agent>" or "team <team id>"
    # written (a flush) before its writer's first look at the sources was done: a reader that
    # loads it reads the rest from the sources
    partial: bool = False

    def names(self) -> list[str]:
        """Every file this version is made of."""
        out = [n for seg in self.segments for n in seg] + list(self.pages)
        out += [self.head] if self.head else []
        out += [self.dict] if self.dict else []
        return out + list(self.vectors)


class OldManifest(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    segments: list[str]
    table: str
    vectors: list[str] = msgspec.field(default_factory=list)
    model: Optional[str] = None
    made: Optional[str] = None
    of: Optional[str] = None


class FormatField(msgspec.Struct, forbid_unknown_fields=False):
    format: str


class SegmentPart(msgspec.Struct, array_like=True):
    """A part of a segment (the whole of a small one; in lnkmem-copy-3 always the whole)."""
    pids: bytes
    lens: bytes
    refs: list[str]
    terms: list[bytes]
    postings: list[bytes]
    passages: list[bytes]


class TablePage(msgspec.Struct, array_like=True):
    files: list[tuple[str, bytes]]  # (ref, its FileRec as the index stores it), refs ascending


class Head(msgspec.Struct, array_like=True):
    tombs: list[bytes]  # for each segment, its passages no longer live (u32, ascending)
    next_pid: int
    model: Optional[str]
    of: Optional[str] = None


class OldTable(msgspec.Struct, array_like=True):  # lnkmem-copy-3's: the head and the whole table in one
    files: list[tuple[str, bytes]]
    dead: bytes
    next_pid: int
    model: Optional[str]
    of: Optional[str] = None
    zdict: Optional[bytes] = None


class VectorChunk(msgspec.Struct, array_like=True):
    pids: bytes
    rows: bytes  # n x (dim int8 + 4-byte scale)
    dim: int


def pack(obj) -> bytes:
    return zlib.compress(encoder.encode(obj), 3)


def blob_name(kind: str, blob: bytes) -> str:
    return f"{kind}-{hashlib.sha256(blob).hexdigest()[:40]}-{len(blob)}.bin"


def variant(name: str, blob: bytes) -> tuple[str, bytes]:
    """Another file of the same content as ``blob`` (named ``name``): its bytes
    decompressed and compressed again as another zlib stream (an empty block flushed at a
    random point), so under another name. A write-back never relies on a file it did not
    make and no version it read names (another writer may be deleting it): where its name
    is taken, it sends this instead."""
    raw = zlib.decompress(blob)
    cut = int.from_bytes(os.urandom(4), "little") % (len(raw) + 1)
    z = zlib.compressobj(3)
    out = z.compress(raw[:cut]) + z.flush(zlib.Z_FULL_FLUSH) + z.compress(raw[cut:]) + z.flush()
    return blob_name(name.split("-", 1)[0], out), out


def page_of(ref: str, pages: int) -> int:
    """The table page that holds ``ref`` among ``pages``."""
    return zlib.crc32(ref.encode("utf-8", "surrogatepass")) % pages


def encode_manifest(m: Manifest) -> bytes:
    return msgspec.json.encode(m)


def decode_manifest(data: bytes) -> Manifest:
    """The manifest (one of the previous format too, given this format's shape)."""
    if len(data) > MAX_MANIFEST:
        raise CopyDamaged(f"the manifest is {len(data)} bytes, over {MAX_MANIFEST}")
    try:
        fmt = msgspec.json.decode(data, type=FormatField).format
        if fmt == FORMAT:
            return msgspec.json.decode(data, type=Manifest)
        if fmt == OLD_FORMAT:
            o = msgspec.json.decode(data, type=OldManifest)
            return Manifest(OLD_FORMAT, [[s] for s in o.segments], [o.table], "", None, o.vectors,
                            o.model, o.made, o.of)
    except (msgspec.DecodeError, RecursionError) as e:  # (nested past msgspec's depth: not understood either)
        raise CopyDamaged(f"the manifest is not understood: {e}") from None
    raise CopyDamaged(f"copy format {fmt!r} is not {FORMAT!r}")


