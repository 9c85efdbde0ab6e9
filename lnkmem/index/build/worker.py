"""The second core of a build: local files read, cut and counted in a forked process.

:func:`start` forks a child that goes through its share of a plan with the
very place objects of the parent (the same roots, the same checks: every
open stays beneath its root), counts each batch's files together into flat
u32 columns (:func:`count.count_files`) and sends it down a pipe as one msgpack
message: the batch's terms once, then per file its passages as the index
stores them (compressed here, with the index's dictionary, which the parent
makes before the fork when the index has none) and four byte strings (term
ids, postings per passage, tfs, lengths). The parent commits a
batch while the child counts the next one. The child writes on a thread of
its own (:class:`child.Sender`), so it goes on counting while the parent, busy
with a commit of its own batch, has not read its last one yet: the child
holds at most three batches (one being written, one waiting, one being
counted), the parent one of the child's beside its own.

The child never touches the index, so a kill of either process leaves the
index as the parent's last commit made it. It dies with the thread that
forked it (``PR_SET_PDEATHSIG``), and of a broken pipe at its next message;
it ignores Ctrl-C and SIGTERM (the parent stops it: a kill, its batch
unread); it holds no descriptor of the parent but its pipe (standard streams
on /dev/null), so no pipe of the parent waits on it. When the child fails
(killed, out of memory, an error), the parent indexes what the child had not
sent, in its own thread.

Forking (not spawning a new interpreter) keeps the start at a few ms and
shares the place objects and the stem memo as they are; the child runs
only the reading and counting code (no lock of another thread's, no LMDB;
numpy only on its own arrays: a sort a batch, no BLAS) and leaves with
``os._exit``.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import signal
import time
from typing import Callable, Mapping, Optional

import msgspec

from lnkmem.core import procs
from lnkmem.index.build import count
from lnkmem.index.codec import textpack
from lnkmem.index.child import Sender
from lnkmem.index.commit import Batch, NewFile
from lnkmem.core.procs import cores as _cores  # (a name of this module's: tests set it)

# a plan is split off to the worker from this much (bytes, or files) of local
# files; below it (one changed file, a few) everything stays in the thread
WORKER_BYTES = 1 << 20
WORKER_FILES = 200
PROGRESS, BATCH, ERROR, END = 0, 1, 2, 3


class _File(msgspec.Struct, array_like=True):
    ref: str
    version: str
    size: int
    kind: str
    mtime: Optional[str]
    packed: list[bytes]  # its passages as stored (textpack, with the index's dictionary)
    tids: bytes
    npost: bytes
    tfs: bytes
    lens: bytes


class _Msg(msgspec.Struct, array_like=True):
    kind: int
    done: int  # entries of the child's share gone through
    terms: list[str] = []
    removed: list[str] = []
    files: list[_File] = []
    error: str = ""
    inexact: int = 0  # of the entries gone through since the last batch: not indexed as listed


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(_Msg)


def forkable(place) -> bool:
    """Whether a place is read in the worker: a local folder (its reads are
    system calls beneath its root; a bridge's client stays in the parent)."""
    return place.forkable


def share(places: Mapping[str, object], todo: list) -> list:
    """The entries of ``todo`` the worker takes ([]: none, all stay here).

    ``LNKMEM_WORKER``: ``0`` never, ``1`` whenever a local file is to be read
    (tests), else when there are two cores and the local files are many."""
    if not hasattr(os, "fork"):
        return []
    far = [x for x in todo if forkable(places[x[0]])]
    if far and second_core(lambda: len(far) >= WORKER_FILES or sum(e.size or 0 for _, e in far) >= WORKER_BYTES):
        return far
    return []


def second_core(large: Callable[[], bool]) -> bool:
    """:func:`procs.second_core`, with this module's count of cores (tests set it)."""
    return procs.second_core(large, lambda: _cores())


class Worker:
    """The parent's side: the child's pid, the read end of its pipe, and the two
    words both see (``head``: the next entry the child takes, written by the
    child; ``tail``: the lowest entry this thread took, written here)."""

    def __init__(self, pid: int, fd: int, items: list, shm: mmap.mmap, zdict: Optional[bytes]):
        self.pid = pid
        self.zdict = zdict  # what the child packs passages with
        self.fd = fd
        self.pipe = open(fd, "rb", buffering=0)
        self.items = items
        self.shm = shm
        self.head = ctypes.c_int64.from_buffer(shm, 0)
        self.tail = ctypes.c_int64.from_buffer(shm, 8)
        self.taken = 0  # entries 0..taken-1 are the child's, committed
        self.exited = False
        self.front = (0, len(items))  # (the next entry the child reads, the one past this thread's next): readahead

    def _recv(self) -> Optional[_Msg]:
        return procs.read_msg(self.pipe, _dec)

    def share_with(self, b, places: Mapping[str, object], tmpdir: str, should_stop: Callable[[], bool]) -> bool:
        """Index the child's entries together: the child from the first on, this
        thread (``b``, an ``indexer.Build``) from the last on, committing the
        child's batches as they come, until the two meet. When the child fails,
        this thread does all it had not sent. False when stopped.

        Each side writes its claim before it reads the other's: the child stops
        at an entry this thread took; this thread indexes each entry it took and
        stops after one the child had already taken. So every entry is indexed,
        and at most the one where they meet twice (harmless: a commit of a file
        replaces the one before)."""
        n = len(self.items)
        tail = n  # entries tail..n-1 are this thread's
        base = b.done
        running, meet = True, False
        poll = select.poll()
        poll.register(self.fd, select.POLLIN)

        seen = 0  # entries the child has gone through (committed or not)

        def report(k: int) -> None:  # done: the child's first k entries and this thread's
            b.done = base + k + (n - tail) - max(0, k - tail)
            b.report()

        while True:
            if should_stop():
                self.front = (n, n)
                report(self.taken)
                return False
            low = self.head.value if running else self.taken
            self.front = (low, tail)
            claim = tail > low and (not meet or not running)
            if running:
                if poll.poll(0 if claim else 100):
                    msg = self._recv()
                    if msg is None or msg.kind == ERROR:  # the child died: the rest is this thread's
                        running = False
                        self.close()
                    elif msg.kind == BATCH:
                        files = [NewFile(f.ref, f.version, f.size, f.kind, [], None, f.mtime,
                                         msg.terms, f.tids, f.npost, f.tfs, f.lens, f.packed) for f in msg.files]
                        msg.files = []  # the batch's columns held once
                        b.commit_batch(Batch(files, msg.removed, self.zdict))
                        b.store.let_go()
                        del files
                        b.inexact += msg.inexact
                        self.taken = msg.done
                    elif msg.kind == END:
                        self.taken = msg.done
                        running = False
                        self.close()
                    seen = max(seen, msg.done if msg is not None else 0)
                    report(seen if running else self.taken)
                    continue
            if not claim:
                if running:
                    continue
                break
            j = tail - 1
            if running:
                self.tail.value = j
                if self.head.value > j:
                    meet = True  # the child may have taken it too: this one is the last
            b.add(*self.items[j], places, tmpdir)
            tail = j
            report(seen if running else self.taken)
        self.front = (n, n)
        b.done = base + n
        return True

    def close(self) -> None:
        """Stop the child (at once: what it has not sent is dropped) and reap it."""
        if not self.exited:
            self.exited = True
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pipe.close()
            del self.head, self.tail
            self.shm.close()


def start(items: list, places: Mapping[str, object], tmpdir: str,
          zdict: Optional[bytes] = None) -> Optional[Worker]:
    """Fork the worker for ``items``, packing passages with the index's dictionary
    ``zdict`` (None: without one); None when it cannot (all is then done here)."""
    got = procs.fork_sharing(lambda w, parent, shm: _child(w, parent, items, places, tmpdir, shm, zdict), len(items))
    if got is None:
        return None
    pid, r, shm = got
    return Worker(pid, r, items, shm, zdict)


def _detach(w: int, parent: int) -> None:
    """The child's ties (:func:`procs.detach`); no collection of the parent's garbage
    here (an index transaction's finaliser would touch the index's shared reader
    table): the child makes little of its own."""
    procs.detach(w, parent, b"lnkmem-worker")


def _child(w: int, parent: int, items: list, places: Mapping[str, object], tmpdir: str, shm: mmap.mmap,
           zdict: Optional[bytes]) -> None:
    _detach(w, parent)
    # the passages compressed here, on this core (the parent only stores them)
    pack, encode = textpack.Packer(zdict).pack, _enc.encode
    head = ctypes.c_int64.from_buffer(shm, 0)
    tail = ctypes.c_int64.from_buffer(shm, 8)
    done = 0  # entries 0..done-1 gone through
    out = Sender(w)
    try:
        vocab = count.Vocab()  # (kept from batch to batch: count.VOCAB_MAX)
        files: list = []  # the batch's files (count.NewFile), counted all at once when it is sent

        def batch() -> _Msg:
            count.count_files(files, vocab)
            sent = [_File(nf.ref, nf.version, nf.size, nf.kind, nf.mtime, [pack(encode(p)) for p in nf.passages],
                          nf.tids.tobytes(), nf.npost.tobytes(), nf.tfs.tobytes(), nf.lens.tobytes()) for nf in files]
            return _Msg(BATCH, done, files[0].terms if files else [], removed, sent, inexact=inexact)
        removed: list[str] = []
        size = inexact = 0
        last = time.monotonic()
        for i, (source, entry) in enumerate(items):
            head.value = i + 1  # taken; then: had the parent taken it first?
            if i >= tail.value:
                break
            nf = count.read_file(source, entry, places[source], tmpdir)
            done = i + 1
            if not count.as_listed(nf, entry):
                inexact += 1
            if nf is None:
                removed.append(count.ref_of(source, entry.path))
            else:
                files.append(nf)
                size += nf.size
            if size >= count.BATCH_BYTES or len(files) >= count.BATCH_FILES:
                out.send(batch())
                files, removed, size, inexact = [], [], 0, 0
                if vocab.full():
                    vocab = count.Vocab()
                last = time.monotonic()
            elif time.monotonic() - last > 0.1:
                out.send(_Msg(PROGRESS, done), wait=False)
                last = time.monotonic()
        if files or removed:
            out.send(batch())
        out.send(_Msg(END, done))
        out.close()
    except BrokenPipeError:
        raise
    except Exception as e:  # the parent does the rest itself (and meets the error there)
        out.send(_Msg(ERROR, done, error=f"{type(e).__name__}: {e}"))
        out.close()
