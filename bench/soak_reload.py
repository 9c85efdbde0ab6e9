"""Reloads under searches (issue 45): a soak of concurrent searches through N loads of a newer
version beside the cache and its swap into place.

Run: ``.venv/bin/python bench/soak_reload.py [--reloads 100] [--threads 8]``

A memory of 60 files and one of a single file give two copies (the large one and the small
one, in turn: the index's file shrinks and grows at each swap); N times a version is loaded
beside the current store (``open_beside``, ``load_copy`` in steps) and put in its place
(``replaced_by``) while T threads search whichever store is current, and the one they held,
without a pause. Prints the searches made, the error answers (goal 0), the stores marked
damaged (goal 0: a healthy index is never rebuilt) and the answers that were of neither
version (goal 0). Exit 1 when a goal is missed. Part of ``make soak``.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: E402,F401  (first of ours: it puts the repository's root on the path)
from lnkmem.core.errors import DamagedIndex  # noqa: E402
from lnkmem.index.rank.search import bm25  # noqa: E402
from lnkmem.replica.export import export  # noqa: E402
from lnkmem.replica.load import load_copy  # noqa: E402
from lnkmem.replica.manifest import decode_manifest, encode_manifest  # noqa: E402
from lnkmem.replica.state import CopyState, copy_state  # noqa: E402
from tests.test_copy_scale import OF, memory, text  # noqa: E402

QUERIES = ("narwhal kelp", "uniq7x1")
SOURCES = {"home", "chats", "skills", "notes"}


def copy_of(st) -> dict:
    exp = export(st, CopyState(), OF, part=3000)
    files = dict(exp.blobs)
    files["manifest.json"] = encode_manifest(exp.manifest)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: searches through reloads")
    ap.add_argument("--reloads", type=int, default=100)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="lnkmem-soak-reload-"))
    big, _ = memory(tmp / "big", {f"n/f{i}.md": text(i) for i in range(60)}, batches=2)
    large = copy_of(big.store)
    want_large = {q: bm25(big.store, q, 10) for q in QUERIES}
    big.store.close()
    mem, _ = memory(tmp / "served", {"n/other.md": "narwhal kelp uniq7x1\n"})
    small = copy_of(mem.store)
    want_small = {q: bm25(mem.store, q, 10) for q in QUERIES}
    stores = [mem.store]
    counts = {"searches": 0, "errors": 0, "other answers": 0}
    stop = threading.Event()
    damaged = 0

    def search() -> None:
        while not stop.is_set():
            st = stores[-1]
            try:
                st.refresh()
                got = {q: bm25(st, q, 10) for q in QUERIES}
            except DamagedIndex:
                counts["errors"] += 1
                continue
            counts["searches"] += 1
            if got not in (want_large, want_small):
                counts["other answers"] += 1

    threads = [threading.Thread(target=search, daemon=True) for _ in range(a.threads)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        for i in range(a.reloads):
            copy = large if i % 2 == 0 else small
            old = stores[-1]
            side = old.open_beside()
            if side is None:
                print("this file system cannot swap two folders in one step: nothing to soak")
                return 1
            load_copy(side, decode_manifest(copy["manifest.json"]),
                              lambda n, c=copy: c[n], f"v{i}", OF, SOURCES, step=4000,
                              was=copy_state(old))
            stores.append(old.replaced_by(side))
            stores[-2] = None  # (let go of: LMDB closes it when its last search ends)
            time.sleep(0.01)  # (the searches under way on it end)
            damaged += old.damaged is not None
            old = None
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    damaged += stores[-1].damaged is not None
    stores[-1].close()
    dt = time.monotonic() - t0
    print(f"| reloads | threads | searches | error answers | stores damaged | answers of neither version | s |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {a.reloads} | {a.threads} | {counts['searches']} | {counts['errors']} | {damaged} | "
          f"{counts['other answers']} | {dt:.1f} |")
    return 0 if counts["errors"] == 0 and damaged == 0 and counts["other answers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
