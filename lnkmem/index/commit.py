"""A commit: a batch of files (re)indexed and refs removed, written in one LMDB write
transaction as one new segment, the passages it replaces marked dead (:func:`write`).

Ids follow live data, not edits: a segment whose passages are all dead now is dropped at
once (:func:`drop_segment`, as a merge would drop it), and new passages take the lowest ids
no segment holds. The store runs it under its write lock and publishes the snapshot it
makes (:meth:`lnkmem.index.store.Store.commit`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from lnkmem.index.codec import postings, textpack
from lnkmem.index.format import (CRC, FCRC, FILES_SUM, KEY_MAX, PCRC, FileRec, Passage, PostingsSum, SegMeta,
                                 crc_of, encoder, file_decoder, file_get, file_key, file_value, id_key, seg_codec,
                                 take_from_sum)
from lnkmem.index.snapshot import Delta


@dataclass
class NewFile:
    """One file (re)indexed: its passages and their postings.

    The postings come as flat columns, made when the file is counted
    (``count.count_files``): ``tids`` (an index into ``terms``, a list that
    the files of one batch may share), ``tfs``, and ``npost`` (how many of
    them each passage has, in passage order), with ``lens`` (each passage's
    length). ``counts`` ((term -> tf, length) per passage) is taken instead
    when given: the columns are then made from it by :meth:`columns`."""

    ref: str
    version: str
    size: int
    kind: str
    passages: list[Passage]
    counts: Optional[list[tuple[dict, int]]] = None
    mtime: Optional[str] = None
    terms: Optional[list[str]] = None
    tids: Any = None  # u32 columns: array('I'), bytes or numpy arrays
    npost: Any = None
    tfs: Any = None
    lens: Any = None
    # the passages as stored (textpack, with the dictionary ``Batch.packed_with``),
    # when they were packed where the file was counted (the build's worker); then
    # ``passages`` is not needed
    packed: Optional[list[bytes]] = None

    def count(self) -> int:
        """How many passages the file has."""
        return len(self.packed) if self.packed is not None else len(self.passages)

    def columns(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(terms, tids, npost, tfs, lens) as numpy arrays."""
        if self.counts is not None:
            vocab: dict[str, int] = {}
            tids, npost, tfs, lens = [], [], [], []
            for c, n in self.counts:
                tids.extend(vocab.setdefault(t, len(vocab)) for t in c)
                tfs.extend(c.values())
                npost.append(len(c))
                lens.append(n)
            return (list(vocab), np.asarray(tids, np.uint32), np.asarray(npost, np.uint32),
                    np.asarray(tfs, np.uint32), np.asarray(lens, np.uint32))
        return (self.terms or [], *(np.frombuffer(x, np.uint32) if not isinstance(x, np.ndarray) else x
                                    for x in (self.tids, self.npost, self.tfs, self.lens)))


@dataclass
class Batch:
    """Changes to commit together: files (re)indexed and refs removed."""

    files: list[NewFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    packed_with: Optional[bytes] = None  # the dictionary its files' ``packed`` passages were packed with

    def __bool__(self) -> bool:
        return bool(self.files or self.removed)

    @property
    def text_bytes(self) -> int:
        return sum(f.size for f in self.files)


def write(store, batch: Batch) -> tuple[list[int], Optional[Delta]]:
    """One transaction of ``store`` (its environment and tables; its write lock held);
    returns the ids given to new passages and what changed (None when the snapshot was
    not the index's: another process wrote).

    Ids follow live data, not edits: a segment whose passages are all dead
    now is dropped at once (as a merge would drop it), and new passages take
    the lowest ids no segment holds before new ones are made; ``next_pid``
    comes down when the highest ids are free."""
    with store.env.begin(write=True) as txn:
        next_pid = int(txn.get(b"next_pid", db=store.meta))
        was_next = next_pid
        seg = int(txn.get(b"next_seg", db=store.meta))
        snap = store.snapshot  # read once: a search's refresh may swap it meanwhile
        if int(txn.get(b"gen", db=store.meta)) != snap.gen:
            snap = None
        gone = set(batch.removed) | {f.ref for f in batch.files}
        killed: list[int] = []
        dying: dict[int, list[int]] = {}  # segment -> CRCs of its passages that die now
        fsum = files_sum(store, txn)  # None: not kept (stale, or an index made before)
        for ref in gone:
            old = file_get(txn, store.files, ref)
            if old is None:
                continue
            if fsum is not None:
                key = file_key(ref)
                fsum.take(crc_of(key, txn.get(key, db=store.files)))
            for p in file_decoder.decode(old).pids:
                txn.put(id_key(p), b"", db=store.dead)
                was = txn.get(id_key(p), db=store.passages)
                if was is not None and snap is not None and snap.seg_of is not None and p < len(snap.seg_of) \
                        and snap.seg_of[p] >= 0:
                    dying.setdefault(int(snap.seg_of[p]), []).append(crc_of(id_key(p), was))
                txn.delete(id_key(p), db=store.passages)
                txn.delete(id_key(p), db=store.vectors)
                txn.delete(id_key(p), db=store.vec_pending)
                killed.append(p)
            txn.delete(file_key(ref), db=store.files)
        if killed and (snap is None or snap.seg_of is None):  # whose passages died is not known
            forget_passage_sums(store, txn)
        for s_, crcs in dying.items():
            take_from_sum(txn, store.meta, PCRC + id_key(s_), crcs)
        ids = iter(())
        seg_of = None
        dropped: list[int] = []
        if snap is not None and snap.seg_of is not None:  # else: another process wrote; plain ids
            seg_of = snap.seg_of.copy()
            if killed:
                alive = snap.alive.copy()
                alive[killed] = False
                for s in sorted(set(seg_of[killed].tolist())):  # (not np.unique: it imports numpy.ma)
                    members = np.flatnonzero(seg_of == s)
                    if s >= 0 and s not in store.merging and not alive[members].any():  # wholly dead: drop it now
                        drop_segment(store, txn, s, members)
                        seg_of[members] = -1
                        dropped.append(s)
            # (a copy's vector chunks name passages by id: `pid_reuse` tells the
            # write-back to send all vectors anew, see copy.export)
            held = seg_of[1:next_pid] >= 0
            free = np.flatnonzero(~held) + 1
            # the highest ids free: made again (the last held id found without a list
            # of every held one: megabytes a commit at 1.27M passages)
            next_pid = len(held) - int(np.argmax(held[::-1])) + 1 if held.any() else 1
            ids = iter(free[free < next_pid].tolist())
        allocated: list[int] = []
        # postings of the batch: each file's columns (made when it was counted),
        # its term ids mapped into one vocabulary of the batch, then grouped by
        # term with one sort
        vocab: dict[str, int] = {}
        mapped: dict[int, tuple[list, Optional[np.ndarray]]] = {}  # id(terms) -> (terms, their
        # vocab ids; None: the batch's first terms, whose ids are the vocabulary's own)
        first: Optional[list] = None  # those terms (most batches have no other: one indexer._Vocab)
        p_terms: list[np.ndarray] = []
        p_tfs: list[np.ndarray] = []
        p_pids: list[np.ndarray] = []
        seg_pids: list[int] = []
        seg_lens: list[int] = []
        seg_refs: list[str] = []
        new_keys: list[bytes] = []
        new_passages: list[Passage] = []
        for f in batch.files:
            terms, tids, npost, tfs, lens = f.columns()
            if len(lens) != f.count() or int(npost.sum()) != len(tids) or len(tfs) != len(tids):
                raise ValueError(f"postings of {f.ref!r} do not match its passages")
            # ascending (a file's ids ascend with its lines): free ids first, then new ones
            pids = list(itertools.islice(ids, len(lens)))
            if len(pids) < len(lens):
                pids += range(next_pid, next_pid + len(lens) - len(pids))
                next_pid = pids[-1] + 1
            new_keys.extend(map(id_key, pids))
            new_passages.extend(f.packed if f.packed is not None else f.passages)
            allocated.extend(pids)
            seg_pids.extend(pids)
            seg_lens.extend(lens.tolist())
            seg_refs.extend([f.ref] * len(pids))
            if len(tids):
                m = mapped.get(id(terms))
                if m is None:
                    if not mapped and len(set(terms)) == len(terms):
                        first = terms
                        m = mapped[id(terms)] = (terms, None)
                    else:
                        if not vocab and first is not None:
                            vocab.update((t, i) for i, t in enumerate(first))
                        m = mapped[id(terms)] = (terms, np.fromiter(
                            (vocab.setdefault(t, len(vocab)) for t in terms), np.int32, len(terms)))
                p_terms.append(tids if m[1] is None else m[1][tids])
                p_tfs.append(tfs)
                p_pids.append(np.repeat(np.asarray(pids, np.uint32), npost))
            key = file_key(f.ref)
            value = file_value(f.ref, encoder.encode(FileRec(f.version, f.size, pids, f.kind, f.mtime)))
            txn.put(key, value, db=store.files)
            if fsum is not None:
                fsum.add(key, value)
        mapped.clear()
        if new_keys:  # compressed, with the index's dictionary (made once, from the first big commit)
            zdict = store.passage_dict_in(txn, (p for p in new_passages if type(p) is Passage))
            packer = textpack.Packer(zdict)
            encode = encoder.encode
            if batch.packed_with is not None and batch.packed_with != zdict:  # packed with another
                # dictionary (the index was replaced since the worker was given it): again with its own
                def pack(p, other=batch.packed_with):
                    return packer.pack(encode(p) if type(p) is Passage else textpack.unpack(p, other))
            else:
                def pack(p):
                    return packer.pack(encode(p)) if type(p) is Passage else p
            # new ids only: appending packs the pages full; reused ones go in their place
            last = txn.cursor(db=store.passages)
            fresh = not last.last() or last.key() < new_keys[0]
            # each packed as it is written (all of a batch's at once held megabytes)
            psum = PostingsSum()
            txn.cursor(db=store.passages).putmulti(
                psum.over(zip(new_keys, map(pack, new_passages))), append=fresh)
            txn.put(PCRC + id_key(seg), psum.value(), db=store.meta)
        if seg_pids:
            sk = id_key(seg)
            names = list(vocab) if vocab else list(first or ())
            order = sorted(range(len(names)), key=names.__getitem__)
            names = [names[i] for i in order]
            rank = np.empty(len(order), np.int32)  # batch vocab id -> its rank in key order
            rank[order] = np.arange(len(order), dtype=np.int32)
            r = rank[np.concatenate(p_terms)] if p_terms else np.zeros(0, np.int32)
            del p_terms
            pid_arr = np.concatenate(p_pids) if p_pids else np.zeros(0, np.uint32)
            # by term, then passage: one sort of a 64-bit key (a term's passages are distinct),
            # faster than a lexsort of the two
            order = np.argsort((r.astype(np.int64) << 32) | pid_arr)
            r, pid_arr = r[order], pid_arr[order]
            tf_arr = (np.concatenate(p_tfs) if p_tfs else np.zeros(0, np.uint32))[order]
            del p_tfs, p_pids, order
            bounds = np.flatnonzero(np.diff(r)) + 1
            starts = np.concatenate(([0], bounds))
            ends = np.concatenate((bounds, [len(r)]))
            if len(r):  # made as they are written (a list of them all held megabytes)
                items = zip((sk + names[k].encode() for k in r[starts].tolist()),
                            postings.pack_many(pid_arr, tf_arr, starts, ends))
                # a term LMDB cannot key (analyze keeps none: a store's own defence) is
                # left out, never the batch: no query can name it either
                items = ((k, v) for k, v in items if len(k) <= KEY_MAX)
                summed = PostingsSum()
                # a new segment's keys sort after every other: appended, no old page touched
                txn.cursor(db=store.postings).putmulti(summed.over(items), append=True)
                txn.put(CRC + sk, summed.value(), db=store.meta)
            meta = SegMeta(np.asarray(seg_pids, "<u4").tobytes(), np.asarray(seg_lens, "<u4").tobytes(),
                           seg_refs)
            txn.put(sk, seg_codec.encode(meta), db=store.segments)
            txn.put(b"next_seg", str(seg + 1).encode(), db=store.meta)
        txn.put(b"next_pid", str(next_pid).encode(), db=store.meta)
        gen = int(txn.get(b"gen", db=store.meta)) + 1
        txn.put(b"gen", str(gen).encode(), db=store.meta)
        txn.put(b"cgen", str(gen).encode(), db=store.meta)  # (the content's: a merge changes none)
        if fsum is not None and fsum.n >= 0:
            txn.put(FCRC, FILES_SUM.pack(gen, fsum.total, fsum.n), db=store.meta)
        if allocated and min(allocated) < was_next:  # an id given before: the generation it was given again
            txn.put(b"pid_reuse", str(gen).encode(), db=store.meta)
        if seg_of is None:
            return allocated, None
        return allocated, Delta(snap, gen, next_pid, seg, seg_of, killed, dropped, seg_pids, seg_lens, seg_refs)


def drop_segment(store, txn, seg: int, pids: np.ndarray) -> None:
    """Remove a segment whose passages are all dead: its postings, its record,
    its passages' dead marks and vectors. Their ids are free after it."""
    sk = id_key(seg)
    cur = txn.cursor(db=store.postings)
    if cur.set_range(sk):
        while cur.key()[:4] == sk:
            if not cur.delete():
                break
    txn.delete(sk, db=store.segments)
    txn.delete(CRC + sk, db=store.meta)
    txn.delete(PCRC + sk, db=store.meta)
    for p in pids.tolist():
        txn.delete(id_key(p), db=store.dead)
        txn.delete(id_key(p), db=store.vectors)
        txn.delete(id_key(p), db=store.vec_pending)


def files_sum(store, txn) -> Optional[PostingsSum]:
    """The files table's sum as kept (:data:`format.FCRC`), or a new one for an empty table;
    None when it is not kept or is stale (another generation's)."""
    v = txn.get(FCRC, db=store.meta)
    out = PostingsSum()
    if v is None:
        return out if not txn.stat(store.files)["entries"] else None
    if len(v) != FILES_SUM.size:
        return None
    at, out.total, out.n = FILES_SUM.unpack(v)
    return out if at == int(txn.get(b"gen", db=store.meta)) else None


def forget_passage_sums(store, txn) -> None:
    """Drop every segment's passages' sum (a commit that cannot tell whose passages died)."""
    cur = txn.cursor(db=store.meta)
    while cur.set_range(PCRC) and bytes(cur.key()).startswith(PCRC):
        cur.delete()

