"""Warm a tree's metadata on the other core while the index is imported and opened.

A restart on an unchanged tree is one ``stat`` a file (nothing else says a file changed
while no process watched it). Right after a build, or once the kernel has let go of the
tree's inodes, most of those read the disk: at 120,000 files the listing took markedly
longer than the same listing at once again (docs/BENCHMARKS.md). :func:`start` runs a bare walk of the folders
(``scandir`` and ``lstat``, no link followed, hidden names left out as the listing leaves
them out) in a small process of its own, begun before the index is imported and opened,
so the listing that follows finds many inodes in memory; :func:`stop` ends it as the
listing begins (a large tree's listing takes both cores itself,
:mod:`lnkmem.bridges.shared_walk`: a walk beside it only competed, 10x restarts
slower with it than without; stopped as the listing begins, faster with it, warm
or with inodes dropped: docs/BENCHMARKS.md). It reads metadata only, never a file's
bytes, and writes nothing; it never changes what is listed (the listing decides, with
its own checks). A walk that cannot start is no error: the listing only runs as it
would have.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from lnkmem.core.procs import cores

# run with -I -S: no site, no environment, nothing imported but os and sys
_WALK = """
import os, sys
stack = sys.argv[1:]
while stack:
    try:
        it = os.scandir(stack.pop())
    except OSError:
        continue
    with it:
        for d in it:
            if d.name[0] == ".":
                continue
            try:
                if d.is_dir(follow_symlinks=False):
                    stack.append(d.path)
                d.stat(follow_symlinks=False)
            except OSError:
                pass
"""


def start(folders: Sequence[str]):
    """A walk of ``folders`` (those that are folders) begun in its own process; None
    when there is nothing to walk, one core only, or it cannot start."""
    roots = [f for f in folders if f and os.path.isdir(f)]
    if not roots or not sys.executable or cores() < 2:
        return None
    import subprocess
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WALK, *roots],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={}, close_fds=True)
    except OSError:
        return None


def stop(walk: Optional[object]) -> None:
    """End a walk from :func:`start` (done or not) and reap it."""
    if walk is None:
        return
    try:
        if walk.poll() is None:
            walk.kill()
        walk.wait()
    except OSError:
        pass
