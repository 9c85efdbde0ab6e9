"""The cache's state relative to the copy: the version it is of, the files the copy
names, the files doomed (deleted once a manifest that does not name them has landed),
the copy's segments as the cache knows them (ids, live, digests)."""

from __future__ import annotations

import hashlib
import zlib
from typing import Iterable, Optional

import msgspec
import numpy as np

from lnkmem.index.store import Store
from lnkmem.index.tables import Reading, Writing

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
    # `named` may lack files of the copy (a damaged version, one loaded renumbered or of
    # the previous format): the write-back that replaces it deletes every file of the
    # place its new manifest does not name. Kept under its first name, "sweep", in the
    # cache's meta (caches written before still read)
    named_incomplete: bool = msgspec.field(default=False, name="sweep")
    # loaded into a cache that knew nothing of the copy (a new machine): files of the place
    # that no manifest names (a writer killed once its manifest was on its way left them)
    # are unknown here; the next write-back lists the place once (its orphans, below)
    unknown: bool = False
    # files of the place that no version this cache knows names (found by a listing: another
    # writer's files for a manifest still on its way, or ones a killed writer left), each
    # with the copy's version when it was found: a manifest that may still land and name
    # one is conditional on that version, so it is deleted only once the copy is another
    # version that does not name it (:func:`ripe_orphans`)
    orphans: list[tuple[str, str]] = msgspec.field(default_factory=list)
    # the index's content generation (:func:`content_gen`) when it was made this version:
    # unchanged since (merges change no content), a newer version can be applied as a change
    content_gen: int = -1
    partial: bool = False  # the version says it was written before its writer's first look was done


class CopySegment(msgspec.Struct, array_like=True):
    """One segment of the copy as the cache knows it: its parts, every passage id it holds,
    which are live in it, and each live passage's digest (its stored bytes): a local
    segment made since (a merge) whose live passages are all these, by id and digest,
    needs nothing sent."""
    parts: list[str]
    pids: bytes  # u32
    live: bytes  # one byte a pid
    sums: bytes  # u64 a pid (0 where not live)


class CopySegments(msgspec.Struct, array_like=True):
    version: Optional[str]
    segs: list[CopySegment]


def passage_digests(blobs: list) -> np.ndarray:
    """Each stored passage's 64-bit digest (0 for none)."""
    out = np.zeros(len(blobs), np.uint64)
    for i, b in enumerate(blobs):
        if b:
            out[i] = int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little") | 1
    return out


def copy_segments(r: Reading, state: "CopyState") -> list:
    """The copy's segments as recorded for the version the cache is of ([] when unknown)."""
    raw = r.meta(b"copy-segs")
    if not raw or state.version is None or state.named_incomplete:
        return []
    try:
        cs = msgspec.msgpack.decode(raw, type=CopySegments)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
    known = set(state.named)
    if cs.version != state.version or not all(n in known for c in cs.segs for n in c.parts):
        return []
    return cs.segs


def decode_state(raw: Optional[bytes]) -> CopyState:
    """The cache's state as its ``copy`` meta key holds it. A state this format cannot
    read (a cache of the previous format's copy) keeps its version, if it names one, and
    says that the copy's files are not all known (``named_incomplete``)."""
    if not raw:
        return CopyState()
    try:
        return msgspec.msgpack.decode(raw, type=CopyState)
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:
            old = msgspec.msgpack.decode(raw)
            version = old.get("version") if isinstance(old, dict) else None
        except msgspec.DecodeError:
            version = None
        return CopyState(version=version if isinstance(version, str) else None, named_incomplete=True)


def copy_state(store: Store) -> CopyState:
    return decode_state(store.get_meta(b"copy"))


def content_gen(r: Reading) -> int:
    """The generation of the index's last commit (``cgen``: a merge is none), 0 before any."""
    raw = r.meta(b"cgen")
    return int(raw) if raw else 0


PAGE_REFS = b"copy-page-refs:"  # + a table page's number (4 bytes): what the page held, and its name


def page_refs(r: Reading, page: int, name: str) -> Optional[dict[str, int]]:
    """What the copy's table page ``page``, the file ``name``, held in the version the cache
    is of: each ref and the CRC-32 of its record as the page had it (None: not kept for that
    file -- a cache loaded before they were, or a page of another version). A change to the
    page is applied without a walk of every file, and without a look-up of the files whose
    record it did not change."""
    packed = _page_refs_of(r, page, name)
    if packed is None:
        return None
    try:
        return msgspec.msgpack.decode(zlib.decompress(packed), type=dict[str, int])
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError):
        return None


def has_page_refs(r: Reading, page: int, name: str) -> bool:
    """Whether what page ``page``, the file ``name``, holds is kept."""
    return _page_refs_of(r, page, name) is not None


def _page_refs_of(r: Reading, page: int, name: str) -> Optional[bytes]:
    raw = r.meta(PAGE_REFS + page.to_bytes(4, "big"))
    if raw is None:
        return None
    try:
        held_name, packed = msgspec.msgpack.decode(raw, type=tuple[str, bytes])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return packed if held_name == name else None


def page_crcs(files: Iterable[tuple[str, bytes]]) -> bytes:
    """A page's (ref, record) pairs as :func:`page_refs` keeps them: each ref and its record's CRC-32."""
    return zlib.compress(msgspec.msgpack.encode({ref: zlib.crc32(rec) for ref, rec in files}), 1)


def put_page_refs(w: Writing, page: int, name: str, crcs: bytes) -> None:
    """Keep what page ``page`` (the file ``name``) holds (``crcs``: :func:`page_crcs` of its files)."""
    w.put_meta(PAGE_REFS + page.to_bytes(4, "big"), msgspec.msgpack.encode((name, crcs)))


def drop_page_refs(w: Writing, pages: Iterable[int]) -> None:
    """Forget what ``pages`` held (a table paged anew into fewer pages)."""
    for page in pages:
        w.delete_meta(PAGE_REFS + page.to_bytes(4, "big"))


def content_gen_of(store: Store) -> int:
    """:func:`content_gen` of the store now."""
    with store.reading() as r:
        return content_gen(r)


def put_state(w: Writing, state: CopyState) -> None:
    w.put_meta(b"copy", msgspec.msgpack.encode(state))


def state_in(r: Reading) -> CopyState:
    """The state as a transaction reads it (:func:`decode_state`)."""
    return decode_state(r.meta(b"copy"))


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
        state = state_in(w)
        have = set(state.doomed) | set(state.named)
        new = [n for n in names if n not in have]
        if new:
            state.doomed = state.doomed + new
            put_state(w, state)


def note_orphans(store: Store, found: Iterable[str], seen: str) -> None:
    """The place was listed (``found``: its copy files) and the copy was then at version
    ``seen``: the files no version this cache knows names, and none it dooms already, are
    orphans found at ``seen``; the place is not listed again for them (``unknown``)."""
    with store.writing() as w:
        state = state_in(w)
        have = set(state.doomed) | set(state.named) | {n for n, _ in state.orphans}
        state.orphans = state.orphans + [(n, seen) for n in found if n not in have]
        state.unknown = False
        put_state(w, state)


def ripe_orphans(state: CopyState, current: str, named: set) -> list[str]:
    """The orphans no manifest that may still land can name: the copy is ``current`` now, a
    version other than the one each was found at, and does not name them (``named``)."""
    return [n for n, seen in state.orphans if seen != current and n not in named]


def forget_doomed(store: Store, gone: Iterable[str]) -> None:
    """Files deleted from the copy's place: nothing is left to do about them."""
    gone = set(gone)
    if not gone:
        return
    with store.writing() as w:
        state = state_in(w)
        state.doomed = [n for n in state.doomed if n not in gone]
        state.orphans = [o for o in state.orphans if o[0] not in gone]
        put_state(w, state)


