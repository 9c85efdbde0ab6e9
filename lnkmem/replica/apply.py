"""A newer version of the copy applied to the cache as a change (issue 45: a reader pays
for what changed, as Litestream's LTX files, SlateDB's readers and Lightning Stream's
snapshots do): the cache keeps what it holds and fetches only the files it lacks.

The cache is of one version of the copy (its state says which, and what each table page
of it held: each ref and its record's CRC-32), with or without commits of its own since.
The table's pages that differ from that version's say which files the newer one changed,
added or removed; the segments it does not know hold the passages and postings of the
files that changed. Those files are fetched and checked (every check of §7.2 that a file
can take alone: its name is the hash of its content, its sizes are bounded, its refs are
this memory's, its passages and posting lists are ones the engine makes, and every
passage a changed file names is in a new segment, once, of its ref) and the change is
written as one commit of the store (one transaction: a search sees the old version or
the new one, never a mix), its snapshot extended by what changed. The passage ids the
cache gives the new passages are its own; the copy's segments it held keep theirs (and
its record of them), so a write-back after an apply sends what the cache has that the
copy lacks, not the whole index.

Commits of the cache's own since its version (a writer's change the copy does not hold
yet, met by another writer's version: a 412; a writer restarted with a change unsent) are
kept, files the newer version did not change; a file both changed is taken from the
newer version and named in :attr:`Applied.touched`, for its source to be looked at again
(the folder says which is right). A cache with commits of its own stays dirty.

Anything this path cannot do -- another format or dictionary, the table paged anew,
vectors, a changed file whose passages are in a segment the cache knows, new files
past :data:`MOST` of the copy's bytes (and :data:`SMALL`), a file that fails a check -- answers None, and
the caller loads the whole version as before (which calls a damaged copy damaged)."""

from __future__ import annotations

import logging
import zlib
from typing import Callable, Iterable, Optional

import msgspec
import numpy as np

from lnkmem.bridges.place import NotFound
from lnkmem.index.codec import postings, textpack
from lnkmem.index.commit import Batch, NewFile
from lnkmem.index.format import passage_decoder
from lnkmem.index.store import Store
from lnkmem.replica.checks import blob_size, checked_blob, checked_record, decoded, valid_ref
from lnkmem.replica.manifest import FORMAT, RATIO, SLACK, CopyDamaged, Head, Manifest, SegmentPart, TablePage, page_of
from lnkmem.replica.state import (CopySegments, CopyState, content_gen, content_gen_of, copy_segments, copy_state,
                                  page_crcs, page_refs, put_page_refs, put_state)

log = logging.getLogger("lnkmem")

MOST = 0.25  # the new files' bytes, past this share of the copy's (and past SMALL): the whole version is loaded
SMALL = 1 << 20


class Applied:
    """What a change applied: files (re)written, files removed, bytes fetched, and the refs of
    the files the cache had changed itself that the newer version changed too (``touched``)."""

    def __init__(self, changed: int, removed: int, fetched: int, touched: tuple = ()):
        self.changed, self.removed, self.fetched, self.touched = changed, removed, fetched, touched


def apply_change(store: Store, manifest: Manifest, fetch: Callable[[str], bytes], version: str,
                 of: Optional[str] = None, sources: Optional[Iterable[str]] = None) -> Optional[Applied]:
    """Make the cache ``version`` of the copy by applying what changed since the version it
    is of; None where it cannot (nothing written then: load the whole version)."""
    state = copy_state(store)
    with store.reading() as r:
        zdict = r.meta(b"zdict")
        model = r.meta(b"model")
        now = content_gen(r)
    if not _can_apply(state, manifest, model):
        return None
    own = state.content_gen != now  # commits of the cache's own since its version
    known = set(state.named)
    new_pages = [i for i, (a, b) in enumerate(zip(state.pages, manifest.pages)) if a != b]
    new_segs = [parts for parts in manifest.segments if any(n not in known for n in parts)]
    fresh = [manifest.pages[i] for i in new_pages] + [n for parts in new_segs for n in parts]
    total = sum(blob_size(n) or 0 for n in manifest.names())
    new_bytes = sum(blob_size(n) or 0 for n in fresh)
    if new_bytes > MOST * total and new_bytes > SMALL:
        return None
    srcs = set(sources) if sources is not None else None
    try:
        fetched = 0
        head_raw = checked_blob(fetch, manifest.head) if manifest.head not in known else None
        if head_raw is not None:
            fetched += blob_size(manifest.head) or 0
            head = decoded(head_raw, Head, manifest.head)
            if of is not None and head.of != of:
                raise CopyDamaged(f"the copy's table is not this memory's (it says it is of {head.of!r})")
            if head.model != manifest.model:
                raise CopyDamaged("the table and the manifest name different models")
        # the pages that differ: each file's record, against what the cache holds on that page
        wanted: dict[str, object] = {}  # ref -> its record in the new version (changed or new)
        gone: list[str] = []
        npages = len(manifest.pages)
        on_page: dict[int, dict] = {}  # a changed page: its refs (and their records' CRC-32, when kept)
        with store.reading() as r:
            for i in new_pages:
                held_there = page_refs(r, i, state.pages[i])
                if held_there is not None:
                    on_page[i] = held_there
        if len(on_page) < len(new_pages):  # (a cache loaded before pages' refs were kept: a walk)
            on_page = {i: {} for i in new_pages}
            for ref in store.refs_under(""):
                p = page_of(ref, npages)
                if p in on_page:
                    on_page[p][ref] = None
        new_pages_files: dict[int, list] = {}
        for i in new_pages:
            name = manifest.pages[i]
            files = decoded(checked_blob(fetch, name), TablePage, name).files
            fetched += blob_size(name) or 0
            seen = set()
            before = on_page[i]
            for ref, rec_raw in files:
                if not valid_ref(ref, srcs) or ref in seen or page_of(ref, npages) != i:
                    raise CopyDamaged(f"{name} holds {ref!r}, which is no ref of its page")
                seen.add(ref)
                if before.get(ref) is not None and before[ref] == zlib.crc32(rec_raw):
                    continue  # (the same record: the page changed for another file)
                # (a passage id twice, in one record or two: _changed_files refuses it)
                wanted[ref] = checked_record(ref, rec_raw)
            gone.extend(sorted(set(before) - seen))
            new_pages_files[i] = files
        held = store.file_recs(wanted)
        for ref in list(wanted):
            was, rec = held.get(ref), wanted[ref]
            if was is not None and (was.version, was.size, was.kind, was.mtime, len(was.pids)) == \
                    (rec.version, rec.size, rec.kind, rec.mtime, len(rec.pids)):
                del wanted[ref]  # the same file (its page changed for another)
        files, got = _changed_files(wanted, new_segs, fetch, zdict, srcs)
        fetched += got
        touched = _both_changed(store, list(wanted) + gone, on_page, npages) if own else ()
    except (CopyDamaged, NotFound) as e:  # (the whole version's load says whether it is damaged)
        log.info("the copy's newer version is not applied as a change (%s): loaded whole", e)
        return None
    if files is None:
        return None
    batch = Batch(files=files, removed=gone, packed_with=zdict)
    with store.write_lock:
        if content_gen_of(store) != now:  # committed to meanwhile: not the version it was
            return None
        store.commit(batch)
        with store.writing() as w:
            named = manifest.names()
            now_named = set(named)
            held = copy_segments(w, state)  # the copy's segments the cache holds, by the copy's ids
            kept = [c for c in held if all(n in now_named for n in c.parts)]
            has = {n for n, _ in state.orphans}
            # (the files of the version it was of that this one does not name: another writer's
            # to delete; orphans here, deleted once the copy has moved on without them)
            orphans = state.orphans + [(n, version) for n in state.named if n not in now_named and n not in has]
            put_state(w, CopyState(version, state.gen if own else w.meta_int(b"gen"), state.seg_mark, [],
                                   manifest.model, list(manifest.pages), named,
                                   [n for n in state.doomed if n not in now_named], named_incomplete=state.named_incomplete,
                                   unknown=state.unknown, orphans=[o for o in orphans if o[0] not in now_named],
                                   content_gen=state.content_gen if own else content_gen(w)))
            if held:
                w.put_meta(b"copy-segs", msgspec.msgpack.encode(CopySegments(version, kept)))
            else:
                w.delete_meta(b"copy-segs")
            for i, files_there in new_pages_files.items():
                put_page_refs(w, i, manifest.pages[i], page_crcs(files_there))
    return Applied(len(files), len(gone), fetched, touched)


def _both_changed(store: Store, refs: list, on_page: dict, npages: int) -> tuple:
    """Of ``refs`` (the files a change writes or removes), those whose record in the cache is
    not the one the version it is of held (what each page held: ``on_page``): changed here too."""
    out = []
    with store.reading() as r:
        for ref in refs:
            before = on_page[page_of(ref, npages)]
            raw = r.file(ref)
            now = zlib.crc32(raw) if raw is not None else None
            if ref in before and (before[ref] is None or before[ref] != now) or ref not in before and now is not None:
                out.append(ref)
    return tuple(out)


def _can_apply(state: CopyState, m: Manifest, model: Optional[bytes]) -> bool:
    """Whether the cache is of a version of the copy the newer one can be applied to."""
    if state.version is None or not state.pages or not state.named:
        return False
    if m.format != FORMAT or len(m.pages) != len(state.pages) or m.vectors or state.vectors:
        return False
    if (m.model or None) != (model.decode() if model else None):
        return False
    known = set(state.named)
    return m.dict is None and not any(n.startswith("dict-") for n in known) or m.dict in known


def _changed_files(wanted: dict, new_segs: list, fetch, zdict: Optional[bytes], srcs) -> tuple[Optional[list], int]:
    """The changed files as commits take them, from the new segments' parts; (None, bytes)
    when a passage a changed file names is in none of them."""
    slot_of: dict[int, int] = {}  # the copy's id -> its place among the wanted passages
    owner: list[str] = []
    for ref, rec in wanted.items():
        for p in rec.pids:
            if p in slot_of:
                raise CopyDamaged(f"the table gives passage {p} to two files")
            slot_of[p] = len(owner)
            owner.append(ref)
    n = len(owner)
    want = np.fromiter(slot_of, np.int64, n)
    order = np.argsort(want)
    want_sorted, want_slot = want[order], np.asarray(order, np.int64)
    packed: list = [None] * n
    lens = np.zeros(n, np.uint32)
    vocab: dict[str, int] = {}
    rows_slot, rows_term, rows_tf = [], [], []
    fetched = 0
    for parts in new_segs:
        seg_pids: list[np.ndarray] = []
        for name in parts:
            raw = checked_blob(fetch, name)
            fetched += blob_size(name) or 0
            s = decoded(raw, SegmentPart, name)
            if len(s.pids) % 4:
                raise CopyDamaged(f"{name}: its ids are no whole number")
            pids = np.frombuffer(s.pids, "<u4").astype(np.int64)
            k = len(pids)
            if len(s.lens) != 4 * k or len(s.refs) != k or len(s.passages) != k or len(s.terms) != len(s.postings):
                raise CopyDamaged(f"{name}: its lengths disagree")
            seg_pids.append(pids)
            if k and n:
                at = np.minimum(np.searchsorted(want_sorted, pids), n - 1)
                hit = np.flatnonzero(want_sorted[at] == pids)
                if len(hit):
                    slots = want_slot[at[hit]]
                    blobs = [s.passages[i] for i in hit.tolist()]
                    refs = [s.refs[i] for i in hit.tolist()]
                    if any(owner[sl] != rf for sl, rf in zip(slots.tolist(), refs)):
                        raise CopyDamaged(f"{name}: the table gives a file a passage of another")
                    if not all(blobs):
                        raise CopyDamaged(f"{name}: a live passage has no text")
                    try:
                        texts = textpack.unpack_many(blobs, zdict, RATIO * len(raw) + SLACK)
                        if [passage_decoder.decode(t).ref for t in texts] != refs:
                            raise CopyDamaged(f"{name}: a passage names another ref than its segment")
                    except (textpack.BadPassage, msgspec.DecodeError, msgspec.ValidationError) as e:
                        raise CopyDamaged(f"{name}: a passage is not understood ({e})") from None
                    for sl, b in zip(slots.tolist(), blobs):
                        if packed[sl] is not None:
                            raise CopyDamaged(f"{name}: a passage is in two segments")
                        packed[sl] = b
                    lens[slots] = np.frombuffer(s.lens, "<u4")[hit]
            if s.terms:
                try:
                    pp, counts = postings.check_many(list(s.postings))
                except ValueError as e:
                    raise CopyDamaged(f"{name}: {e}") from None
                held = np.sort(np.concatenate(seg_pids)) if seg_pids else np.empty(0, np.int64)
                if len(pp) and (not len(held) or not np.isin(pp, held).all()):
                    raise CopyDamaged(f"{name}: a posting names a passage the segment does not hold")
                if n and len(pp):
                    pp = pp.astype(np.int64)
                    at = np.minimum(np.searchsorted(want_sorted, pp), n - 1)
                    hit = want_sorted[at] == pp
                    if hit.any():
                        which = np.repeat(np.arange(len(counts)), counts)[hit]
                        tfs = np.concatenate([postings.unpack(v)[1] for v in s.postings]) if len(pp) else None
                        for t in np.unique(which).tolist():
                            term = s.terms[t]
                            try:
                                word = term.decode("utf-8")
                            except UnicodeDecodeError:
                                raise CopyDamaged(f"{name}: a term is not UTF-8") from None
                            vocab.setdefault(word, len(vocab))
                        tid_of = np.fromiter((vocab[s.terms[t].decode("utf-8")] for t in which.tolist()),
                                             np.int64, len(which))
                        rows_slot.append(want_slot[at[hit]])
                        rows_term.append(tid_of)
                        rows_tf.append(tfs[hit].astype(np.uint32))
    if any(p is None for p in packed):
        return None, fetched  # a changed file's passage is in a segment the cache knows: loaded whole
    slot = np.concatenate(rows_slot) if rows_slot else np.empty(0, np.int64)
    term = np.concatenate(rows_term) if rows_term else np.empty(0, np.int64)
    tf = np.concatenate(rows_tf) if rows_tf else np.empty(0, np.uint32)
    by = np.lexsort((term, slot))
    slot, term, tf = slot[by], term[by], tf[by]
    npost = np.bincount(slot, minlength=n).astype(np.uint32) if n else np.empty(0, np.uint32)
    if len(slot) and (np.diff(slot * (len(vocab) + 1) + term) == 0).any():
        raise CopyDamaged("a term is listed twice for one passage")
    ends = np.cumsum(npost, dtype=np.int64)
    terms = list(vocab)
    out = []
    at = 0
    for ref, rec in wanted.items():
        k = len(rec.pids)
        lo, hi = (int(ends[at - 1]) if at else 0), (int(ends[at + k - 1]) if k else (int(ends[at - 1]) if at else 0))
        out.append(NewFile(ref, rec.version, rec.size, rec.kind, [], mtime=rec.mtime, terms=terms,
                           tids=term[lo:hi].astype(np.uint32), npost=npost[at:at + k], tfs=tf[lo:hi],
                           lens=lens[at:at + k], packed=packed[at:at + k]))
        at += k
    return out, fetched
