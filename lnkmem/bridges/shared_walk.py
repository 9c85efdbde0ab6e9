"""A large local listing on two cores (issue 12: a restart at 120,000 files).

A restart on an unchanged tree costs one ``stat`` a file: nothing else tells a file
changed while no process watched it. At 120,000 files that listing is most of a
restart, bound by the kernel's and Python's work per entry on one core (as fast as a
bare ``os.scandir`` walk). :func:`walk` lists the root's own entries here, then shares
the root's folders with a forked child, as the build's worker shares files: the child
takes them from the first on, this process from the last on, each writing its claim
before it reads the other's, until they meet (the folder where they meet may be walked
twice: either walk is the same). Each folder is walked by ``LocalPlace._walk`` as the
one-process walk would walk it, with the same checks (every open beneath the root, the
ignore rules, links followed only inside), and a ``seen`` set of its own; the child
sends each folder's entries, the folders it went through (device, inode) and what it
skipped, and the listing is put together in the one-process order.

The one-process walk lists a folder reachable twice (a link to a folder, a bind mount)
once, where it comes first. When two folders' walks went through one folder, their
results are not used: those folders are walked again here, in order, with one ``seen``
set, so the listing is always the one-process walk's. So it is when the child fails
(killed, out of memory, an error): what it did not send is walked here. The child
never writes anything but its pipe, dies with the thread that forked it, and leaves
with ``os._exit``.
"""

from __future__ import annotations

import ctypes
import os
import signal

import msgspec

from lnkmem.core import procs
from lnkmem.bridges.local_entry import LocalEntry
from lnkmem.bridges.place import Entry


class _Part(msgspec.Struct, array_like=True):
    at: int  # which folder (-1: the child is done)
    paths: list[str] = []  # its entries, a column a field (decoded faster than a list of Entry)
    sizes: list[int] = []
    versions: list[str] = []
    seen: list[tuple[int, int]] = []  # the folders its walk went through
    skipped: dict[str, int] = {}  # by why


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(_Part)


def walk(place, rel: str, stack) -> list[Entry]:
    """``place``'s files below ``rel`` (a folder), as ``place._walk`` lists them in one
    process, the root's folders shared with a child when there are two cores."""
    out: list[Entry] = []
    seen: set = set()
    later: list = []  # (place in out, path) of the root's folders, in order
    place._walk(rel, out, seen, stack, later=later)
    if not later:
        return out
    root = frozenset(seen)
    parts: list = [None] * len(later)  # per folder: (entries, seen, skipped by why)
    if len(later) >= 2 and hasattr(os, "fork") and procs.second_core(lambda: True):
        _shared(place, later, stack, root, parts)
    for i, part in enumerate(parts):
        if part is None:
            parts[i] = _one(place, later[i][1], stack, root)
    total = sum(len(p[1]) for p in parts)
    if len(set().union(*(p[1] for p in parts))) < total:
        # one folder reached from two of them: walked again in order, one seen set (the
        # skips counted by those walks dropped first)
        for _, _, skipped in parts:
            for why, n in skipped.items():
                place.skipped -= n
                place.skipped_by[why] -= n
                if not place.skipped_by[why]:
                    del place.skipped_by[why]
        seen = set(root)
        parts = []
        for _, path in later:
            mine: list[Entry] = []
            place._walk(path, mine, seen, stack, True)
            parts.append((mine, (), {}))
    listed: list[Entry] = []
    done = 0
    for (at, _), (entries, _, _) in zip(later, parts):
        listed += out[done:at]
        listed += entries
        done = at
    listed += out[done:]
    return listed


def _one(place, path: str, stack, root: frozenset) -> tuple[list[Entry], set, dict]:
    """One of the root's folders walked here: its entries, the folders gone through
    (the root's left out) and the skips counted (already added to ``place``'s)."""
    before = dict(place.skipped_by)
    seen = set(root)
    mine: list[Entry] = []
    place._walk(path, mine, seen, stack, True)
    skipped = {why: n - before.get(why, 0) for why, n in place.skipped_by.items() if n != before.get(why, 0)}
    return mine, seen - root, skipped


def _shared(place, later: list, stack, root: frozenset, parts: list) -> None:
    """Fill ``parts`` with the folders' walks, a child taking them from the first on and
    this process from the last on; a folder the child took and did not send is left
    None (walked here afterwards)."""
    got = procs.fork_sharing(lambda w, parent, shm: _child(place, later, stack, root, w, parent, shm), len(later))
    if got is None:
        return
    pid, r, shm = got
    head = ctypes.c_int64.from_buffer(shm, 0)  # the next folder the child takes
    tail = ctypes.c_int64.from_buffer(shm, 8)  # the lowest this process took
    pipe = open(r, "rb")
    try:
        j = len(later)
        while j > 0:  # this process: from the last folder on, until it meets the child
            j -= 1
            tail.value = j
            meet = head.value > j  # the child may have taken this one too: the last here
            parts[j] = _one(place, later[j][1], stack, root)
            if meet:
                break
        while True:  # then what the child sent
            part = procs.read_msg(pipe, _dec)
            if part is None or part.at < 0:
                break
            if 0 <= part.at < len(later) and parts[part.at] is None \
                    and len(part.paths) == len(part.sizes) == len(part.versions):
                for why, n in part.skipped.items():
                    place.skipped += n
                    place.skipped_by[why] = place.skipped_by.get(why, 0) + n
                entries = list(map(LocalEntry, part.paths, part.sizes, part.versions))
                parts[part.at] = (entries, {tuple(x) for x in part.seen}, part.skipped)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        pipe.close()
        del head, tail
        shm.close()


def _child(place, later: list, stack, root: frozenset, w: int, parent: int, shm) -> None:
    procs.detach(w, parent, b"lnkmem-listing")
    head = ctypes.c_int64.from_buffer(shm, 0)
    tail = ctypes.c_int64.from_buffer(shm, 8)
    done = []
    for i in range(len(later)):
        head.value = i + 1  # taken; then: had the parent taken it first?
        if i >= tail.value:
            break
        entries, seen, skipped = _one(place, later[i][1], stack, root)
        done.append(_Part(i, [e.path for e in entries], [e.size for e in entries],
                          [e.version for e in entries], sorted(seen), skipped))
    # sent at the end: the parent reads once it has walked its own (a pipe holds 64 KiB, a
    # folder's entries are megabytes: sent as walked, the child would wait on the parent)
    for part in done:
        procs.write_framed(w, _enc.encode(part))
    procs.write_framed(w, _enc.encode(_Part(-1)))
