"""The index's LMDB file: checked before it is mapped, read whole in a child, compacted,
covered after each write, let go of, swapped with another's folder, wiped; and which of LMDB's errors say it is damaged.

Nothing here knows the index's tables but by name (the deep check's sums, the compaction's
listed segments): their records are :mod:`lnkmem.index.format`'s.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import struct
import subprocess
import sys
import threading
import weakref
from typing import Optional

import lmdb

from lnkmem.core import atomic, memtrim
from lnkmem.core.errors import DamagedIndex, ToolError
from lnkmem.index import mapguard
from lnkmem.index.child import child_env
from lnkmem.index.format import FORMAT

# errors of an open that say this process cannot open the index now, not that it is damaged
LMDB_NOT_DAMAGE = tuple(getattr(lmdb, n) for n in (
    "ReadersFullError", "LockError", "MapResizedError", "MemoryError", "TlsFullError", "DiskError",
    "ReadonlyError", "MapFullError") if hasattr(lmdb, n))


def damage_at_open(e: BaseException) -> bool:
    """Whether an error opening the index says its files are damaged (then it is wiped and
    made anew from the sources), not only that this process cannot open it now: out of
    descriptors or memory, locks or readers taken, the disk failing or read-only, the
    state folder not writable. Those say nothing of what the index holds: the open fails,
    the index stays, and the next open tries again."""
    if isinstance(e, OSError):
        return e.errno in (errno.ELOOP, errno.EISDIR)  # a link or a folder where data.mdb should be
    if type(e) is lmdb.Error:  # an errno py-lmdb has no class for: EMFILE, ENFILE, EPERM, ...
        return False
    return not isinstance(e, LMDB_NOT_DAMAGE)


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



def deep_check(path: str) -> None:
    """Read every page of the index in a child process: a damaged page there is the
    child's SIGSEGV/SIGABRT or LMDB error, never this process's. Raises DamagedIndex."""
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    env = child_env()
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


def pages_of(st: dict) -> int:
    return st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]


def compact_file(path: str) -> bool:
    """Rewrite ``path``'s data.mdb without free pages (a packed copy, :func:`copy_packed`,
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
        atomic.remove(tmp)  # (what a killed compaction left; anything else there: never followed)
        os.mkdir(tmp, 0o700)
        copy_packed(path, tmp)
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


COPY_STEP = 8 << 20  # bytes of keys and values a write transaction of copy_packed


def copy_packed(src: str, dst: str) -> None:
    """Copy the index at ``src`` (opened without LMDB's locks: the caller holds them)
    into a new one at ``dst``, table by table in key order (appended: pages packed
    full, no free page). Not LMDB's compacting copy: that reads the whole file through
    this process's map in one call, and every page read stays in its resident set (a
    build's peak RSS grew by the file's size); here the
    pages are let go after each step of COPY_STEP bytes (:func:`release_map`)."""
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
                        records = listed_postings(stxn.cursor(db=sdb), listed)
                    else:
                        records = iter(stxn.cursor(db=sdb))
                    while True:
                        with denv.begin(write=True, db=ddb) as dtxn:
                            took, _ = dtxn.cursor().putmulti(itertools.islice(records, per), append=True)
                        release_map(data)
                        release_map(os.path.join(dst, "data.mdb"))
                        if took < per:
                            break
            denv.sync(True)
        finally:
            denv.close()
    finally:
        senv.close()


def listed_postings(cur, listed: list):
    """The postings records of the segments ``listed`` (their keys, in order): each one's
    keys are those starting with it, found by one seek."""
    for sk in listed:
        if len(sk) == 4 and cur.set_range(sk):
            yield from itertools.takewhile(lambda kv, sk=sk: kv[0][:4] == sk, cur.iternext())

def stamp(data: str, txnid: Optional[int]) -> str:
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



class CoveringEnv:
    """An LMDB environment whose write transactions leave data.mdb as long as the pages
    it says it uses. LMDB itself may not: a page allocated and freed again in one
    transaction (deletions do it) is never written, so the file can end a page or more
    short of ``last_pgno``. Those pages are free and never read, but the checks above
    (:func:`check_file`, ``Store.guard``) cannot tell such a file from a truncated one,
    so after each commit the file is extended (zeros, never shortened) to cover them.
    Everything else is the environment's own."""

    __slots__ = ("_env", "_data", "_file", "watch")

    def __init__(self, env, data: str):
        self._env = env
        self._data = data
        # the file LMDB maps, held open: its size is looked at (``file_size``) and it is
        # covered through this descriptor, never by its name, which may come to name another
        # file (a newer version put in the folder's place, a rebuild, a folder swapped by
        # someone else): only this file's size says whether reading its map is safe
        self._file = _HeldFile(data)
        # a SIGBUS in its map (the file cut short under a read) caught, not the process's end
        self.watch = mapguard.watch(data, env.stat()["psize"])
        # (the token stays through set_mapsize) an environment let go of without its close --
        # a retired index, closed by LMDB when its last reader ends -- is no longer watched then
        weakref.finalize(env, mapguard.forget, self.watch)
        weakref.finalize(env, self._file.close)

    def __getattr__(self, name):
        return getattr(self._env, name)

    def set_mapsize(self, size: int) -> None:
        self._env.set_mapsize(size)
        self.watch = mapguard.watch(self._data, self._env.stat()["psize"], self.watch)  # (the map moved)

    def close(self) -> None:
        mapguard.forget(self.watch)  # first: once let go of, its addresses may be mapped again
        self._env.close()
        self._file.close()

    def file_size(self) -> int:
        """The size of the file this environment maps (OSError once it is closed)."""
        return self._file.size()

    def faulted(self) -> bool:
        """Whether a read met a page the file no longer held (then the map is never trusted again)."""
        return mapguard.faulted(self.watch)

    def begin(self, *a, write: bool = False, **kw):
        txn = self._env.begin(*a, write=write, **kw)
        return CoveringTxn(txn, self) if write else txn

    def cover(self) -> None:
        need = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        try:
            self._file.grow_to(need)  # grows only: never shorter
        except OSError:
            pass  # not ours to extend: the checks will say so


class _HeldFile:
    """An environment's data.mdb held open by descriptor (read and write, never through a
    link), from its environment's open to its close: closed once, whoever asks first."""

    __slots__ = ("fd", "_lock")

    def __init__(self, path: str):
        self._lock = threading.Lock()
        self.fd: Optional[int] = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))

    def size(self) -> int:
        with self._lock:  # (never a descriptor closed, and its number given to another file, meanwhile)
            if self.fd is None:
                raise OSError(errno.EBADF, "the index's file is closed")
            return os.fstat(self.fd).st_size

    def grow_to(self, need: int) -> None:
        with self._lock:
            if self.fd is not None and os.fstat(self.fd).st_size < need:
                os.ftruncate(self.fd, need)

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class CoveringTxn:
    __slots__ = ("_txn", "_env")

    def __init__(self, txn, env: CoveringEnv):
        self._txn = txn
        self._env = env

    def __enter__(self):
        return self._txn.__enter__()

    def __exit__(self, *exc):
        out = self._txn.__exit__(*exc)
        if exc[0] is None:
            self._env.cover()
        return out


def let_go_of_map(data: str, limit: int) -> Optional[tuple[int, int]]:
    """:func:`release_map` once this process's file-backed memory is past ``limit``;
    the resident memory read before (:func:`memtrim.resident`)."""
    held = memtrim.resident()
    if held is not None and held[1] > limit:
        release_map(data)
    return held


def release_map(data: str) -> None:
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


def can_exchange_folders(where: str) -> bool:
    """Whether :func:`lnkmem.core.atomic.exchange` works in the folder ``where`` (tried on two
    folders made in it, removed after)."""
    a, b = os.path.join(where, ".exchange-a"), os.path.join(where, ".exchange-b")
    try:
        os.mkdir(a, 0o700)
        os.mkdir(b, 0o700)
        return atomic.exchange(a, b)
    except OSError:
        return False
    finally:
        for p in (a, b):
            try:
                os.rmdir(p)
            except OSError:
                pass


def wipe(path: str) -> None:
    """Remove an index environment (only its own names; a folder found under one of them,
    never the index's own making, goes whole: else the index could never be made anew).
    Its folder is opened once, never through a link (a link at ``path`` -- to another
    agent's index, say -- is unlinked, nothing behind it touched), and every name is
    removed from that folder."""
    try:
        fd = atomic.open_folder_nofollow(path)
    except FileNotFoundError:
        return
    except OSError:  # a link, a file, a FIFO at its name: removed, never followed
        atomic.remove(path)
        return
    try:
        for name in ("data.mdb", "lock.mdb", SEAL, SNAP, LISTED, COMPACTING):
            atomic.remove_at(fd, name)  # (a link unlinked, never followed)
        for name in (SEAL, SNAP, LISTED):
            atomic.clear_leftovers_at(fd, name)  # their temp files (older versions' fixed names too)
        empty = not os.listdir(fd)
    finally:
        os.close(fd)
    if empty:
        with atomic.folder(path) as (parent, name):
            try:
                os.rmdir(name, dir_fd=parent)  # (a link put there meanwhile: ENOTDIR, left)
            except OSError:
                pass
