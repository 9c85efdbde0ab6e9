"""A merge's reading: the live postings of its segments, joined term by term.

:func:`steps` walks every merged segment's posting lists in term order (a
heap of one cursor each), joins the lists of a term found in several
(:func:`postings.join_many`, a batch of terms at a time), drops the postings
of passages dead when the merge began, and gives a write step's (key, value)
items at a time; the store writes them (``merge.run.MergeJob.write_postings``).

A large merge (the one that ends a build merges every segment) is shared with
a helper, the second core: :func:`start` runs ``python -B -m
lnkmem.index.merge.steps`` (a fresh interpreter: an LMDB environment is never
used across a fork, nor opened twice in one process), which reads the terms
from a middle one on through a read-only environment of its own (in the
reader table, so no page it reads is reused meanwhile) and sends each step
down its stdout; the merging thread writes them between its own steps, so
the index has one writer. The helper never writes: killed at any moment, it
leaves nothing; when it fails, the merging thread merges the rest of its
terms itself (:meth:`Helper.resume`).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import select
import subprocess
import sys
import threading
from typing import Optional

import msgspec
import numpy as np

from lnkmem.core import procs
from lnkmem.index.codec import postings
from lnkmem.index.child import Sender, child_env
from lnkmem.index.format import id_key
from lnkmem.index.lmdbfile import let_go_of_map, release_map

# a merge of fewer passages stays in one thread (short: a helper's start would weigh)
SHARED_PASSAGES = 20_000
# the helper's share of a merge's postings: the merging thread writes them all besides
# its own (at 1x, with half each, both threads did about as much)
HELPER_SHARE = 0.5
BATCH, ERROR, END = 1, 2, 3


class Abandoned(Exception):
    """A merge given up between its steps (stopped, or its segments changed under it)."""


def dead_of(mask: np.ndarray, pids: np.ndarray) -> np.ndarray:
    """Which of ``pids`` the dead mask (by id) marks; ids beyond it are not dead."""
    if not len(pids):
        return np.zeros(0, bool)
    if int(pids.max()) < len(mask):
        return mask[pids]
    inside = pids < len(mask)
    out = np.zeros(len(pids), bool)
    out[inside] = mask[pids[inside]]
    return out


class Job(msgspec.Struct, array_like=True):
    """What reading a merge needs, here or in the helper (its request, with the dead
    mask and the helper's first term)."""
    path: str  # the index's folder
    data: str  # its data.mdb
    segs: list[int]
    new: int  # the segment merged into
    clean: list[int]  # segments holding no dead passage: their lists are copied as stored
    step_bytes: int
    join_bytes: int
    map_resident: int
    map_size: int


class _Request(msgspec.Struct, array_like=True):
    job: Job
    lo: bytes  # the helper's first term
    dead: bytes  # np.packbits of the dead mask
    ndead: int  # its length


class _Part(msgspec.Struct, array_like=True):
    kind: int  # BATCH, ERROR, END
    items: list[tuple[bytes, bytes]] = []
    error: str = ""


_enc = msgspec.msgpack.Encoder()
_part_dec = msgspec.msgpack.Decoder(_Part)


def steps(job: Job, env, db, dead: np.ndarray, lo: Optional[bytes], hi: Optional[bytes], stop):
    """The merged live postings of ``job.segs`` under ``job.new`` for the terms from ``lo``
    (None: the first) to before ``hi`` (None: the last), in key order, one write step's
    (key, value) items at a time, read through ``env`` (this process's), its read
    transaction closed while a step is out. Abandoned when a segment went away or
    ``stop`` says so."""

    nk = id_key(job.new)
    keys = [id_key(s) for s in job.segs]
    clean = [s in job.clean for s in job.segs]
    heap: list = []  # (term, segment index, stored value): each segment's next term
    txn = env.begin()
    try:
        curs = [txn.cursor(db=db) for _ in job.segs]

        def advance(i: int, first: bool = False) -> None:
            c = curs[i]
            ok = c.set_range(keys[i] + (lo or b"")) if first else c.next()
            if ok:
                k = c.key()
                if k[:4] == keys[i]:
                    term = bytes(k[4:])
                    if hi is None or term < hi:
                        heapq.heappush(heap, (term, i, c.value()))

        for i in range(len(job.segs)):
            advance(i, True)
        items: list = []  # (key, value); None where a joined term is still pending
        size = 0
        pending: list = []  # (place in items, key, the term's lists, whether one is of a
        # segment holding dead ids): joined a batch at a time
        pend_bytes = 0  # their lists' bytes

        def join_pending() -> int:
            nonlocal pend_bytes
            dirty_ = any(p[3] for p in pending)
            vals = postings.join_many([p[2] for p in pending], dead if dirty_ else None)
            got = 0
            for (at, key, _, _), v in zip(pending, vals):
                if v is not None:
                    items[at] = (key, v)
                    got += len(v) + len(key)
            pending.clear()
            pend_bytes = 0
            return got

        while heap:
            term, i, v = heapq.heappop(heap)
            parts = [v]
            dirty = not clean[i]
            advance(i)
            while heap and heap[0][0] == term:
                _, j, w = heapq.heappop(heap)
                parts.append(w)
                dirty = dirty or not clean[j]
                advance(j)
            if len(parts) == 1:  # the stored value as it is, unless it names the dead
                if not clean[i]:
                    p, t = postings.unpack(v)
                    drop = dead_of(dead, p)
                    if drop.any():
                        keep = ~drop
                        v = postings.pack(p[keep], t[keep]) if keep.any() else None
            else:  # each segment's list ascends and no id lies in two segments: joined
                # with others (postings.join_many), a few dozen numpy calls a batch
                pending.append((len(items), nk + term, parts, dirty))
                items.append(None)
                pend_bytes += sum(map(len, parts))
                if pend_bytes >= job.join_bytes:
                    size += join_pending()
                v = None
            if v is not None:
                items.append((nk + term, v))
                size += len(v) + len(term) + 4
            if len(items) % 1024 == 0:
                let_go_of_map(job.data, job.map_resident)  # (the read transaction stays: only the pages go)
            if size + pend_bytes >= job.step_bytes:  # (the pending lists' bytes: about what they join to)
                if stop():
                    raise Abandoned()
                size += join_pending()
                # no read transaction open across a write step: a full map is grown there (a
                # remap), and an old reader would pin the pages commits free meanwhile
                txn.abort()
                yield [x for x in items if x is not None]
                items, size = [], 0
                release_map(job.data)
                txn = env.begin()  # each cursor again at the term it stands on
                curs = [txn.cursor(db=db) for _ in job.segs]
                for t_, j, _ in heap:
                    if not curs[j].set_key(keys[j] + t_):
                        raise Abandoned()  # the segment went away meanwhile
        if pending:
            join_pending()
        txn.abort()
        yield [x for x in items if x is not None]
    finally:
        txn.abort()
        release_map(job.data)


def shared(passages: int) -> bool:
    """Whether a merge of this many passages is shared with a helper
    (:func:`procs.second_core`: past :data:`SHARED_PASSAGES`)."""
    return procs.second_core(lambda: passages >= SHARED_PASSAGES)


class Helper:
    """The merging thread's side of the helper: its steps one at a time (:meth:`next`),
    ``done`` once it ended, ``whole`` when it merged all its terms (``lo`` on)."""

    def __init__(self, proc: subprocess.Popen, lo: bytes):
        self.proc, self.lo = proc, lo
        self.pipe = proc.stdout
        self.poll = select.poll()
        self.poll.register(self.pipe.fileno(), select.POLLIN)
        self.done = self.whole = False
        self.last: Optional[bytes] = None  # the last term it sent
        self.error = ""

    def ready(self) -> bool:
        """Whether its next step (or its end) is there to read."""
        return not self.done and bool(self.poll.poll(0))

    def next(self, stop=lambda: False) -> list:
        """Its next step's (key, value) items, waiting for them; [] once it ended."""
        while not self.done and not self.poll.poll(200):
            if stop():
                raise Abandoned()
        if self.done:
            return []
        part = procs.read_msg(self.pipe, _part_dec)
        if part is None or part.kind != BATCH:
            self.done = True
            self.whole = part is not None and part.kind == END
            self.error = part.error if part is not None else "it ended"
            if self.whole:  # it exits now
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self.close()
            return []
        if part.items:
            self.last = part.items[-1][0][4:]
        return part.items

    def resume(self) -> bytes:
        """The first term it did not send."""
        return self.lo if self.last is None else self.last + b"\0"

    def close(self) -> None:
        """Stop it (at once) and reap it."""
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait()
        self.pipe.close()


def start(job: Job, dead: np.ndarray, lo: bytes) -> Optional[Helper]:
    """Start the helper on the terms from ``lo`` on; None when it cannot (all is then
    merged here)."""
    if not sys.executable:  # (an embedded interpreter: nothing to start)
        return None
    env = child_env()
    try:
        # -B: no bytecode written beside the program (the engine writes only <state> and the notes)
        proc = subprocess.Popen([sys.executable, "-B", "-m", "lnkmem.index.merge.steps"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0)
    except (OSError, ValueError) as e:
        import logging
        logging.getLogger("lnkmem").warning("the merge's helper process could not start (%s): merging in one thread", e)
        return None
    request = _enc.encode(_Request(job, lo, np.packbits(dead).tobytes(), len(dead)))

    def send() -> None:  # (on a thread: the merge goes on while the helper starts)
        try:
            proc.stdin.write(request)
        except OSError:
            pass  # it died: its stdout ends, and its terms are merged here
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    threading.Thread(target=send, name="lnkmem-merge-request", daemon=True).start()
    return Helper(proc, lo)


def main() -> None:
    """The helper: reads its request on stdin, sends its steps on stdout, writes nothing else."""
    w = os.dup(1)  # its steps; nothing else reaches the parent's pipe
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    procs.tie_to_parent()  # dies with the thread that started it
    out = Sender(w)
    try:
        req = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Request)
        job = req.job
        dead = np.unpackbits(np.frombuffer(req.dead, np.uint8), count=req.ndead).astype(bool)
        import lmdb
        env = lmdb.open(job.path, readonly=True, lock=True, max_dbs=8, map_size=job.map_size * 8, readahead=False)
        db = env.open_db(b"postings", create=False)
        for items in steps(job, env, db, dead, req.lo, None, lambda: False):
            out._put(_enc.encode(_Part(BATCH, items)))
        out._put(_enc.encode(_Part(END)))
        out.close()
    except BrokenPipeError:
        os._exit(1)
    except BaseException as e:  # the merging thread merges the rest itself
        out._put(_enc.encode(_Part(ERROR, error=f"{type(e).__name__}: {e}")))
        out.close()
    os._exit(0)


if __name__ == "__main__":
    main()
