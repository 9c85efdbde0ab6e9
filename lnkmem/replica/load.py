"""Verify and load: every file of a copy fetched (one ahead, on a thread), checked (each
alone: :mod:`checks`; then together: ids, owners, postings within their segment) and
written into the cache one at a time; :func:`verify` the same pass writing nothing."""

from __future__ import annotations

import itertools
from array import array
from typing import Callable, Iterable, Optional

import msgspec
import numpy as np

from lnkmem.core import memtrim
from lnkmem.index.codec import postings, textpack
from lnkmem.index.format import (LOADING, FileRec, encoder, file_decoder, file_key, file_value,
                                 id_key, passage_decoder, seg_codec)
from lnkmem.index.store import Store
from lnkmem.replica.manifest import (CopyDamaged, FORMAT, Head, MAX_DIM, MAX_TERM, Manifest, OLD_FORMAT, OldTable, RATIO, SLACK, SegmentPart, TablePage, VectorChunk, page_of)
from lnkmem.replica.checks import (FetchAhead, blob_size, check_names, checked_blob, checked_record, decoded, distinct,
                                   reading_order, u4, valid_ref)
from lnkmem.replica.state import (CopySegment, CopySegments, CopyState, content_gen, page_crcs, passage_digests,
                                  put_page_refs, put_state, state_in)

LOAD_STEP = 8 << 20  # an empty cache's load commits after about this many bytes written (twice that: a higher peak, no faster)
CHECK_POSTINGS = 1 << 18  # postings checked at once (postings.check_many's work arrays: ~2 MiB each)
SPARSE = 4  # ids beyond SPARSE x passages + DENSE_SLACK are renumbered at load
DENSE_SLACK = 1 << 16
MASK_IDS = 1 << 24  # a segment's ids below this are checked against a mask of them (16 MiB at most)

# --- verify and load: every file checked, one at a time, before the copy is kept -----------

class Verified:
    """A copy that passed every check: its manifest, the files of its table, how many
    passages it holds, whether its ids are renumbered at load."""

    def __init__(self, manifest: Manifest, refs: list, passages: int, renumbered: bool, fetch=None):
        self.manifest, self.refs, self.passages, self.renumbered = manifest, refs, passages, renumbered
        self.fetch = fetch


class _Reader:
    """One pass over a copy: each file fetched, checked and (with a write txn) written
    into the cache, then dropped before the next is fetched (the next is fetched and
    checked meanwhile: :class:`FetchAhead`)."""

    def __init__(self, manifest: Manifest, fetch: Callable[[str], bytes], of: Optional[str],
                 sources, width, store: Optional[Store] = None, txns: Optional["_LoadTxns"] = None):
        self.m, self.fetch, self.of, self.width = manifest, fetch, of, width
        self.sources = set(sources) if sources is not None else None
        self.store, self.txns = store, txns
        self.ok_refs: dict[str, bool] = {}  # refs checked that the table does not hold
        self.ref_ix: dict[str, int] = {}  # the table's refs -> their index (filled with its pages)
        self.order: Optional[np.ndarray] = None  # sorted old pids when renumbered: new pid = index + 1
        self.keep_dead = False  # the tombed passages kept dead, their postings in place (_run)
        self.ahead: Optional[FetchAhead] = None  # while it runs

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
            raise CopyDamaged(f"{where} names {r!r}, which is no ref of this memory's sources")

    def remap(self, a: np.ndarray) -> np.ndarray:
        if self.order is None or not len(a):
            return a.astype("<u4")
        return (np.searchsorted(self.order, a) + 1).astype("<u4")

    def run(self) -> Verified:
        check_names(self.m, self.of)
        self.ahead = FetchAhead(self.fetch, reading_order(self.m))
        try:
            return self._run()
        finally:
            self.ahead.close()
            self.ahead = None

    def blob(self, name: str) -> bytes:
        """A file of the copy, fetched and checked (read ahead while the reader runs)."""
        return self.ahead(name) if self.ahead is not None else checked_blob(self.fetch, name)

    def _run(self) -> Verified:
        m = self.m
        old = m.format == OLD_FORMAT
        # the head (dead passages, next id, model, whose) and the dictionary
        if old:  # one dead list for every segment
            table = decoded(self.blob(m.pages[0]), OldTable, m.pages[0])
            dead = np.sort(u4(table.dead, m.pages[0], ">u4").astype(np.int64))
            head = Head([], table.next_pid, table.model, table.of)
            zdict = table.zdict
            tombs = [dead] * len(m.segments)
        else:
            table = None
            head = decoded(self.blob(m.head), Head, m.head)
            zdict = decoded(self.blob(m.dict), bytes, m.dict) if m.dict else None
            if len(head.tombs) != len(m.segments):
                raise CopyDamaged("the head's dead passages and the manifest's segments disagree")
            tombs = []
            for t in head.tombs:
                a = u4(t, m.head).astype(np.int64)
                if len(a) > 1 and not (a[1:] > a[:-1]).all():
                    raise CopyDamaged("the head's dead passages are not distinct and ascending")
                tombs.append(a)
            head.tombs = []
        if self.of is not None and head.of != self.of:
            raise CopyDamaged(f"the copy's table is not this memory's (it says it is of {head.of!r})")
        if head.model != m.model:
            raise CopyDamaged("the table and the manifest name different models")
        try:
            textpack.check_dict(zdict)
        except ValueError as e:
            raise CopyDamaged(f"the table's passage dictionary is not one the engine makes ({e})") from None
        if not isinstance(head.next_pid, int) or head.next_pid < 1 or head.next_pid > 1 << 32:
            raise CopyDamaged(f"the table's next passage id {head.next_pid} is not beyond its passages")
        # the table's pages: each file's record (written as read), and who owns which passage
        refs: list[str] = []
        ref_ix: dict[str, int] = {}
        owned_p = array("q")  # every file's passage ids, one after the other (no object a file)
        owned_r = array("q")  # ... and the index of the file owning each
        npages = len(m.pages)
        for i, name in enumerate(m.pages):
            files = table.files if old else decoded(self.blob(name), TablePage, name).files
            items = []
            for ref, rec_raw in files:
                if not valid_ref(ref, self.sources):  # (each once: not kept, see check_ref)
                    raise CopyDamaged(f"{name} names {ref!r}, which is no ref of this memory's sources")
                if ref in ref_ix:
                    raise CopyDamaged(f"the table names {ref!r} twice")
                if not old and page_of(ref, npages) != i:
                    raise CopyDamaged(f"{name} holds {ref!r}, which is not of its page")
                rec = checked_record(ref, rec_raw)
                ix = ref_ix[ref] = len(refs)
                refs.append(ref)
                if rec.pids:
                    p = rec.pids  # (ints: the record's type says so)
                    owned_p.extend(p)
                    owned_r.extend(array("q", (ix,)) * len(p))
                items.append((file_key(ref), file_value(ref, rec_raw)))  # any length (LMDB keys ≤ 511 bytes)
            if self.txn is not None and items:
                items.sort()
                self.txn.put_files(items)
            if self.txn is not None and not old:  # (what the page held: a change to it applied without a walk)
                put_page_refs(self.txn, i, name, page_crcs(files))
                self.wrote(sum(len(k) + len(v) for k, v in items))
            del files, items
        table = None
        owned = np.frombuffer(owned_p, np.int64) if owned_p else np.empty(0, np.int64)
        owner = np.frombuffer(owned_r, np.int64) if owned_r else np.empty(0, np.int64)
        # every live passage of the copy is a file's, never twice (and in one segment: below)
        by = np.argsort(owned, kind="stable")
        every, whose = owned[by], owner[by].astype(np.int32)  # (a file's index: 4 bytes a passage, not 8)
        del by, owned, owner, owned_p, owned_r
        if len(every) > 1 and not (every[1:] != every[:-1]).all():
            raise CopyDamaged("the table gives a passage to two files")
        top = int(every[-1]) if len(every) else 0
        if head.next_pid < top + 1:
            raise CopyDamaged(f"the table's next passage id {head.next_pid} is not beyond its passages")
        if head.next_pid > SPARSE * len(every) + DENSE_SLACK:  # ids never size an allocation
            self.order = every
            if self.txn is not None:
                self._renumber_files()
        seen = np.zeros(len(every), bool)
        self.ref_ix = ref_ix
        # the tombed passages kept as a local delete leaves them (dead, their postings in
        # place: re-packing every list that names one was a good part of a 10x load), when no id
        # is tombed twice or live elsewhere (ids given again: then their postings go)
        if self.order is None and not old and any(len(t) for t in tombs):
            dead_all = np.sort(np.concatenate(tombs))
            at = np.minimum(np.searchsorted(every, dead_all), max(len(every) - 1, 0))
            self.keep_dead = bool((dead_all[1:] != dead_all[:-1]).all()) and \
                not (len(every) and (every[at] == dead_all).any())
            del dead_all, at
        # segments, part by part
        next_seg = self.txn.meta_int(b"next_seg") if self.txn is not None else 1
        seg_map: dict[int, list[str]] = {}
        self.copy_segs: list[CopySegment] = []
        for parts, tomb in zip(m.segments, tombs):
            self._segment(parts, every, whose, seen, zdict, next_seg, tomb, check_tomb=not old)
            seg_map[next_seg] = list(parts)
            next_seg += 1
        del tombs
        if not seen.all():
            raise CopyDamaged("the table's files and the segments' live passages disagree")
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
        those of the segment's passages, checked in batches). Only the live passages reach
        the cache; the dead ones' postings are dropped, or with ``keep_dead`` kept as a
        local delete leaves them (the segment's record names them, the dead table holds
        their ids)."""
        keep_dead = self.keep_dead and self.txn is not None
        names: list[str] = []
        runs: list[int] = []
        pid_parts: list[np.ndarray] = []  # the copy's ids, all (u32: 4 bytes a passage, shared with rec_p)
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
        if nt and int(tomb[-1]) < MASK_IDS and not self.keep_dead:  # (only a re-pack reads it)
            self._tomb_mask = np.zeros(int(tomb[-1]) + 1, bool)
            self._tomb_mask[tomb] = True
        for name in parts:
            raw = self.blob(name)
            s = decoded(raw, SegmentPart, name)
            pids_u4 = u4(s.pids, name)
            pids = pids_u4.astype(np.int64)
            n = len(pids)
            if len(s.lens) != 4 * n or len(s.refs) != n or len(s.passages) != n or len(s.terms) != len(s.postings):
                raise CopyDamaged(f"{name}: its lengths disagree")
            if n and held is not None:
                raise CopyDamaged(f"{name}: passages after the segment's postings")
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
                    raise CopyDamaged(f"{name}: a live passage no file of the table has")
                if seen[at].any() or not distinct(at):
                    raise CopyDamaged(f"{name}: a passage is in two segments")
                seen[at] = True
                refs = s.refs if len(li) == n else [s.refs[i] for i in li.tolist()]
                for r in set(s.refs if keep_dead else refs):  # (a dead passage's ref reaches the cache too)
                    self.check_ref(r, name)
                get = self.ref_ix.get
                ix = np.fromiter(map(get, refs, itertools.repeat(-2, len(refs))), np.int64, len(refs))
                if not (whose[at] == ix).all():
                    raise CopyDamaged(f"{name}: the table gives a file a passage of another")
                blobs = s.passages if len(li) == n else [s.passages[i] for i in li.tolist()]
                self._check_passages(name, blobs, refs, pids[li], zdict, RATIO * len(raw) + SLACK)
                dead_kept = keep_dead and len(li) < n  # this part's dead passages go in too
                # the segment's refs as runs (a file's passages follow one another): where the
                # file index changes (each ref's index is its own: checked against whose above);
                # with the dead kept, where the ref changes (a dead passage's has no index)
                if dead_kept:
                    run_of = s.refs
                    starts = [0] + [i for i in range(1, n) if run_of[i] != run_of[i - 1]]
                else:
                    run_of = refs
                    starts = np.flatnonzero(np.concatenate(([True], ix[1:] != ix[:-1]))).tolist() if len(ix) else []
                if starts:
                    counts = np.diff(np.append(starts, len(run_of))).tolist()
                    run_refs = [run_of[i] for i in starts]
                    if names and names[-1] == run_refs[0]:
                        runs[-1] += counts[0]
                        run_refs, counts = run_refs[1:], counts[1:]
                    names.extend(run_refs)
                    runs.extend(counts)
                new = self.remap(lp)
                pid_parts.append(pids_u4)
                if dead_kept:
                    new_parts.append(pids_u4)
                    len_parts.append(bytes(s.lens))
                    self.txn.put_dead(sorted(id_key(int(p)) for p in pids[~live].tolist()))
                else:
                    new_parts.append(new)
                    len_parts.append(np.frombuffer(s.lens, "<u4")[live].tobytes())
                rec_p.append(pids_u4)
                rec_l.append(live)
                sums = np.zeros(n, "<u8")
                sums[li] = passage_digests(blobs)
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
                    held = np.concatenate(pid_parts).astype(np.int64) if pid_parts else np.empty(0, np.int64)
                    held.sort()
                    pid_parts = []
                terms = s.terms  # (each compared in C: tens of millions of terms at 10x)
                if (prev is not None and terms[0] <= prev) or not all(map(bytes.__lt__, terms, terms[1:])) \
                        or min(map(len, terms)) < 1 or max(map(len, terms)) > MAX_TERM:
                    raise CopyDamaged(f"{name}: its terms are not distinct, sorted and short")
                prev = terms[-1]
                self._postings(name, s, held, sk)
            self.wrote(len(raw))  # (about what this part wrote: its passages and postings, decompressed)
            del raw, s
            if self.store is not None:
                self.store.let_go()  # (LMDB's dirty pages stay until the commit)
        if check_tomb and tombed != nt:
            raise CopyDamaged("the head marks dead passages its segment does not hold")
        lens = b"".join(len_parts)
        pids_all = np.concatenate(new_parts) if new_parts else np.empty(0, "<u4")
        if self.txn is not None:
            if len(pids_all):
                self.txn.put_segment(sk, seg_codec.encode_runs(pids_all.astype("<u4").tobytes(), lens, names,
                                                                np.asarray(runs, np.int64)))
            # (each part's bytes joined: no array of the whole segment made on the way)
            self.copy_segs.append(CopySegment(list(parts), b"".join(map(np.ndarray.tobytes, rec_p)),
                                           b"".join(a.astype(np.uint8).tobytes() for a in rec_l),
                                           b"".join(map(np.ndarray.tobytes, rec_s))))

    def _check_passages(self, name: str, blobs: list, refs: list, pids: np.ndarray, zdict, room: int) -> None:
        """Each live passage of a part is one the engine makes, of the ref its segment
        says, all of them decompressing to at most ``room`` bytes."""
        if not all(blobs):
            raise CopyDamaged(f"{name}: live passage {int(pids[blobs.index(b'')])} has no text")
        try:
            raws = textpack.unpack_many(blobs, zdict, room)
        except textpack.BadPassage as e:
            raise CopyDamaged(f"{name}: passage {int(pids[e.index])} is not understood ({e})") from None
        dec = passage_decoder.decode
        try:
            got = [p.ref for p in map(dec, raws)]
        except (msgspec.DecodeError, msgspec.ValidationError):
            for i, r in enumerate(raws):
                try:
                    dec(r)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    raise CopyDamaged(f"{name}: passage {int(pids[i])} is not understood") from None
            raise
        if got != refs:
            i = next(i for i, (a, b) in enumerate(zip(got, refs)) if a != b)
            raise CopyDamaged(f"{name}: passage {int(pids[i])} names another ref than its segment")

    def _postings(self, name: str, s: SegmentPart, held: np.ndarray, sk: bytes) -> None:
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
            raise CopyDamaged(f"{name}: a posting list has a broken length")
        if len(claims) and claims.max() > n:
            raise CopyDamaged(f"{name}: a posting list claims more postings than the segment holds")
        upto = np.cumsum(claims)
        a = 0
        while a < len(vals):
            # a batch: lists whose stated counts add up to CHECK_POSTINGS (a list of more alone)
            below = int(upto[a - 1]) if a else 0
            b = max(int(np.searchsorted(upto, below + CHECK_POSTINGS, side="right")), a + 1)
            try:
                pp, counts = postings.check_many(vals[a:b])
            except ValueError as e:
                raise CopyDamaged(f"{name}: {e}") from None
            if len(pp) and (n == 0 or not mask_ok(pp)):
                raise CopyDamaged(f"{name}: a posting names a passage the segment does not hold")
            if self.txn is not None:
                batch = list(vals[a:b])
                tomb = self._tomb
                which = []
                if len(tomb) and len(pp) and not self.keep_dead:  # the dead passages' postings dropped
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

    def _vectors(self, head: Head) -> int:
        m = self.m
        dim = None
        live = 0
        for name in m.vectors:
            v = decoded(self.blob(name), VectorChunk, name)
            vp = u4(v.pids, name)
            if not 1 <= v.dim <= MAX_DIM or (dim is not None and v.dim != dim):
                raise CopyDamaged(f"{name}: vectors {v.dim} wide, not the copy's width")
            if self.width is not None and self.width[0] == m.model and v.dim != self.width[1]:
                raise CopyDamaged(f"{name}: vectors {v.dim} wide, but the model's are {self.width[1]}")
            dim = v.dim
            if len(v.rows) != len(vp) * (v.dim + 4):
                raise CopyDamaged(f"{name}: its rows and ids disagree")
            if len(vp) and (int(vp.max()) >= head.next_pid):
                raise CopyDamaged(f"{name}: a vector names a passage id the copy never gave")
            if len(vp):
                raw = np.frombuffer(v.rows, np.uint8).reshape(len(vp), v.dim + 4)
                scale = raw[:, v.dim:].copy().view("<f4").ravel()
                if not np.isfinite(scale).all():
                    raise CopyDamaged(f"{name}: a vector's scale is not a number")
            if self.txn is not None:
                live += self._load_vectors(v, vp)
        return live

    def _load_vectors(self, v: VectorChunk, vp: np.ndarray) -> int:
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
              width: Optional[tuple[str, int]] = None, step: int = LOAD_STEP,
              was: Optional[CopyState] = None) -> Verified:
    """Replace the whole cache with this version of the copy, each file fetched, checked and
    written before the next is fetched; CopyDamaged (and the cache as it was) at the first
    check that fails. A cache that holds files is replaced in one write transaction (its
    readers see the old version until the commit); an empty one is written in transactions
    of about ``step`` bytes (LMDB holds a transaction's dirty pages in memory until its
    commit), invisible to readers until the last (the snapshot and the generation move only
    then) and marked as loading until it, so that a load cut short is wiped at the next open.
    ``was``: the copy state of the cache this one will replace (an index loaded beside it,
    ``Store.open_beside``), else the store's own."""
    with store.write_lock:
        store.forget_listed()  # (the lock is reentrant) every file replaced
        size = sum(blob_size(n) or 0 for n in manifest.names())
        least = 4 * size + (64 << 20)  # room for what it holds decompressed, ids and B-trees
        v = store.with_map_room(lambda: _load_txn(store, manifest, fetch, version, of, sources, width, step, was),
                                least)
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
        old = state_in(w)
        put_state(w, CopyState(version=version, named_incomplete=True, doomed=old.doomed, orphans=old.orphans))


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
              step: Optional[int], was: Optional[CopyState]) -> Verified:
    with store.reading() as txn:
        empty = txn.count("files") == 0 and txn.count("passages") == 0
    txns = _LoadTxns(store, step if empty else None)
    try:
        txn = txns.txn
        old = was if was is not None else state_in(txn)
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
        # the files this cache sent that this version does not name stay doomed (its own: no
        # other writer relies on them); those of the version it held that this one does not name
        # are the new version's writer's to delete, and an orphan here until the copy moves past
        # this version (a writer killed once its manifest was on its way never deleted them;
        # deleted at once, one another writer made again for a manifest conditional on this
        # version -- it loaded it too -- would be gone under it)
        doomed = [n for n in dict.fromkeys(old.doomed) if n not in keep]
        orphans = [o for o in old.orphans if o[0] not in keep]  # (still not named: still found at their version)
        mine = set(doomed) | {o[0] for o in orphans}
        orphans += [(n, version) for n in dict.fromkeys(old.named) if n not in keep and n not in mine]
        if v.renumbered or manifest.format != FORMAT:
            # of this version, but every file is sent anew at the next write-back (renumbered:
            # the copy's files are no longer the cache's segments; the previous format: written
            # in this one), and the files of the place it does not name deleted then
            state = CopyState(version, -1, doomed=doomed, named_incomplete=True, orphans=orphans, partial=manifest.partial)
            txn.delete_meta(b"copy-segs")
        else:
            state = CopyState(version, gen, r.next_seg, list(manifest.vectors), manifest.model,
                              list(manifest.pages), named, doomed, unknown=old.version is None, orphans=orphans,
                              content_gen=content_gen(txn), partial=manifest.partial)
            txn.put_meta(b"copy-segs", msgspec.msgpack.encode(CopySegments(version, r.copy_segs)))
        put_state(txn, state)
        txns.finish()
    except BaseException:
        txns.abort()
        raise
    return v

