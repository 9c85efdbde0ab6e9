"""The snapshot: what BM25 needs in memory of one committed generation, made from the
tables (:func:`load`), extended by a commit (:func:`extend`) and patched by a merge
(:func:`merged`), O(change); and the snapshot and the listings saved beside data.mdb at
a clean close (read at the next open instead of the tables: a restart is O(change)).

A published snapshot never changes where a search holding it can see, so searches read
a consistent snapshot.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from typing import Optional

import lmdb
import msgspec
import numpy as np

from lnkmem.core import atomic
from lnkmem.core.errors import DamagedIndex
from lnkmem.index.format import SOURCE_CODE, encoder, file_decoder, file_entry, seg_codec, source_of
from lnkmem.index.lmdbfile import LISTED, SNAP
from lnkmem.index.codec.refs import Refs


class Listed(msgspec.Struct):
    """The file LISTED: the stamp it is valid beside, and per source a listing's digest (hex)."""
    stamp: str
    listed: dict[str, str]



class SavedSnapshot(msgspec.Struct, array_like=True):
    """A snapshot as saved at a clean close (``snapshot`` beside data.mdb, after the seal's stamp)."""

    gen: int
    live: int
    total_len: float
    segs: list[tuple[int, int]]
    refs: list[str]
    doclen: bytes
    alive: bytes
    src: bytes
    refid: bytes
    seg_of: bytes


_saved_decoder = msgspec.msgpack.Decoder(SavedSnapshot)


@dataclass(frozen=True)
class Snapshot:
    """What BM25 needs in memory, consistent with one committed generation."""

    gen: int
    doclen: np.ndarray  # float32 per pid
    alive: np.ndarray  # bool per pid
    src: np.ndarray  # uint8 per pid
    refid: np.ndarray  # int32 per pid -> refs
    refs: Refs
    live: int
    total_len: float
    seg_of: Optional[np.ndarray] = None  # int32 per pid -> its segment, -1: in none (a free id)
    segs: Optional[dict] = None  # segment -> its passages (dead ones included)
    # (under, refs counted, which refs start with it): keep()'s last folder test, since a
    # search asks it more than once (prune.maxscore, at each of its cuts)
    _under: Optional[tuple] = field(default=None, repr=False, compare=False)
    # what searches work out once for this snapshot, by name (terms.FACTS, checks.FILE_TIMES):
    # kept with it, so that memories searched in turn in one process keep theirs
    worked_out: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def avgdl(self) -> float:
        return self.total_len / self.live if self.live else 1.0

    def keep(self, pids: np.ndarray, sources=None, under: Optional[str] = None) -> np.ndarray:
        """Those of ``pids`` from the given sources and with refs starting ``under``."""
        if sources is not None and set(sources) != set(SOURCE_CODE):
            codes = np.array([SOURCE_CODE[s] for s in sources if s in SOURCE_CODE], np.uint8)
            pids = pids[np.isin(self.src[pids], codes)]
        if under:
            memo = self._under
            if memo is not None and memo[0] == under and memo[1] is self.refs:
                ok = memo[2]
            else:
                ok = self.refs.starting(under)
                object.__setattr__(self, "_under", (under, self.refs, ok))
            rid = self.refid[pids]
            pids = pids[(rid >= 0) & ok[np.maximum(rid, 0)]]
        return pids


@dataclass
class Delta:
    """What one commit changed, for extending the snapshot (:func:`extend`)."""

    base: "Snapshot"  # the snapshot the commit started from (a search may refresh meanwhile)
    gen: int
    next_pid: int
    seg: int
    seg_of: np.ndarray  # the segment of each id after the commit (new passages not yet set)
    killed: list[int]  # ids live before, dead now
    dropped: list[int]  # segments removed (all their passages dead)
    pids: list[int]  # new passages: ids, lengths, refs
    lens: list[int]
    refs: list[str]



class Buffers:
    """``doclen``/``src``/``refid`` with room beyond the snapshot's length (one per store):
    a commit writes a new passage's entries in place where no snapshot a search may hold
    can see them (:func:`extend`)."""

    __slots__ = ("arrays",)

    def __init__(self) -> None:
        self.arrays: tuple = ()

    def own(self, snap: Snapshot) -> bool:
        """Whether ``snap``'s arrays are views of these buffers."""
        bufs = self.arrays
        return bool(bufs) and (snap.doclen is bufs[0] or snap.doclen.base is bufs[0])


def load(txn, tables, check: bool = True) -> Snapshot:
    """The snapshot read in ``txn`` from ``segments`` and ``dead`` (of ``tables``: the
    store's named tables); with ``check``, every file record is read too and must name
    exactly the live passages (DamagedIndex)."""
    gen = int(txn.get(b"gen", db=tables.meta))
    next_pid = int(txn.get(b"next_pid", db=tables.meta))
    cap = next_pid + 1
    doclen = np.zeros(cap, np.float32)
    alive = np.zeros(cap, bool)
    src = np.zeros(cap, np.uint8)
    refid = np.full(cap, -1, np.int32)
    seg_of = np.full(cap, -1, np.int32)
    names: list[str] = []
    ids: dict[str, int] = {}  # (while loading only)
    segs: dict[int, int] = {}
    for k, v in txn.cursor(db=tables.segments):
        seg = seg_codec.decode(v)
        pids = np.frombuffer(seg.pids, "<u4")
        if len(pids) != len(seg.refs) or (len(pids) and pids.max() >= cap):
            raise DamagedIndex("segment table disagrees with passage ids")
        if len(pids) and (seg_of[pids] >= 0).any():
            raise DamagedIndex("a passage id lies in two segments")
        seg_of[pids] = int.from_bytes(k, "big")
        segs[int.from_bytes(k, "big")] = len(pids)
        doclen[pids] = np.frombuffer(seg.lens, "<u4")
        alive[pids] = True
        for r in dict.fromkeys(seg.refs):  # new refs, in order
            if r not in ids:
                ids[r] = len(names)
                names.append(r)
        refid[pids] = np.fromiter(map(ids.__getitem__, seg.refs), np.int32, len(pids))
    # a passage's source is its ref's: computed once per ref
    ref_src = np.fromiter((SOURCE_CODE.get(source_of(r), 0) for r in names), np.uint8, len(names))
    del ids
    refs = Refs.of(names)
    del names
    has = refid >= 0
    src[has] = ref_src[refid[has]]
    for k, _ in txn.cursor(db=tables.dead):
        p = int.from_bytes(k, "big")
        if p < cap:
            alive[p] = False
    if check:  # every live passage belongs to exactly one file record, and back
        owned = array("q")  # every file's ids, checked at once (one gather, not one per file; 8 bytes an id)
        for k, v in txn.cursor(db=tables.files):
            owned.extend(file_decoder.decode(file_entry(k, v)[1]).pids)
        if owned and not alive[np.frombuffer(owned, np.int64)].all():
            raise DamagedIndex("a file names passages that are not live")
        if len(owned) != int(alive.sum()):
            raise DamagedIndex("live passages and files disagree")
    live = int(alive.sum())
    return Snapshot(gen, doclen, alive, src, refid, refs, live, float(doclen[alive].sum(dtype=np.float64)),
                    seg_of, segs)

_bufs: tuple = ()  # (doclen, src, refid) with room beyond the snapshot's length

def extend(old: Snapshot, d: Delta, buffers: Buffers) -> Snapshot:
    """The snapshot after a commit, made from the one before it and what the commit
    changed: O(change) but for a copy of the 1-byte ``alive`` per pid (a search may
    still hold ``old``, whose arrays are never changed where it can see them).

    ``doclen``/``src``/``refid`` live in buffers with room to grow: a new passage's
    entries are written in place when ``old`` cannot see them (beyond its length, or
    an id not live in it); otherwise (an id freed and reused in one commit) the
    buffers are copied first."""
    n_old = len(old.alive)
    n = max(n_old, d.next_pid + 1)
    new = np.asarray(d.pids, np.int64)
    seen = new[new < n_old]
    bufs = buffers.arrays
    own = buffers.own(old)
    if not own or len(bufs[0]) < n or (len(seen) and old.alive[seen].any()):
        cap = max(n, n_old + n_old // 8 + 1024)
        doclen = np.zeros(cap, np.float32)
        src = np.zeros(cap, np.uint8)
        refid = np.full(cap, -1, np.int32)
        doclen[:n_old], src[:n_old], refid[:n_old] = old.doclen, old.src, old.refid
        bufs = buffers.arrays = (doclen, src, refid)
    doclen, src, refid = bufs
    refs = old.refs
    if len(new):
        named = list(dict.fromkeys(d.refs))  # each ref once, in order
        found = refs.find_all(named)
        if (found < 0).any():
            fresh = [r for r, f in zip(named, found.tolist()) if f < 0]
            found[found < 0] = np.arange(len(refs), len(refs) + len(fresh), dtype=np.int32)
            refs = refs.extended(fresh)  # a new table: ``old`` keeps its own
        ids = dict(zip(named, found.tolist()))
        rid = np.fromiter(map(ids.__getitem__, d.refs), np.int32, len(new))
        ref_src = {i: SOURCE_CODE.get(source_of(r), 0) for r, i in ids.items()}
        lens = np.asarray(d.lens, np.float32)
        doclen[new] = lens
        refid[new] = rid
        src[new] = np.fromiter(map(ref_src.__getitem__, rid.tolist()), np.uint8, len(new))
    alive = np.zeros(n, bool)
    alive[:n_old] = old.alive
    killed = np.asarray(d.killed, np.int64)
    total = old.total_len
    if len(killed):
        alive[killed] = False
        total -= float(old.doclen[killed].sum(dtype=np.float64))
    if len(new):
        alive[new] = True
        total += float(np.asarray(d.lens, np.float64).sum())
    seg_of = d.seg_of
    if len(seg_of) < n:
        seg_of = np.concatenate((seg_of, np.full(n - len(seg_of), -1, np.int32)))
    segs = dict(old.segs or {})
    for s in d.dropped:
        segs.pop(s, None)
    if len(new):
        seg_of[new] = d.seg
        segs[d.seg] = len(new)
    live = old.live - len(killed) + len(new)
    return Snapshot(d.gen, doclen[:n], alive, src[:n], refid[:n], refs, live, total, seg_of, segs)

def saved_listed(path: str, sealed: Optional[str]) -> dict[str, bytes]:
    """The listings noted at the last clean close, when it was of the index as sealed."""
    try:
        saved = msgspec.json.decode(atomic.read_file(os.path.join(path, LISTED)) or b"", type=Listed)
        if sealed is None or saved.stamp != sealed:
            return {}
        return {k: bytes.fromhex(v) for k, v in saved.listed.items()}
    except (OSError, ValueError, msgspec.DecodeError):
        return {}

def save_listed(path: str, stamp: str, listed: dict[str, bytes]) -> None:
    """Keep ``listed`` (the listings the index matches) beside a seal of ``stamp``."""
    where = os.path.join(path, LISTED)
    if not listed:
        atomic.remove(where)
        return
    atomic.write_file(where, msgspec.json.encode(Listed(stamp, {k: v.hex() for k, v in listed.items()})))

def saved_matches(path: str, sealed: Optional[str]) -> bool:
    """Whether the saved snapshot's first line is the stamp ``sealed`` (its body is read,
    and checked, when the snapshot is first asked for)."""
    if sealed is None:
        return False
    want = sealed.encode() + b"\n"
    return atomic.read_file(os.path.join(path, SNAP), len(want)) == want

def saved_snapshot(path: str, sealed: str, gen_now) -> Optional[Snapshot]:
    """The snapshot saved at the last clean close, when it is of the index as sealed
    (same stamp: no transaction since) and the generation it names (``gen_now()``: the
    index's); else None."""
    try:
        raw = atomic.read_file(os.path.join(path, SNAP))  # (never through a link, never a FIFO's wait)
        if raw is None:
            return None
        head, _, body = raw.partition(b"\n")
        if head.decode() != sealed:
            return None
        d = _saved_decoder.decode(body)
        if gen_now() != d.gen:
            return None
        n = len(d.alive)
        arrays = [np.frombuffer(b, t).copy() for b, t in
                  ((d.doclen, "<f4"), (d.alive, "?"), (d.src, "u1"), (d.refid, "<i4"), (d.seg_of, "<i4"))]
        if any(len(a) != n for a in arrays):
            return None
        doclen, alive, src, refid, seg_of = arrays
        if len(refid) and (refid.max() >= len(d.refs) or refid.min() < -1):
            return None
        return Snapshot(d.gen, doclen.astype(np.float32), alive, src, refid, Refs.of(d.refs), d.live, d.total_len,
                        seg_of, dict(d.segs))
    except (OSError, ValueError, UnicodeDecodeError, msgspec.DecodeError, TypeError, lmdb.Error):
        return None

def snapshot_bytes(snap: Snapshot, gen_now: int) -> Optional[bytes]:
    """``snap`` encoded for the next open, when it is the index's (its generation is
    ``gen_now``: no other process committed since it was made); None otherwise."""
    if snap.seg_of is None or snap.segs is None or gen_now != snap.gen:
        return None
    return encoder.encode(SavedSnapshot(
        snap.gen, snap.live, snap.total_len, list(snap.segs.items()), list(snap.refs),
        snap.doclen.astype("<f4").tobytes(), snap.alive.tobytes(), snap.src.tobytes(),
        snap.refid.astype("<i4").tobytes(), snap.seg_of.astype("<i4").tobytes()))

def merged(old: Snapshot, segs: list[int], new: int, gen: int, kept: np.ndarray,
           gone: np.ndarray, buffers: Buffers, refs_slack: int) -> Snapshot:
    """The snapshot after a merge: no live passage changes; the merged segments'
    ids move to the new one and their dead ids leave every segment (free ids)."""
    seg_of = old.seg_of.copy()
    seg_of[kept] = new
    seg_of[gone] = -1
    sizes = {s: n for s, n in (old.segs or {}).items() if s not in set(segs)}
    if len(kept):
        sizes[new] = len(kept)
    refs, refid = old.refs, old.refid
    # refs only grow between merges (a removed or renamed file's stays): here, where the
    # work is already O(merged), drop those no passage in a segment names any more
    used = np.zeros(len(refs), bool)
    held = old.refid[seg_of[:len(old.refid)] >= 0]
    used[held[held >= 0]] = True
    n_used = int(used.sum())
    if len(refs) > n_used and len(refs) > 2 * n_used + refs_slack:
        remap = np.full(len(refs) + 1, -1, np.int32)  # + 1: refid -1 stays -1
        remap[np.flatnonzero(used)] = np.arange(n_used, dtype=np.int32)
        refs = refs.kept(used)
        bufs = buffers.arrays
        own = buffers.own(old)
        buf = np.full(len(bufs[2]) if own else len(old.refid), -1, np.int32)  # a new one: ``old`` keeps its own
        buf[:len(old.refid)] = remap[old.refid]
        if own:
            buffers.arrays = (bufs[0], bufs[1], buf)
        refid = buf[:len(old.refid)]
    return Snapshot(gen, old.doclen, old.alive, old.src, refid, refs, old.live, old.total_len,
                    seg_of, sizes)

REFS_SLACK = 1024  # refs no segment names, kept until a merge finds more than this (and the named)
