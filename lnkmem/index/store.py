"""The words index in LMDB: segments of postings, passages, files.

Layout (one LMDB environment, ``<state>/index/``), named databases:

``meta``      format, generation, next passage id, next segment id, model,
              ``zdict`` (the passages' dictionary, zstd or deflate: :mod:`textpack`)
``files``     ref -> FileRec: the version seen and the passages made of it
``passages``  pid (4 bytes, big-endian) -> Passage: ref, lines, text, thread...
              (msgpack, compressed: :mod:`lnkmem.index.textpack`)
``postings``  segment (4 bytes BE) + term -> pids and tfs in compressed blocks
              (:mod:`lnkmem.index.postings`)
``segments``  segment -> SegMeta: its pids, their lengths and refs (as runs: _SegStored)
``dead``      pid -> b"": passages replaced or deleted, still in a segment
``vectors``   pid -> int8 embedding + float32 scale (meta ``model``: whose)
``vec_pending`` pid -> b"": vectors made since the copy was last written

Like Lucene, the index grows by immutable segments: a batch of changed
files becomes one new segment in one write transaction, and the passages it
replaces are marked dead, filtered at search time and dropped when segments
are merged. Every change is one LMDB transaction, so a process killed at any
moment leaves the index at the state before or after a batch; :meth:`open`
checks that the tables agree and raises :class:`DamagedIndex` when not, unless
the index was closed whole and is untouched since (its seal): then the snapshot
saved at that close is read instead (a restart is O(change), not O(index)).

The few numbers BM25 needs per passage (length, source, ref) are held in
memory as numpy arrays, read at open from ``segments`` (cross-checked with
``files``) and then extended by each commit and patched by each merge (O(change),
:meth:`Store._extend`, :meth:`Store._merged`); a published snapshot never changes
where a search holding it can see, so searches read a consistent snapshot.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time
import weakref
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import lmdb
import msgspec
import numpy as np

from lnkmem import memtrim, procs
from lnkmem.errors import DamagedIndex, ToolError
from lnkmem.index import mapguard, postings, textpack
from lnkmem.index.refs import Refs

FORMAT = b"lnkmem-index-5"  # 5: long lines cut at word boundaries (issue 35); 4: postings in bit-packed blocks, passages deflated (issue 12)
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


class _Listed(msgspec.Struct):
    """The file LISTED: the stamp it is valid beside, and per source a listing's digest (hex)."""
    stamp: str
    listed: dict[str, str]


class SegMeta(msgspec.Struct, array_like=True):
    pids: bytes  # u32 LE
    lens: bytes  # u32 LE
    refs: list[str]  # one per pid


class _SavedSnapshot(msgspec.Struct, array_like=True):
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


class _FileHead(msgspec.Struct, array_like=True):
    """A FileRec's first fields only (the rest of its array is skipped, not built)."""

    version: str
    size: int


class _FileKind(msgspec.Struct, array_like=True):
    """A FileRec's head and kind: its passage ids left as the raw bytes they are."""

    version: str
    size: int
    pids: msgspec.Raw
    kind: str = "text"


_enc = msgspec.msgpack.Encoder()
_dec_file = msgspec.msgpack.Decoder(FileRec)
_dec_head = msgspec.msgpack.Decoder(_FileHead)
_dec_kind = msgspec.msgpack.Decoder(_FileKind)
_dec_snap = msgspec.msgpack.Decoder(_SavedSnapshot)
_dec_passage = msgspec.msgpack.Decoder(Passage)


class _SegStored(msgspec.Struct, array_like=True):
    """A SegMeta as stored: its refs as runs (a file's passages are consecutive in a
    segment), each ref once: 4.5 bytes a passage less at scale 1 (5 of 113 MB)."""

    pids: bytes  # u32 LE
    lens: bytes  # u32 LE
    names: list[str]  # each run's ref
    runs: bytes  # u32 LE: how many consecutive passages each run has


class _SegCodec:
    """SegMeta to and from its stored bytes (:class:`_SegStored`)."""

    _dec = msgspec.msgpack.Decoder(_SegStored)

    def encode(self, m: SegMeta) -> bytes:
        names: list[str] = []
        runs: list[int] = []
        for r in m.refs:
            if names and names[-1] == r:
                runs[-1] += 1
            else:
                names.append(r)
                runs.append(1)
        return self.encode_runs(m.pids, m.lens, names, np.asarray(runs))

    def encode_runs(self, pids: bytes, lens: bytes, names: list[str], runs: np.ndarray) -> bytes:
        """Stored bytes of a segment whose refs are given as runs (``names[i]``, ``runs[i]`` times)."""
        return _enc.encode(_SegStored(pids, lens, names, runs.astype("<u4").tobytes()))

    def decode(self, v) -> SegMeta:
        s, runs = self.stored(v)
        names = s.names
        return SegMeta(s.pids, s.lens, [names[i] for i, c in enumerate(runs.tolist()) for _ in range(c)])

    def stored(self, v) -> tuple[_SegStored, np.ndarray]:
        """The stored form, checked, and its runs (u32): no list a passage."""
        s = self._dec.decode(v)
        n = len(s.pids) // 4
        if len(s.runs) % 4 or len(s.runs) // 4 != len(s.names) or len(s.lens) != len(s.pids) or len(s.pids) % 4:
            raise ValueError("a segment's refs are broken")
        runs = np.frombuffer(s.runs, "<u4")
        if int(runs.sum(dtype=np.int64)) != n:  # before any list is made of them
            raise ValueError("a segment's refs do not match its passages")
        return s, runs


_seg_codec = _SegCodec()


class IndexInUse(Exception):
    """The index is open in this process already (an LMDB environment must be opened once a
    process: a second open, and its close, would break the first's locks)."""


# the indexes open in this process, by their folder's real path (a Store dropped without
# its close leaves with its last reference)
_open_here: "weakref.WeakValueDictionary[str, Store]" = weakref.WeakValueDictionary()
_open_here_lock = threading.Lock()


# errors of an open that say this process cannot open the index now, not that it is damaged
_LMDB_NOT_DAMAGE = tuple(getattr(lmdb, n) for n in (
    "ReadersFullError", "LockError", "MapResizedError", "MemoryError", "TlsFullError", "DiskError",
    "ReadonlyError", "MapFullError") if hasattr(lmdb, n))


def _damage_at_open(e: BaseException) -> bool:
    """Whether an error opening the index says its files are damaged (then it is wiped and
    made anew from the sources), not only that this process cannot open it now: out of
    descriptors or memory, locks or readers taken, the disk failing or read-only, the
    state folder not writable. Those say nothing of what the index holds: the open fails,
    the index stays, and the next open tries again."""
    if isinstance(e, OSError):
        return e.errno in (errno.ELOOP, errno.EISDIR)  # a link or a folder where data.mdb should be
    if type(e) is lmdb.Error:  # an errno py-lmdb has no class for: EMFILE, ENFILE, EPERM, ...
        return False
    return not isinstance(e, _LMDB_NOT_DAMAGE)


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


def check_file(data: str) -> Optional[int]:
    """Raise DamagedIndex unless ``data`` (a data.mdb) is whole by its own header:
    both meta pages sound, and the file as long as the pages the current one uses.
    Returns the last committed transaction's id (None where the header cannot be read)."""
    if not _CHECKABLE:
        return None
    # (non-blocking: a FIFO in its place must not hold the open; it is no file, so damage)
    fd = os.open(data, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st_ = os.fstat(fd)
        if not stat.S_ISREG(st_.st_mode):
            raise DamagedIndex("data.mdb is not a file")
        size = st_.st_size
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
    _, last, txnid, dbs = max(m0, m1, key=lambda m: m[2])
    if size < (last + 1) * psize:
        raise DamagedIndex(f"data.mdb holds {size} bytes but its index uses {(last + 1) * psize}")
    for depth, branch, leaf, overflow, root in dbs:
        if root == P_INVALID:
            continue
        if root > last or root < 2 or depth > 64 or branch + leaf + overflow > last + 1:
            raise DamagedIndex("data.mdb: a table's root lies outside the file")
    return txnid


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
dbs = {}
for name in names:
    db = dbs[name] = env.open_db(name, create=False)
    with env.begin(db=db) as txn:
        n = 0
        for k, v in txn.cursor():
            n += len(v)
# each listed segment's postings against their sum (store.PostingsSum)
import struct, zlib


def item_sum(total, k, v):  # a running sum (mod 2**64) of items' CRC-32s (key, then value)
    return (total + zlib.crc32(v, zlib.crc32(k))) & 0xFFFFFFFFFFFFFFFF


def sums(txn, prefix, what, keep=lambda key: True):
    # {key after prefix: (sum, count)} of the meta items under `prefix` that `keep`
    # (each checked for its length: exit 4 naming `what` when broken)
    out = {}
    cur = txn.cursor(db=dbs[b"meta"])
    if cur.set_range(prefix):
        for k, v in cur:
            if k[:len(prefix)] != prefix:
                break
            key = bytes(k[len(prefix):])
            if keep(key):
                if len(v) != 12:
                    sys.stderr.write(f"a segment's {what} sum is broken\n")
                    sys.exit(4)
                out[key] = struct.unpack("<QI", v)
    return out


if all(n in dbs for n in (b"meta", b"postings", b"segments")):
    with env.begin() as txn:
        listed = set(bytes(k) for k in txn.cursor(db=dbs[b"segments"]).iternext(values=False))
        want = sums(txn, b"crc", "postings", listed.__contains__)
        pc = txn.cursor(db=dbs[b"postings"])
        for sk, (total, count) in sorted(want.items()):
            t = c = 0
            if pc.set_range(sk):
                for k, v in pc:
                    if k[:4] != sk:
                        break
                    t = item_sum(t, k, v)
                    c += 1
            if (t, c) != (total, count):
                sys.stderr.write(f"segment {int.from_bytes(sk, 'big')}'s postings do not match their sum\n")
                sys.exit(4)
# the files table against its sum, when it is the index's generation's
if all(n in dbs for n in (b"meta", b"files")):
    with env.begin() as txn:
        v = txn.get(b"fcrc", db=dbs[b"meta"])
        gen = txn.get(b"gen", db=dbs[b"meta"])
        if v is not None and gen is not None:
            if len(v) != 20:
                sys.stderr.write("the files table's sum is broken\n")
                sys.exit(4)
            at, total, count = struct.unpack("<QQI", v)
            if at == int(gen):
                t = c = 0
                for k, v in txn.cursor(db=dbs[b"files"]):
                    t = item_sum(t, k, v)
                    c += 1
                if (t, c) != (total, count):
                    sys.stderr.write("the files table does not match its sum\n")
                    sys.exit(4)
# each listed segment's live passages against their sum
if all(n in dbs for n in (b"meta", b"passages", b"segments")):
    try:
        import msgspec
    except ImportError:
        sys.exit(0)
    with env.begin() as txn:
        want = {int.from_bytes(k, "big"): s for k, s in sums(txn, b"pcrc", "passages").items()}
        seg_of = {}
        listed = set()
        for k, v in txn.cursor(db=dbs[b"segments"]):
            seg = int.from_bytes(k, "big")
            listed.add(seg)
            if seg in want:
                pids = msgspec.msgpack.decode(v)[0]
                for (p,) in struct.iter_unpack("<I", pids):
                    seg_of[p] = seg
        got = {s: [0, 0] for s in want}
        for k, v in txn.cursor(db=dbs[b"passages"]):
            s = seg_of.get(int.from_bytes(k, "big"))
            if s is not None:
                g = got[s]
                g[0] = item_sum(g[0], k, v)
                g[1] += 1
        for s, (total, count) in sorted(want.items()):
            if s in listed and tuple(got[s]) != (total, count):
                sys.stderr.write(f"segment {s}'s passages do not match their sum\n")
                sys.exit(4)
"""
DEEP_CHECK_S = 120


def _child_env() -> dict:
    """The environment of a Python child of the index's (the deep check, a merge's
    helper): few variables, and lmdb and lnkmem where this process found them."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def deep_check(path: str) -> None:
    """Read every page of the index in a child process: a damaged page there is the
    child's SIGSEGV/SIGABRT or LMDB error, never this process's. Raises DamagedIndex."""
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    env = _child_env()
    try:
        r = subprocess.run([sys.executable, "-B", "-c", _DEEP_CHECK, path, str(max(size, 1 << 20))],
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


SEAL = "sealed"  # beside data.mdb: its size, mtime, inode and last transaction when it was last closed whole
SNAP = "snapshot"  # beside it: the snapshot at that close, after the same stamp (used only when both agree)
LISTED = "listed"  # beside it: the stamp, and per source the digest of the listing the index matched at that close


COMPACT_FREE = 0.2  # close(compact=True) rewrites data.mdb when more of it than this is free pages
COMPACT_MIN = 1 << 20  # ... and it is at least this long
COMPACTING = "compacting"  # beside data.mdb: the folder a compacted copy is written in


def _pages(st: dict) -> int:
    return st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]


def compact_file(path: str) -> bool:
    """Rewrite ``path``'s data.mdb without free pages (a packed copy, :func:`_copy_packed`,
    then a rename over it), only while no process has the index open: every process with
    an LMDB environment open holds a shared lock on lock.mdb's first byte, so this
    takes it exclusively (False, nothing done, when it cannot). A process opening the
    index meanwhile waits on that lock and then opens the new file. The copy is made
    without LMDB's locks (none can be taken by another process while the byte is
    held); then the index is opened once normally, which, as the only opener,
    resets lock.mdb's reader table and last transaction to the new file's (a reader
    trusting the old last transaction would pick the wrong meta page)."""
    import fcntl
    lockpath = os.path.join(path, "lock.mdb")
    lfd = os.open(lockpath, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        try:
            fcntl.lockf(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
        except OSError:
            return False  # open elsewhere (a serve, a search)
        tmp = os.path.join(path, COMPACTING)
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        _copy_packed(path, tmp)
        new = os.path.join(tmp, "data.mdb")
        fd = os.open(new, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(new, os.path.join(path, "data.mdb"))
        os.rmdir(tmp)
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        # the one opener: LMDB takes lock.mdb exclusively (this process's own lock does
        # not stand in its way), resets it for the new file, then shares it (the
        # exclusive lock above becomes shared: a waiting opener goes on)
        lmdb.open(path, max_dbs=8).close()
        return True
    finally:
        os.close(lfd)  # whatever lock this process still holds on lock.mdb goes with it


COPY_STEP = 8 << 20  # bytes of keys and values a write transaction of _copy_packed


def _copy_packed(src: str, dst: str) -> None:
    """Copy the index at ``src`` (opened without LMDB's locks: the caller holds them)
    into a new one at ``dst``, table by table in key order (appended: pages packed
    full, no free page). Not LMDB's compacting copy: that reads the whole file through
    this process's map in one call, and every page read stays in its resident set (a
    build's peak RSS grew by the file's size: 292 against 213 MiB at scale 1); here the
    pages are let go after each step of COPY_STEP bytes (:func:`_release_map`)."""
    data = os.path.join(src, "data.mdb")
    senv = lmdb.open(src, readonly=True, lock=False, max_dbs=16, readahead=False)
    try:
        denv = lmdb.open(dst, map_size=os.path.getsize(data) * 2 + (64 << 20), max_dbs=16, sync=False, lock=False,
                         metasync=False, readahead=False)
        try:
            with senv.begin() as stxn:
                names = [bytes(k) for k in stxn.cursor().iternext(values=False)]
                for name in names:
                    sdb = senv.open_db(name, txn=stxn, create=False)
                    with denv.begin(write=True) as dtxn:
                        ddb = denv.open_db(name, txn=dtxn)
                    # about COPY_STEP bytes a step, by the table's mean record; its records
                    # go from cursor to cursor in C (islice), not one by one through Python
                    st_ = stxn.stat(sdb)
                    mean = (st_["leaf_pages"] + st_["overflow_pages"]) * st_["psize"] // max(st_["entries"], 1)
                    per = max(64, COPY_STEP // max(mean, 1))
                    if name == b"postings" and b"segments" in names:  # listed segments' only: what a
                        # merge or a killed one left unlisted is read by nobody (no other process has
                        # the index open: the caller holds its lock)
                        seg_db = senv.open_db(b"segments", txn=stxn, create=False)
                        listed = [bytes(k) for k in stxn.cursor(db=seg_db).iternext(values=False)]
                        records = _listed_postings(stxn.cursor(db=sdb), listed)
                    else:
                        records = iter(stxn.cursor(db=sdb))
                    while True:
                        with denv.begin(write=True, db=ddb) as dtxn:
                            took, _ = dtxn.cursor().putmulti(itertools.islice(records, per), append=True)
                        _release_map(data)
                        _release_map(os.path.join(dst, "data.mdb"))
                        if took < per:
                            break
            denv.sync(True)
        finally:
            denv.close()
    finally:
        senv.close()


def _listed_postings(cur, listed: list):
    """The postings records of the segments ``listed`` (their keys, in order): each one's
    keys are those starting with it, found by one seek."""
    for sk in listed:
        if len(sk) == 4 and cur.set_range(sk):
            yield from itertools.takewhile(lambda kv, sk=sk: kv[0][:4] == sk, cur.iternext())


def joined(pids: list, tfs: list, dtype) -> tuple[np.ndarray, np.ndarray]:
    """One term's (pids, tfs) from its segments' lists (pids of ``dtype`` when none)."""
    if not pids:
        return np.empty(0, dtype), np.empty(0, np.uint16)
    if len(pids) == 1:
        return pids[0], tfs[0]
    return np.concatenate(pids), np.concatenate(tfs)


def _stamp(data: str, txnid: Optional[int]) -> str:
    """What the seal says of ``data``: a file changed in any of these since (a write,
    a copy, a restore, a transaction by a process that did not close) is checked whole."""
    st_ = os.stat(data)
    return f"{FORMAT.decode()} {st_.st_size} {st_.st_mtime_ns} {st_.st_ino} {txnid}"


# LMDB's errors that say its file is damaged (not a full disk, not a full map). BadTxnError
# too: a fresh read transaction refused (MDB_BAD_TXN) is what a named table's record on a
# zeroed page gives (test_fs_hardening); our own code never reuses a finished transaction.
DAMAGE_ERRORS = tuple(getattr(lmdb, n) for n in (
    "CorruptedError", "PageNotFoundError", "InvalidError", "VersionMismatchError", "PanicError",
    "BadChecksumError", "IncompatibleError", "BadTxnError") if hasattr(lmdb, n))


def _guarded(method):
    """Store methods that read or write LMDB: refused once the index is damaged, and an
    LMDB error saying its file is damaged marks it so (the engine rebuilds it)."""

    @functools.wraps(method)
    def run(self, *a, **kw):
        self._guard()
        try:
            out = method(self, *a, **kw)
        except DAMAGE_ERRORS as e:
            raise self.damage(e) from None
        except Exception:
            self.check_map()  # what it read was a page cut away: damage, not this error
            raise
        self.check_map()
        return out

    return run


class _CoveringEnv:
    """An LMDB environment whose write transactions leave data.mdb as long as the pages
    it says it uses. LMDB itself may not: a page allocated and freed again in one
    transaction (deletions do it) is never written, so the file can end a page or more
    short of ``last_pgno``. Those pages are free and never read, but the checks above
    (:func:`check_file`, ``Store._guard``) cannot tell such a file from a truncated one,
    so after each commit the file is extended (zeros, never shortened) to cover them.
    Everything else is the environment's own."""

    __slots__ = ("_env", "_data", "watch")

    def __init__(self, env, data: str):
        self._env = env
        self._data = data
        # a SIGBUS in its map (the file cut short under a read) caught, not the process's end
        self.watch = mapguard.watch(data, env.stat()["psize"])

    def __getattr__(self, name):
        return getattr(self._env, name)

    def set_mapsize(self, size: int) -> None:
        self._env.set_mapsize(size)
        self.watch = mapguard.watch(self._data, self._env.stat()["psize"], self.watch)  # (the map moved)

    def close(self) -> None:
        mapguard.forget(self.watch)  # first: once let go of, its addresses may be mapped again
        self._env.close()

    def faulted(self) -> bool:
        """Whether a read met a page the file no longer held (then the map is never trusted again)."""
        return mapguard.faulted(self.watch)

    def begin(self, *a, write: bool = False, **kw):
        txn = self._env.begin(*a, write=write, **kw)
        return _CoveringTxn(txn, self) if write else txn

    def cover(self) -> None:
        need = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        try:
            if os.stat(self._data).st_size < need:
                fd = os.open(self._data, os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
                try:  # grows only: never O_TRUNC, never shorter
                    if os.fstat(fd).st_size < need:
                        os.ftruncate(fd, need)
                finally:
                    os.close(fd)
        except OSError:
            pass  # the file is gone or not ours to extend: the checks will say so


class _CoveringTxn:
    __slots__ = ("_txn", "_env")

    def __init__(self, txn, env: _CoveringEnv):
        self._txn = txn
        self._env = env

    def __enter__(self):
        return self._txn.__enter__()

    def __exit__(self, *exc):
        out = self._txn.__exit__(*exc)
        if exc[0] is None:
            self._env.cover()
        return out


def _k(n: int) -> bytes:
    return n.to_bytes(4, "big")


# --- the files table's keys ------------------------------------------------------------
#
# LMDB takes keys of at most 511 bytes (MDB_BAD_VALSIZE beyond: before this, one ref that
# long stopped a whole indexing pass), but a ref is as long as a path may be (4,096 bytes
# and more). A ref of up to KEY_MAX bytes is its own key, as it always was (an index made
# before holds no other kind: no format change, nothing rebuilt); a longer one is keyed by
# its first bytes, a NUL (which no ref holds) and a BLAKE2b digest of the whole ref, and
# its value is the pair (ref, record): the ref is read back from the value, never from
# the key. Prefix scans stay scans of key ranges (the first bytes are kept).

KEY_MAX = 511  # LMDB's key limit (mdb_env_get_maxkeysize of its default build)
_REF_DIGEST = 16
_REF_HEAD = KEY_MAX - 1 - _REF_DIGEST  # bytes of a long ref kept at the front of its key
_dec_long_file = msgspec.msgpack.Decoder(tuple[str, bytes])


def file_key(ref: str) -> bytes:
    """The ``files`` table's key of ``ref`` (at most KEY_MAX bytes whatever its length)."""
    b = ref.encode()
    if len(b) <= KEY_MAX:
        return b
    import hashlib
    return b[:_REF_HEAD] + b"\0" + hashlib.blake2b(b, digest_size=_REF_DIGEST).digest()


def file_value(ref: str, rec: bytes) -> bytes:
    """What the ``files`` table holds for ``ref`` whose record's bytes are ``rec``."""
    return rec if len(ref.encode()) <= KEY_MAX else _enc.encode((ref, rec))


def file_entry(key, value) -> tuple[str, bytes]:
    """(ref, its record's bytes) of one item of the ``files`` table."""
    key = bytes(key)
    if b"\0" in key:
        ref, rec = _dec_long_file.decode(value)
        if file_key(ref) != key:
            raise DamagedIndex("a long ref's record names another ref")
        return ref, rec
    return key.decode(), bytes(value)


def file_get(txn, db, ref: str) -> Optional[bytes]:
    """The record's bytes of ``ref`` in the ``files`` table ``db``, or None."""
    key = file_key(ref)
    v = txn.get(key, db=db)
    if v is None or len(key) == len(ref.encode()):
        return v
    got, rec = _dec_long_file.decode(v)
    return rec if got == ref else None


def file_put(txn, db, ref: str, rec: bytes) -> None:
    """Write ``ref``'s record (its bytes ``rec``) into the ``files`` table ``db``."""
    txn.put(file_key(ref), file_value(ref, rec), db=db)


# --- a segment's postings, summed ---------------------------------------------------------
#
# LMDB keeps no checksum of a page: a bit flipped in a posting list's bytes decodes to
# other ids or tfs and is served (3 of 60 single flips changed answers, none detected).
# A segment's postings never change once written, so each listed segment has, in
# ``meta`` under ``crc`` + its key, the sum (mod 2**64) and count of CRC-32s of its
# items (key then value): order-free (a merge writes its two halves as they come), and
# a single flipped bit always changes its item's CRC. Checked whenever the index is
# read through whole (the deep check, in a child: an index not closed whole, or changed
# since its seal); a segment without one (written by a copy's load, or by an engine
# before) is not.

CRC = b"crc"
_CRC = struct.Struct("<QI")
# the same of each segment's live passages (pid key, stored value): the passages table is
# not a segment's alone (a passage is deleted when it dies), so a commit takes a dying
# passage's CRC out of its segment's sum, and a merge's segment sums its segments' sums
PCRC = b"pcrc"
_MASK64 = 0xFFFFFFFFFFFFFFFF


# and of the whole files table (key, stored value), kept by every commit (a record
# replaced: its old CRC out, its new one in), stamped with the generation it was made at:
# valid only while that is the index's generation (a merge carries it on; a copy's load
# does not, and leaves it stale: then it is not checked)
FCRC = b"fcrc"
_FCRC = struct.Struct("<QQI")


def _crc_of(key, value) -> int:
    return zlib.crc32(value, zlib.crc32(key))


def _less(txn, db, key: bytes, crcs: list[int]) -> None:
    """Take ``crcs`` (items gone) out of the sum under ``key`` in ``db`` (if it has one)."""
    v = txn.get(key, db=db)
    if v is None:
        return
    total, n = _CRC.unpack(v) if len(v) == _CRC.size else (0, -1)
    if n < len(crcs):  # (broken, or not what was summed: no sum is better than a wrong one)
        txn.delete(key, db=db)
        return
    txn.put(key, _CRC.pack((total - sum(crcs)) & _MASK64, n - len(crcs)), db=db)


class PostingsSum:
    """The sum and count of CRC-32s of a segment's postings items, as they are written."""

    __slots__ = ("total", "n")

    def __init__(self) -> None:
        self.total = 0
        self.n = 0

    def add(self, key, value) -> None:
        self.total = (self.total + zlib.crc32(value, zlib.crc32(key))) & _MASK64
        self.n += 1

    def take(self, crc: int) -> None:
        self.total = (self.total - crc) & _MASK64
        self.n -= 1

    def add_sum(self, stored: Optional[bytes]) -> bool:
        """Add a sum as stored; False when there is none (then this one means nothing)."""
        if stored is None or len(stored) != _CRC.size:
            return False
        total, n = _CRC.unpack(stored)
        self.total = (self.total + total) & _MASK64
        self.n += n
        return True

    def over(self, items):
        """``items`` ((key, value) pairs) passed on, each added."""
        add = self.add
        for k, v in items:
            add(k, v)
            yield k, v

    def value(self) -> bytes:
        return _CRC.pack(self.total, self.n)


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
    refs: Refs
    live: int
    total_len: float
    seg_of: Optional[np.ndarray] = None  # int32 per pid -> its segment, -1: in none (a free id)
    segs: Optional[dict] = None  # segment -> its passages (dead ones included)
    # (under, refs counted, which refs start with it): keep()'s last folder test, since a
    # search asks it more than once (search._maxscore, at each of its cuts)
    _under: Optional[tuple] = field(default=None, repr=False, compare=False)
    # what searches work out once for this snapshot, by name (search.FACTS, search.FILE_TIMES):
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


LOOKED_UP_BYTES = 4 << 20  # Store.looked_up's budget
SMALL_SEGMENT_TERMS = 4096  # a segment of at most this many terms has them held as a set (Store.holding)


class Store:
    """One agent's words index, in one LMDB environment."""

    MAP_SIZE = 1 << 30

    def __init__(self, path: str):
        self.path = path
        self.write_lock = threading.RLock()  # re-entrant: refresh() from a commit's own on_alloc
        self._merge_lock = threading.Lock()  # one merge at a time (each step takes write_lock)
        # a merge leaves the merged segments' postings (unlisted, read by nobody) to the
        # compaction at close, which copies only listed segments' (the people's `index`:
        # its build ends with a merge of every segment and its close compacts; deleting
        # them one key at a time was ~0.5 s at 1x, ~5 s at 10x, on one core)
        self.leave_merged = False
        self._left_merged = False  # a merge left some (a compaction at close drops them)
        self.decoded = postings.Decoded()  # long lists decoded, by segment and term (immutable)
        # short lists search only looks up, decoded whole and kept apart, so that many
        # of them never evict the long ones above (search.LOOKUP_WHOLE)
        self.looked_up = postings.Decoded(LOOKED_UP_BYTES)
        self.compacted: Optional[bool] = None  # close(compact=True): whether data.mdb was rewritten
        self._seg_terms: dict[bytes, Optional[frozenset]] = {}  # by segment key: its terms when few (holding)
        self.block_max: dict = {}  # by list key: its blocks' largest scores' part (search._block_max)
        self._merge_sums: dict[int, PostingsSum] = {}  # a merge's new segment -> its postings' sum so far
        try:
            self._open()
        except BaseException:
            env = getattr(self, "env", None)
            if env is not None:
                env.close()
            self._let_go_of_path()
            raise

    _real: Optional[str] = None  # the folder's real path, while this holds it open (_open_here)

    def _let_go_of_path(self) -> None:
        with _open_here_lock:
            if self._real is not None and _open_here.get(self._real) is self:
                del _open_here[self._real]
        self._real = None

    # --- opening, checking, wiping ---------------------------------------

    def _open(self) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        real = os.path.realpath(self.path)
        with _open_here_lock:  # before anything is touched (the seal, the files)
            if _open_here.get(real) is not None:
                raise IndexInUse(f"the index in {self.path} is already open in this process")
            _open_here[real] = self
        self._real = real
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
        # "new": no file yet; "sealed": closed whole and untouched since, so neither every
        # page nor the files/segments agreement is checked again (restart O(change));
        # "checked": not closed whole (a killed process: its seal was removed at its open)
        # or touched since: every page read in a child, and the tables cross-checked
        self.opened_as = "new"
        if os.path.lexists(data):
            txnid = check_file(data)  # whatever the seal says: a torn or truncated file never maps
            if sealed is not None and sealed == _stamp(data, txnid):
                self.opened_as = "sealed"
            else:
                self.opened_as = "checked"
                deep_check(self.path)
            size = max(size, os.path.getsize(data) * 2)
        self.env = _CoveringEnv(lmdb.open(
            self.path, map_size=size, max_dbs=8, metasync=False, sync=True, readahead=False
        ), data)
        self.meta = self.env.open_db(b"meta")
        self.files = self.env.open_db(b"files")
        self.passages = self.env.open_db(b"passages")
        self.postings = self.env.open_db(b"postings")
        self.segments = self.env.open_db(b"segments")
        self.dead = self.env.open_db(b"dead")
        self.vectors = self.env.open_db(b"vectors")
        self.vec_pending = self.env.open_db(b"vec_pending")
        with self.env.begin() as txn:  # (read: an index opened and closed unchanged keeps its stamp)
            fmt = txn.get(b"format", db=self.meta)
        if fmt is None:
            with self.env.begin(write=True) as txn:
                if txn.stat(self.files)["entries"] or txn.stat(self.segments)["entries"]:
                    raise DamagedIndex("index has data but no format")
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"gen", b"0", db=self.meta)
                txn.put(b"next_pid", b"1", db=self.meta)
                txn.put(b"next_seg", b"1", db=self.meta)
        elif fmt != FORMAT:
            raise DamagedIndex(f"index format {fmt!r} is not {FORMAT!r}")
        self.psize = self.env.stat()["psize"]
        if os.path.isdir(os.path.join(self.path, COMPACTING)):  # a compaction killed (none runs while this is open)
            shutil.rmtree(os.path.join(self.path, COMPACTING), ignore_errors=True)
        self._sealed = sealed
        self._listed = self._saved_listed(sealed) if self.opened_as == "sealed" else {}
        if self.opened_as == "sealed" and self._saved_matches(sealed):
            return  # its snapshot is read when first asked for (a restart that changes nothing never does)
        self.snapshot = self._load(check=self.opened_as != "sealed")

    @classmethod
    def open(cls, path: str) -> "Store":
        """Open the index at ``path``; a damaged one is wiped and started anew. An index open
        in this process already is refused (IndexInUse), and one this process cannot open
        now (:func:`_damage_at_open`) raises its error: neither is wiped."""
        try:
            return cls(path)
        except (DamagedIndex, lmdb.Error, msgspec.DecodeError, ValueError, IndexError, OSError) as e:
            if not _damage_at_open(e):
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
                    saved = self._saved_snapshot(self._sealed)
                    if saved is not None:
                        self._snap_stamp, self._snapshot_from = self._sealed, "saved"
                        snap = saved
                    else:
                        try:
                            snap = self._load(check=False)
                        except (DamagedIndex, lmdb.Error, msgspec.DecodeError, ValueError, IndexError) as e:
                            raise self.damage(e) from None
                    self._snapshot = snap
        return snap

    @snapshot.setter
    def snapshot(self, snap: Snapshot) -> None:
        self._snapshot = snap

    @property
    def snapshot_from(self) -> str:
        """Where the snapshot came from: "saved" (at the last clean close) or "tables"."""
        self.snapshot
        return self._snapshot_from

    @property
    def snapshot_saved(self) -> bool:
        """Whether the snapshot is (or, not read yet, will be) the one saved at the last close."""
        return self._snapshot_from == "saved" if self._snapshot is not None else self._sealed is not None

    @_guarded
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
        self.check_map()
        try:
            # the file first: the pages in use are read from its meta pages, in the map,
            # and a file cut below them is a SIGBUS at that read (caught: mapguard; but
            # not touched at all is better)
            size = os.stat(self.data).st_size
            if size < 2 * self.psize:
                raise self.damage(f"data.mdb holds {size} bytes, less than its two meta pages")
            # then the pages in use, then the size again if need be: a commit in between
            # grows the file before its meta, so a size read after the pages is never short
            need = (self.env.info()["last_pgno"] + 1) * self.psize
            if size < need:
                size = os.stat(self.data).st_size
        except (OSError, lmdb.Error) as e:
            raise self.damage(e) from None
        self.check_map()
        if size < need:
            raise self.damage(f"data.mdb holds {size} bytes but the index uses {need}")

    def check_map(self) -> None:
        """Raise (and mark the index damaged) if a read through the map met a page the file
        no longer held: what it read was not the index's (:mod:`mapguard`)."""
        if self.env.faulted():
            raise self.damage("data.mdb was cut short while it was read")

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

    def _load(self, check: bool = True) -> Snapshot:
        """The snapshot read from ``segments`` and ``dead``; with ``check``, every file
        record is read too and must name exactly the live passages (DamagedIndex)."""
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
            next_pid = int(txn.get(b"next_pid", db=self.meta))
            cap = next_pid + 1
            doclen = np.zeros(cap, np.float32)
            alive = np.zeros(cap, bool)
            src = np.zeros(cap, np.uint8)
            refid = np.full(cap, -1, np.int32)
            seg_of = np.full(cap, -1, np.int32)
            names: list[str] = []
            ids: dict[str, int] = {}  # (while loading only)
            segs: dict[int, int] = {}
            for k, v in txn.cursor(db=self.segments):
                seg = _seg_codec.decode(v)
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
            for k, _ in txn.cursor(db=self.dead):
                p = int.from_bytes(k, "big")
                if p < cap:
                    alive[p] = False
            if check:  # every live passage belongs to exactly one file record, and back
                owned: list[int] = []  # every file's ids, checked at once (one gather, not one per file)
                for k, v in txn.cursor(db=self.files):
                    owned.extend(_dec_file.decode(file_entry(k, v)[1]).pids)
                if owned and not alive[np.asarray(owned, np.int64)].all():
                    raise DamagedIndex("a file names passages that are not live")
                if len(owned) != int(alive.sum()):
                    raise DamagedIndex("live passages and files disagree")
        live = int(alive.sum())
        return Snapshot(gen, doclen, alive, src, refid, refs, live, float(doclen[alive].sum(dtype=np.float64)),
                        seg_of, segs)

    _bufs: tuple = ()  # (doclen, src, refid) with room beyond the snapshot's length

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
            cap = max(n, n_old + n_old // 8 + 1024)
            doclen = np.zeros(cap, np.float32)
            src = np.zeros(cap, np.uint8)
            refid = np.full(cap, -1, np.int32)
            doclen[:n_old], src[:n_old], refid[:n_old] = old.doclen, old.src, old.refid
            bufs = self._bufs = (doclen, src, refid)
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

    read_at = 0.0  # time.monotonic() of the last refresh: a search's look at the index
    # called (on a search's thread; it must not block) when searches have left more than
    # SEARCH_MAP_RESIDENT of file-backed memory mapped: the engine lets go of the map's pages
    # on its own thread. Each page a search reads maps 64 KiB of cached neighbours, so 600
    # searches in a row at 1.27M passages left ~200 MiB of the map in serve's RSS until it rested
    on_map_grown = None
    SEARCH_MAP_RESIDENT = 96 << 20  # (the libraries' ~20 MiB included)
    MAP_CHECK_EVERY = 32  # searches between two reads of the resident memory (/proc/self/statm)
    _reads = 0

    @_guarded
    def refresh(self) -> Snapshot:
        """Reload the snapshot when another process has committed since.

        A writer of this process publishes its snapshot before it lets go of the write
        lock, so a generation ahead of the snapshot is first waited out under that lock
        (a commit between its transaction and its snapshot: milliseconds); only a
        generation still ahead after it is another process's, read anew."""
        self.read_at = time.monotonic()
        if self.on_map_grown is not None:
            self._reads += 1  # (searches on several threads may miscount: no matter)
            if self._reads >= self.MAP_CHECK_EVERY:
                self._reads = 0
                held = memtrim.resident()
                if held is not None and held[1] > self.SEARCH_MAP_RESIDENT:
                    self.on_map_grown()
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
        if gen != self.snapshot.gen:
            with self.write_lock:
                with self.env.begin() as txn:
                    gen = int(txn.get(b"gen", db=self.meta))
                if gen != self.snapshot.gen:
                    self.snapshot = self._load()
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

    def _saved_listed(self, sealed: Optional[str]) -> dict[str, bytes]:
        """The listings noted at the last clean close, when it was of the index as sealed."""
        try:
            with open(os.path.join(self.path, LISTED), "rb") as f:
                saved = msgspec.json.decode(f.read(), type=_Listed)
            if sealed is None or saved.stamp != sealed:
                return {}
            return {k: bytes.fromhex(v) for k, v in saved.listed.items()}
        except (OSError, ValueError, msgspec.DecodeError):
            return {}

    def _save_listed(self, stamp: str) -> None:
        where = os.path.join(self.path, LISTED)
        if not self._listed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where)
            return
        tmp = where + ".tmp"
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(_Listed(stamp, {k: v.hex() for k, v in self._listed.items()})))
        os.replace(tmp, where)

    def _saved_matches(self, sealed: Optional[str]) -> bool:
        """Whether the saved snapshot's first line is the stamp ``sealed`` (its body is read,
        and checked, when the snapshot is first asked for)."""
        if sealed is None:
            return False
        try:
            with open(os.path.join(self.path, SNAP), "rb") as f:
                head = f.readline(len(sealed.encode()) + 1)
        except OSError:
            return False
        return head == sealed.encode() + b"\n"

    def _saved_snapshot(self, sealed: str) -> Optional[Snapshot]:
        """The snapshot saved at the last clean close, when it is of the index as sealed
        (same stamp: no transaction since) and the generation it names; else None."""
        try:
            with open(os.path.join(self.path, SNAP), "rb") as f:
                raw = f.read()
            head, _, body = raw.partition(b"\n")
            if head.decode() != sealed:
                return None
            d = _dec_snap.decode(body)
            with self.env.begin() as txn:
                if int(txn.get(b"gen", db=self.meta)) != d.gen:
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

    def _snapshot_bytes(self) -> Optional[bytes]:
        """The published snapshot, encoded for the next open, when it is the index's
        (no other process committed since it was made); None otherwise."""
        snap = self.snapshot
        if snap.seg_of is None or snap.segs is None:
            return None
        with self.env.begin() as txn:
            if int(txn.get(b"gen", db=self.meta)) != snap.gen:
                return None
        return _enc.encode(_SavedSnapshot(
            snap.gen, snap.live, snap.total_len, list(snap.segs.items()), list(snap.refs),
            snap.doclen.astype("<f4").tobytes(), snap.alive.tobytes(), snap.src.tobytes(),
            snap.refid.astype("<i4").tobytes(), snap.seg_of.astype("<i4").tobytes()))

    _trimmed_at = 0  # anonymous memory after the last trim of let_go
    MAP_RESIDENT = 32 << 20  # file-backed memory (libraries included) past which a build lets go of the map's pages

    TRIM_STEP = 32 << 20  # anonymous memory grown since the last trim before a build trims again

    def let_go(self) -> None:
        """Give back what a build's commit leaves held: the map's pages (:meth:`let_go_of_map`)
        and, once the anonymous memory has grown by :data:`TRIM_STEP` since the last time, the
        heap freed (glibc keeps it in its arenas otherwise). Not after every commit: each trim
        hands back pages the next batch faults in again (a 1x build 5-10 % slower)."""
        held = self.let_go_of_map()  # (letting go of the map leaves the anonymous memory as it was)
        if held is None or held[0] > self._trimmed_at + self.TRIM_STEP:
            memtrim.trim()
            after = memtrim.resident()
            self._trimmed_at = after[0] if after is not None else 0

    def let_go_of_map(self) -> Optional[tuple[int, int]]:
        """Let go of the map's pages this process has touched once its file-backed memory is
        past :data:`MAP_RESIDENT`. Each read of a page not mapped yet maps its cached
        neighbours too (the kernel's fault-around, 64 KiB), so a walk through the B-trees
        soon holds many times the pages it read: each commit of a build at 1.27M passages
        (~130 MiB stayed resident), the people's index asking 120k file records at its end
        (+111 MiB in 0.3 s), a merge between its steps (~70 MiB). Returns the resident
        memory read before (:func:`memtrim.resident`)."""
        return _let_go_of_map(self.data, self.MAP_RESIDENT)

    def free_share(self) -> float:
        """The share of data.mdb's pages that no table uses (freed by merges and
        deletions; LMDB reuses them for later writes but never shortens the file)."""
        with self.env.begin() as txn:
            used = 2 + sum(_pages(txn.stat(db)) for db in (
                self.meta, self.files, self.passages, self.postings, self.segments, self.dead,
                self.vectors, self.vec_pending)) + _pages(self.env.stat())
        total = self.env.info()["last_pgno"] + 1
        return max(0.0, 1 - used / total) if total else 0.0

    def close(self, compact: bool = False) -> None:
        """Close; an index closed whole is sealed, so the next open need not read it all,
        and its snapshot is saved beside it, so the next open need not rebuild it.
        ``compact``: first rewrite data.mdb without its free pages when they are more
        than :data:`COMPACT_FREE` of it and no other process has the index open
        (:func:`compact_file`; the people's ``index`` asks, after its build)."""
        try:
            self._close(compact)
        finally:
            self._let_go_of_path()  # (last: no other open of this process while it compacts)

    def _close(self, compact: bool) -> None:
        self.stop_merger()  # a merge under way stops at its next step (what it wrote: swept later)
        with self.write_lock:
            whole = self.damaged is None and not self.env.faulted()
            saved = None
            try:
                if whole:
                    self.env.sync(True)
                    compact = compact and os.path.getsize(self.data) >= COMPACT_MIN \
                        and (self._left_merged or self.free_share() > COMPACT_FREE)
                    # a snapshot never read: the saved one stands while the file is as it was sealed
                    if self._snapshot is not None or compact or _stamp(self.data, check_file(self.data)) != self._sealed:
                        saved = self._snapshot_bytes()
            except (lmdb.Error, OSError, DamagedIndex):
                whole = False
            whole = whole and not self.env.faulted()  # (what was saved was read through it)
            self.env.close()
            if whole and compact:
                memtrim.trim()  # the build's freed heap, before the copy adds its own
                try:
                    self.compacted = compact_file(self.path)
                except (lmdb.Error, OSError):
                    self.compacted = False  # the old file stands (an unfinished copy is removed at open)
            if whole:
                try:
                    stamp = _stamp(self.data, check_file(self.data))
                    # first: a kill before the seal leaves it unused; not again when no
                    # transaction ran since it was saved (a restart on an unchanged tree)
                    if saved is not None and stamp != self._snap_stamp:
                        tmp = os.path.join(self.path, SNAP + ".tmp")
                        with open(tmp, "wb") as f:
                            f.write(stamp.encode() + b"\n" + saved)
                        os.replace(tmp, os.path.join(self.path, SNAP))
                    self._save_listed(stamp)  # valid only beside a seal of the same stamp
                    tmp = os.path.join(self.path, SEAL + ".tmp")
                    with open(tmp, "w") as f:
                        f.write(stamp)
                    os.replace(tmp, os.path.join(self.path, SEAL))
                except (OSError, DamagedIndex):
                    pass

    # --- reading ---------------------------------------------------------

    @_guarded
    def all_files(self) -> dict[str, FileRec]:
        with self.env.begin() as txn:
            return {ref: _dec_file.decode(rec) for ref, rec in self.file_items(txn)}

    def file_items(self, txn):
        """(ref, record's bytes) of every file, in key order (a long ref's by its key)."""
        for k, v in txn.cursor(db=self.files):
            yield file_entry(k, v)

    def put_file(self, txn, ref: str, rec: bytes) -> None:
        """Write ``ref``'s record (its bytes) in ``txn`` (a copy's load)."""
        file_put(txn, self.files, ref, rec)

    def _files_under(self, prefix: str, dec=_dec_file):
        """(ref, FileRec) of every file whose ref starts with ``prefix``."""
        p = prefix.encode()[:_REF_HEAD]  # a long ref's key holds this much of it
        exact = len(prefix.encode()) > _REF_HEAD
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.files)
            if cur.set_range(p):
                for k, v in cur:
                    if not k.startswith(p):
                        break
                    if b"\0" in k or exact:
                        ref, rec = file_entry(k, v)
                        if ref.startswith(prefix):
                            yield ref, dec.decode(rec)
                    else:
                        yield k.decode(), dec.decode(v)

    @_guarded
    def file_versions(self, prefix: str = "") -> dict[str, tuple[str, int]]:
        # only each record's head: a file's passage ids are not built (every restart's plan)
        return {ref: (rec.version, rec.size) for ref, rec in self._files_under(prefix, _dec_head)}

    def _records(self, refs: Iterable[str], dec):
        """(ref, record decoded by ``dec``) of each of ``refs`` the index holds (one lookup
        each), one at a time."""
        with self.env.begin() as txn:
            for ref in refs:
                v = file_get(txn, self.files, ref)
                if v is not None:
                    yield ref, dec.decode(v)

    @_guarded
    def file_recs(self, refs: Iterable[str]) -> dict[str, FileRec]:
        """The records of ``refs`` that the index holds (one lookup each)."""
        return dict(self._records(refs, _dec_file))

    @_guarded
    def kinds_of(self, refs: Iterable[str]) -> dict[str, str]:
        """How each of ``refs`` that the index holds was indexed (its record's kind), no
        record kept and the map's pages let go as it goes: the people's ``index`` asks it
        of every file it read (at 1.27M passages whole records held ~60 MiB more, and the
        pages their lookups mapped ~110 MiB)."""
        kinds: dict[str, str] = {}
        out = {}
        for i, (ref, rec) in enumerate(self._records(refs, _dec_kind)):
            out[ref] = kinds.setdefault(rec.kind, rec.kind)
            if i % 4096 == 4095:
                self.let_go_of_map()
        self.let_go()
        return out

    @_guarded
    def refs_of_kind(self, prefix: str, kind: str) -> set[str]:
        """The refs below ``prefix`` indexed as ``kind`` (e.g. "name": a document
        indexed by name while no converter was installed, §3.3)."""
        return {ref for ref, rec in self._files_under(prefix) if rec.kind == kind}

    @_guarded
    def file_mtime(self, ref: str) -> Optional[str]:
        """A file's modification time as indexed (None when unknown)."""
        with self.env.begin() as txn:
            v = file_get(txn, self.files, ref)
        return _dec_file.decode(v).mtime if v is not None else None

    @_guarded
    def passages_of(self, pids: Iterable[int]) -> list[Optional[Passage]]:
        with self.env.begin() as txn:
            zdict = txn.get(b"zdict", db=self.meta)
            out = []
            for p in pids:
                v = txn.get(_k(int(p)), db=self.passages)
                out.append(_dec_passage.decode(textpack.unpack(v, zdict)) if v is not None else None)
            return out

    def segment_keys(self, txn) -> list[bytes]:
        return [bytes(k) for k in txn.cursor(db=self.segments).iternext(values=False)]

    def postings_of(self, txn, term: str, segs: Optional[list[bytes]] = None) -> tuple[np.ndarray, np.ndarray]:
        """(pids, tfs) of a term across all segments, dead ones included."""
        t = term.encode()
        pids, tfs = [], []
        for sk in segs if segs is not None else self.segment_keys(txn):
            got = self.decoded_list(txn, sk + t)
            if got is None:
                continue
            ps, ts = got
            pids.append(ps)
            tfs.append(ts)
        return joined(pids, tfs, np.uint32)

    def holding(self, txn, segs: list[bytes], term: bytes) -> list[bytes]:
        """Those of ``segs`` that may hold a list of ``term``: a small segment (a changed
        file's, a few commits') only where its terms, read once and held as a set, have
        it, so a search does not look every term up in each of them (a segment's terms
        never change; its key is never reused)."""
        known = self._seg_terms
        if len(known) > 2 * len(segs) + 64:  # segments merged away: forget them
            keep = set(segs)
            self._seg_terms = known = {k: v for k, v in known.items() if k in keep}
        out = []
        for sk in segs:
            try:
                terms = known[sk]
            except KeyError:
                terms = known[sk] = self._terms_if_few(txn, sk)
            if terms is None or term in terms:
                out.append(sk)
        return out

    def _terms_if_few(self, txn, sk: bytes) -> Optional[frozenset]:
        """The terms of segment ``sk`` (bytes), or None when it has more than
        :data:`SMALL_SEGMENT_TERMS`."""
        cur = txn.cursor(db=self.postings)
        if not cur.set_range(sk):
            return frozenset()
        n, out = len(sk), []
        for k in cur.iternext(values=False):
            if k[:n] != sk:
                break
            if len(out) >= SMALL_SEGMENT_TERMS:
                return None
            out.append(bytes(k[n:]))
        return frozenset(out)

    def decoded_list(self, txn, key: bytes) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(pids, tfs) of one segment's list of a term (segment key + term), decoded once and
        kept in :attr:`decoded`; None when the segment has no such list."""
        got = self.decoded.get(key)
        if got is None:
            v = txn.get(key, db=self.postings)
            if v is None:
                return None
            got = self.decoded.put(key, postings.unpack(v))
        return got

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
            return self._passage_dict_in(txn, passages)

    def _passage_dict_in(self, txn, passages: Iterable) -> Optional[bytes]:
        """The index's passage dictionary in a write transaction: the one it has, else
        one made from ``passages`` (read only then) and kept, else None (too few)."""
        zdict = txn.get(b"zdict", db=self.meta)
        if zdict is None:
            zdict = textpack.make_dict([_enc.encode(p) for p in passages])
            if zdict is not None:
                txn.put(b"zdict", zdict, db=self.meta)
        return zdict

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
            self.forget_listed()
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
            dying: dict[int, list[int]] = {}  # segment -> CRCs of its passages that die now
            fsum = self._files_sum(txn)  # None: not kept (stale, or an index made before)
            for ref in gone:
                old = file_get(txn, self.files, ref)
                if old is None:
                    continue
                if fsum is not None:
                    key = file_key(ref)
                    fsum.take(_crc_of(key, txn.get(key, db=self.files)))
                for p in _dec_file.decode(old).pids:
                    txn.put(_k(p), b"", db=self.dead)
                    was = txn.get(_k(p), db=self.passages)
                    if was is not None and snap is not None and snap.seg_of is not None and p < len(snap.seg_of) \
                            and snap.seg_of[p] >= 0:
                        dying.setdefault(int(snap.seg_of[p]), []).append(_crc_of(_k(p), was))
                    txn.delete(_k(p), db=self.passages)
                    txn.delete(_k(p), db=self.vectors)
                    txn.delete(_k(p), db=self.vec_pending)
                    killed.append(p)
                txn.delete(file_key(ref), db=self.files)
            if killed and (snap is None or snap.seg_of is None):  # whose passages died is not known
                self._forget_passage_sums(txn)
            for s_, crcs in dying.items():
                _less(txn, self.meta, PCRC + _k(s_), crcs)
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
                        if s >= 0 and s not in self._merging and not alive[members].any():  # wholly dead: drop it now
                            self._drop_segment(txn, s, members)
                            seg_of[members] = -1
                            dropped.append(s)
                # (a copy's vector chunks name passages by id: `pid_reuse` tells the
                # write-back to send all vectors anew, see copy.export)
                held = seg_of[1:next_pid] >= 0
                free = np.flatnonzero(~held) + 1
                # the highest ids free: made again (the last held id found without a list
                # of every held one: 10 MB a commit at 1.27M passages)
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
                new_keys.extend(map(_k, pids))
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
                value = file_value(f.ref, _enc.encode(FileRec(f.version, f.size, pids, f.kind, f.mtime)))
                txn.put(key, value, db=self.files)
                if fsum is not None:
                    fsum.add(key, value)
            mapped.clear()
            if new_keys:  # compressed, with the index's dictionary (made once, from the first big commit)
                zdict = self._passage_dict_in(txn, (p for p in new_passages if type(p) is Passage))
                packer = textpack.Packer(zdict)
                encode = _enc.encode
                if batch.packed_with is not None and batch.packed_with != zdict:  # packed with another
                    # dictionary (the index was replaced since the worker was given it): again with its own
                    def pack(p, other=batch.packed_with):
                        return packer.pack(encode(p) if type(p) is Passage else textpack.unpack(p, other))
                else:
                    def pack(p):
                        return packer.pack(encode(p)) if type(p) is Passage else p
                # new ids only: appending packs the pages full; reused ones go in their place
                last = txn.cursor(db=self.passages)
                fresh = not last.last() or last.key() < new_keys[0]
                # each packed as it is written (all of a batch's at once were ~9 MiB at 4 MB of text)
                psum = PostingsSum()
                txn.cursor(db=self.passages).putmulti(
                    psum.over(zip(new_keys, map(pack, new_passages))), append=fresh)
                txn.put(PCRC + _k(seg), psum.value(), db=self.meta)
            if seg_pids:
                sk = _k(seg)
                names = list(vocab) if vocab else list(first or ())
                order = sorted(range(len(names)), key=names.__getitem__)
                names = [names[i] for i in order]
                rank = np.empty(len(order), np.int32)  # batch vocab id -> its rank in key order
                rank[order] = np.arange(len(order), dtype=np.int32)
                r = rank[np.concatenate(p_terms)] if p_terms else np.zeros(0, np.int32)
                del p_terms
                pid_arr = np.concatenate(p_pids) if p_pids else np.zeros(0, np.uint32)
                # by term, then passage: one sort of a 64-bit key (a term's passages are distinct),
                # 5x faster than a lexsort of the two
                order = np.argsort((r.astype(np.int64) << 32) | pid_arr)
                r, pid_arr = r[order], pid_arr[order]
                tf_arr = (np.concatenate(p_tfs) if p_tfs else np.zeros(0, np.uint32))[order]
                del p_tfs, p_pids, order
                bounds = np.flatnonzero(np.diff(r)) + 1
                starts = np.concatenate(([0], bounds))
                ends = np.concatenate((bounds, [len(r)]))
                if len(r):  # made as they are written (a list of them all was ~10 MiB at 4 MB of text)
                    items = zip((sk + names[k].encode() for k in r[starts].tolist()),
                                postings.pack_many(pid_arr, tf_arr, starts, ends))
                    # a term LMDB cannot key (analyze keeps none: a store's own defence) is
                    # left out, never the batch: no query can name it either
                    items = ((k, v) for k, v in items if len(k) <= KEY_MAX)
                    summed = PostingsSum()
                    # a new segment's keys sort after every other: appended, no old page touched
                    txn.cursor(db=self.postings).putmulti(summed.over(items), append=True)
                    txn.put(CRC + sk, summed.value(), db=self.meta)
                meta = SegMeta(np.asarray(seg_pids, "<u4").tobytes(), np.asarray(seg_lens, "<u4").tobytes(),
                               seg_refs)
                txn.put(sk, _seg_codec.encode(meta), db=self.segments)
                txn.put(b"next_seg", str(seg + 1).encode(), db=self.meta)
            txn.put(b"next_pid", str(next_pid).encode(), db=self.meta)
            gen = int(txn.get(b"gen", db=self.meta)) + 1
            txn.put(b"gen", str(gen).encode(), db=self.meta)
            if fsum is not None and fsum.n >= 0:
                txn.put(FCRC, _FCRC.pack(gen, fsum.total, fsum.n), db=self.meta)
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
        txn.delete(CRC + sk, db=self.meta)
        txn.delete(PCRC + sk, db=self.meta)
        for p in pids.tolist():
            txn.delete(_k(p), db=self.dead)
            txn.delete(_k(p), db=self.vectors)
            txn.delete(_k(p), db=self.vec_pending)

    def _files_sum(self, txn) -> Optional[PostingsSum]:
        """The files table's sum as kept (:data:`FCRC`), or a new one for an empty table;
        None when it is not kept or is stale (another generation's)."""
        v = txn.get(FCRC, db=self.meta)
        out = PostingsSum()
        if v is None:
            return out if not txn.stat(self.files)["entries"] else None
        if len(v) != _FCRC.size:
            return None
        at, out.total, out.n = _FCRC.unpack(v)
        return out if at == int(txn.get(b"gen", db=self.meta)) else None

    def _forget_passage_sums(self, txn) -> None:
        """Drop every segment's passages' sum (a commit that cannot tell whose passages died)."""
        cur = txn.cursor(db=self.meta)
        while cur.set_range(PCRC) and bytes(cur.key()).startswith(PCRC):
            cur.delete()

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
                        zdict = txn.get(b"zdict", db=self.meta)
                        for i, (pid, v) in enumerate(zip(pids, vecs)):
                            now = txn.get(_k(pid), db=self.passages)
                            if now is None or (expect is not None and textpack.unpack(now, zdict) != expect[i]):
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
    #
    # A merge streams (docs/SCALE-NOTES.md item 2): a k-way merge by term over the merged
    # segments' postings (each segment's keys are term-sorted), one term in memory at a
    # time, written under a new segment id in write transactions of about STEP_BYTES;
    # a segment not listed in ``segments`` is invisible to readers, so those writes change
    # nothing anyone sees. The last transaction lists the new segment and unlists the old
    # ones, dropping the passages that were dead when the merge began; the old segments'
    # postings are deleted after it, again in bounded transactions. The write lock is held
    # per step, so commits go on beside a merge; a passage a commit kills meanwhile stays
    # dead-marked in the new segment (the next merge drops it). A process killed between
    # steps leaves only postings of a segment not listed: :meth:`sweep` deletes them.

    MERGE_FACTOR = 8  # a tier of segments is merged when it holds this many
    TIER_FLOOR = 16  # passages: smaller segments are all in the lowest tier
    DEAD_SHARE = 0.5  # a segment with more dead passages than this share is merged alone
    STEP_BYTES = 4 << 20  # postings written (or keys deleted, x64 B) per write transaction of a merge
    JOIN_BYTES = 64 << 10  # stored lists of terms in several segments joined at a time by a merge

    _merger: Optional[threading.Thread] = None
    _swept = False
    _merging: frozenset = frozenset()  # segments a merge of this process is reading: commits keep them

    @_guarded
    def segment_sizes(self) -> dict[int, int]:
        with self.env.begin() as txn:
            return {int.from_bytes(k, "big"): len(v) for k, v in txn.cursor(db=self.segments)}

    @_guarded
    def merge(self, segs: list[int], should_stop=None) -> bool:
        """Merge segments into one, dropping their dead passages; False when nothing was
        merged (stopped by ``should_stop``, or a segment went away meanwhile)."""
        segs = sorted(set(int(s) for s in segs))
        if not segs:
            return False
        stop = should_stop or (lambda: False)
        with self._merge_lock:
            self._sweep()
            if len(segs) < 2 and not self._has_dead(segs):
                return False
            new = self._merge_begin(segs)
            if new is None:
                return False
            try:
                self._merge_postings(segs, new, stop)
                done = self._step(lambda: self._merge_end(segs, new))
            except _Abandoned:
                done = None
            finally:
                self._merging = frozenset()
                self._merge_sums.pop(new, None)
            if done is None:  # stopped, or the segments changed under it: its postings are garbage
                if not stop():
                    self._delete_segment_postings(new, stop)
                    self._step(lambda: self._unregister(new))
                return False
            if self.leave_merged:  # unlisted now: dropped by the compaction at close (else the next sweep)
                self._left_merged = True
            else:
                for s in segs:  # unlisted now: nobody reads these any more
                    if stop():
                        break  # left for the next sweep
                    self._delete_segment_postings(s, stop)
        self._changed()
        return True

    def _step(self, fn):
        """One write step of a merge, under the write lock; a full map grows and the step alone
        runs again."""
        with self.write_lock:
            self._guard()
            while True:
                try:
                    return fn()
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def _has_dead(self, segs: list[int]) -> bool:
        snap = self.snapshot
        if snap.seg_of is None:
            with self.env.begin() as txn:
                return txn.stat(self.dead)["entries"] > 0
        n = min(len(snap.seg_of), len(snap.alive))
        return bool((np.isin(snap.seg_of[:n], segs) & ~snap.alive[:n]).any())

    def _merge_begin(self, segs: list[int]) -> Optional[int]:
        """Take the new segment's id (registered in ``meta`` as a merge of this process's);
        None when a segment to merge is no longer listed."""

        def begin():
            with self.env.begin(write=True) as txn:
                if any(txn.get(_k(s), db=self.segments) is None for s in segs):
                    return None
                new = int(txn.get(b"next_seg", db=self.meta))
                txn.put(b"next_seg", str(new + 1).encode(), db=self.meta)
                txn.put(_MERGING + _k(new), str(os.getpid()).encode(), db=self.meta)
                # the passages dead now are dropped by this merge: a mask by id (one gather a term)
                dead = np.fromiter((int.from_bytes(k, "big") for k in
                                    txn.cursor(db=self.dead).iternext(values=False)), np.int64)
                top = max(int(dead.max()) if len(dead) else 0, int(txn.get(b"next_pid", db=self.meta)))
                mask = np.zeros(top + 1, bool)
                mask[dead] = True
                self._deadmask = mask
                # the segments holding none of them: their postings are copied as they are stored
                snap = self.snapshot
                self._clean = frozenset()
                if snap.seg_of is not None and snap.gen == int(txn.get(b"gen", db=self.meta)):
                    d = dead[dead < len(snap.seg_of)]
                    self._clean = frozenset(segs) - set(snap.seg_of[d].tolist())
                self._merging = frozenset(segs)  # a commit no longer drops them when wholly dead
                return new

        return self._step(begin)

    def _merge_postings(self, segs: list[int], new: int, stop) -> None:
        """Write the merged segments' live postings under ``new``, term by term, in steps
        (:func:`merge_steps.steps`); a large merge's upper terms read and joined by a
        helper process (the second core, :func:`merge_steps.start`), whose steps this
        thread writes between its own."""
        from lnkmem.index.merge import steps as merge_steps
        job = merge_steps.Job(self.path, self.data, segs, new, sorted(self._clean), self.STEP_BYTES,
                              self.JOIN_BYTES, self.MAP_RESIDENT, self.env.info()["map_size"])
        helper = None
        sizes = self._segment_sizes_of(self.snapshot)
        passages = sum(sizes.get(s, 0) for s in segs)
        if passages >= merge_steps.SHARED_PASSAGES:
            # the heap freed before (a build's batches) back first: a large merge's peak comes
            # on top of what is held, not of that (10x build: 174 -> 133 MiB at its start)
            memtrim.trim()
        if merge_steps.shared(passages):
            mid = self._merge_split(segs, sizes)
            if mid is not None:
                helper = merge_steps.start(job, self._deadmask, mid)
        hi = helper.lo if helper is not None else None
        summed = self._merge_sums[new] = PostingsSum()

        def put(items: list, theirs: bool = False) -> None:
            if items:
                self._step(lambda: self._put_postings(segs, items))
                for k, v in items:  # (once written: a step retried is not summed twice)
                    summed.add(k, v)
            if theirs:  # (the pages its write walked; this thread's steps let go of theirs)
                self.let_go_of_map()

        try:
            for items in merge_steps.steps(job, self.env, self.postings, self._deadmask, None, hi, stop):
                put(items)
                while helper is not None and helper.ready():
                    put(helper.next(stop), True)
            if helper is not None:
                while not helper.done:
                    put(helper.next(stop), True)
                if not helper.whole:  # it failed: the rest of its share here
                    import logging
                    logging.getLogger("lnkmem").warning("the merge's helper process failed (%s): its terms are merged "
                                                        "here", helper.error)
                    for items in merge_steps.steps(job, self.env, self.postings, self._deadmask,
                                                   helper.resume(), None, stop):
                        put(items)
        finally:
            if helper is not None:
                helper.close()
                if not helper.whole:  # killed: its slot in the reader table would pin pages
                    with contextlib.suppress(lmdb.Error):
                        self.env.reader_check()

    def _segment_sizes_of(self, snap: "Snapshot") -> dict:
        """Passages by segment: the snapshot's, else read from the segments' records."""
        return snap.segs if snap.segs is not None else self.segment_sizes()

    def _merge_split(self, segs: list[int], sizes: dict) -> Optional[bytes]:
        """The term from which the helper merges (its share of the postings by the bytes
        of the largest segment's lists: the segments of a build hold much the same words),
        None when there is none."""
        from lnkmem.index.merge import steps as merge_steps
        big = _k(max(segs, key=lambda s: sizes.get(s, 0)))
        with self.env.begin(buffers=True) as txn:
            cur = txn.cursor(db=self.postings)
            lens = array("q")
            if cur.set_range(big):
                for k, v in cur:
                    if k[:4] != big:
                        break
                    lens.append(len(v))
            if len(lens) < 2:
                return None
            half = int(np.searchsorted(np.cumsum(np.frombuffer(lens, np.int64)), sum(lens) * (1 - merge_steps.HELPER_SHARE)))
            if not 0 < half < len(lens):
                return None
            cur.set_range(big)
            for _ in range(half):
                cur.next()
            mid = bytes(cur.key()[4:])
        _release_map(self.data)
        return mid

    def _put_postings(self, segs: list[int], items: list) -> None:
        with self.env.begin(write=True) as txn:
            if any(txn.get(_k(s), db=self.segments) is None for s in segs):
                raise _Abandoned()  # dropped by a commit (all dead) or replaced by a copy
            txn.cursor(db=self.postings).putmulti(items)

    def _merge_end(self, segs: list[int], new: int) -> Optional[tuple]:
        """The last transaction: list the new segment, unlist the merged ones, drop the ids
        dead when the merge began; then the snapshot. None when a segment went away."""
        dead = self._deadmask
        snap = self.snapshot
        with self.env.begin(write=True) as txn:
            listed = txn.cursor(db=self.segments)
            if not all(listed.set_key(_k(s)) for s in segs):
                return None
            # each segment's record as stored (refs as runs), one at a time: no list a passage
            all_p, all_l, names, runs, gone = [], [], [], [], []
            psum, psums = PostingsSum(), []  # the new segment's live passages: its segments' sums
            for s in segs:
                st, rn = _seg_codec.stored(txn.get(_k(s), db=self.segments))
                self.let_go_of_map()  # (a record of the final merge's segments: overflow pages, ~16 MB)
                p = np.frombuffer(st.pids, "<u4")
                ln = np.frombuffer(st.lens, "<u4")
                nm = st.names
                d = _dead_of(dead, p)
                if d.any():
                    left = np.bincount(np.repeat(np.arange(len(rn)), rn)[~d], minlength=len(rn))
                    nm = [x for x, k in zip(nm, (left > 0).tolist()) if k]
                    rn = left[left > 0]
                    for q in p[d].tolist():
                        txn.delete(_k(q), db=self.dead)
                        txn.delete(_k(q), db=self.vectors)
                        txn.delete(_k(q), db=self.vec_pending)
                    gone.append(p[d])
                    p, ln = p[~d], ln[~d]
                all_p.append(p)
                all_l.append(ln)
                names.extend(nm)
                runs.append(rn)
                txn.delete(_k(s), db=self.segments)
                txn.delete(CRC + _k(s), db=self.meta)
                psums.append(txn.get(PCRC + _k(s), db=self.meta))
                txn.delete(PCRC + _k(s), db=self.meta)
            kept = np.concatenate(all_p).astype(np.int64) if all_p else np.empty(0, np.int64)
            summed = self._merge_sums.pop(new, None)
            if len(kept) and summed is not None:
                txn.put(CRC + _k(new), summed.value(), db=self.meta)
            if len(kept) and all(psum.add_sum(p) for p in psums):
                txn.put(PCRC + _k(new), psum.value(), db=self.meta)
            if len(kept):
                txn.put(_k(new), _seg_codec.encode_runs(kept.astype("<u4").tobytes(), np.concatenate(all_l).astype(
                    "<u4").tobytes(), names, np.concatenate(runs)), db=self.segments)
            del all_p, all_l, names, runs
            txn.delete(_MERGING + _k(new), db=self.meta)
            was = int(txn.get(b"gen", db=self.meta))
            gen = was + 1
            fsum = self._files_sum(txn)  # (a merge changes no file record: the sum stands)
            txn.put(b"gen", str(gen).encode(), db=self.meta)
            if fsum is not None:
                txn.put(FCRC, _FCRC.pack(gen, fsum.total, fsum.n), db=self.meta)
        gone_a = np.concatenate(gone).astype(np.int64) if gone else np.empty(0, np.int64)
        # the merged segments' part replaced; read anew only after another process wrote
        fresh = snap.seg_of is not None and was == snap.gen
        self.snapshot = self._merged(snap, segs, new, gen, kept, gone_a) if fresh else self._load()
        return new, gen

    def _unregister(self, new: int) -> None:
        with self.env.begin(write=True) as txn:
            txn.delete(_MERGING + _k(new), db=self.meta)

    def _delete_segment_postings(self, seg: int, stop=lambda: False) -> None:
        """Delete the postings stored under ``seg`` (not listed), a bounded number a transaction."""
        sk = _k(seg)
        per = max(self.STEP_BYTES // 64, 16)

        def some() -> bool:
            with self.env.begin(write=True) as txn:
                cur = txn.cursor(db=self.postings)
                n = 0
                if cur.set_range(sk):
                    while n < per and cur.key()[:4] == sk:
                        if not cur.delete():
                            return False
                        n += 1
                    return n == per
                return False

        while self._step(some):
            _release_map(self.data)  # the leaf pages it walked
            if stop():
                return
        _release_map(self.data)

    @_guarded
    def sweep(self) -> list[int]:
        """Delete the postings of segments not listed (a merge killed or stopped between its
        steps), but a merge's still under way in another live process; returns the segments
        swept. Waits for a merge of this process under way."""
        with self._merge_lock:
            return self._sweep()

    def _sweep(self) -> list[int]:
        with self.env.begin() as txn:
            listed = {int.from_bytes(k, "big") for k in txn.cursor(db=self.segments).iternext(values=False)}
            cur = txn.cursor(db=self.postings)
            found, s = [], 0
            while cur.set_range(_k(s)):  # one seek a segment, not a read of every key
                s = int.from_bytes(cur.key()[:4], "big")
                if s not in listed:
                    owner = txn.get(_MERGING + _k(s), db=self.meta)
                    if owner is None or not _live_elsewhere(owner):
                        found.append(s)
                s += 1
            stale = [bytes(k) for k in txn.cursor(db=self.meta).iternext(values=False)
                     if bytes(k).startswith(_MERGING) and int.from_bytes(bytes(k)[len(_MERGING):], "big") not in listed
                     and not _live_elsewhere(txn.get(k, db=self.meta))]
        for s in found:
            self._delete_segment_postings(s)
        if stale:
            def forget():
                with self.env.begin(write=True) as txn:
                    for k in stale:
                        txn.delete(k, db=self.meta)
            self._step(forget)
        self._swept = True
        return found

    def merge_plan(self, factor: Optional[int] = None) -> list[int]:
        """The segments to merge next, or []: log-structured tiers by size (in passages,
        from the snapshot), the lowest tier holding ``factor`` segments first, all of that
        tier together; else a segment more than DEAD_SHARE dead, alone. A merge never
        rewrites segments of a larger tier than its own, so a few live changes never
        make a merge of most of the index."""
        factor = factor or self.MERGE_FACTOR
        snap = self.refresh()
        sizes = self._segment_sizes_of(snap)
        tiers: dict[int, list[int]] = {}
        for s, n in sizes.items():
            tiers.setdefault(_tier(n, self.TIER_FLOOR, factor), []).append(s)
        for t in sorted(tiers):
            if len(tiers[t]) >= factor:
                return sorted(tiers[t])
        if snap.seg_of is not None and sizes:
            n = min(len(snap.seg_of), len(snap.alive))
            of = snap.seg_of[:n][~snap.alive[:n]]
            of = of[of >= 0]
            if len(of):
                dead = np.bincount(of)
                for s in sorted(sizes):
                    if s < len(dead) and dead[s] > self.DEAD_SHARE * sizes[s]:
                        return [s]
        return []

    def maybe_merge(self, factor: Optional[int] = None) -> bool:
        """Merge what the policy (:meth:`merge_plan`) asks for: on the merger thread when
        one runs (this returns at once), else here, until it asks for nothing; nothing
        while another thread's merge is under way (a change never waits behind a merge)."""
        m = self._merger
        if m is not None and m.is_alive():
            self._merger_wake.set()
            return False
        merged = False
        self.sweep_once()
        while True:
            if self._merge_lock.locked():
                return merged  # a merge under way (another thread's): never wait behind it
            plan = self.merge_plan(factor)
            if not plan or not self.merge(plan):
                return merged
            merged = True

    def sweep_once(self) -> None:
        """What a merge killed before this open left, swept once (never behind a merge under way)."""
        if not self._swept and self._merge_lock.acquire(blocking=False):
            try:
                self._sweep()
            finally:
                self._merge_lock.release()

    def start_merger(self) -> None:
        """Merge on a thread of its own from now on: :meth:`maybe_merge` only wakes it."""
        if self._merger is not None and self._merger.is_alive():
            return
        self._merger_stop = threading.Event()
        self._merger_wake = threading.Event()
        self._merger_wake.set()  # a first look: what the index holds may want a merge already
        self._merger = threading.Thread(target=self._merger_loop, name="lnkmem-merge", daemon=True)
        self._merger.start()

    def stop_merger(self, timeout: float = 30.0) -> None:
        """Stop the merger thread (a merge under way stops at its next step) and wait for it."""
        m = self._merger
        if m is None:
            return
        self._merger_stop.set()
        self._merger_wake.set()
        if m is not threading.current_thread():
            m.join(timeout)
        self._merger = None

    def _merger_loop(self) -> None:
        import logging
        stop, wake = self._merger_stop, self._merger_wake
        try:
            self.sweep()  # what a merge killed before this open left
        except Exception as e:
            logging.getLogger("lnkmem").warning("sweeping merge leftovers failed: %s", e)
        while not stop.is_set():
            wake.wait()
            wake.clear()
            merged = False
            while not stop.is_set():
                try:
                    plan = self.merge_plan()
                    if not plan or not self.merge(plan, stop.is_set):
                        break
                    merged = True
                except DamagedIndex:
                    return  # the engine rebuilds the index, and merges on its own
                except Exception as e:  # the disk, say: the next wake tries again
                    if self.damaged is not None:
                        return
                    logging.getLogger("lnkmem").warning("merging failed: %s", e)
                    stop.wait(5.0)
                    break
            if merged:  # what the merge's columns took, handed back (glibc keeps freed heap otherwise)
                memtrim.trim()

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
            refs = refs.kept(used)
            bufs = self._bufs
            own = bool(bufs) and (old.doclen is bufs[0] or old.doclen.base is bufs[0])
            buf = np.full(len(bufs[2]) if own else len(old.refid), -1, np.int32)  # a new one: ``old`` keeps its own
            buf[:len(old.refid)] = remap[old.refid]
            if own:
                self._bufs = (bufs[0], bufs[1], buf)
            refid = buf[:len(old.refid)]
        return Snapshot(gen, old.doclen, old.alive, old.src, refid, refs, old.live, old.total_len,
                        seg_of, sizes)

    REFS_SLACK = 1024  # refs no segment names, kept until a merge finds more than this (and the named)


_MERGING = b"merging/"  # meta: merging/<segment> -> the pid of the process writing that merge


class _Abandoned(Exception):
    """A merge given up between its steps (stopped, or its segments changed under it)."""


def _dead_of(mask: np.ndarray, pids: np.ndarray) -> np.ndarray:
    """Which of ``pids`` the dead mask (by id) marks; ids beyond it are not dead."""
    if not len(pids):
        return np.zeros(0, bool)
    if int(pids.max()) < len(mask):
        return mask[pids]
    inside = pids < len(mask)
    out = np.zeros(len(pids), bool)
    out[inside] = mask[pids[inside]]
    return out


def _let_go_of_map(data: str, limit: int) -> Optional[tuple[int, int]]:
    """:func:`_release_map` once this process's file-backed memory is past ``limit``;
    the resident memory read before (:func:`memtrim.resident`)."""
    held = memtrim.resident()
    if held is not None and held[1] > limit:
        _release_map(data)
    return held


def _release_map(data: str) -> None:
    """Let go of the pages of LMDB's map (``data``) this process has touched: a merge reads
    every posting of its segments through the map, and each page read stays resident in
    this process (its RSS) until the kernel wants it back. MADV_DONTNEED on the shared,
    read-only file mapping only unmaps them: the next read maps the page cache's page again.
    Linux only; best effort."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        real = os.path.realpath(data)
        spans = []
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip("\n").endswith(" " + real):
                    a, b = line.split(None, 1)[0].split("-")
                    spans.append((int(a, 16), int(b, 16)))
        if not spans:
            return
        global _madvise
        if _madvise is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _madvise = libc.madvise
        for a, b in spans:
            _madvise(a, b - a, 4)  # MADV_DONTNEED
    except (OSError, ValueError, AttributeError):
        pass


_madvise = None


def _tier(n: int, floor: int, factor: int) -> int:
    """A segment's tier by its size in passages: 0 below ``floor``, then one a power of ``factor``."""
    t = 0
    while n >= floor * factor:
        n //= factor
        t += 1
    return t


def _live_elsewhere(owner) -> bool:
    """Whether a merge registered by process ``owner`` (its pid) may still be writing:
    another process, alive (this process's merges are one at a time, under its lock)."""
    try:
        pid = int(owner)
    except (TypeError, ValueError):
        return False
    return pid != os.getpid() and pid > 0 and procs.alive(pid)


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
    """Remove an index environment (only its own names; a folder found under one of them,
    never the index's own making, goes whole: else the index could never be made anew)."""
    for name in ("data.mdb", "lock.mdb", SEAL, SEAL + ".tmp", SNAP, SNAP + ".tmp", LISTED, LISTED + ".tmp"):
        p = os.path.join(path, name)
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(p)
    shutil.rmtree(os.path.join(path, COMPACTING), ignore_errors=True)
    if os.path.isdir(path) and not os.listdir(path):
        shutil.rmtree(path, ignore_errors=True)
