"""Passage ids against edits (issue 11): appends to one conversation, re-indexed
after each, as the watcher would. Prints ids used, live passages, the snapshot's
bytes and a search's time. Usage: python bench/passage_ids.py [appends]"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from lnkmem.bridges.local import LocalPlace
from lnkmem.index.build import indexer
from lnkmem.index.rank.search import bm25
from lnkmem.index.store import Store


def main(appends: int = 1000) -> None:
    base = tempfile.mkdtemp()
    chats = os.path.join(base, "chats")
    os.makedirs(chats)
    conv = os.path.join(chats, "t.jsonl")
    with open(conv, "w") as f:
        for i in range(400):
            f.write(json.dumps({"role": "user", "text": f"message {i} about the heron and the ibis {i % 17}"}) + "\n")
    store = Store.open(os.path.join(base, "index"))
    places = {"chats": LocalPlace(chats)}
    t0 = time.perf_counter()
    for i in range(appends):
        with open(conv, "a") as f:
            f.write(json.dumps({"role": "assistant", "text": f"reply {i} on the heron, the egret and the stork"}) + "\n")
        plan = indexer.plan(store, places, only="chats/t.jsonl")
        indexer.build(store, places, plan, base)
    spent = time.perf_counter() - t0
    snap = store.snapshot
    nbytes = snap.doclen.nbytes + snap.alive.nbytes + snap.src.nbytes + snap.refid.nbytes
    runs = []
    for _ in range(7):  # the best of seven runs of 50 searches: a shared machine is noisy
        t1 = time.perf_counter()
        for _ in range(50):
            bm25(store, "heron egret", 10)
        runs.append((time.perf_counter() - t1) / 50 * 1000)
    search_ms = min(runs)
    print(json.dumps({"appends": appends, "ids_used": int(store.get_meta(b"next_pid")) - 1, "live": snap.live,
                      "snapshot_bytes": nbytes, "segments": len(store.segment_sizes()),
                      "data_mdb_bytes": os.path.getsize(os.path.join(base, "index", "data.mdb")),
                      "search_ms": round(search_ms, 3), "indexing_s": round(spent, 1)}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
