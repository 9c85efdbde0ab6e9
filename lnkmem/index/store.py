"""The words index in LMDB: segments of postings, passages, files.

Layout (one LMDB environment, ``<state>/index/``), named databases:

``meta``      format, generation, next passage id, next segment id, model
``files``     ref -> FileRec: the version seen and the passages made of it
``passages``  pid (4 bytes, big-endian) -> Passage: ref, lines, text, thread...
``postings``  segment (4 bytes BE) + term -> pids (u32 LE) + tfs (u16 LE)
``segments``  segment -> SegMeta: its pids, their lengths and refs
``dead``      pid -> b"": passages replaced or deleted, still in a segment
``vectors``   pid -> int8 embedding + float32 scale (meta ``model``: whose)
``vec_pending`` pid -> b"": vectors made since the copy was last written

Like Lucene, the index grows by immutable segments: a batch of changed
files becomes one new segment in one write transaction, and the passages it
replaces are marked dead, filtered at search time and dropped when segments
are merged. Every change is one LMDB transaction, so a process killed at any
moment leaves the index at the state before or after a batch; :meth:`open`
checks that the tables agree and raises :class:`DamagedIndex` when not.

The few numbers BM25 needs per passage (length, source, ref) are held in
memory as numpy arrays, read at open from ``segments`` (cross-checked with
``files``) and then extended by each commit and patched by each merge (O(change),
:meth:`Store._extend`, :meth:`Store._merged`); a published snapshot never changes
where a search holding it can see, so searches read a consistent snapshot.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import lmdb
import msgspec
import numpy as np

from lnkmem.errors import DamagedIndex, ToolError
from lnkmem.index import postings

FORMAT = b"lnkmem-index-3"  # 3: whole identifiers as terms, files' modification times
SOURCES = ("home", "chats", "skills", "notes")
SOURCE_CODE = {s: i for i, s in enumerate(SOURCES)}


class FileRec(msgspec.Struct, array_like=True):
    version: str
    size: int
    pids: list[int]
    kind: str = "text"  # "text" | "name" (by name only: no converter) | "name-failed" (the converter failed)
    mtime: Optional[str] = None  # modification time (RFC 3339), for the after/before filters


class Passage(msgspec.Struct, array_like=True, omit_defaults=True):
    ref: str
    first: int
    last: int
    text: str
    thread: Optional[str] = None
    role: Optional[str] = None
    at: Optional[str] = None


class SegMeta(msgspec.Struct, array_like=True):
    pids: bytes  # u32 LE
    lens: bytes  # u32 LE
    refs: list[str]  # one per pid


_enc = msgspec.msgpack.Encoder()
_dec_file = msgspec.msgpack.Decoder(FileRec)
_dec_passage = msgspec.msgpack.Decoder(Passage)
_dec_seg = msgspec.msgpack.Decoder(SegMeta)


class DamagedWhileServing(DamagedIndex, ToolError):
    """The index was found damaged under a call: that call fails, the index is rebuilt."""


# --- LMDB's file, checked before it is mapped (§7.1 rev. 2) -----------------------------
#
# A data.mdb begins with two meta pages (LMDB 0.9, 64-bit): a 16-byte page header
# (pgno u64, pad u16, flags u16, lower u16, upper u16), then MDB_meta: magic u32,
# version u32, address u64, mapsize u64, two MDB_db records of 48 bytes (pad u32
# -- the page size, in the first --, flags u16, depth u16, branch/leaf/overflow
# pages, entries, root: u64 each), last page u64, txnid u64. LMDB serves from the
# meta with the higher txnid; every page it may touch lies at or below its last
# page. A file shorter than that, mapped, is a SIGBUS at the first touch.

MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
P_META = 0x08
P_INVALID = (1 << 64) - 1
_META = struct.Struct("=QHHHHIIQQ" + "IHHQQQQQ" * 2 + "QQ")  # LMDB writes its host's byte order
_CHECKABLE = sys.maxsize > 2 ** 32  # the layout above is a 64-bit build's


def _meta(page: bytes, n: int) -> Optional[tuple[int, int, int, list[tuple[int, int, int, int, int]]]]:
    """(psize, last page, txnid, [(depth, branch, leaf, overflow, root)] * 2) of a meta page, or None."""
    if len(page) < _META.size:
        return None
    f = _META.unpack_from(page)
    pgno, flags, magic, version = f[0], f[2], f[5], f[6]
    if pgno != n or not flags & P_META or magic != MDB_MAGIC or version != MDB_DATA_VERSION:
        return None
    dbs = [(f[i + 2], f[i + 3], f[i + 4], f[i + 5], f[i + 7]) for i in (9, 17)]
    if f[8] < (f[25] + 1) * max(f[9], 1):  # a map smaller than the pages it holds
        return None
    return f[9], f[25], f[26], dbs


def check_file(data: str) -> None:
    """Raise DamagedIndex unless ``data`` (a data.mdb) is whole by its own header:
    both meta pages sound, and the file as long as the pages the current one uses."""
    if not _CHECKABLE:
        return
    fd = os.open(data, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        first = os.pread(fd, _META.size, 0)
        m0 = _meta(first, 0)
        if m0 is None:
            raise DamagedIndex("data.mdb: the first meta page is not LMDB's")
        psize = m0[0]
        if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
            raise DamagedIndex(f"data.mdb: page size {psize} is not one LMDB writes")
        m1 = _meta(os.pread(fd, _META.size, psize), 1)
        if m1 is None:
            raise DamagedIndex("data.mdb: the second meta page is not LMDB's")
    finally:
        os.close(fd)
    _, last, _, dbs = max(m0, m1, key=lambda m: m[2])
    if size < (last + 1) * psize:
        raise DamagedIndex(f"data.mdb holds {size} bytes but its index uses {(last + 1) * psize}")
    for depth, branch, leaf, overflow, root in dbs:
        if root == P_INVALID:
            continue
        if root > last or root < 2 or depth > 64 or branch + leaf + overflow > last + 1:
            raise DamagedIndex("data.mdb: a table's root lies outside the file")


_DEEP_CHECK = r"""
import sys
try:
    import lmdb
except ImportError:
    sys.exit(3)  # this child cannot check: not a verdict on the index
env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=64, map_size=int(sys.argv[2]),
                readahead=False, subdir=True)
with env.begin() as txn:
    names = [bytes(k) for k in txn.cursor().iternext(values=False)]
    for k, v in txn.cursor():
        pass
for name in names:
    db = env.open_db(name, create=False)
    with env.begin(db=db) as txn:
        n = 0
        for k, v in txn.cursor():
            n += len(v)
"""
DEEP_CHECK_S = 120


def deep_check(path: str) -> None:
    """Read every page of the index in a child process: a damaged page there is the
    child's SIGSEGV/SIGABRT or LMDB error, never this process's. Raises DamagedIndex."""
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # lmdb where this process found it
    try:
        r = subprocess.run([sys.executable, "-c", _DEEP_CHECK, path, str(max(size, 1 << 20))],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=DEEP_CHECK_S, env=env)
    except subprocess.TimeoutExpired:
        raise DamagedIndex(f"reading the whole index took over {DEEP_CHECK_S}s") from None
    except OSError:  # no child can be started: the header check stands alone
        return
    if r.returncode == 3:
        return
    if r.returncode != 0:
        last = (r.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:200]
        why = f"signal {-r.returncode}" if r.returncode < 0 else last
        raise DamagedIndex(f"reading the whole index failed: {why}")


SEAL = "sealed"  # beside data.mdb: its size, mtime and inode when it was last closed whole


def _stamp(data: str) -> str:
    st_ = os.stat(data)
    return f"{FORMAT.decode()} {st_.st_size} {st_.st_mtime_ns} {st_.st_ino}"


# LMDB's errors that say its file is damaged (not a full disk, not a full map)
DAMAGE_ERRORS = tuple(getattr(lmdb, n) for n in (
    "CorruptedError", "PageNotFoundError", "InvalidError", "VersionMismatchError", "PanicError",
    "BadChecksumError", "IncompatibleError") if hasattr(lmdb, n))


def _guarded(method):
    """Store methods that read or write LMDB: refused once the index is damaged, and an
    LMDB error saying its file is damaged marks it so (the engine rebuilds it)."""

    @functools.wraps(method)
    def run(self, *a, **kw):
        self._guard()
        try:
            return method(self, *a, **kw)
        except DAMAGE_ERRORS as e:
            raise self.damage(e) from None

    return run


def _k(n: int) -> bytes:
    return n.to_bytes(4, "big")


def source_of(ref: str) -> str:
    return ref.split("/", 1)[0]


@dataclass(frozen=True)
class Snapshot:
    """What BM25 needs in memory, consistent with one committed generation."""

    gen: int
    doclen: np.ndarray  # float32 per pid
    alive: np.ndarray  # bool per pid
    src: np.ndarray  # uint8 per pid
    refid: np.ndarray  # int32 per pid -> refs
    refs: list[str]
    live: int
    total_len: float
    seg_of: Optional[np.ndarray] = None  # int32 per pid -> its segment, -1: in none (a free id)
    segs: Optional[dict] = None  # segment -> its passages (dead ones included)

    @property
    def avgdl(self) -> float:
        return self.total_len / self.live if self.live else 1.0

    def keep(self, pids: np.ndarray, sources=None, under: Optional[str] = None) -> np.ndarray:
        """Those of ``pids`` from the given sources and with refs starting ``under``."""
        if sources is not None and set(sources) != set(SOURCE_CODE):
            codes = np.array([SOURCE_CODE[s] for s in sources if s in SOURCE_CODE], np.uint8)
            pids = pids[np.isin(self.src[pids], codes)]
        if under:
            ok = np.fromiter((r.startswith(under) for r in self.refs), bool, len(self.refs))
            rid = self.refid[pids]
            pids = pids[(rid >= 0) & ok[np.maximum(rid, 0)]]
        return pids


@dataclass
class _Delta:
    """What one commit changed, for extending the snapshot (Store._extend)."""

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


@dataclass
class NewFile:
    """One file (re)indexed: its passages and their postings.

    The postings come as flat columns, made when the file is counted
    (``indexer.index_file``): ``tids`` (an index into ``terms``, a list that
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

    def __bool__(self) -> bool:
        return bool(self.files or self.removed)

    @property
    def text_bytes(self) -> int:
        return sum(f.size for f in self.files)


class Store:
    """One agent's words index, in one LMDB environment."""

    MAP_SIZE = 1 << 30

    def __init__(self, path: str):
        self.path = path
        self.write_lock = threading.Lock()
        try:
            self._open()
        except BaseException:
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            raise

    # --- opening, checking, wiping ---------------------------------------

    def _open(self) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        size = self.MAP_SIZE
        data = os.path.join(self.path, "data.mdb")
        self.data = data
        seal = os.path.join(self.path, SEAL)
        try:
            with open(seal) as f:
                sealed = f.read()
            os.unlink(seal)  # from now on the file may change
        except OSError:
            sealed = None
        if os.path.lexists(data):
            check_file(data)
            if sealed != _stamp(data):  # not closed whole, or touched since: read it all first
                deep_check(self.path)
            size = max(size, os.path.getsize(data) * 2)
        self.env = lmdb.open(
            self.path, map_size=size, max_dbs=8, metasync=False, sync=True, readahead=False
        )
        self.meta = self.env.open_db(b"meta")
        self.files = self.env.open_db(b"files")
        self.passages = self.env.open_db(b"passages")
        self.postings = self.env.open_db(b"postings")
        self.segments = self.env.open_db(b"segments")
        self.dead = self.env.open_db(b"dead")
        self.vectors = self.env.open_db(b"vectors")
        self.vec_pending = self.env.open_db(b"vec_pending")
        with self.env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self.meta)
            if fmt is None:
                if txn.stat(self.files)["entries"] or txn.stat(self.segments)["entries"]:
                    raise DamagedIndex("index has data but no format")
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"gen", b"0", db=self.meta)
                txn.put(b"next_pid", b"1", db=self.meta)
                txn.put(b"next_seg", b"1", db=self.meta)
            elif fmt != FORMAT:
                raise DamagedIndex(f"index format {fmt!r} is not {FORMAT!r}")
        self.psize = self.env.stat()["psize"]
        self.snapshot = self._load()

    @classmethod
    def open(cls, path: str) -> "Store":
        """Open the index at ``path``; a damaged one is wiped and started anew."""
        try:
            return cls(path)
        except (DamagedIndex, lmdb.Error, msgspec.DecodeError, ValueError, IndexError, OSError) as e:
            wipe(path)
            store = cls(path)
            store.rebuilt_because = str(e)
            return store

    rebuilt_because: Optional[str] = None
    on_commit = None  # called after every change that is committed
    on_damage = None  # called (once) when the index is found damaged while serving
    on_alloc = None  # called with the ids a commit gave new passages (ids are reused)
    damaged: Optional[str] = None

    def _guard(self) -> None:
        """Refuse to touch a damaged index, or one whose file became shorter than the
        pages it uses (touching those would be a SIGBUS)."""
        if self.damaged is not None:
            raise DamagedWhileServing(f"the index is damaged ({self.damaged}) and is being rebuilt "
                                      "from the sources; try again in a moment")
        try:  # pages in use first: a commit after this only grows the file before its meta
            need = (self.env.info()["last_pgno"] + 1) * self.psize
            size = os.stat(self.data).st_size
        except (OSError, lmdb.Error) as e:
            raise self.damage(e) from None
        if size < need:
            raise self.damage(f"data.mdb holds {size} bytes but the index uses {need}")

    def damage(self, why) -> DamagedWhileServing:
        """Mark the index damaged (the engine is told once); the error for the call."""
        if self.damaged is None:
            self.damaged = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
            if self.on_damage is not None:
                self.on_damage(self.damaged)
        return DamagedWhileServing(f"the index is damaged ({self.damaged}) and is being rebuilt "
                                   "from the sources; try again in a moment")

    def _changed(self) -> None:
        if self.on_commit is not None:
            self.on_commit()

    def _load(self) -> Snapshot:
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
            next_pid = int(txn.get(b"next_pid", db=self.meta))
            cap = next_pid + 1
            doclen = np.zeros(cap, np.float32)
            alive = np.zeros(cap, bool)
            src = np.zeros(cap, np.uint8)
            refid = np.full(cap, -1, np.int32)
            seg_of = np.full(cap, -1, np.int32)
            refs: list[str] = []
            ids: dict[str, int] = {}
            segs: dict[int, int] = {}
            for k, v in txn.cursor(db=self.segments):
                seg = _dec_seg.decode(v)
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
                        ids[r] = len(refs)
                        refs.append(r)
                refid[pids] = np.fromiter(map(ids.__getitem__, seg.refs), np.int32, len(pids))
            # a passage's source is its ref's: computed once per ref
            ref_src = np.fromiter((SOURCE_CODE.get(source_of(r), 0) for r in refs), np.uint8, len(refs))
            has = refid >= 0
            src[has] = ref_src[refid[has]]
            for k, _ in txn.cursor(db=self.dead):
                p = int.from_bytes(k, "big")
                if p < cap:
                    alive[p] = False
            # every live passage belongs to exactly one file record, and back
            owned: list[int] = []  # every file's ids, checked at once (one gather, not one per file)
            for _, v in txn.cursor(db=self.files):
                owned.extend(_dec_file.decode(v).pids)
            if owned and not alive[np.asarray(owned, np.int64)].all():
                raise DamagedIndex("a file names passages that are not live")
            if len(owned) != int(alive.sum()):
                raise DamagedIndex("live passages and files disagree")
        live = int(alive.sum())
        return Snapshot(gen, doclen, alive, src, refid, refs, live, float(doclen[alive].sum(dtype=np.float64)),
                        seg_of, segs)

    _bufs: tuple = ()  # (doclen, src, refid) with room beyond the snapshot's length
    _refids: tuple = ()  # (the snapshot's refs list, ref -> its index in it)

    def _extend(self, old: Snapshot, d: "_Delta") -> Snapshot:
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
        bufs = self._bufs
        own = bool(bufs) and (old.doclen is bufs[0] or old.doclen.base is bufs[0])
        if not own or len(bufs[0]) < n or (len(seen) and old.alive[seen].any()):
            cap = max(n, n_old + n_old // 2 + 1024)
            doclen = np.zeros(cap, np.float32)
            src = np.zeros(cap, np.uint8)
            refid = np.full(cap, -1, np.int32)
            doclen[:n_old], src[:n_old], refid[:n_old] = old.doclen, old.src, old.refid
            bufs = self._bufs = (doclen, src, refid)
        doclen, src, refid = bufs
        refs = old.refs
        if not self._refids or self._refids[0] is not refs:
            self._refids = (refs, {r: i for i, r in enumerate(refs)})
        ids = self._refids[1]
        if len(new):
            fresh = [r for r in dict.fromkeys(d.refs) if r not in ids]
            if fresh:
                refs = refs + fresh  # a new list: ``old`` keeps its own
                for r in fresh:
                    ids[r] = len(ids)
                self._refids = (refs, ids)
            rid = np.fromiter(map(ids.__getitem__, d.refs), np.int32, len(new))
            ref_src = {}
            for r in dict.fromkeys(d.refs):
                ref_src[ids[r]] = SOURCE_CODE.get(source_of(r), 0)
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

    @_guarded
    def refresh(self) -> Snapshot:
        """Reload the snapshot when another process has committed since."""
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
        if gen != self.snapshot.gen:
            self.snapshot = self._load()
        return self.snapshot

    def close(self) -> None:
        """Close; an index closed whole is sealed, so the next open need not read it all."""
        with self.write_lock:
            whole = self.damaged is None
            try:
                if whole:
                    self.env.sync(True)
            except lmdb.Error:
                whole = False
            self.env.close()
            if whole:
                try:
                    tmp = os.path.join(self.path, SEAL + ".tmp")
                    with open(tmp, "w") as f:
                        f.write(_stamp(self.data))
                    os.replace(tmp, os.path.join(self.path, SEAL))
                except OSError:
                    pass

    # --- reading ---------------------------------------------------------

    @_guarded
    def all_files(self) -> dict[str, FileRec]:
        with self.env.begin() as txn:
            return {k.decode(): _dec_file.decode(v) for k, v in txn.cursor(db=self.files)}

    def _files_under(self, prefix: str):
        """(ref, FileRec) of every file whose ref starts with ``prefix``."""
        p = prefix.encode()
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.files)
            if cur.set_range(p):
                for k, v in cur:
                    if not k.startswith(p):
                        break
                    yield k.decode(), _dec_file.decode(v)

    @_guarded
    def file_versions(self, prefix: str = "") -> dict[str, tuple[str, int]]:
        return {ref: (rec.version, rec.size) for ref, rec in self._files_under(prefix)}

    @_guarded
    def refs_of_kind(self, prefix: str, kind: str) -> set[str]:
        """The refs below ``prefix`` indexed as ``kind`` (e.g. "name": a document
        indexed by name while no converter was installed, §3.3)."""
        return {ref for ref, rec in self._files_under(prefix) if rec.kind == kind}

    @_guarded
    def file_mtime(self, ref: str) -> Optional[str]:
        """A file's modification time as indexed (None when unknown)."""
        with self.env.begin() as txn:
            v = txn.get(ref.encode(), db=self.files)
        return _dec_file.decode(v).mtime if v is not None else None

    @_guarded
    def passages_of(self, pids: Iterable[int]) -> list[Optional[Passage]]:
        with self.env.begin() as txn:
            out = []
            for p in pids:
                v = txn.get(_k(int(p)), db=self.passages)
                out.append(_dec_passage.decode(v) if v is not None else None)
            return out

    def segment_keys(self, txn) -> list[bytes]:
        return [bytes(k) for k in txn.cursor(db=self.segments).iternext(values=False)]

    def postings_of(self, txn, term: str, segs: Optional[list[bytes]] = None) -> tuple[np.ndarray, np.ndarray]:
        """(pids, tfs) of a term across all segments, dead ones included."""
        t = term.encode()
        pids, tfs = [], []
        for sk in segs if segs is not None else self.segment_keys(txn):
            v = txn.get(sk + t, db=self.postings)
            if v is None:
                continue
            ps, ts = postings.unpack(v)
            pids.append(ps)
            tfs.append(ts)
        if not pids:
            return np.empty(0, np.uint32), np.empty(0, np.uint16)
        if len(pids) == 1:
            return pids[0], tfs[0]
        return np.concatenate(pids), np.concatenate(tfs)

    def segment_postings(self, txn, seg: bytes):
        """(term bytes, posting bytes) of one segment, in term order."""
        cur = txn.cursor(db=self.postings)
        if cur.set_range(seg):
            for k, v in cur:
                if not k.startswith(seg):
                    break
                yield bytes(k[4:]), v

    @_guarded
    def get_meta(self, key: bytes) -> Optional[bytes]:
        with self.env.begin() as txn:
            return txn.get(key, db=self.meta)

    @_guarded
    def put_meta(self, key: bytes, value: bytes) -> None:
        with self.write_lock, self.env.begin(write=True) as txn:
            txn.put(key, value, db=self.meta)

    # --- writing ---------------------------------------------------------

    @_guarded
    def commit(self, batch: Batch) -> None:
        """Apply a batch in one transaction and publish a new snapshot."""
        if not batch:
            return
        with self.write_lock:
            while True:
                try:
                    allocated, delta = self._commit(batch)
                    break
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
            if allocated and self.on_alloc is not None:
                self.on_alloc(allocated)  # before any search sees them as live
            # extended by what changed; read anew only after another process wrote
            self.snapshot = self._extend(delta.base, delta) if delta is not None else self._load()
        self._changed()

    def _commit(self, batch: Batch) -> tuple[list[int], Optional[_Delta]]:
        """One transaction; returns the ids given to new passages and what changed
        (None when the snapshot was not the index's: another process wrote).

        Ids follow live data, not edits: a segment whose passages are all dead
        now is dropped at once (as a merge would drop it), and new passages take
        the lowest ids no segment holds before new ones are made; ``next_pid``
        comes down when the highest ids are free."""
        with self.env.begin(write=True) as txn:
            next_pid = int(txn.get(b"next_pid", db=self.meta))
            was_next = next_pid
            seg = int(txn.get(b"next_seg", db=self.meta))
            snap = self.snapshot  # read once: a search's refresh may swap it meanwhile
            if int(txn.get(b"gen", db=self.meta)) != snap.gen:
                snap = None
            gone = set(batch.removed) | {f.ref for f in batch.files}
            killed: list[int] = []
            for ref in gone:
                old = txn.get(ref.encode(), db=self.files)
                if old is None:
                    continue
                for p in _dec_file.decode(old).pids:
                    txn.put(_k(p), b"", db=self.dead)
                    txn.delete(_k(p), db=self.passages)
                    txn.delete(_k(p), db=self.vectors)
                    txn.delete(_k(p), db=self.vec_pending)
                    killed.append(p)
                txn.delete(ref.encode(), db=self.files)
            ids = iter(())
            seg_of = None
            dropped: list[int] = []
            if snap is not None and snap.seg_of is not None:  # else: another process wrote; plain ids
                seg_of = snap.seg_of.copy()
                if killed:
                    alive = snap.alive.copy()
                    alive[killed] = False
                    for s in np.unique(seg_of[killed]).tolist():
                        members = np.flatnonzero(seg_of == s)
                        if s >= 0 and not alive[members].any():  # wholly dead: drop it now
                            self._drop_segment(txn, s, members)
                            seg_of[members] = -1
                            dropped.append(s)
                # (a copy's vector chunks name passages by id: `pid_reuse` tells the
                # write-back to send all vectors anew, see copy.export)
                free = np.flatnonzero(seg_of[1:next_pid] < 0) + 1
                used = np.flatnonzero(seg_of[1:next_pid] >= 0)
                next_pid = int(used[-1]) + 2 if len(used) else 1  # the highest ids free: made again
                ids = iter(free[free < next_pid].tolist())
            allocated: list[int] = []
            # postings of the batch: each file's columns (made when it was counted),
            # its term ids mapped into one vocabulary of the batch, then grouped by
            # term with one sort
            vocab: dict[str, int] = {}
            mapped: dict[int, tuple[list, np.ndarray]] = {}  # id(terms) -> (terms, their vocab ids)
            p_terms: list[np.ndarray] = []
            p_tfs: list[np.ndarray] = []
            p_pids: list[np.ndarray] = []
            seg_pids: list[int] = []
            seg_lens: list[int] = []
            seg_refs: list[str] = []
            new_passages: list[tuple[bytes, bytes]] = []
            for f in batch.files:
                terms, tids, npost, tfs, lens = f.columns()
                if len(lens) != len(f.passages) or int(npost.sum()) != len(tids) or len(tfs) != len(tids):
                    raise ValueError(f"postings of {f.ref!r} do not match its passages")
                pids = []
                for passage in f.passages:
                    pid = next(ids, None)  # ascending: a file's ids ascend with its lines
                    if pid is None:
                        pid = next_pid
                        next_pid += 1
                    pids.append(pid)
                    new_passages.append((_k(pid), _enc.encode(passage)))
                allocated.extend(pids)
                seg_pids.extend(pids)
                seg_lens.extend(lens.tolist())
                seg_refs.extend([f.ref] * len(pids))
                if len(tids):
                    m = mapped.get(id(terms))
                    if m is None:
                        m = mapped[id(terms)] = (terms, np.fromiter(
                            (vocab.setdefault(t, len(vocab)) for t in terms), np.int32, len(terms)))
                    p_terms.append(m[1][tids])
                    p_tfs.append(tfs)
                    p_pids.append(np.repeat(np.asarray(pids, np.uint32), npost))
                txn.put(f.ref.encode(), _enc.encode(FileRec(f.version, f.size, pids, f.kind, f.mtime)), db=self.files)
            mapped.clear()
            # new ids only: appending packs the pages full; reused ones go in their place
            last = txn.cursor(db=self.passages)
            fresh = not new_passages or not last.last() or last.key() < new_passages[0][0]
            txn.cursor(db=self.passages).putmulti(new_passages, append=fresh)
            if seg_pids:
                sk = _k(seg)
                names = list(vocab)
                order = sorted(range(len(names)), key=names.__getitem__)
                names = [names[i] for i in order]
                rank = np.empty(len(order), np.int32)  # batch vocab id -> its rank in key order
                rank[order] = np.arange(len(order), dtype=np.int32)
                r = rank[np.concatenate(p_terms)] if p_terms else np.zeros(0, np.int32)
                del p_terms
                pid_arr = np.concatenate(p_pids) if p_pids else np.zeros(0, np.uint32)
                order = np.lexsort((pid_arr, r))
                r, pid_arr = r[order], pid_arr[order]
                tf_arr = (np.concatenate(p_tfs) if p_tfs else np.zeros(0, np.uint32))[order]
                del p_tfs, p_pids, order
                bounds = np.flatnonzero(np.diff(r)) + 1
                starts = np.concatenate(([0], bounds))
                ends = np.concatenate((bounds, [len(r)]))
                if len(r):
                    starts, ends = starts.tolist(), ends.tolist()
                    items = list(zip([sk + names[k].encode() for k in r[starts].tolist()],
                                     postings.pack_many(pid_arr, tf_arr, starts, ends)))
                else:
                    items = []
                # a new segment's keys sort after every other: appended, no old page touched
                txn.cursor(db=self.postings).putmulti(items, append=True)
                meta = SegMeta(np.asarray(seg_pids, "<u4").tobytes(), np.asarray(seg_lens, "<u4").tobytes(),
                               seg_refs)
                txn.put(sk, _enc.encode(meta), db=self.segments)
                txn.put(b"next_seg", str(seg + 1).encode(), db=self.meta)
            txn.put(b"next_pid", str(next_pid).encode(), db=self.meta)
            gen = int(txn.get(b"gen", db=self.meta)) + 1
            txn.put(b"gen", str(gen).encode(), db=self.meta)
            if allocated and min(allocated) < was_next:  # an id given before: the generation it was given again
                txn.put(b"pid_reuse", str(gen).encode(), db=self.meta)
            if seg_of is None:
                return allocated, None
            return allocated, _Delta(snap, gen, next_pid, seg, seg_of, killed, dropped, seg_pids, seg_lens, seg_refs)

    def _drop_segment(self, txn, seg: int, pids: np.ndarray) -> None:
        """Remove a segment whose passages are all dead: its postings, its record,
        its passages' dead marks and vectors. Their ids are free after it."""
        sk = _k(seg)
        cur = txn.cursor(db=self.postings)
        if cur.set_range(sk):
            while cur.key()[:4] == sk:
                if not cur.delete():
                    break
        txn.delete(sk, db=self.segments)
        for p in pids.tolist():
            txn.delete(_k(p), db=self.dead)
            txn.delete(_k(p), db=self.vectors)
            txn.delete(_k(p), db=self.vec_pending)

    # --- vectors -----------------------------------------------------------

    def vector_model(self) -> Optional[str]:
        v = self.get_meta(b"model")
        return v.decode() if v is not None else None

    @_guarded
    def use_vector_model(self, model: str) -> bool:
        """Record whose vectors the index holds; another model's are dropped.
        Returns True when vectors were dropped."""
        with self.write_lock, self.env.begin(write=True) as txn:
            old = txn.get(b"model", db=self.meta)
            if old == model.encode():
                return False
            txn.drop(self.vectors, delete=False)
            txn.drop(self.vec_pending, delete=False)
            txn.put(b"model", model.encode(), db=self.meta)
            return old is not None

    @_guarded
    def put_vectors(self, pids: list[int], vecs: np.ndarray, passages: Optional[list] = None) -> list[int]:
        """Store unit vectors (int8 with a scale) of passages still live and, when
        ``passages`` are given, still the passages embedded; returns those stored."""
        expect = [_enc.encode(p) for p in passages] if passages is not None else None
        stored = []
        with self.write_lock:
            while True:
                try:
                    with self.env.begin(write=True) as txn:
                        stored = []
                        for i, (pid, v) in enumerate(zip(pids, vecs)):
                            now = txn.get(_k(pid), db=self.passages)
                            if now is None or (expect is not None and bytes(now) != expect[i]):
                                continue  # replaced meanwhile
                            txn.put(_k(pid), quantize(v), db=self.vectors)
                            txn.put(_k(pid), b"", db=self.vec_pending)
                            stored.append(pid)
                    break
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
        if stored:
            self._changed()
        return stored

    @_guarded
    def vector_shape(self) -> tuple[int, int]:
        """(largest pid with a vector + 1, dimension) of the stored vectors; (0, 0) when none."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.vectors)
            if not cur.first():
                return 0, 0
            dim = len(cur.value()) - 4  # the first row's, as iter_vectors keeps
            cur.last()
            return int.from_bytes(cur.key(), "big") + 1, dim

    def iter_vectors(self, chunk: int = 8192):
        """Every stored vector, as it is stored, in chunks of ``chunk`` rows:
        (pids int64, int8 rows, float32 scales); rows of another length than
        the first are skipped. Only one chunk is held at a time besides LMDB's map."""
        with self.env.begin() as txn:
            dim = None
            pids: list[int] = []
            rows: list[bytes] = []
            for k, v in txn.cursor(db=self.vectors):
                if dim is None:
                    dim = len(v) - 4
                if len(v) != dim + 4:
                    continue
                pids.append(int.from_bytes(k, "big"))
                rows.append(v)
                if len(rows) >= chunk:
                    yield _vector_rows(pids, rows, dim)
                    pids, rows = [], []
            if rows:
                yield _vector_rows(pids, rows, dim)

    @_guarded
    def all_vectors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pids, int8 matrix, float32 scales) of every stored vector; a row's
        vector is ``matrix[i] * scales[i]``."""
        parts = list(self.iter_vectors())
        if not parts:
            return np.empty(0, np.int64), np.empty((0, 0), np.int8), np.empty(0, np.float32)
        return tuple(np.concatenate(x) for x in zip(*parts))  # type: ignore[return-value]

    # --- merging ---------------------------------------------------------

    @_guarded
    def segment_sizes(self) -> dict[int, int]:
        with self.env.begin() as txn:
            return {int.from_bytes(k, "big"): len(v) for k, v in txn.cursor(db=self.segments)}

    @_guarded
    def merge(self, segs: list[int]) -> None:
        """Merge segments into one, dropping dead passages from them."""
        if len(segs) < 2 and not self._has_dead():
            return
        with self.write_lock:
            snap = self.snapshot
            while True:
                try:
                    done = self._merge(segs)
                    break
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
            # the merged segments' part replaced; read anew only after another process wrote
            fresh = snap.seg_of is not None and done[1] == snap.gen + 1
            self.snapshot = self._merged(snap, segs, *done) if fresh else self._load()
        self._changed()

    def _has_dead(self) -> bool:
        with self.env.begin() as txn:
            return txn.stat(self.dead)["entries"] > 0

    def _merge(self, segs: list[int]) -> tuple[int, int, np.ndarray, np.ndarray]:
        """One transaction; returns (the new segment, the generation, the ids it holds,
        the dead ids dropped from the merged segments)."""
        with self.env.begin(write=True) as txn:
            new = int(txn.get(b"next_seg", db=self.meta))
            nk = _k(new)
            metas = [(s, _dec_seg.decode(txn.get(_k(s), db=self.segments))) for s in segs]
            # the dead as a mask by id: one gather per term, not a search of the whole set
            dead = np.fromiter((int.from_bytes(k, "big") for k, _ in txn.cursor(db=self.dead)), np.int64)
            top = max([int(dead.max()) if len(dead) else 0] +
                      [int(np.frombuffer(m.pids, "<u4").max()) for _, m in metas if len(m.pids)])
            deadmask = np.zeros(top + 1, bool)
            deadmask[dead] = True
            grouped: dict[bytes, tuple[list, list]] = {}
            for s, _ in metas:
                sk = _k(s)
                for term, v in self.segment_postings(txn, sk):
                    ps, ts = grouped.setdefault(term, ([], []))
                    p, t = postings.unpack(v)
                    ps.append(p.copy())
                    ts.append(t.copy())
                cur = txn.cursor(db=self.postings)  # drop the segment's postings
                if cur.set_range(sk):
                    while cur.key()[:4] == sk:
                        if not cur.delete():
                            break
            items = []
            for term in sorted(grouped):
                ps, ts = grouped[term]
                p = np.concatenate(ps) if len(ps) > 1 else ps[0]
                t = np.concatenate(ts) if len(ts) > 1 else ts[0]
                keep = ~deadmask[p]
                if not keep.all():
                    p, t = p[keep], t[keep]
                if len(p):
                    items.append((nk + term, postings.pack(p, t)))
            txn.cursor(db=self.postings).putmulti(items, append=True)
            all_p, all_l, all_r, gone = [], [], [], []
            for s, m in metas:
                p = np.frombuffer(m.pids, "<u4")
                ln = np.frombuffer(m.lens, "<u4")
                d = deadmask[p]
                if d.any():
                    keep = np.flatnonzero(~d)
                    all_p.append(p[keep])
                    all_l.append(ln[keep])
                    all_r.extend(m.refs[i] for i in keep.tolist())
                    for q in p[d].tolist():
                        txn.delete(_k(q), db=self.dead)
                        txn.delete(_k(q), db=self.vectors)
                    gone.append(p[d])
                else:
                    all_p.append(p)
                    all_l.append(ln)
                    all_r.extend(m.refs)
                txn.delete(_k(s), db=self.segments)
            kept = np.concatenate(all_p).astype(np.int64) if all_p else np.empty(0, np.int64)
            if len(kept):
                meta = SegMeta(kept.astype("<u4").tobytes(), np.concatenate(all_l).astype("<u4").tobytes(), all_r)
                txn.put(nk, _enc.encode(meta), db=self.segments)
            txn.put(b"next_seg", str(new + 1).encode(), db=self.meta)
            gen = int(txn.get(b"gen", db=self.meta)) + 1
            txn.put(b"gen", str(gen).encode(), db=self.meta)
            return new, gen, kept, (np.concatenate(gone).astype(np.int64) if gone else np.empty(0, np.int64))

    def _merged(self, old: Snapshot, segs: list[int], new: int, gen: int, kept: np.ndarray,
                gone: np.ndarray) -> Snapshot:
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
        if len(refs) > n_used and len(refs) > 2 * n_used + self.REFS_SLACK:
            remap = np.full(len(refs) + 1, -1, np.int32)  # + 1: refid -1 stays -1
            remap[np.flatnonzero(used)] = np.arange(n_used, dtype=np.int32)
            refs = [r for r, u in zip(refs, used.tolist()) if u]
            bufs = self._bufs
            own = bool(bufs) and (old.doclen is bufs[0] or old.doclen.base is bufs[0])
            buf = np.full(len(bufs[2]) if own else len(old.refid), -1, np.int32)  # a new one: ``old`` keeps its own
            buf[:len(old.refid)] = remap[old.refid]
            if own:
                self._bufs = (bufs[0], bufs[1], buf)
            refid = buf[:len(old.refid)]
            self._refids = (refs, {r: i for i, r in enumerate(refs)})
        return Snapshot(gen, old.doclen, old.alive, old.src, refid, refs, old.live, old.total_len,
                        seg_of, sizes)

    REFS_SLACK = 1024  # refs no segment names, kept until a merge finds more than this (and the named)

    def maybe_merge(self, max_segments: int = 24, keep: int = 8) -> bool:
        """Tiered merging: when there are too many segments, merge the smallest
        (sizes in passages, from the snapshot: no segment record read)."""
        snap = self.refresh()
        sizes = snap.segs if snap.segs is not None else self.segment_sizes()
        if len(sizes) <= max_segments:
            return False
        small = sorted(sizes, key=lambda s: sizes[s])[: len(sizes) - keep + 1]
        self.merge(small)
        return True


def quantize_rows(vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row) of float vectors: row i is about
    ``q[i] * scale[i]``; the largest component maps to ±127."""
    v = np.asarray(vecs, np.float32)
    if v.ndim == 1:
        v = v[None, :]
    m = np.abs(v).max(axis=1).astype(np.float64) if v.shape[1] else np.zeros(len(v))
    m[m == 0] = 1.0
    scale = (m / 127.0).astype(np.float32)
    return np.round(v / scale[:, None]).astype(np.int8), scale


def quantize(v: np.ndarray) -> bytes:
    """int8 components and one float32 scale: 4x smaller than float32."""
    q, scale = quantize_rows(v)
    return q[0].tobytes() + scale[:1].astype("<f4").tobytes()


def _vector_rows(pids: list[int], rows: list[bytes], dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raw = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), dim + 4)
    q = np.ascontiguousarray(raw[:, :dim]).view(np.int8)
    scale = np.ascontiguousarray(raw[:, dim:]).view("<f4").reshape(len(rows)).astype(np.float32)
    return np.asarray(pids, np.int64), q, scale


def wipe(path: str) -> None:
    """Remove an index environment (only its own files)."""
    for name in ("data.mdb", "lock.mdb", SEAL, SEAL + ".tmp"):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    if os.path.isdir(path) and not os.listdir(path):
        shutil.rmtree(path, ignore_errors=True)
