"""The index copy's format (§7.2, §7.3; docs/ARCHITECTURE.md "The copy").

A copy is a set of immutable, content-addressed files plus one small manifest,
made for a bucket: no file is larger than :data:`MAX_BLOB` (64 MiB) whatever
the index's size, and a small change sends about what changed.

``manifest.json``          which files make this version (its bridge version is
                           the copy's version)
``seg-<hash>-<size>.bin``  a part of one index segment: passages (ids, lengths,
                           refs, the stored passages) and then postings (terms and
                           their lists, as the index stores them, postings.py); a
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
back in this one.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
import zlib
from array import array
from typing import Callable, Iterable, Iterator, Optional

import msgspec
import numpy as np

from lnkmem.core import memtrim
from lnkmem.core.knobs import knobs
from lnkmem.index.codec import postings, textpack
from lnkmem.index.format import (KEY_MAX, LOADING, FileRec, encoder, file_decoder, file_key, file_value,
                                 id_key, passage_decoder, seg_codec)
from lnkmem.index.store import Store
from lnkmem.index.tables import Reading, Writing

FORMAT = "lnkmem-copy-4"  # -4: bounded files, a paged table, the head and dictionary apart (issue 33)
OLD_FORMAT = "lnkmem-copy-3"  # read once, then written back as FORMAT
MANIFEST = "manifest.json"

# bounds on what a copy may make the engine hold (§7.2: never trusted to size an allocation)
MAX_MANIFEST = 1 << 20
MAX_BLOB = 64 << 20  # a file of the copy, at most (rev. 3)
OLD_MAX_BLOB = 1 << 30  # a file of an lnkmem-copy-3 copy (one segment a file), at most
PART_BYTES = 8 << 20  # what a write-back puts in one file (`LNKMEM_COPY_PART` for tests)
RATIO = 32  # decompressed bytes per compressed byte, at most (plus SLACK)
SLACK = 1 << 20
MAX_FILES = 100_000  # files one manifest may name
MAX_DIM = 16384
MAX_TERM = KEY_MAX - 4  # a posting's key is its segment (4 bytes) and its term: LMDB keys no more
MAX_COPY_SEGMENTS = 256  # past this many segments the copy is written anew whole (a load's GETs)
PAGE_GROUP_BYTES = 8 << 20  # the file table's bytes an export holds at once, about
FILES_A_PAGE = 128  # the table's files a page, aimed at: pages are 2**k, made again past 4x either way
LOAD_STEP = 16 << 20  # an empty cache's load commits after about this many bytes written
CHECK_POSTINGS = 1 << 18  # postings checked at once (postings.check_many's work arrays: ~2 MiB each)
SPARSE = 4  # ids beyond SPARSE x passages + DENSE_SLACK are renumbered at load
DENSE_SLACK = 1 << 16
MASK_IDS = 1 << 24  # a segment's ids below this are checked against a mask of them (16 MiB at most)
_NAME = re.compile(r"(seg|page|head|dict|vec)-[0-9a-f]{40}-([0-9]{1,12})\.bin")
_OLD_NAME = re.compile(r"(seg|table|vec)-[0-9a-f]{40}\.bin")


def part_bytes() -> int:
    """The bytes a write-back puts in one file of the copy, aimed at (`LNKMEM_COPY_PART`,
    for tests; never over :data:`MAX_BLOB`)."""
    return min(knobs().copy_part or PART_BYTES, MAX_BLOB // 2)


def is_copy_file(name: str) -> bool:
    """Whether ``name`` is the name of a file of a copy (this format's or the previous one's)."""
    return bool(_NAME.fullmatch(name) or _OLD_NAME.fullmatch(name))


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

    def names(self) -> list[str]:
        """Every file this version is made of."""
        out = [n for seg in self.segments for n in seg] + list(self.pages)
        out += [self.head] if self.head else []
        out += [self.dict] if self.dict else []
        return out + list(self.vectors)


class _OldManifest(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    segments: list[str]
    table: str
    vectors: list[str] = msgspec.field(default_factory=list)
    model: Optional[str] = None
    made: Optional[str] = None
    of: Optional[str] = None


class _Format(msgspec.Struct, forbid_unknown_fields=False):
    format: str


class _Segment(msgspec.Struct, array_like=True):
    """A part of a segment (the whole of a small one; in lnkmem-copy-3 always the whole)."""
    pids: bytes
    lens: bytes
    refs: list[str]
    terms: list[bytes]
    postings: list[bytes]
    passages: list[bytes]


class _Page(msgspec.Struct, array_like=True):
    files: list[tuple[str, bytes]]  # (ref, its FileRec as the index stores it), refs ascending


class _Head(msgspec.Struct, array_like=True):
    tombs: list[bytes]  # for each segment, its passages no longer live (u32, ascending)
    next_pid: int
    model: Optional[str]
    of: Optional[str] = None


class _Table(msgspec.Struct, array_like=True):  # lnkmem-copy-3's: the head and the whole table in one
    files: list[tuple[str, bytes]]
    dead: bytes
    next_pid: int
    model: Optional[str]
    of: Optional[str] = None
    zdict: Optional[bytes] = None


class _Vectors(msgspec.Struct, array_like=True):
    pids: bytes
    rows: bytes  # n x (dim int8 + 4-byte scale)
    dim: int


def _pack(obj) -> bytes:
    return zlib.compress(encoder.encode(obj), 3)


def blob_name(kind: str, blob: bytes) -> str:
    return f"{kind}-{hashlib.sha256(blob).hexdigest()[:40]}-{len(blob)}.bin"


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
        fmt = msgspec.json.decode(data, type=_Format).format
        if fmt == FORMAT:
            return msgspec.json.decode(data, type=Manifest)
        if fmt == OLD_FORMAT:
            o = msgspec.json.decode(data, type=_OldManifest)
            return Manifest(OLD_FORMAT, [[s] for s in o.segments], [o.table], "", None, o.vectors,
                            o.model, o.made, o.of)
    except msgspec.DecodeError as e:
        raise CopyDamaged(f"the manifest is not understood: {e}") from None
    raise CopyDamaged(f"copy format {fmt!r} is not {FORMAT!r}")


# --- local state of the cache relative to the copy ------------------------------------

class CopyState(msgspec.Struct):
    version: Optional[str] = None  # the copy version this cache is of
    gen: int = -1  # the cache generation last written to (or read from) the copy
    seg_mark: int = 0  # the cache's next segment number when this version was written (or read)
    vectors: list[str] = msgspec.field(default_factory=list)
    vec_model: Optional[str] = None
    pages: list[str] = msgspec.field(default_factory=list)
    named: list[str] = msgspec.field(default_factory=list)  # every file the copy at `version` is made of
    # files sent by this cache but named by no manifest it wrote (a write-back killed or
    # beaten to the manifest), or named by a version this cache replaced and not yet
    # deleted: each deleted at a later write-back unless a manifest names it again
    doomed: list[str] = msgspec.field(default_factory=list)
    # the copy's files are not all known here (a damaged version, one loaded renumbered
    # or of the previous format): the write-back that replaces it deletes every file of
    # the place its new manifest does not name
    sweep: bool = False
    # loaded into a cache that knew nothing of the copy (a new machine): files of the place
    # that no manifest names (a writer killed once its manifest was on its way left them)
    # are unknown here; the next sweep lists the place once and dooms them
    unknown: bool = False


class _CopySeg(msgspec.Struct, array_like=True):
    """One segment of the copy as the cache knows it: its parts, every passage id it holds,
    which are live in it, and each live passage's digest (its stored bytes): a local
    segment made since (a merge) whose live passages are all these, by id and digest,
    needs nothing sent."""
    parts: list[str]
    pids: bytes  # u32
    live: bytes  # one byte a pid
    sums: bytes  # u64 a pid (0 where not live)


class _CopySegs(msgspec.Struct, array_like=True):
    version: Optional[str]
    segs: list[_CopySeg]


def _digests(blobs: list) -> np.ndarray:
    """Each stored passage's 64-bit digest (0 for none)."""
    out = np.zeros(len(blobs), np.uint64)
    for i, b in enumerate(blobs):
        if b:
            out[i] = int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little") | 1
    return out


def _copy_segs(r: Reading, state: "CopyState") -> list:
    """The copy's segments as recorded for the version the cache is of ([] when unknown)."""
    raw = r.meta(b"copy-segs")
    if not raw or state.version is None or state.sweep:
        return []
    try:
        cs = msgspec.msgpack.decode(raw, type=_CopySegs)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
    known = set(state.named)
    if cs.version != state.version or not all(n in known for c in cs.segs for n in c.parts):
        return []
    return cs.segs


def copy_state(store: Store) -> CopyState:
    raw = store.get_meta(b"copy")
    if not raw:
        return CopyState()
    try:
        return msgspec.msgpack.decode(raw, type=CopyState)
    except (msgspec.DecodeError, msgspec.ValidationError):  # a cache of the previous format's copy
        try:
            old = msgspec.msgpack.decode(raw)
            version = old.get("version") if isinstance(old, dict) else None
        except msgspec.DecodeError:
            version = None
        return CopyState(version=version if isinstance(version, str) else None, sweep=True)


def _put_state(w: Writing, state: CopyState) -> None:
    w.put_meta(b"copy", msgspec.msgpack.encode(state))


def _state_in(r: Reading) -> CopyState:
    raw = r.meta(b"copy")
    if not raw:
        return CopyState()
    try:
        return msgspec.msgpack.decode(raw, type=CopyState)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return CopyState(sweep=True)


def dirty(store: Store, state: Optional[CopyState] = None) -> bool:
    """Whether the cache holds anything the copy does not."""
    state = state or copy_state(store)
    with store.reading() as r:
        gen = r.meta_int(b"gen")
        pending = r.count("vec_pending")
    return state.version is None or gen != state.gen or pending > 0


def note_sent(store: Store, names: Iterable[str]) -> None:
    """Files about to be sent: remembered (before they are) so that one no manifest ends
    up naming is deleted later, even after a kill (§7.3 rev. 3)."""
    with store.writing() as w:
        state = _state_in(w)
        have = set(state.doomed) | set(state.named)
        new = [n for n in names if n not in have]
        if new:
            state.doomed = state.doomed + new
            _put_state(w, state)


def note_unknown(store: Store, found: Iterable[str]) -> None:
    """The place was listed (``found``: its copy files): those the version this cache holds
    does not name are doomed, and the place is not listed again for them."""
    with store.writing() as w:
        state = _state_in(w)
        have = set(state.doomed) | set(state.named)
        state.doomed = state.doomed + [n for n in found if n not in have]
        state.unknown = False
        _put_state(w, state)


def forget_doomed(store: Store, gone: Iterable[str]) -> None:
    """Files deleted from the copy's place: nothing is left to do about them."""
    gone = set(gone)
    if not gone:
        return
    with store.writing() as w:
        state = _state_in(w)
        state.doomed = [n for n in state.doomed if n not in gone]
        _put_state(w, state)


# --- export: what a write-back sends, one file at a time -----------------------------------

MAX_VECTOR_CHUNKS = 16


class Export:
    """Everything needed to make the copy equal to the cache now, read in one read txn.

    ``blobs`` yields (name, bytes) of each file the copy lacks, one at a time, made as
    it is asked for (a write-back sends each before the next is made); once it is
    exhausted, ``manifest`` is the version they make."""

    def __init__(self, store: Store, state: CopyState, of: Optional[str], part: Optional[int] = None,
                 page_group: int = PAGE_GROUP_BYTES):
        self.store = store
        self.state = state
        self.of = of
        self.part = part or part_bytes()
        self.page_group = page_group  # the file table's bytes held at once, about
        self.gen = -1
        self.copy_segs: list[_CopySeg] = []  # the copy's segments this export makes
        self.seg_mark = 0
        self.compacted = False
        self.pages: list[str] = []
        self.vec_sent: list[int] = []  # pending vectors this export carries
        self.sent: list[str] = []
        self._manifest: Optional[Manifest] = None
        self.blobs: Iterator[tuple[str, bytes]] = self._make()

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            raise RuntimeError("the export's files are not all made yet")
        return self._manifest

    def _out(self, kind: str, obj) -> tuple[str, bytes]:
        blob = obj if isinstance(obj, bytes) else _pack(obj)
        if len(blob) > MAX_BLOB:  # never made: no part holds more than one item over `part`
            raise ValueError(f"a {kind} file of {len(blob)} bytes, over {MAX_BLOB}")
        return blob_name(kind, blob), blob

    def _make(self) -> Iterator[tuple[str, bytes]]:
        store, state = self.store, self.state
        known = set(state.named)
        with store.reading() as txn:
            self.gen = txn.meta_int(b"gen")
            raw_model = txn.meta(b"model")
            model = raw_model.decode() if raw_model else None
            self.seg_mark = txn.meta_int(b"next_seg")
            dead = txn.dead_ids()
            kept, todo = self._plan(txn, dead)
            segments: list[list[str]] = [c.parts for c in kept]
            self.copy_segs = list(kept)
            for sk in todo:
                names = []
                for name, blob in self._segment(txn, sk, dead):
                    names.append(name)
                    if name not in known:
                        self.sent.append(name)
                        yield name, blob
                self.copy_segs.append(_CopySeg(names, *self._made))
                segments.append(names)
            # the file table, in pages: a page is made of the files whose ref falls in it
            files = txn.count("files")
            pages = len(state.pages)
            if not pages or not FILES_A_PAGE // 4 * pages <= files <= FILES_A_PAGE * 4 * pages:
                pages = 1
                while pages * FILES_A_PAGE < files:
                    pages *= 2
            # made a group of pages at a time, each group a walk of the table (~8 MiB of
            # records held at once: at 10x the whole table held was ~35 MiB of objects)
            held = txn.table_bytes("files")
            groups = max(1, min(pages, -(-held // self.page_group)))
            for g in range(groups):
                lo, hi = g * pages // groups, (g + 1) * pages // groups
                by_page: list[list] = [[] for _ in range(lo, hi)]
                for i, (ref, rec) in enumerate(txn.files()):  # a long ref's record keyed by its digest
                    p = page_of(ref, pages)
                    if lo <= p < hi:
                        by_page[p - lo].append((ref, rec))
                    if i % 8192 == 8191:
                        store.let_go()  # the map's pages the walk read (10x: 120 MiB by its end)
                for p in range(lo, hi):
                    name, blob = self._out("page", _Page(by_page[p - lo]))
                    by_page[p - lo] = None  # type: ignore[call-overload]
                    self.pages.append(name)
                    if name not in known:
                        self.sent.append(name)
                        yield name, blob
                del by_page
            tombs = []
            for c in self.copy_segs:
                pids = np.frombuffer(c.pids, "<u4")
                tombs.append(np.sort(pids[np.frombuffer(c.live, np.uint8) == 0]).astype("<u4").tobytes())
            hname, blob = self._out("head", _Head(tombs, txn.meta_int(b"next_pid"), model, self.of))
            if hname not in known:
                self.sent.append(hname)
                yield hname, blob
            zdict = txn.meta(b"zdict")
            dname = None
            if zdict:
                dname, blob = self._out("dict", _pack(bytes(zdict)))
                if dname not in known:
                    self.sent.append(dname)
                    yield dname, blob
            # vectors: chunks of those made since the last write; all of them anew
            # when the model changed, the chunks pile up, or passage ids were given again
            # since the last write (an old chunk names the id's former passage)
            vec_names = list(state.vectors)
            reuse = txn.meta(b"pid_reuse")
            rebuild = (state.vec_model != model or len(vec_names) >= MAX_VECTOR_CHUNKS
                       or (reuse is not None and int(reuse) > state.gen)
                       or not all(n in known for n in vec_names))
            self.vec_sent = txn.pending_vector_ids()
            if rebuild:
                vec_names = []
                source = txn.vectors()
            else:
                source = ((p, txn.vector(p)) for p in self.vec_sent)
            pids, rows, size = [], [], 0
            for p, v in source:
                if v:
                    pids.append(p)
                    rows.append(bytes(v))
                    size += len(v) + 4
                    if size >= self.part:
                        name, blob = self._vectors(pids, rows)
                        pids, rows, size = [], [], 0
                        vec_names.append(name)
                        if name not in known:
                            self.sent.append(name)
                            yield name, blob
            if rows:
                name, blob = self._vectors(pids, rows)
                vec_names.append(name)
                if name not in known:
                    self.sent.append(name)
                    yield name, blob
        self._manifest = Manifest(FORMAT, segments, self.pages, hname, dname,
                                  vec_names, model, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), self.of)

    def _vectors(self, pids: list, rows: list) -> tuple[str, bytes]:
        return self._out("vec", _Vectors(np.asarray(pids, "<u4").tobytes(), b"".join(rows), len(rows[0]) - 4))

    def _plan(self, txn, dead: np.ndarray) -> tuple[list, list]:
        """(the copy's segments kept, each with its passages live now; the local segments
        sent anew). The copy follows its own policy, not the local merger's: a local
        segment whose live passages the copy holds already (one the copy was written or
        read with, or made since by merging such: the same ids and digests) sends nothing;
        a copy segment keeps its file while any of its passages is live, the rest marked
        in the head; once more than half of the copy's passages are not live, or it has
        more than MAX_COPY_SEGMENTS segments, it is written anew whole (compacted)."""
        state = self.state
        old = _copy_segs(txn, state)
        every = txn.segment_keys()
        if not old:
            return [], every

        def local():  # each segment's ids, one segment at a time (10x: 10 MB for all of them)
            for sk in every:
                stored, _ = seg_codec.stored(txn.segment(sk))
                yield int.from_bytes(sk, "big"), sk, np.frombuffer(stored.pids, "<u4").astype(np.int64)
        # every passage live in the copy: (id, its segment, its digest), by id
        hp, hc, hs = [], [], []
        for ci, c in enumerate(old):
            live = np.frombuffer(c.live, np.uint8) == 1
            hp.append(np.frombuffer(c.pids, "<u4")[live].astype(np.int64))
            hc.append(np.full(int(live.sum()), ci, np.int64))
            hs.append(np.frombuffer(c.sums, "<u8")[live])
        hp_a, hc_a, hs_a = np.concatenate(hp), np.concatenate(hc), np.concatenate(hs)
        if not len(hp_a) or len(old) > MAX_COPY_SEGMENTS:  # nothing live, or too many files to load
            self.compacted = True
            return [], every
        order = np.argsort(hp_a, kind="stable")
        hp_a, hc_a, hs_a = hp_a[order], hc_a[order], hs_a[order]
        held_p, held_c = [], []
        todo = []
        for seg, sk, pids in local():
            at = np.searchsorted(dead, pids)
            live = pids[~((at < len(dead)) & (dead[np.minimum(at, max(len(dead) - 1, 0))] == pids))] \
                if len(dead) else pids
            if not len(live):
                continue
            j = np.minimum(np.searchsorted(hp_a, live), len(hp_a) - 1)
            ok = hp_a[j] == live
            if ok.all() and seg >= state.seg_mark:  # made since: a merge of the copy's, or ids given again
                for a in range(0, len(live), 4096):  # (a few MiB of passages at a time)
                    some = live[a:a + 4096].tolist()
                    blobs = [txn.passage(p) for p in some]
                    if not (hs_a[j[a:a + 4096]] == _digests([bytes(b) if b is not None else b"" for b in blobs])).all():
                        ok = np.zeros(len(live), bool)
                        break
            if ok.all():
                held_p.append(live)
                held_c.append(hc_a[j])
            else:
                todo.append(sk)
        kept_p = np.concatenate(held_p) if held_p else np.empty(0, np.int64)
        kept_c = np.concatenate(held_c) if held_c else np.empty(0, np.int64)
        kept = []
        total = still = 0
        for ci, c in enumerate(old):
            mine = np.sort(kept_p[kept_c == ci])
            pids = np.frombuffer(c.pids, "<u4").astype(np.int64)
            if not len(mine):
                continue
            at = np.minimum(np.searchsorted(mine, pids), len(mine) - 1)
            live = (mine[at] == pids)
            kept.append(_CopySeg(c.parts, c.pids, live.astype(np.uint8).tobytes(),
                                 np.where(live, np.frombuffer(c.sums, "<u8"), 0).astype("<u8").tobytes()))
            total += len(pids)
            still += int(live.sum())
        if total and (total - still) * 2 > total:  # more than half of what the copy holds is not live
            self.compacted = True
            return [], every
        return kept, todo

    def _segment(self, txn, sk: bytes, dead: np.ndarray) -> Iterator[tuple[str, bytes]]:
        """The parts of one local segment: its passages in id order, then its postings
        in term order, a part closed once it holds `part` bytes (so a part holds one
        item over it at most). Sets ``_made``: its ids, which are live, their digests."""
        store = self.store
        stored, runs = seg_codec.stored(txn.segment(sk))
        pids = np.frombuffer(stored.pids, "<u4")
        lens = stored.lens
        if len(dead) and len(pids):
            p64 = pids.astype(np.int64)
            at = np.minimum(np.searchsorted(dead, p64), len(dead) - 1)
            live = ~(dead[at] == p64)
            del p64, at
        else:
            live = np.ones(len(pids), bool)
        sums = np.zeros(len(pids), np.uint64)
        ref_at = np.repeat(np.arange(len(stored.names), dtype=np.int32), runs)
        cur: dict = {"i0": 0, "refs": [], "passages": [], "terms": [], "postings": [], "size": 0}
        made = 0

        def close(i: int) -> tuple[str, bytes]:
            store.let_go()  # the map's pages read for this part, the heap it freed
            a = cur["i0"]
            part = _Segment(pids[a:i].tobytes(), bytes(lens[4 * a:4 * i]), cur["refs"], cur["terms"],
                            cur["postings"], cur["passages"])
            cur.update(i0=i, refs=[], passages=[], terms=[], postings=[], size=0)
            return self._out("seg", part)

        names = stored.names
        n = len(pids)
        for i in range(n):
            blob = txn.passage(int(pids[i]))
            blob = bytes(blob) if blob is not None and live[i] else b""
            if blob:
                sums[i] = int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") | 1
            ref = names[ref_at[i]]
            cur["refs"].append(ref)
            cur["passages"].append(blob)
            cur["size"] += len(blob) + len(ref) + 12
            if cur["size"] >= self.part:
                yield close(i + 1)
                made += 1
        for t, v in txn.segment_postings(sk):
            cur["terms"].append(t)
            cur["postings"].append(bytes(v))
            cur["size"] += len(t) + len(v) + 8
            if cur["size"] >= self.part:
                yield close(n)
                made += 1
        if cur["size"] or not made or cur["i0"] < n:
            yield close(n)
        self._made = (pids.tobytes(), live.astype(np.uint8).tobytes(), sums.astype("<u8").tobytes())


def export(store: Store, state: CopyState, of: Optional[str] = None, part: Optional[int] = None,
           page_group: int = PAGE_GROUP_BYTES) -> Export:
    """The files that make the copy equal to the cache now (:class:`Export`)."""
    return Export(store, state, of, part, page_group)


def written(store: Store, exp: Export, version: str) -> CopyState:
    """Record that the copy is now ``version``, made of ``exp``: what it names, and the
    files no longer named (doomed: deleted once the manifest has landed). The new state."""
    m = exp.manifest
    with store.writing() as w:
        for p in exp.vec_sent:
            w.drop_pending_vector(p)
        old = _state_in(w)
        named = m.names()
        keep = set(named)
        doomed = [n for n in dict.fromkeys(old.doomed + old.named + exp.sent) if n not in keep]
        state = CopyState(version, exp.gen, exp.seg_mark, m.vectors, m.model, m.pages, named, doomed,
                          unknown=old.unknown)  # still to be listed: the place may hold files no one knows
        _put_state(w, state)
        w.put_meta(b"copy-segs", msgspec.msgpack.encode(_CopySegs(version, exp.copy_segs)))
    return state


# --- verify and load: every file checked, one at a time, before the copy is kept -----------

class Verified:
    """A copy that passed every check: its manifest, the files of its table, how many
    passages it holds, whether its ids are renumbered at load."""

    def __init__(self, manifest: Manifest, refs: list, passages: int, renumbered: bool, fetch=None):
        self.manifest, self.refs, self.passages, self.renumbered = manifest, refs, passages, renumbered
        self.fetch = fetch


def _bad(why: str) -> CopyDamaged:
    return CopyDamaged(why)


def blob_size(name: str) -> Optional[int]:
    """The length a file's name says it has (None: a name of the previous format)."""
    m = _NAME.fullmatch(name)
    return int(m.group(2)) if m else None


def _blob(fetch: Callable[[str], bytes], name: str) -> bytes:
    """A file's decompressed content, once its name is the hash of its content. A file
    whose name says it is over the bound is refused before it is fetched."""
    size = blob_size(name)
    limit = MAX_BLOB if size is not None else OLD_MAX_BLOB
    if size is not None and size > MAX_BLOB:
        raise _bad(f"{name} is {size} bytes, over {MAX_BLOB}")
    data = fetch(name)
    if len(data) > limit:
        raise _bad(f"{name} is {len(data)} bytes, over {limit}")
    made = blob_name(name.split("-", 1)[0], data)
    if (made if size is not None else made.rsplit("-", 1)[0] + ".bin") != name:
        raise _bad(f"{name}: its content does not match its name")
    limit = RATIO * len(data) + SLACK
    d = zlib.decompressobj()
    try:
        raw = d.decompress(data, limit)
    except zlib.error as e:
        raise _bad(f"{name} does not decompress: {e}") from None
    if d.unconsumed_tail:
        raise _bad(f"{name} decompresses to more than {limit} bytes")
    if not d.eof or d.unused_data:
        raise _bad(f"{name} is truncated or has bytes after its end")
    return raw


def _decode(raw: bytes, typ, name: str):
    try:
        return msgspec.msgpack.decode(raw, type=typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _bad(f"{name} is not understood: {e}") from None


def valid_ref(ref: str, sources: Optional[Iterable[str]]) -> bool:
    """A ref this memory could have made: a known source, then a clean path (or `notes`)."""
    if not isinstance(ref, str) or not ref or len(ref) > 4096 or "\0" in ref or "\\" in ref:
        return False
    source, _, path = ref.partition("/")
    if sources is not None and source not in sources:
        return False
    if source == "notes":
        return path == "" and "/" not in ref
    if source not in ("home", "chats", "skills") or not path:
        return False
    return all(p not in ("", ".", "..") for p in path.split("/"))


def _distinct(a: np.ndarray) -> bool:
    k = np.sort(a)
    return bool((k[1:] != k[:-1]).all())


def _u4(b: bytes, what: str, dtype: str = "<u4") -> np.ndarray:
    if len(b) % 4:
        raise _bad(f"{what}: {len(b)} bytes is no whole number of ids")
    return np.frombuffer(b, dtype)


def _check_names(manifest: Manifest, of: Optional[str]) -> None:
    if of is not None and manifest.of != of:
        raise _bad(f"the copy is not this memory's (it says it is of {manifest.of!r})")
    old = manifest.format == OLD_FORMAT
    names = manifest.names()
    if len(names) > MAX_FILES:
        raise _bad(f"the manifest names {len(names)} files, over {MAX_FILES}")
    if len(set(names)) != len(names):
        raise _bad("the manifest names a file twice")
    pat = _OLD_NAME if old else _NAME
    groups = [("seg", [n for s in manifest.segments for n in s]), ("vec", manifest.vectors)]
    groups += [("table", manifest.pages)] if old else [("page", manifest.pages), ("head", [manifest.head]),
                                                       ("dict", [manifest.dict] if manifest.dict else [])]
    for kind, group in groups:
        for n in group:
            if not isinstance(n, str) or not pat.fullmatch(n) or not n.startswith(kind + "-"):
                raise _bad(f"the manifest names {n!r}, which is no {kind} file name")
    if any(not s for s in manifest.segments):
        raise _bad("the manifest names a segment of no file")
    if not manifest.pages:
        raise _bad("the manifest names no table")
    if manifest.vectors and not manifest.model:
        raise _bad("the copy has vectors but names no model")


def reading_order(manifest: Manifest) -> list[str]:
    """The files of a copy in the order a load reads them."""
    m = manifest
    if m.format == OLD_FORMAT:
        first = m.pages[:1]
    else:
        first = [m.head] + ([m.dict] if m.dict else []) + list(m.pages)
    return first + [n for parts in m.segments for n in parts] + list(m.vectors)


class ReadAhead:
    """A copy's files fetched and checked (their hash, their decompression) one ahead of
    the reader, on a thread of its own: the bridge's transfer, the hash and zlib run
    while the reader checks and writes the file before (each lets go of the GIL), and at
    most two files are held at once. A file asked out of order is fetched then."""

    def __init__(self, fetch: Callable[[str], bytes], names: Iterable[str]):
        from concurrent.futures import ThreadPoolExecutor
        self.fetch = fetch
        self.names = list(names)
        self.at = 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="lnkmem-copy-read")
        self.ahead = None  # (name, future) of the next file
        self._next()

    def _next(self) -> None:
        self.ahead = None
        if self.at < len(self.names):
            name = self.names[self.at]
            self.at += 1
            self.ahead = (name, self.pool.submit(_blob, self.fetch, name))

    def __call__(self, name: str) -> bytes:
        if self.ahead is None or self.ahead[0] != name:
            return _blob(self.fetch, name)
        got = self.ahead[1]
        self._next()  # (queued behind it: it starts once this one is fetched)
        return got.result()

    def close(self) -> None:
        """Nothing more is read: what is ahead is dropped (a transfer under way ends first)."""
        if self.ahead is not None:
            self.ahead[1].cancel()
            self.ahead = None
        self.pool.shutdown(wait=True)


class _Reader:
    """One pass over a copy: each file fetched, checked and (with a write txn) written
    into the cache, then dropped before the next is fetched (the next is fetched and
    checked meanwhile: :class:`ReadAhead`)."""

    def __init__(self, manifest: Manifest, fetch: Callable[[str], bytes], of: Optional[str],
                 sources, width, store: Optional[Store] = None, txns: Optional["_LoadTxns"] = None):
        self.m, self.fetch, self.of, self.width = manifest, fetch, of, width
        self.sources = set(sources) if sources is not None else None
        self.store, self.txns = store, txns
        self.ok_refs: dict[str, bool] = {}  # refs checked that the table does not hold
        self.ref_ix: dict[str, int] = {}  # the table's refs -> their index (filled with its pages)
        self.order: Optional[np.ndarray] = None  # sorted old pids when renumbered: new pid = index + 1
        self.ahead: Optional[ReadAhead] = None  # while it runs

    @property
    def txn(self):
        """The load's write transaction now (None: a check only)."""
        return self.txns.txn if self.txns is not None else None

    def wrote(self, n: int) -> None:
        if self.txns is not None:
            self.txns.wrote(n)

    def check_ref(self, r: str, where: str) -> None:
        if r in self.ref_ix:  # a file of the table: checked with it
            return
        good = self.ok_refs.get(r)
        if good is None:
            if len(self.ok_refs) > 1 << 20:
                self.ok_refs.clear()
            good = self.ok_refs[r] = valid_ref(r, self.sources)
        if not good:
            raise _bad(f"{where} names {r!r}, which is no ref of this memory's sources")

    def remap(self, a: np.ndarray) -> np.ndarray:
        if self.order is None or not len(a):
            return a.astype("<u4")
        return (np.searchsorted(self.order, a) + 1).astype("<u4")

    def run(self) -> Verified:
        _check_names(self.m, self.of)
        self.ahead = ReadAhead(self.fetch, reading_order(self.m))
        try:
            return self._run()
        finally:
            self.ahead.close()
            self.ahead = None

    def blob(self, name: str) -> bytes:
        """A file of the copy, fetched and checked (read ahead while the reader runs)."""
        return self.ahead(name) if self.ahead is not None else _blob(self.fetch, name)

    def _run(self) -> Verified:
        m = self.m
        old = m.format == OLD_FORMAT
        # the head (dead passages, next id, model, whose) and the dictionary
        if old:  # one dead list for every segment
            table = _decode(self.blob(m.pages[0]), _Table, m.pages[0])
            dead = np.sort(_u4(table.dead, m.pages[0], ">u4").astype(np.int64))
            head = _Head([], table.next_pid, table.model, table.of)
            zdict = table.zdict
            tombs = [dead] * len(m.segments)
        else:
            table = None
            head = _decode(self.blob(m.head), _Head, m.head)
            zdict = _decode(self.blob(m.dict), bytes, m.dict) if m.dict else None
            if len(head.tombs) != len(m.segments):
                raise _bad("the head's dead passages and the manifest's segments disagree")
            tombs = []
            for t in head.tombs:
                a = _u4(t, m.head).astype(np.int64)
                if len(a) > 1 and not (a[1:] > a[:-1]).all():
                    raise _bad("the head's dead passages are not distinct and ascending")
                tombs.append(a)
            head.tombs = []
        if self.of is not None and head.of != self.of:
            raise _bad(f"the copy's table is not this memory's (it says it is of {head.of!r})")
        if head.model != m.model:
            raise _bad("the table and the manifest name different models")
        try:
            textpack.check_dict(zdict)
        except ValueError as e:
            raise _bad(f"the table's passage dictionary is not one the engine makes ({e})") from None
        if not isinstance(head.next_pid, int) or head.next_pid < 1 or head.next_pid > 1 << 32:
            raise _bad(f"the table's next passage id {head.next_pid} is not beyond its passages")
        # the table's pages: each file's record (written as read), and who owns which passage
        refs: list[str] = []
        ref_ix: dict[str, int] = {}
        owned_p = array("q")  # every file's passage ids, one after the other (no object a file)
        owned_r = array("q")  # ... and the index of the file owning each
        npages = len(m.pages)
        for i, name in enumerate(m.pages):
            files = table.files if old else _decode(self.blob(name), _Page, name).files
            items = []
            for ref, rec_raw in files:
                if not valid_ref(ref, self.sources):  # (each once: not kept, see check_ref)
                    raise _bad(f"{name} names {ref!r}, which is no ref of this memory's sources")
                if ref in ref_ix:
                    raise _bad(f"the table names {ref!r} twice")
                if not old and page_of(ref, npages) != i:
                    raise _bad(f"{name} holds {ref!r}, which is not of its page")
                try:
                    rec = file_decoder.decode(rec_raw)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    raise _bad(f"the table's record of {ref!r} is not understood") from None
                if rec.size < 0 or rec.kind not in ("text", "name"):
                    raise _bad(f"the table's record of {ref!r} is not sane")
                ix = ref_ix[ref] = len(refs)
                refs.append(ref)
                if rec.pids:
                    p = rec.pids  # (ints: the record's type says so)
                    if min(p) < 0 or max(p) >= 1 << 32:
                        raise _bad(f"the table gives {ref!r} a passage that is not its own live one")
                    owned_p.extend(p)
                    owned_r.extend(array("q", (ix,)) * len(p))
                items.append((file_key(ref), file_value(ref, rec_raw)))  # any length (LMDB keys ≤ 511 bytes)
            if self.txn is not None and items:
                items.sort()
                self.txn.put_files(items)
                self.wrote(sum(len(k) + len(v) for k, v in items))
            del files, items
        table = None
        owned = np.frombuffer(owned_p, np.int64) if owned_p else np.empty(0, np.int64)
        owner = np.frombuffer(owned_r, np.int64) if owned_r else np.empty(0, np.int64)
        # every live passage of the copy is a file's, never twice (and in one segment: below)
        by = np.argsort(owned, kind="stable")
        every, whose = owned[by], owner[by]
        del by, owned, owner, owned_p, owned_r
        if len(every) > 1 and not (every[1:] != every[:-1]).all():
            raise _bad("the table gives a passage to two files")
        top = int(every[-1]) if len(every) else 0
        if head.next_pid < top + 1:
            raise _bad(f"the table's next passage id {head.next_pid} is not beyond its passages")
        if head.next_pid > SPARSE * len(every) + DENSE_SLACK:  # ids never size an allocation
            self.order = every
            if self.txn is not None:
                self._renumber_files()
        seen = np.zeros(len(every), bool)
        self.ref_ix = ref_ix
        # segments, part by part
        next_seg = self.txn.meta_int(b"next_seg") if self.txn is not None else 1
        seg_map: dict[int, list[str]] = {}
        self.copy_segs: list[_CopySeg] = []
        for parts, tomb in zip(m.segments, tombs):
            self._segment(parts, every, whose, seen, zdict, next_seg, tomb, check_tomb=not old)
            seg_map[next_seg] = list(parts)
            next_seg += 1
        del tombs
        if not seen.all():
            raise _bad("the table's files and the segments' live passages disagree")
        vecs = self._vectors(head)
        if self.txn is not None:
            txn = self.txn
            if m.model:
                txn.put_meta(b"model", m.model.encode())
            else:
                txn.delete_meta(b"model")
            if zdict:  # the copy's passages are packed with its dictionary
                txn.put_meta(b"zdict", zdict)
            else:
                txn.delete_meta(b"zdict")
            next_pid = len(self.order) + 1 if self.order is not None else head.next_pid
            txn.put_meta(b"next_seg", str(next_seg).encode())
            txn.put_meta(b"next_pid", str(next_pid).encode())
            self.seg_map = seg_map
            self.next_seg = next_seg
        del vecs
        return Verified(m, refs, len(every), self.order is not None, self.fetch)

    def _renumber_files(self) -> None:
        txn = self.txn
        items = []
        for ref, rec in txn.files():
            r = file_decoder.decode(rec)
            new = self.remap(np.asarray(r.pids, np.int64)).tolist() if r.pids else []
            items.append((file_key(ref), file_value(ref, encoder.encode(FileRec(r.version, r.size, new, r.kind, r.mtime)))))
        txn.put_files(items)
        self.wrote(sum(len(k) + len(v) for k, v in items))

    def _segment(self, parts: list[str], every, whose, seen, zdict, seg: int, tomb: np.ndarray,
                 check_tomb: bool = True) -> None:
        """One segment, part by part: its live passages (those not in ``tomb``; checked
        against the table, each in one segment only), then its postings (each list's ids
        those of the segment's passages, checked in batches; the dead ones' postings
        dropped). Only the live passages reach the cache."""
        names: list[str] = []
        runs: list[int] = []
        pid_parts: list[np.ndarray] = []  # the copy's ids, all
        new_parts: list[np.ndarray] = []  # the cache's (renumbered or not), live ones
        len_parts: list[bytes] = []
        rec_p, rec_l, rec_s = [], [], []  # for the cache's record of the copy's segments
        held: Optional[np.ndarray] = None  # the segment's pids, sorted, once its postings begin
        prev: Optional[bytes] = None
        sk = id_key(seg)
        tombed = 0
        nt = len(tomb)
        self._tomb = tomb
        self._tomb_mask = None  # the dead ids as a mask, when they are few enough
        if nt and int(tomb[-1]) < MASK_IDS:
            self._tomb_mask = np.zeros(int(tomb[-1]) + 1, bool)
            self._tomb_mask[tomb] = True
        for name in parts:
            raw = self.blob(name)
            s = _decode(raw, _Segment, name)
            pids = _u4(s.pids, name).astype(np.int64)
            n = len(pids)
            if len(s.lens) != 4 * n or len(s.refs) != n or len(s.passages) != n or len(s.terms) != len(s.postings):
                raise _bad(f"{name}: its lengths disagree")
            if n and held is not None:
                raise _bad(f"{name}: passages after the segment's postings")
            if n:
                if nt:
                    at = np.minimum(np.searchsorted(tomb, pids), nt - 1)
                    live = tomb[at] != pids
                else:
                    live = np.ones(n, bool)
                tombed += n - int(live.sum())
                lp = pids[live]
                li = np.flatnonzero(live)
                at = np.minimum(np.searchsorted(every, lp), max(len(every) - 1, 0))
                if len(lp) and (not len(every) or not (every[at] == lp).all()):
                    raise _bad(f"{name}: a live passage no file of the table has")
                if seen[at].any() or not _distinct(at):
                    raise _bad(f"{name}: a passage is in two segments")
                seen[at] = True
                refs = s.refs if len(li) == n else [s.refs[i] for i in li.tolist()]
                for r in set(refs):
                    self.check_ref(r, name)
                get = self.ref_ix.get
                ix = np.fromiter(map(get, refs, itertools.repeat(-2, len(refs))), np.int64, len(refs))
                if not (whose[at] == ix).all():
                    raise _bad(f"{name}: the table gives a file a passage of another")
                blobs = s.passages if len(li) == n else [s.passages[i] for i in li.tolist()]
                self._check_passages(name, blobs, refs, pids[li], zdict, RATIO * len(raw) + SLACK)
                # the segment's refs as runs (a file's passages follow one another): where the
                # file index changes (each ref's index is its own: checked against whose above)
                if len(ix):
                    starts = np.flatnonzero(np.concatenate(([True], ix[1:] != ix[:-1])))
                    counts = np.diff(np.append(starts, len(ix))).tolist()
                    run_refs = [refs[i] for i in starts.tolist()]
                    if names and names[-1] == run_refs[0]:
                        runs[-1] += counts[0]
                        run_refs, counts = run_refs[1:], counts[1:]
                    names.extend(run_refs)
                    runs.extend(counts)
                new = self.remap(lp)
                pid_parts.append(pids)
                new_parts.append(new)
                lens = np.frombuffer(s.lens, "<u4")
                len_parts.append(lens[live].tobytes())
                rec_p.append(pids)
                rec_l.append(live)
                sums = np.zeros(n, np.uint64)
                sums[li] = _digests(blobs)
                rec_s.append(sums)
                if self.txn is not None:
                    keys = new.astype(">u4").tobytes()  # (each id's key: 4 bytes, big-endian)
                    items = zip((keys[i:i + 4] for i in range(0, len(keys), 4)), blobs)
                    if len(new) > 1 and not (new[1:] > new[:-1]).all():  # (a part's ids ascend)
                        items = sorted(items)
                    self.txn.put_passages(items)
                    del items, keys
                del blobs
            if s.terms:
                if held is None:
                    held = np.sort(np.concatenate(pid_parts)) if pid_parts else np.empty(0, np.int64)
                    pid_parts = []
                terms = s.terms  # (each compared in C: 10^7 terms at 10x)
                if (prev is not None and terms[0] <= prev) or not all(map(bytes.__lt__, terms, terms[1:])) \
                        or min(map(len, terms)) < 1 or max(map(len, terms)) > MAX_TERM:
                    raise _bad(f"{name}: its terms are not distinct, sorted and short")
                prev = terms[-1]
                self._postings(name, s, held, sk)
            self.wrote(len(raw))  # (about what this part wrote: its passages and postings, decompressed)
            del raw, s
            if self.store is not None:
                self.store.let_go()  # (LMDB's dirty pages stay until the commit)
        if check_tomb and tombed != nt:
            raise _bad("the head marks dead passages its segment does not hold")
        lens = b"".join(len_parts)
        pids_all = np.concatenate(new_parts) if new_parts else np.empty(0, "<u4")
        if self.txn is not None:
            if len(pids_all):
                self.txn.put_segment(sk, seg_codec.encode_runs(pids_all.astype("<u4").tobytes(), lens, names,
                                                                np.asarray(runs, np.int64)))
            cat = (lambda xs, d: np.concatenate(xs) if xs else np.empty(0, d))
            self.copy_segs.append(_CopySeg(list(parts), cat(rec_p, np.int64).astype("<u4").tobytes(),
                                           cat(rec_l, bool).astype(np.uint8).tobytes(),
                                           cat(rec_s, np.uint64).astype("<u8").tobytes()))

    def _check_passages(self, name: str, blobs: list, refs: list, pids: np.ndarray, zdict, room: int) -> None:
        """Each live passage of a part is one the engine makes, of the ref its segment
        says, all of them decompressing to at most ``room`` bytes."""
        if not all(blobs):
            raise _bad(f"{name}: live passage {int(pids[blobs.index(b'')])} has no text")
        try:
            raws = textpack.unpack_many(blobs, zdict, room)
        except textpack.BadPassage as e:
            raise _bad(f"{name}: passage {int(pids[e.index])} is not understood ({e})") from None
        dec = passage_decoder.decode
        try:
            got = [p.ref for p in map(dec, raws)]
        except (msgspec.DecodeError, msgspec.ValidationError):
            for i, r in enumerate(raws):
                try:
                    dec(r)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    raise _bad(f"{name}: passage {int(pids[i])} is not understood") from None
            raise
        if got != refs:
            i = next(i for i, (a, b) in enumerate(zip(got, refs)) if a != b)
            raise _bad(f"{name}: passage {int(pids[i])} names another ref than its segment")

    def _postings(self, name: str, s: _Segment, held: np.ndarray, sk: bytes) -> None:
        n = len(held)
        vals = s.postings
        top = int(held[-1]) if n else -1
        if n and (top < 4 * n + DENSE_SLACK or top < MASK_IDS):  # a mask of the segment's ids: one gather a posting
            mask = np.zeros(top + 1, bool)
            mask[held] = True

            def mask_ok(pp: np.ndarray) -> bool:
                return int(pp.max()) <= top and bool(mask[pp].all())
        else:
            def mask_ok(pp: np.ndarray) -> bool:
                at = np.minimum(np.searchsorted(held, pp), n - 1)
                return bool((held[at] == pp).all())
        claims = postings.stated_counts(vals)
        if len(claims) and claims.min() < 0:
            raise _bad(f"{name}: a posting list has a broken length")
        if len(claims) and claims.max() > n:
            raise _bad(f"{name}: a posting list claims more postings than the segment holds")
        upto = np.cumsum(claims)
        a = 0
        while a < len(vals):
            # a batch: lists whose stated counts add up to CHECK_POSTINGS (a list of more alone)
            below = int(upto[a - 1]) if a else 0
            b = max(int(np.searchsorted(upto, below + CHECK_POSTINGS, side="right")), a + 1)
            try:
                pp, counts = postings.check_many(vals[a:b])
            except ValueError as e:
                raise _bad(f"{name}: {e}") from None
            if len(pp) and (n == 0 or not mask_ok(pp)):
                raise _bad(f"{name}: a posting names a passage the segment does not hold")
            if self.txn is not None:
                batch = list(vals[a:b])
                tomb = self._tomb
                which = []
                if len(tomb) and len(pp):  # the dead passages' postings dropped
                    dead = self._tomb_mask
                    if dead is not None:
                        is_dead = dead[np.minimum(pp, len(dead) - 1)] & (pp < len(dead))
                    else:
                        at = np.minimum(np.searchsorted(tomb, pp), len(tomb) - 1)
                        is_dead = tomb[at] == pp
                    hit = np.bincount(np.repeat(np.arange(len(counts)), counts)[is_dead], minlength=len(counts))
                    which = np.flatnonzero(hit).tolist()
                    if which:
                        if dead is not None:
                            dead[tomb] = True
                            for i, v in zip(which, postings.join_many([[batch[i]] for i in which], dead)):
                                batch[i] = v if v is not None else b""
                        else:
                            for i in which:
                                p, tf = postings.unpack(batch[i])
                                keep = ~np.isin(p.astype(np.int64), tomb)
                                batch[i] = postings.pack(p[keep], tf[keep]) if keep.any() else b""
                if self.order is None:
                    items = zip(map(sk.__add__, s.terms[a:b]), batch)  # (keys made in C)
                    keep = counts > 0  # lists left empty (or sent empty) are not kept
                    if which:
                        keep[which] = [len(batch[i]) > 1 for i in which]
                    if not keep.all():
                        items = itertools.compress(items, keep.tolist())
                else:
                    items = []
                    for t, v in zip(s.terms[a:b], batch):
                        if len(v) > 1:
                            p, tf = postings.unpack(v)
                            items.append((sk + t, postings.pack(self.remap(p.astype(np.int64)), tf)))
                self.txn.put_postings(items, append=True)
            a = b

    def _vectors(self, head: _Head) -> int:
        m = self.m
        dim = None
        live = 0
        for name in m.vectors:
            v = _decode(self.blob(name), _Vectors, name)
            vp = _u4(v.pids, name)
            if not 1 <= v.dim <= MAX_DIM or (dim is not None and v.dim != dim):
                raise _bad(f"{name}: vectors {v.dim} wide, not the copy's width")
            if self.width is not None and self.width[0] == m.model and v.dim != self.width[1]:
                raise _bad(f"{name}: vectors {v.dim} wide, but the model's are {self.width[1]}")
            dim = v.dim
            if len(v.rows) != len(vp) * (v.dim + 4):
                raise _bad(f"{name}: its rows and ids disagree")
            if len(vp) and (int(vp.max()) >= head.next_pid):
                raise _bad(f"{name}: a vector names a passage id the copy never gave")
            if len(vp):
                raw = np.frombuffer(v.rows, np.uint8).reshape(len(vp), v.dim + 4)
                scale = raw[:, v.dim:].copy().view("<f4").ravel()
                if not np.isfinite(scale).all():
                    raise _bad(f"{name}: a vector's scale is not a number")
            if self.txn is not None:
                live += self._load_vectors(v, vp)
        return live

    def _load_vectors(self, v: _Vectors, vp: np.ndarray) -> int:
        txn = self.txn
        width = v.dim + 4
        order = self.order
        live = 0
        items = []
        for i, pid in enumerate(vp.tolist()):
            if order is not None:
                j = int(np.searchsorted(order, pid))
                if j >= len(order) or order[j] != pid:
                    continue
                pid = j + 1
            if txn.passage(pid) is None:
                continue
            items.append((id_key(pid), v.rows[i * width:(i + 1) * width]))
        items.sort()
        txn.put_vectors(items)
        self.wrote(len(items) * (width + 4))
        live += len(items)
        return live


def verify(manifest: Manifest, fetch: Callable[[str], bytes], of: Optional[str] = None,
           sources: Optional[Iterable[str]] = None, width: Optional[tuple[str, int]] = None) -> Verified:
    """Every check of §7.2 on one version of the copy, nothing kept; CopyDamaged at the
    first that fails. ``of``: whose memory this must be; ``sources``: the sources refs
    may name (None: any); ``width``: (model, its vector width) when known."""
    return _Reader(manifest, fetch, of, sources, width).run()


# --- import: the cache becomes one version of the copy ---------------------------------

def load_copy(store: Store, manifest: Manifest, fetch: Callable[[str], bytes], version: str,
              of: Optional[str] = None, sources: Optional[Iterable[str]] = None,
              width: Optional[tuple[str, int]] = None, step: int = LOAD_STEP) -> Verified:
    """Replace the whole cache with this version of the copy, each file fetched, checked and
    written before the next is fetched; CopyDamaged (and the cache as it was) at the first
    check that fails. A cache that holds files is replaced in one write transaction (its
    readers see the old version until the commit); an empty one is written in transactions
    of about ``step`` bytes (LMDB holds a transaction's dirty pages in memory until its
    commit), invisible to readers until the last (the snapshot and the generation move only
    then) and marked as loading until it, so that a load cut short is wiped at the next open."""
    with store.write_lock:
        store.forget_listed()  # (the lock is reentrant) every file replaced
        size = sum(blob_size(n) or 0 for n in manifest.names())
        least = 4 * size + (64 << 20)  # room for what it holds decompressed, ids and B-trees
        v = store.with_map_room(lambda: _load_txn(store, manifest, fetch, version, of, sources, width, step), least)
        store.let_go_of_map()
        memtrim.trim()  # the load's heap handed back before the snapshot is read
        store.reload_snapshot(check=False)  # (the load checked files and passages agree)
        store.let_go()
    return v


def load(store: Store, v: Verified, version: str, fetch: Optional[Callable[[str], bytes]] = None) -> Verified:
    """Load a copy :func:`verify` passed (read and checked again as it is written)."""
    return load_copy(store, v.manifest, fetch or v.fetch, version)


def damaged(store: Store, version: str) -> None:
    """The copy at ``version`` failed its checks: the cache is not of it, and the next
    write-back replaces all of it, conditionally on that version (§7.2)."""
    with store.writing() as w:
        old = _state_in(w)
        _put_state(w, CopyState(version=version, sweep=True, doomed=old.doomed))


class _LoadTxns:
    """A load's write transactions: one for a cache that holds files, or a commit after
    every ``step`` bytes written for an empty one (``step`` None: never), the first commit
    marking the index as loading (:data:`LOADING`) and the last, :meth:`finish`, removing it."""

    def __init__(self, store: Store, step: Optional[int]):
        self.store, self.step = store, step
        self.written = 0
        self._begin()

    def _begin(self) -> None:
        self.txn = self.store.begin_writing()  # (load_copy holds the write lock)
        self._open = True

    def _commit(self) -> None:
        self._open = False
        self.txn.commit()

    def wrote(self, n: int) -> None:
        if self.step is None:
            return
        self.written += n
        if self.written >= self.step:
            self.written = 0
            self.txn.put_meta(LOADING, b"1")
            self._commit()
            self.store.let_go()  # (the map's pages this step read and wrote)
            self._begin()

    def finish(self) -> None:
        self.txn.delete_meta(LOADING)
        self._commit()

    def abort(self) -> None:
        """Leave the cache as it was: this transaction dropped; what earlier steps of an
        empty cache's load committed, dropped too (the cache was empty)."""
        if self._open:
            self._open = False
            self.txn.abort()
        if self.step is not None:
            with self.store.writing() as w:
                if w.meta(LOADING) is not None:
                    w.clear_data()
                    w.delete_meta(LOADING)


def _load_txn(store: Store, manifest: Manifest, fetch, version: str, of, sources, width,
              step: Optional[int]) -> Verified:
    with store.reading() as txn:
        empty = txn.count("files") == 0 and txn.count("passages") == 0
    txns = _LoadTxns(store, step if empty else None)
    try:
        txn = txns.txn
        old = _state_in(txn)
        txn.clear_data()
        r = _Reader(manifest, fetch, of, sources, width, store, txns)
        try:
            v = r.run()
        except (ValueError, IndexError, KeyError, TypeError, OverflowError) as e:
            if isinstance(e, CopyDamaged):
                raise
            # a check this module lacks: still a copy not to load, never a reason to stop
            raise CopyDamaged(f"the copy is not understood ({type(e).__name__}: {e})") from e
        txn = txns.txn
        gen = txn.meta_int(b"gen") + 1
        txn.put_meta(b"gen", str(gen).encode())
        named = manifest.names()
        keep = set(named)
        # the files of the version this cache held (and any it sent) that this one does not
        # name: a writer that was killed once its manifest was on its way never deleted them
        doomed = [n for n in dict.fromkeys(old.doomed + old.named) if n not in keep]
        if v.renumbered or manifest.format != FORMAT:
            # of this version, but every file is sent anew at the next write-back (renumbered:
            # the copy's files are no longer the cache's segments; the previous format: written
            # in this one), and the files of the place it does not name deleted then
            state = CopyState(version, -1, doomed=doomed, sweep=True)
            txn.delete_meta(b"copy-segs")
        else:
            state = CopyState(version, gen, r.next_seg, list(manifest.vectors), manifest.model,
                              list(manifest.pages), named, doomed, unknown=old.version is None)
            txn.put_meta(b"copy-segs", msgspec.msgpack.encode(_CopySegs(version, r.copy_segs)))
        _put_state(txn, state)
        txns.finish()
    except BaseException:
        txns.abort()
        raise
    return v
