"""An index's opening and its close whole: the checks an open makes, and the seal a close leaves.

At an open (:meth:`Store._open <lnkmem.index.store.Store>` calls these in order): the index's
folder pinned, never through a link (:func:`pin_folder`), claimed once in this process
(:func:`claim`, :class:`IndexInUse`), what is not a plain file at LMDB's names cleared
(:func:`clear_lmdb_names`), the seal read and removed (:func:`take_seal`), the file checked as
the seal allows (:func:`check_file_at_open`: "sealed" skips the deep check), the format's record
(:func:`check_format`) and a killed compaction's copy removed (:func:`remove_unfinished_compaction`).

At a close whole: whether a compaction is worth it (:func:`worth_compacting`, :func:`free_share`),
the compaction (:func:`compact`), then the snapshot saved and the seal written
(:func:`seal_at_close`): the next open need neither read every page nor rebuild the snapshot.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import weakref
from typing import Callable, Optional

import lmdb

from lnkmem.core import atomic, memtrim
from lnkmem.core.errors import DamagedIndex
from lnkmem.index import lmdbfile
from lnkmem.index import snapshot as snapshots
from lnkmem.index.format import FORMAT, LOADING
from lnkmem.index.lmdbfile import (COMPACT_FREE, COMPACT_MIN, COMPACTING, SEAL, SNAP, check_file, compact_file,
                                   deep_check, pages_of)
from lnkmem.index.tables import Tables


class IndexInUse(Exception):
    """The index is open in this process already (an LMDB environment must be opened once a
    process: a second open, and its close, would break the first's locks)."""


# the indexes open in this process, by their folder's device and inode (a store dropped without
# its close leaves with its last reference)
open_here: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
open_here_lock = threading.Lock()


# --- opening -----------------------------------------------------------------

def pin_folder(path: str) -> int:
    """The index's folder at ``path`` (made when missing) opened once, never through a link:
    its descriptor. What is there and not a folder (a link, a file, a FIFO) is moved aside as
    it is, never followed, and DamagedIndex raised; so is a folder replaced while it opened."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):  # moved aside as it is, never followed
        with atomic.folder(path) as (parent, name):
            moved = atomic.move_aside_at(parent, name)
        raise DamagedIndex(f"the index's folder was {atomic.kind_of(st.st_mode)}"
                           + (f" (moved aside to {moved[0]}, never followed)" if moved else ""))
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        return atomic.open_folder_nofollow(path)
    except OSError as e:
        raise DamagedIndex(f"the index's folder was replaced while it was opened ({e.strerror})") from None


def claim(fd: int, store, path: str) -> str:
    """Hold the folder open as ``fd`` for ``store`` in this process (by its device and inode,
    returned: :func:`release` lets go); IndexInUse when another store of this process holds it."""
    st = os.fstat(fd)
    real = f"{st.st_dev}:{st.st_ino}"
    with open_here_lock:  # before anything is touched (the seal, the files)
        if open_here.get(real) is not None:
            raise IndexInUse(f"the index in {path} is already open in this process")
        open_here[real] = store
    return real


def release(real: Optional[str], store) -> None:
    """Let go of the claim ``real`` (:func:`claim`) if ``store`` still holds it."""
    with open_here_lock:
        if real is not None and open_here.get(real) is store:
            del open_here[real]


def clear_lmdb_names(here: str) -> None:
    """LMDB opens data.mdb and lock.mdb itself, by name: a link there would be written
    through, a folder or a FIFO would fail every open. What is not a plain file at either
    name is removed (a link unlinked, never followed) and DamagedIndex raised (the index is
    made anew)."""
    for name in ("lock.mdb", "data.mdb"):
        was = atomic.clear_non_file(os.path.join(here, name))
        if was is not None:
            raise DamagedIndex(f"{name} is not a file but {was} (removed)")


def take_seal(here: str) -> Optional[str]:
    """The seal a close whole left (its stamp), removed: from now on the file may change.
    None when there was none, or it could not be removed."""
    seal = os.path.join(here, SEAL)
    raw = atomic.read_file(seal, 4096)  # (never through a link, never waiting on a FIFO)
    sealed = raw.decode("utf-8", "replace") if raw is not None else None
    try:
        atomic.remove(seal)
    except OSError:
        sealed = None
    return sealed


def check_file_at_open(here: str, data: str, sealed: Optional[str]) -> str:
    """How the index opens: "new" (no file yet); "sealed" (closed whole and untouched since,
    so neither every page nor the files/segments agreement is checked again: a restart is
    O(change)); "checked" (not closed whole -- a killed process: its seal was removed at its
    open -- or touched since: every page read in a child, :func:`lmdbfile.deep_check`).
    Whatever the seal says, a torn or truncated file never maps (DamagedIndex)."""
    if not os.path.lexists(data):
        return "new"
    txnid = check_file(data)
    if sealed is not None and sealed == lmdbfile.stamp(data, txnid):
        return "sealed"
    deep_check(here)
    return "checked"


def check_format(env, t: Tables) -> None:
    """The index's format as its ``meta`` records it: a new index's first records written;
    another format, data without one, or a copy's load cut short: DamagedIndex. (Read first:
    an index opened and closed unchanged keeps its stamp.)"""
    with env.begin() as txn:
        fmt = txn.get(b"format", db=t.meta)
    if fmt is None:
        with env.begin(write=True) as txn:
            if txn.stat(t.files)["entries"] or txn.stat(t.segments)["entries"]:
                raise DamagedIndex("index has data but no format")
            txn.put(b"format", FORMAT, db=t.meta)
            txn.put(b"gen", b"0", db=t.meta)
            txn.put(b"next_pid", b"1", db=t.meta)
            txn.put(b"next_seg", b"1", db=t.meta)
    elif fmt != FORMAT:
        raise DamagedIndex(f"index format {fmt!r} is not {FORMAT!r}")
    else:
        with env.begin() as txn:
            if txn.get(LOADING, db=t.meta) is not None:  # (its copy is loaded again)
                raise DamagedIndex("a load of the index copy did not finish")


def remove_unfinished_compaction(here: str) -> None:
    """Remove the copy a compaction killed left (none runs while the index is open)."""
    if os.path.lexists(os.path.join(here, COMPACTING)):
        with contextlib.suppress(OSError):
            atomic.remove(os.path.join(here, COMPACTING))


# --- closing whole -----------------------------------------------------------

def free_share(env, t: Tables) -> float:
    """The share of data.mdb's pages that no table uses (freed by merges and
    deletions; LMDB reuses them for later writes but never shortens the file)."""
    with env.begin() as txn:
        used = 2 + sum(pages_of(txn.stat(db)) for db in (t.meta, *t.data)) + pages_of(env.stat())
    total = env.info()["last_pgno"] + 1
    return max(0.0, 1 - used / total) if total else 0.0


def worth_compacting(data: str, left_merged: bool, share_free: Callable[[], float]) -> bool:
    """Whether a compaction asked for is worth its copy: data.mdb is at least
    :data:`COMPACT_MIN` and a merge left postings to drop, or more than :data:`COMPACT_FREE`
    of it is free (``share_free()``, read only then)."""
    return os.path.getsize(data) >= COMPACT_MIN and (left_merged or share_free() > COMPACT_FREE)


def compact(here: str) -> bool:
    """Rewrite data.mdb without its free pages (:func:`lmdbfile.compact_file`), the
    environment closed; False where it failed (the old file stands: an unfinished copy is
    removed at the next open)."""
    memtrim.trim()  # the build's freed heap, before the copy adds its own
    try:
        return compact_file(here)
    except (lmdb.Error, OSError):
        return False


def seal_at_close(here: str, data: str, saved: Optional[bytes], saved_stamp: Optional[str], listed: dict) -> None:
    """Seal the index closed whole: the snapshot ``saved`` (its bytes, or None: the saved
    one stands) written beside it first -- a kill before the seal leaves it unused -- and
    not again when its stamp is ``saved_stamp`` (no transaction ran since it was saved: a
    restart on an unchanged tree), the listings matched (``listed``), then the seal. What
    cannot be written leaves the index unsealed (checked at the next open)."""
    try:
        stamp = lmdbfile.stamp(data, check_file(data))
        if saved is not None and stamp != saved_stamp:
            atomic.write_file(os.path.join(here, SNAP), stamp.encode() + b"\n" + saved)
        snapshots.save_listed(here, stamp, listed)  # valid only beside a seal of the same stamp
        atomic.write_file(os.path.join(here, SEAL), stamp.encode())
    except (OSError, DamagedIndex):
        pass
