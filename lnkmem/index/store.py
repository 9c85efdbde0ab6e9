"""The words index in LMDB: one agent's index, opened, guarded, read and closed.

The tables and their records are :mod:`lnkmem.index.format`'s; the file's checks,
compaction and damage errors :mod:`lnkmem.index.lmdbfile`'s; an open's checks and a
close's seal :mod:`lnkmem.index.seal`'s; the guard :mod:`lnkmem.index.guard`'s; the
snapshot searches read :mod:`lnkmem.index.snapshot`'s; the reads of files and passages
:mod:`lnkmem.index.file_reads`'; the decoded lists' caches :mod:`lnkmem.index.caches`';
the stored vectors :mod:`lnkmem.index.vector_table`'s; a new version put in the index's
place :mod:`lnkmem.index.beside`'s; a commit's transaction :mod:`lnkmem.index.commit`'s;
a merge :mod:`lnkmem.index.merge`'s. :class:`Store` is the one door to them all: it holds
what they share (the environment, the tables, the snapshot, the locks), a commit, a merge,
a read go through its guard (refused once the index is damaged) and its write lock, and
what it tells its owner goes through one :class:`StoreEvents`.

Like Lucene, the index grows by immutable segments: a batch of changed
files becomes one new segment in one write transaction, and the passages it
replaces are marked dead, filtered at search time and dropped when segments
are merged. Every change is one LMDB transaction, so a process killed at any
moment leaves the index at the state before or after a batch; :meth:`Store.open`
checks that the tables agree and raises :class:`DamagedIndex` when not, unless
the index was closed whole and is untouched since (its seal): then the snapshot
saved at that close is read instead (a restart is O(change), not O(index)).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable, Iterator, Optional, TypeVar

import lmdb
import msgspec
import numpy as np

from lnkmem.core import atomic, memtrim
from lnkmem.core.errors import DamagedIndex
from lnkmem.index import beside, file_reads, guard, lmdbfile, seal, vector_table
from lnkmem.index import commit as commits
from lnkmem.index import snapshot as snapshots
from lnkmem.index.caches import SearchCaches
from lnkmem.index.codec import textpack
from lnkmem.index.commit import Batch
from lnkmem.index.format import FileRec, Passage, encoder
from lnkmem.index.guard import guarded, guarded_search, guarded_walk
from lnkmem.index.lmdbfile import CoveringEnv, DamagedWhileServing, check_file, wipe
from lnkmem.index.merge import policy, run
from lnkmem.index.seal import IndexInUse  # noqa: F401 (raised by Store.open: its callers catch it from here)
from lnkmem.index.snapshot import Snapshot
from lnkmem.index.tables import Reading, ReadingBegun, Tables, Writing


_T = TypeVar("_T")


@dataclass
class StoreEvents:
    """What a store tells its owner (the memory), each a callable or None (nobody told).

    ``committed()``: after every change that is committed (a commit, a merge, vectors);
    ``damaged(why)``: once, when the index is found damaged while serving;
    ``allocated(pids)``: the ids a commit gave new passages (ids are reused), before any
    search sees them live; ``map_grown()``: searches have left more than
    ``Store.SEARCH_MAP_RESIDENT`` of the map resident (called on a search's thread: it must
    not block)."""

    committed: Optional[Callable[[], None]] = None
    damaged: Optional[Callable[[str], None]] = None
    allocated: Optional[Callable[[list], None]] = None
    map_grown: Optional[Callable[[], None]] = None


log = logging.getLogger("lnkmem")


class Store:
    """One agent's words index, in one LMDB environment."""

    MAP_SIZE = 1 << 30

    def __init__(self, path: str):
        self.path = path
        self.write_lock = threading.RLock()  # re-entrant: refresh() from a commit's own events.allocated
        self.merge_lock = threading.Lock()  # one merge at a time (each step takes write_lock)
        self.events = StoreEvents()
        self.merger = policy.Merger(self)  # which segments to merge, and when
        self.merging: frozenset = frozenset()  # segments a merge of this process is reading: commits keep them
        self.buffers = snapshots.Buffers()  # the snapshot's arrays with room to grow (snapshot.extend)
        # a merge leaves the merged segments' postings (unlisted, read by nobody) to the
        # compaction at close, which copies only listed segments' (the people's `index`:
        # its build ends with a merge of every segment and its close compacts; deleting
        # them one key at a time took seconds at 10x, on one core)
        self.leave_merged = False
        self.left_merged = False  # a merge left some (a compaction at close drops them)
        self.caches = SearchCaches()  # the decoded lists, small segments' terms, block-max bounds
        self.compacted: Optional[bool] = None  # close(compact=True): whether data.mdb was rewritten
        try:
            self._open()
        except BaseException:
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            self.let_go_of_path()
            self._let_go_of_here()
            raise

    _real: Optional[str] = None  # the folder's device and inode, while this holds it open (seal.claim)

    def let_go_of_path(self) -> None:
        """Let go of this process's claim on the index's folder (:func:`seal.claim`): another
        store of this process may open it from now on (its close; its retirement)."""
        seal.release(self._real, self)
        self._real = None

    def _let_go_of_here(self) -> None:
        if self._let_go_of_folder is not None:
            self._let_go_of_folder()  # (its descriptor, once: ``here`` names nothing any more)

    # --- opening, checking, wiping ---------------------------------------

    def _open(self) -> None:
        # its folder opened once, never through a link: every name below it is reached from
        # it (self.here), whatever the folder's name -- or a folder above -- leads to later
        # (swapped for a link to another agent's, say: nothing of that one is ever touched)
        fd = seal.pin_folder(self.path)
        self._let_go_of_folder = weakref.finalize(self, os.close, fd)
        self.here = atomic.pinned(fd, self.path)
        self._real = seal.claim(fd, self, self.path)  # before anything is touched (the seal, the files)
        data = os.path.join(self.here, "data.mdb")
        self.data = data
        seal.clear_lmdb_names(self.here)
        sealed = seal.take_seal(self.here)
        self.opened_as = seal.check_file_at_open(self.here, data, sealed)
        size = self.MAP_SIZE
        if self.opened_as != "new":
            size = max(size, os.path.getsize(data) * 2)
        self.env = CoveringEnv(lmdb.open(
            self.here, map_size=size, max_dbs=8, metasync=False, sync=True, readahead=False
        ), data)
        t = self.tables = Tables(self.env)
        # (the handles, for the index's own layers: callers above it read and write through
        # reading() and writing())
        self.meta, self.files, self.passages, self.postings = t.meta, t.files, t.passages, t.postings
        self.segments, self.dead, self.vectors, self.vec_pending = t.segments, t.dead, t.vectors, t.vec_pending
        seal.check_format(self.env, t)
        self.psize = self.env.stat()["psize"]
        seal.remove_unfinished_compaction(self.here)
        self._sealed = sealed
        self._listed = snapshots.saved_listed(self.here, sealed) if self.opened_as == "sealed" else {}
        if self.opened_as == "sealed" and snapshots.saved_matches(self.here, sealed):
            return  # its snapshot is read when first asked for (a restart that changes nothing never does)
        self.snapshot = self.load_snapshot(check=self.opened_as != "sealed")

    @classmethod
    def open(cls, path: str) -> "Store":
        """Open the index at ``path``; a damaged one is wiped and started anew. An index open
        in this process already is refused (IndexInUse), and one this process cannot open
        now (:func:`lmdbfile.damage_at_open`) raises its error: neither is wiped."""
        try:
            return cls(path)
        except (DamagedIndex, lmdb.Error, msgspec.DecodeError, ValueError, IndexError, OSError) as e:
            if not lmdbfile.damage_at_open(e):
                raise
            wipe(path)
            store = cls(path)
            store.rebuilt_because = str(e)
            return store

    rebuilt_because: Optional[str] = None
    _snap_stamp: Optional[str] = None  # the saved snapshot's stamp, once it was used
    _sealed: Optional[str] = None
    _snapshot: Optional[Snapshot] = None
    opened_as = "new"  # "new", "sealed" (closed whole: not checked again) or "checked" (see _open)
    _snapshot_from = "tables"

    @property
    def snapshot(self) -> Snapshot:
        """What searches read: the last commit's; an index opened sealed reads the one saved
        at its close when first asked (a broken one: the tables, then a damaged index)."""
        snap = self._snapshot
        if snap is None:
            with self.write_lock:
                snap = self._snapshot
                if snap is None:
                    saved = snapshots.saved_snapshot(self.here, self._sealed, self._gen)
                    if saved is not None:
                        self._snap_stamp, self._snapshot_from = self._sealed, "saved"
                        snap = saved
                    else:
                        try:
                            snap = self.load_snapshot(check=False)
                        except (DamagedIndex, lmdb.Error, msgspec.DecodeError, ValueError, IndexError) as e:
                            raise self.damage(e) from None
                    self._snapshot = snap
        return snap

    @snapshot.setter
    def snapshot(self, snap: Snapshot) -> None:
        self._snapshot = snap

    @property
    def snapshot_read(self) -> bool:
        """Whether the snapshot was read (an index opened sealed reads it when first asked)."""
        return self._snapshot is not None

    def _gen(self) -> int:
        """The index's generation, as its ``meta`` says now."""
        with self.env.begin() as txn:
            return int(txn.get(b"gen", db=self.meta))

    def load_snapshot(self, check: bool = True) -> Snapshot:
        """The snapshot read anew from the tables (:func:`snapshot.load`); with ``check``,
        every file record is read too and must name exactly the live passages (DamagedIndex)."""
        with self.env.begin() as txn:
            return snapshots.load(txn, self, check)

    @property
    def snapshot_from(self) -> str:
        """Where the snapshot came from: "saved" (at the last clean close) or "tables"."""
        self.snapshot
        return self._snapshot_from

    @property
    def snapshot_saved(self) -> bool:
        """Whether the snapshot is (or, not read yet, will be) the one saved at the last close."""
        return self._snapshot_from == "saved" if self._snapshot is not None else self._sealed is not None

    @guarded
    def file_count(self) -> int:
        """Files the index holds (one read of the files table's size)."""
        with self.env.begin() as txn:
            return txn.stat(self.files)["entries"]

    def live_count(self) -> int:
        """Live passages: the snapshot's, or the passages table's entries when no snapshot was
        read yet (it holds exactly the live ones)."""
        if self._snapshot is not None:
            return self._snapshot.live
        with self.env.begin() as txn:
            return txn.stat(self.passages)["entries"]
    damaged: Optional[str] = None
    sized_until = 0.0  # (time.monotonic) a search's guard looks at the file's size again after it: guard.check

    def guard(self) -> None:
        """Refuse to touch a damaged index, or one whose file became shorter than the
        pages it uses (touching those would be a SIGBUS): :func:`guard.check`."""
        guard.check(self)

    def check_map(self) -> None:
        """Raise (and mark the index damaged) if a read through the map met a page the file
        no longer held: what it read was not the index's (:mod:`mapguard`)."""
        if self.env.faulted():
            raise self.damage("data.mdb was cut short while it was read")

    def damage(self, why) -> DamagedWhileServing:
        """Mark the index damaged (the engine is told once); the error for the call."""
        if self.damaged is None:
            self.damaged = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
            if self.events.damaged is not None:
                self.events.damaged(self.damaged)
        return DamagedWhileServing(f"the index is damaged ({self.damaged}) and is being rebuilt "
                                   "from the sources; try again in a moment")

    def changed(self) -> None:
        """A change was committed (a commit, a merge, vectors): the owner is told."""
        if self.events.committed is not None:
            self.events.committed()

    read_at = 0.0  # time.monotonic() of the last refresh: a search's look at the index
    # events.map_grown is called (on a search's thread; it must not block) when searches have
    # left more than SEARCH_MAP_RESIDENT of file-backed memory mapped: the engine lets go of the
    # map's pages on its own thread. Each page a search reads maps 64 KiB of cached neighbours, so
    # searches in a row at 1.27M passages left much of the map in serve's RSS until it rested
    SEARCH_MAP_RESIDENT = 96 << 20  # (the libraries' ~20 MiB included)
    MAP_CHECK_EVERY = 32  # searches between two reads of the resident memory (/proc/self/statm)
    _reads = 0

    @guarded_search
    def refresh(self) -> Snapshot:
        """Reload the snapshot when another process has committed since.

        A writer of this process publishes its snapshot before it lets go of the write
        lock, so a generation ahead of the snapshot is first waited out under that lock
        (a commit between its transaction and its snapshot: milliseconds); only a
        generation still ahead after it is another process's, read anew."""
        self.read_at = time.monotonic()
        if self.events.map_grown is not None:
            self._reads += 1  # (searches on several threads may miscount: no matter)
            if self._reads >= self.MAP_CHECK_EVERY:
                self._reads = 0
                held = memtrim.resident()
                if held is not None and held[1] > self.SEARCH_MAP_RESIDENT:
                    self.events.map_grown()
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
        if gen != self.snapshot.gen:
            with self.write_lock:
                with self.env.begin() as txn:
                    gen = int(txn.get(b"gen", db=self.meta))
                if gen != self.snapshot.gen:
                    self.snapshot = self.load_snapshot()
        return self.snapshot

    # --- the listings the index matches ----------------------------------

    def listed(self, source: str) -> Optional[bytes]:
        """The digest of the listing of ``source`` (indexer.listing_digest) that the index
        matched file for file when it was noted, no file committed since: a listing
        with this digest needs no file compared (a restart on an unchanged tree)."""
        return self._listed.get(source)

    def note_listed(self, source: str, digest: bytes) -> None:
        """The index now holds exactly what this listing of ``source`` lists (a build
        that read every file of it as listed); kept at a clean close."""
        with self.write_lock:
            self._listed[source] = digest

    def forget_listed(self) -> None:
        """Files were written: no listing noted before is known to match any more."""
        with self.write_lock:
            self._listed = {}

    _trimmed_at = 0  # anonymous memory after the last trim of let_go
    MAP_RESIDENT = 32 << 20  # file-backed memory (libraries included) past which a build lets go of the map's pages

    TRIM_STEP = 32 << 20  # anonymous memory grown since the last trim before a build trims again

    def let_go(self) -> None:
        """Give back what a build's commit leaves held: the map's pages (:meth:`let_go_of_map`)
        and, once the anonymous memory has grown by :data:`TRIM_STEP` since the last time, the
        heap freed (glibc keeps it in its arenas otherwise). Not after every commit: each trim
        hands back pages the next batch faults in again (a build made slower)."""
        held = self.let_go_of_map()  # (letting go of the map leaves the anonymous memory as it was)
        if held is None or held[0] > self._trimmed_at + self.TRIM_STEP:
            memtrim.trim()
            after = memtrim.resident()
            self._trimmed_at = after[0] if after is not None else 0

    def let_go_of_map(self) -> Optional[tuple[int, int]]:
        """Let go of the map's pages this process has touched once its file-backed memory is
        past :data:`MAP_RESIDENT`. Each read of a page not mapped yet maps its cached
        neighbours too (the kernel's fault-around, 64 KiB), so a walk through the B-trees
        soon holds many times the pages it read: each commit of a build at 1.27M passages,
        the people's index asking 120k file records at its end, a merge between its steps
        (docs/BENCHMARKS.md). Returns the resident
        memory read before (:func:`memtrim.resident`)."""
        return lmdbfile.let_go_of_map(self.data, self.MAP_RESIDENT)

    @property
    def data_tables(self) -> tuple:
        """Every table's handle but ``meta``'s: what the index holds (a copy's load replaces them all)."""
        return self.tables.data

    def free_share(self) -> float:
        """The share of data.mdb's pages that no table uses: :func:`seal.free_share`."""
        return seal.free_share(self.env, self.tables)

    def close(self, compact: bool = False) -> None:
        """Close; an index closed whole is sealed, so the next open need not read it all,
        and its snapshot is saved beside it, so the next open need not rebuild it.
        ``compact``: first rewrite data.mdb without its free pages when they are more
        than :data:`COMPACT_FREE` of it and no other process has the index open
        (:func:`compact_file`; the people's ``index`` asks, after its build)."""
        try:
            self._close(compact)
        finally:
            self.let_go_of_path()  # (last: no other open of this process while it compacts)
            self._let_go_of_here()

    def _close(self, compact: bool) -> None:
        self.merger.stop()  # a merge under way stops at its next step (what it wrote: dropped later, drop_merge_leftovers)
        if self.retired:  # nothing of it is kept: its folder's name is another index's
            self.env.close()
            return
        with self.write_lock:
            whole = self.damaged is None and not self.env.faulted()
            saved = None
            try:
                if whole:
                    self.env.sync(True)
                    compact = compact and seal.worth_compacting(self.data, self.left_merged, self.free_share)
                    # a snapshot never read: the saved one stands while the file is as it was sealed
                    if self._snapshot is not None or compact or lmdbfile.stamp(self.data, check_file(self.data)) != self._sealed:
                        saved = snapshots.snapshot_bytes(self.snapshot, self._gen())
            except (lmdb.Error, OSError, DamagedIndex):
                whole = False
            whole = whole and not self.env.faulted()  # (what was saved was read through it)
            self.env.close()
            if whole and compact:
                self.compacted = seal.compact(self.here)
            if whole:
                seal.seal_at_close(self.here, self.data, saved, self._snap_stamp, self._listed)

    here = ""  # its folder, as opened (atomic.pinned): every name below it is reached from there
    _let_go_of_folder: Optional[Callable[[], None]] = None  # closes the folder's descriptor (once)

    # --- a whole new version, loaded beside the index and put in its place ------

    BESIDE = beside.BESIDE  # the folder beside the index's a new version is loaded into (path + BESIDE)

    retired = False  # another index was put in its place (replaced_by): read, never sealed (a write is not refused: it lands in the unlinked file)

    @staticmethod
    def discard_beside(path: str) -> None:
        """Remove what a load beside the index at ``path`` left (a process killed during it,
        or the version it replaced): :func:`beside.discard`."""
        beside.discard(path)

    def open_beside(self) -> Optional["Store"]:
        """A new, empty index in the folder beside this one's, for a whole version to be
        written into (in steps: LMDB holds a write transaction's dirty pages in memory until
        its commit, and keeps them after it) while this one is searched; then
        :meth:`replaced_by`. Anything found there first is removed. None where the system
        cannot swap two folders' names in one step (nothing is left beside)."""
        return beside.open_beside(self, Store)

    def replaced_by(self, side: "Store") -> "Store":
        """Put ``side`` (:meth:`open_beside`, loaded) in this index's place and return it,
        opened there. ``side`` is closed (sealed: its open is quick), the two folders swap
        names in one step (a process killed at any moment leaves the index one whole
        version, and the leftover is removed at the next :meth:`discard_beside`), and this
        store is retired: the reads under way, and any begun on it until its owner lets
        go of it, see the version it held; its owner is told of the new one instead (its
        events), which merges if this one did, on a merger told to look at its first wake;
        this one's merger stops, and its environment closes when the last of its reads
        ends (LMDB's own close, as the last reference goes), its file unlinked already.
        OSError (the folders as they were, ``side`` closed) where the system cannot swap
        folders in one step (:func:`beside.replace`)."""
        return beside.replace(self, side, Store.open)

    # --- transactions of the tables, typed (lnkmem.index.tables) -------------

    def through_guard(self) -> ContextManager[None]:
        """What the guard does around a call, around a transaction's ``with``: :func:`guard.through`."""
        return guard.through(self)

    def reading(self, guarded: bool = True) -> ContextManager[Reading]:
        """A read transaction of the tables (:class:`tables.Reading`): one version of the
        index, whatever commits meanwhile, for as long as the ``with`` lasts.

        ``guarded=False``: without the guard (a cost at every call: a look at the file, the
        map's faults, two generators' contexts), for a caller that passed it just before
        and turns what LMDB raises into damage itself: a search (:meth:`refresh`, then
        ``Memory.rank``'s handlers)."""
        if not guarded:
            return ReadingBegun(self.env, self.tables)
        return self._guarded_reading()

    @contextlib.contextmanager
    def _guarded_reading(self) -> Iterator[Reading]:
        with self.through_guard(), self.env.begin() as txn:
            yield Reading(txn, self.tables)

    @contextlib.contextmanager
    def writing(self) -> Iterator[Writing]:
        """A write transaction of the tables (:class:`tables.Writing`) under the write lock:
        committed when the ``with`` ends, aborted when it raises."""
        with self.through_guard(), self.write_lock, self.env.begin(write=True) as txn:
            yield Writing(txn, self.tables)

    def begin_writing(self) -> Writing:
        """A write transaction the caller ends with its ``commit()`` or ``abort()`` (a copy's
        load commits one every few MiB), begun by a caller that holds :attr:`write_lock`
        until it ends (LMDB has one writer: a second one here would wait on it forever)."""
        self.guard()
        begun = self.env.begin(write=True)
        return Writing(begun.__enter__(), self.tables, begun)

    def with_map_room(self, write: Callable[[], _T], at_least: int = 0) -> _T:
        """``write()``, its transactions given a map of at least ``at_least`` bytes, and run
        again with the map twice as large whenever it fills the map (what it wrote then
        was aborted: LMDB's MapFullError). Under :attr:`write_lock`."""
        with self.write_lock:
            if at_least and self.env.info()["map_size"] < at_least:
                self.env.set_mapsize(at_least)
            while True:
                try:
                    return write()
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def reload_snapshot(self, check: bool = True) -> None:
        """The snapshot read anew from the tables and published (:meth:`load_snapshot`): after
        a caller wrote them through :meth:`writing` (a copy's load), under the write lock."""
        with self.write_lock:
            self.snapshot = self.load_snapshot(check)

    # --- reading (lnkmem.index.file_reads) --------------------------------

    @guarded
    def all_files(self) -> dict[str, FileRec]:
        """Every file's record, by ref."""
        return file_reads.all_files(self)

    @guarded
    def file_versions(self, prefix: str = "") -> dict[str, tuple[str, int]]:
        """(version, size) of every file below ``prefix``, by ref: :func:`file_reads.versions`."""
        return file_reads.versions(self, prefix)

    @guarded_walk
    def heads_of(self, refs: Iterable[str]) -> Iterator[tuple[str, Optional[tuple[str, int]]]]:
        """(ref, (version, size) or None) of each of ``refs``, in their order: :func:`file_reads.heads_of`."""
        yield from file_reads.heads_of(self, refs)

    @guarded_walk
    def refs_under(self, prefix: str) -> Iterator[str]:
        """The ref of every file below ``prefix`` (a walk of the table, nothing kept)."""
        yield from file_reads.refs_under(self, prefix)

    @guarded
    def file_recs(self, refs: Iterable[str]) -> dict[str, FileRec]:
        """The records of ``refs`` that the index holds (one lookup each)."""
        return file_reads.file_recs(self, refs)

    @guarded
    def kinds_of(self, refs: Iterable[str]) -> dict[str, str]:
        """How each of ``refs`` that the index holds was indexed: :func:`file_reads.kinds_of`."""
        return file_reads.kinds_of(self, refs)

    @guarded
    def refs_of_kind(self, prefix: str, kind: str) -> set[str]:
        """The refs below ``prefix`` indexed as ``kind``: :func:`file_reads.refs_of_kind`."""
        return file_reads.refs_of_kind(self, prefix, kind)

    @guarded
    def file_mtime(self, ref: str) -> Optional[str]:
        """A file's modification time as indexed (None when unknown)."""
        return file_reads.file_mtime(self, ref)

    @guarded
    def passages_of(self, pids: Iterable[int]) -> list[Optional[Passage]]:
        """The passages of ``pids``, in their order (None where not live)."""
        return file_reads.passages_of(self, pids)

    def postings_of(self, r: Reading, term: str, segs: Optional[list[bytes]] = None) -> tuple[np.ndarray, np.ndarray]:
        """(pids, tfs) of a term across the segments, dead ones included: :meth:`caches.SearchCaches.postings_of`."""
        return self.caches.postings_of(r, term, segs)

    def holding(self, r: Reading, segs: list[bytes], term: bytes) -> list[bytes]:
        """Those of ``segs`` that may hold a list of ``term``: :meth:`caches.SearchCaches.holding`."""
        return self.caches.holding(r, segs, term)

    def decoded_list(self, r: Reading, key: bytes) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(pids, tfs) of one segment's list of a term, decoded once and kept:
        :meth:`caches.SearchCaches.decoded_list`."""
        return self.caches.decoded_list(r, key)

    @guarded
    def get_meta(self, key: bytes) -> Optional[bytes]:
        with self.env.begin() as txn:
            return txn.get(key, db=self.meta)

    @guarded
    def passage_dict(self, sample) -> Optional[bytes]:
        """The index's dictionary for passages' text (:mod:`textpack`); when it has
        none yet, made now from ``sample()`` (passages) and kept, so that a build's
        worker packs what it sends with it (None: the sample was too small)."""
        with self.env.begin() as txn:
            zdict = txn.get(b"zdict", db=self.meta)
        if zdict is not None:
            return zdict
        passages = sample()  # (its files read outside the write lock)
        with self.write_lock, self.env.begin(write=True) as txn:
            return self.passage_dict_in(txn, passages)

    def passage_dict_in(self, txn, passages: Iterable) -> Optional[bytes]:
        """The index's passage dictionary in a write transaction: the one it has, else
        one made from ``passages`` (read only then) and kept, else None (too few)."""
        zdict = txn.get(b"zdict", db=self.meta)
        if zdict is None:
            zdict = textpack.make_dict([encoder.encode(p) for p in passages])
            if zdict is not None:
                txn.put(b"zdict", zdict, db=self.meta)
        return zdict

    @guarded
    def put_meta(self, key: bytes, value: bytes) -> None:
        with self.write_lock, self.env.begin(write=True) as txn:
            txn.put(key, value, db=self.meta)

    # --- writing ---------------------------------------------------------

    @guarded
    def commit(self, batch: Batch) -> None:
        """Apply a batch in one transaction and publish a new snapshot."""
        if not batch:
            return
        with self.write_lock:
            self.forget_listed()
            allocated, delta = self.with_map_room(lambda: commits.write(self, batch))
            if allocated and self.events.allocated is not None:
                self.events.allocated(allocated)  # before any search sees them as live
            # extended by what changed; read anew only after another process wrote
            self.snapshot = snapshots.extend(delta.base, delta, self.buffers) if delta is not None \
                else self.load_snapshot()
        self.changed()

    # --- vectors (lnkmem.index.vector_table) ----------------------------------

    @guarded
    def vector_count(self) -> int:
        """How many passages have a stored vector: :func:`vector_table.count`."""
        return vector_table.count(self)

    def vector_model(self) -> Optional[str]:
        """The model whose vectors the index holds (None: none recorded)."""
        v = self.get_meta(b"model")
        return v.decode() if v is not None else None

    @guarded
    def use_vector_model(self, model: str) -> bool:
        """Record whose vectors the index holds; another model's are dropped (True when
        some were): :func:`vector_table.use_model`."""
        return vector_table.use_model(self, model)

    @guarded
    def put_vectors(self, pids: list[int], vecs: np.ndarray, passages: Optional[list] = None) -> list[int]:
        """Store unit vectors of passages still live (and still ``passages``, when given);
        returns those stored: :func:`vector_table.put`."""
        return vector_table.put(self, pids, vecs, passages)

    @guarded
    def vector_shape(self) -> tuple[int, int]:
        """(largest pid with a vector + 1, dimension); (0, 0) when none: :func:`vector_table.shape`."""
        return vector_table.shape(self)

    def iter_vectors(self, chunk: int = 8192):
        """Every stored vector in chunks of ``chunk`` rows: :func:`vector_table.iter_rows`."""
        return vector_table.iter_rows(self, chunk)

    @guarded
    def all_vectors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pids, int8 matrix, float32 scales) of every stored vector: :func:`vector_table.all_rows`."""
        return vector_table.all_rows(self)

    # --- merging (lnkmem.index.merge: the run, the policy) ----------------

    MERGE_FACTOR = 8  # a tier of segments is merged when it holds this many
    TIER_FLOOR = 16  # passages: smaller segments are all in the lowest tier
    DEAD_SHARE = 0.5  # a segment with more dead passages than this share is merged alone
    STEP_BYTES = 4 << 20  # postings written (or keys deleted, x64 B) per write transaction of a merge
    JOIN_BYTES = 64 << 10  # stored lists of terms in several segments joined at a time by a merge

    @guarded
    def segment_sizes(self) -> dict[int, int]:
        with self.env.begin() as txn:
            return {int.from_bytes(k, "big"): len(v) for k, v in txn.cursor(db=self.segments)}

    REFS_SLACK = 1024  # refs no segment names, kept until a merge finds more than this (and the named)

    @guarded
    def merge(self, segs: list[int], should_stop=None) -> bool:
        """Merge segments into one, dropping their dead passages; False when nothing was
        merged (stopped by ``should_stop``, or a segment went away meanwhile): :func:`merge.run.merge`."""
        return run.merge(self, segs, should_stop)

    @guarded
    def drop_merge_leftovers(self) -> list[int]:
        """Delete the postings of segments not listed (a merge killed or stopped between its
        steps), but a merge's still under way in another live process; returns the segments
        whose postings were dropped. Waits for a merge of this process under way."""
        with self.merge_lock:
            return run.drop_merge_leftovers(self)

    def merge_plan(self, factor: Optional[int] = None) -> list[int]:
        """The segments to merge next, or [] (:func:`merge.policy.plan`)."""
        return policy.plan(self, factor)

    def maybe_merge(self, factor: Optional[int] = None) -> bool:
        """Merge what the policy asks for: on the merger thread when one runs, else here
        (:meth:`merge.policy.Merger.maybe_merge`)."""
        return self.merger.maybe_merge(factor)

    def drop_merge_leftovers_once(self) -> None:
        """What a merge killed before this open left, dropped once (never behind a merge under way)."""
        self.merger.drop_merge_leftovers_once()

    def merges_held(self):
        """A context in which no merge starts (one under way finishes first):
        :meth:`merge.policy.Merger.held`."""
        return self.merger.held()

    def start_merger(self, look: bool = True) -> None:
        """Merge on a thread of its own from now on: :meth:`maybe_merge` only wakes it
        (``look``: it looks at once at what the index holds, else at its first wake)."""
        self.merger.start(look)

    def stop_merger(self, timeout: float = 30.0) -> None:
        """Stop the merger thread (a merge under way stops at its next step) and wait for it."""
        self.merger.stop(timeout)

