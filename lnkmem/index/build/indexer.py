"""Keeping the index in step with its sources.

:func:`plan` compares what the sources list (path, size, version) with what
the index recorded, reading no content; :func:`build` reads only the files
that changed, cuts them into passages and commits them in batches, so a
process killed half-way keeps every batch committed before it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import lmdb
import msgspec

from lnkmem.bridges.place import Entry, NotFound, Forbidden
from lnkmem.core.errors import DamagedIndex
from lnkmem.index.build import readahead, worker
from lnkmem.index.text import documents
from lnkmem.index.commit import Batch
from lnkmem.index.build.count import (BATCH_BYTES, BATCH_FILES, Vocab, as_listed, count_files, passages_of, read_file,
                                        ref_of)
from lnkmem.index.format import Passage
from lnkmem.index.store import Store

log = logging.getLogger("lnkmem")



@dataclass
class Plan:
    todo: list[tuple[str, Entry]] = field(default_factory=list)  # (source, entry)
    removed: list[str] = field(default_factory=list)
    listed: int = 0
    skipped: int = 0
    # each source listed whole: the digest of its listing (noted in the index once a
    # build has made the index match it exactly, so a restart that lists the same
    # compares no file; see Store.note_listed)
    digests: dict[str, bytes] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.todo) + len(self.removed)


def listing_digest(entries: list[Entry], converting: bool) -> bytes:
    """What a whole listing says (every path, size and version, in the order listed),
    and whether documents are converted: equal digests, equal listings."""
    h = hashlib.blake2b(msgspec.msgpack.encode(entries), digest_size=16)
    h.update(b"documents converted" if converting else b"documents by name")
    return h.digest()


# a whole local listing is shared with a second process (bridges/shared_walk.py) when the
# index holds this many files: a fork and the child's entries sent back cost ~30 ms, ~5,000
# files' listing; at 120,000 files the listing took 0.64-0.84 s against 0.75-1.0 alone
SHARED_LISTING = 20_000


def plan(store: Store, places: Mapping[str, object], only: Optional[str] = None,
         errors: Optional[list] = None) -> Plan:
    """What must change in the index for it to match ``places``.

    ``only``: a ref prefix to look at (a `changed` path, a watched file).
    ``errors``: when given, a place that cannot be listed (a bridge down) is
    left as the index has it and its exception appended, so the other places
    are still brought up to date; without it the exception propagates.
    """
    p = Plan()
    big = None  # whether the index holds enough files for a whole listing to be shared
    for source, place in places.items():
        if only is None or only == source:
            sub = ""
        elif only.startswith(source + "/"):
            sub = only[len(source) + 1 :]
        else:
            continue
        share = False
        if not sub and worker.forkable(place):
            if big is None:
                big = store.file_count() >= SHARED_LISTING
            share = big
        try:
            entries = place.list(sub, share=True) if share else place.list(sub)
        except Exception as e:
            if errors is None:
                raise
            errors.append(e)
            continue
        p.skipped += place.skipped
        p.listed += len(entries)
        converting = source != "chats" and documents.converter() is not None
        if not sub:
            p.digests[source] = digest = listing_digest(entries, converting)
            if store.listed(source) == digest:  # the index matched this very listing, nothing committed since
                logging.getLogger("lnkmem").info("%s: %d files listed as the index last matched them; none compared",
                                                 source, len(entries))
                continue
        prefix = ref_of(source, sub)
        # §3.3 rev. 2: documents indexed by name while lnk-documents was missing are
        # converted once it is installed (not those it failed on: they stay "name-failed")
        unconverted = set()
        if converting:
            unconverted = {r for r in store.refs_of_kind(prefix, "name") if documents.is_document(r)}
        todo = p.todo
        head = source + "/"
        # each listed file looked up in the index (per file: every restart looks at each),
        # then what the index holds there and the listing does not: below the prefix, and
        # the prefix itself (a file, or the notes: one file named by its source), never its
        # siblings ("home/a.md" vs "home/a.md2")
        seen = set()
        refs = (head + e.path if e.path else source for e in entries)
        for e, (ref, v) in zip(entries, store.heads_of(refs)):
            seen.add(ref)
            if v is None or v[0] != e.version or v[1] != e.size or ref in unconverted:
                todo.append((source, e))
        p.removed.extend(ref for ref in store.refs_under(prefix + "/") if ref not in seen)
        if prefix not in seen and store.file_recs([prefix]):
            p.removed.append(prefix)
    return p


def at_fault(store: Store, e: BaseException) -> bool:
    """Whether an error committing a batch may be one of its files' (its data: a key or
    value LMDB cannot take, postings that do not add up), not the store's or the
    machine's (the disk, memory, a damaged index), which every file would meet too."""
    if store.damaged is not None or isinstance(e, (OSError, MemoryError, DamagedIndex)):
        return False
    return not isinstance(e, lmdb.Error) or isinstance(e, lmdb.BadValsizeError)


ProgressFn = Callable[[int, int], None]


class Build:
    """The batches of one build made in this thread: files read here, each batch
    counted and committed every BATCH_BYTES or BATCH_FILES (the vocabulary kept
    from batch to batch until it is full: ``count.VOCAB_MAX``)."""

    def __init__(self, store: Store, total: int, removed: list[str], progress: Optional[ProgressFn]):
        self.store, self.total, self.progress = store, total, progress
        self.batch = Batch(removed=list(removed))
        self.done = len(removed)
        self.size = 0
        self.vocab = Vocab()
        self.last_report = 0.0
        self.inexact = 0  # files not indexed as listed (unreadable, gone, or changed since)
        self.failed = 0  # files the store refused or that failed to be cut (logged; tried again next pass)
        self.at = 0  # the entry :meth:`run` is at

    def report(self, force: bool = False) -> None:
        if self.progress and (force or time.monotonic() - self.last_report > 0.1):
            self.last_report = time.monotonic()
            self.progress(self.done, self.total)

    def count(self, files: list) -> None:
        """Count the batch's files (:func:`count_files`, all at once); should that fail,
        one by one, a file that fails left out of the batch (refused: its fault)."""
        try:
            count_files(files, self.vocab)
            return
        except Exception as e:
            if isinstance(e, (MemoryError, DamagedIndex)):
                raise
        self.vocab = Vocab()
        kept = []
        for f in files:
            try:
                count_files([f], self.vocab)
            except Exception as e:
                if isinstance(e, (MemoryError, DamagedIndex)):
                    raise
                self.refused(f.ref, e)
                continue
            kept.append(f)
        files[:] = kept

    def commit(self) -> None:
        self.count(self.batch.files)
        self.commit_batch(self.batch)
        if self.size >= BATCH_BYTES // 4 or len(self.batch.files) >= BATCH_FILES // 4:
            self.store.let_go()  # a bulk build's: a change of a few files keeps its pages (searches reread them)
        self.batch, self.size = Batch(), 0
        if self.vocab.full():
            self.vocab = Vocab()

    def commit_batch(self, batch: Batch) -> None:
        """Commit ``batch``; a file the store refuses (:func:`at_fault`) is left out of it,
        logged and counted, never the batch nor the pass: the other files are committed
        one by one. Its record stays as it was; the next pass tries it again."""
        try:
            self.store.commit(batch)
            return
        except Exception as e:
            if not batch.files or not at_fault(self.store, e):
                raise
        if batch.removed:
            self.store.commit(Batch(removed=batch.removed))
        for f in batch.files:
            try:
                self.store.commit(Batch([f], [], batch.packed_with))
            except Exception as e:
                if not at_fault(self.store, e):
                    raise
                self.refused(f.ref, e)

    def refused(self, ref: str, e: BaseException) -> None:
        self.failed += 1
        self.inexact += 1
        log.warning("%s could not be indexed (%s: %s); the other files are", ref, type(e).__name__, e)

    def add(self, source: str, entry: Entry, places, tmpdir: str) -> None:
        """Index one file into the batch; the batch committed when full."""
        try:
            nf = read_file(source, entry, places[source], tmpdir)  # (counted with its batch: commit)
        except Exception as e:  # this file's fault (its content or name), not the pass's
            if isinstance(e, (MemoryError, DamagedIndex)):
                raise
            self.refused(ref_of(source, entry.path), e)
            return
        if not as_listed(nf, entry):
            self.inexact += 1
        if nf is None:
            self.batch.removed.append(ref_of(source, entry.path))
        else:
            self.batch.files.append(nf)
            self.size += nf.size
        if self.size >= BATCH_BYTES or len(self.batch.files) >= BATCH_FILES:
            self.commit()

    def run(self, items, places, tmpdir: str, should_stop: Callable[[], bool]) -> bool:
        """Index ``items`` here; False when stopped."""
        for i, (source, entry) in enumerate(items):
            self.at = i
            if should_stop():
                return False
            self.add(source, entry, places, tmpdir)
            self.done += 1
            self.report()
        return True


SAMPLE_FILES = 512  # at most, spread over the plan
SAMPLE_BYTES = 256 << 10  # of text: enough for textpack.make_dict (which keeps 32 KiB of it)


def _sample(items: list, places, tmpdir: str) -> list[Passage]:
    """Passages of files spread over ``items`` (up to SAMPLE_BYTES of text): what the
    index's dictionary is made from (:func:`textpack.make_dict`) before a worker starts."""
    out: list[Passage] = []
    size = 0
    for source, entry in items[:: max(1, len(items) // SAMPLE_FILES)][:SAMPLE_FILES]:
        if size >= SAMPLE_BYTES:
            break
        if documents.is_document(entry.path):  # (no converter run for a sample)
            continue
        try:
            data, _ = places[source].read(entry.path)
        except (NotFound, Forbidden, OSError):
            continue
        passages, kind = passages_of(source, entry.path, data, tmpdir, None)
        if kind == "text":
            out += passages
            size += sum(len(p.text) for p in passages)
    return out


def build(store: Store, places: Mapping[str, object], the_plan: Plan, tmpdir: str,
          progress: Optional[ProgressFn] = None, should_stop: Callable[[], bool] = lambda: False,
          merge: bool = True) -> int:
    """Apply a plan; returns the number of files indexed.

    A large plan's local files are read, cut and counted by a worker process
    (:mod:`lnkmem.index.build.worker`, the second core) from the first on, and by
    this thread from the last on between commits of the worker's batches;
    everything of a small plan here. Then the merge the index asks for
    (:meth:`Store.maybe_merge`), unless ``merge`` is False: the caller merges,
    after letting go of the plan (its entries are ~330 B a file: 39 MiB at
    120k files, held through the merge's own peak otherwise)."""
    b = Build(store, the_plan.total, the_plan.removed, progress)
    todo = the_plan.todo
    w = None
    far = worker.share(places, todo)
    if far:  # the worker compresses the passages it sends: with the index's dictionary, made now if need be
        zdict = store.passage_dict(lambda: _sample(far, places, tmpdir))
        w = worker.start(far, places, tmpdir, zdict)
        if w is not None:
            todo = [x for x in todo if not worker.forkable(places[x[0]])]
    # a large plan's local files asked of the kernel ahead of their reads (a tree the page
    # cache does not hold: the reads would wait on the disk one file at a time)
    ahead = None
    if readahead.enabled():
        if w is not None:  # the worker reads from the first of its entries on, this thread from the last on
            ahead = readahead.Readahead(w.items, places, lambda: w.front).start()
        elif len(todo) >= worker.WORKER_FILES:  # this thread alone, from the first on
            ahead = readahead.Readahead(todo, places, lambda: (b.at, len(todo)), down=False).start()
    try:
        whole = b.run(todo, places, tmpdir, should_stop)
        if whole and w is not None:
            whole = w.share_with(b, places, tmpdir, should_stop)
    finally:
        if ahead is not None:
            ahead.stop()
        if w is not None:
            w.close()
    b.commit()
    if whole and not b.inexact:  # the index is now each whole listing, file for file
        for source, digest in the_plan.digests.items():
            store.note_listed(source, digest)
    if the_plan.total:
        if merge:
            store.maybe_merge()  # once, at the end: merging during a bulk build rewrites the same postings again and again
    else:  # nothing changed, nothing to merge (a restart never reads the snapshot); a killed merge's leftovers go
        store.drop_merge_leftovers_once()
    b.report(force=True)
    return b.done
