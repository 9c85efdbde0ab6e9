"""Export: what a write-back sends, one file at a time (a generator), and the state
recorded once its manifest has landed (:func:`written`)."""

from __future__ import annotations

import hashlib
import time
from typing import Iterator, Optional

import msgspec
import numpy as np

from lnkmem.index.format import seg_codec
from lnkmem.index.store import Store
from lnkmem.replica.manifest import (FORMAT, Head, MAX_BLOB, Manifest, SegmentPart, TablePage, VectorChunk, blob_name, pack, page_of, part_bytes)
from lnkmem.replica.state import (CopySegment, CopySegments, CopyState, content_gen, copy_segments, drop_page_refs,
                                  has_page_refs, page_crcs, passage_digests, put_page_refs, put_state, state_in)

MAX_COPY_SEGMENTS = 256  # past this many segments the copy is written anew whole (a load's GETs)
PAGE_GROUP_BYTES = 8 << 20  # the file table's bytes an export holds at once, about
FILES_A_PAGE = 128  # the table's files a page, aimed at: pages are 2**k, made again past 4x either way

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
        self.content_gen = -1  # the index's content generation the export read (state.content_gen)
        self.copy_segs: list[CopySegment] = []  # the copy's segments this export makes
        self.seg_mark = 0
        self.compacted = False
        self.pages: list[str] = []
        # what each page holds (:func:`state.page_crcs`), kept once it lands; None: kept already
        self.page_crcs: list[Optional[bytes]] = []
        self.vec_sent: list[int] = []  # pending vectors this export carries
        self.sent: list[str] = []
        self._manifest: Optional[Manifest] = None
        self.blobs: Iterator[tuple[str, bytes]] = self._make()

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            raise RuntimeError("the export's files are not all made yet")
        return self._manifest

    def renamed(self, names: dict) -> None:
        """Files sent under other names than made (``names``: made -> sent; the made name was
        taken, :func:`manifest.variant`): the version names what was sent."""
        if not names:
            return
        m = self.manifest

        def of(n):
            return names.get(n, n)
        m.segments = [[of(n) for n in parts] for parts in m.segments]
        m.pages, m.vectors = [of(n) for n in m.pages], [of(n) for n in m.vectors]
        m.head, m.dict = of(m.head), (of(m.dict) if m.dict else m.dict)
        self.pages = m.pages
        self.sent = [of(n) for n in self.sent]
        for c in self.copy_segs:
            c.parts = [of(n) for n in c.parts]

    def _unless_known(self, name: str, blob: bytes, known: set) -> Iterator[tuple[str, bytes]]:
        """``(name, blob)`` to be sent, noted as sent, unless the copy holds the file already."""
        if name not in known:
            self.sent.append(name)
            yield name, blob

    def _out(self, kind: str, obj) -> tuple[str, bytes]:
        blob = obj if isinstance(obj, bytes) else pack(obj)
        if len(blob) > MAX_BLOB:  # never made: no part holds more than one item over `part`
            raise ValueError(f"a {kind} file of {len(blob)} bytes, over {MAX_BLOB}")
        return blob_name(kind, blob), blob

    def _make(self) -> Iterator[tuple[str, bytes]]:
        store, state = self.store, self.state
        known = set(state.named)
        with store.reading() as txn:
            self.gen = txn.meta_int(b"gen")
            self.content_gen = content_gen(txn)
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
                    yield from self._unless_known(name, blob, known)
                self.copy_segs.append(CopySegment(names, *self._made))
                segments.append(names)
            # the file table, in pages: a page is made of the files whose ref falls in it
            files = txn.count("files")
            pages = len(state.pages)
            if not pages or not FILES_A_PAGE // 4 * pages <= files <= FILES_A_PAGE * 4 * pages:
                pages = 1
                while pages * FILES_A_PAGE < files:
                    pages *= 2
            # made a group of pages at a time, each group a walk of the table (a few MiB of
            # records held at once, not the whole table's objects)
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
                        store.let_go()  # the map's pages the walk read (at 10x: many MiB by its end)
                for p in range(lo, hi):
                    name, blob = self._out("page", TablePage(by_page[p - lo]))
                    # (a page the copy holds, its refs kept already: nothing to work out again)
                    kept = name in known and has_page_refs(txn, p, name)
                    self.page_crcs.append(None if kept else page_crcs(by_page[p - lo]))
                    by_page[p - lo] = None  # type: ignore[call-overload]
                    self.pages.append(name)
                    yield from self._unless_known(name, blob, known)
                del by_page
            tombs = []
            for c in self.copy_segs:
                pids = np.frombuffer(c.pids, "<u4")
                tombs.append(np.sort(pids[np.frombuffer(c.live, np.uint8) == 0]).astype("<u4").tobytes())
            hname, blob = self._out("head", Head(tombs, txn.meta_int(b"next_pid"), model, self.of))
            yield from self._unless_known(hname, blob, known)
            zdict = txn.meta(b"zdict")
            dname = None
            if zdict:
                dname, blob = self._out("dict", pack(bytes(zdict)))
                yield from self._unless_known(dname, blob, known)
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
                        yield from self._unless_known(name, blob, known)
            if rows:
                name, blob = self._vectors(pids, rows)
                vec_names.append(name)
                yield from self._unless_known(name, blob, known)
        self._manifest = Manifest(FORMAT, segments, self.pages, hname, dname,
                                  vec_names, model, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), self.of)

    def _vectors(self, pids: list, rows: list) -> tuple[str, bytes]:
        return self._out("vec", VectorChunk(np.asarray(pids, "<u4").tobytes(), b"".join(rows), len(rows[0]) - 4))

    def _plan(self, txn, dead: np.ndarray) -> tuple[list, list]:
        """(the copy's segments kept, each with its passages live now; the local segments
        sent anew). The copy follows its own policy, not the local merger's: a local
        segment whose live passages the copy holds already (one the copy was written or
        read with, or made since by merging such: the same ids and digests) sends nothing;
        a copy segment keeps its file while any of its passages is live, the rest marked
        in the head; once more than half of the copy's passages are not live, or it has
        more than MAX_COPY_SEGMENTS segments, it is written anew whole (compacted)."""
        state = self.state
        old = copy_segments(txn, state)
        every = txn.segment_keys()
        if not old:
            return [], every

        def local():  # each segment's ids, one segment at a time (not all of them at once)
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
                    if not (hs_a[j[a:a + 4096]] == passage_digests([bytes(b) if b is not None else b"" for b in blobs])).all():
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
            kept.append(CopySegment(c.parts, c.pids, live.astype(np.uint8).tobytes(),
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
        sums = np.zeros(len(pids), "<u8")
        cur: dict = {"i0": 0, "refs": [], "passages": [], "terms": [], "postings": [], "size": 0}
        made = 0

        def close(i: int) -> tuple[str, bytes]:
            store.let_go()  # the map's pages read for this part, the heap it freed
            a = cur["i0"]
            part = SegmentPart(pids[a:i].tobytes(), bytes(lens[4 * a:4 * i]), cur["refs"], cur["terms"],
                            cur["postings"], cur["passages"])
            cur.update(i0=i, refs=[], passages=[], terms=[], postings=[], size=0)
            return self._out("seg", part)

        names = stored.names
        n = len(pids)
        # each passage's ref: the runs walked along (no array of a ref index a passage)
        run_left = (int(r) for r in runs)
        ref_i, left = -1, 0
        for i in range(n):
            while not left:
                ref_i, left = ref_i + 1, next(run_left)
            left -= 1
            blob = txn.passage(int(pids[i]))
            blob = bytes(blob) if blob is not None and live[i] else b""
            if blob:
                sums[i] = int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") | 1
            ref = names[ref_i]
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
        self._made = (bytes(stored.pids), live.astype(np.uint8).tobytes(), sums.tobytes())  # (pids: no copy)


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
        old = state_in(w)
        named = m.names()
        keep = set(named)
        doomed = [n for n in dict.fromkeys(old.doomed + old.named + exp.sent) if n not in keep]
        state = CopyState(version, exp.gen, exp.seg_mark, m.vectors, m.model, m.pages, named, doomed,
                          unknown=old.unknown,  # still to be listed: the place may hold files no one knows
                          orphans=[o for o in old.orphans if o[0] not in keep],
                          content_gen=exp.content_gen)  # (what it read: a commit since is not in this version)
        put_state(w, state)
        w.put_meta(b"copy-segs", msgspec.msgpack.encode(CopySegments(version, exp.copy_segs)))
        # what each page holds, for a newer version applied as a change (a 412's, a restart's)
        for i, (name, crcs) in enumerate(zip(m.pages, exp.page_crcs)):
            if crcs is not None and not has_page_refs(w, i, name):
                put_page_refs(w, i, name, crcs)
        drop_page_refs(w, range(len(m.pages), len(old.pages)))
    return state


