"""Memory of a build's batches (issue 12, SCALE-NOTES item 5), in process with tracemalloc.

``python bench/build_memory.py HOME [AGENT]``: builds a fresh index of HOME (and the agent's
chats/ and skills/) with ``indexer.build`` and prints, per commit, the traced memory held when
the commit starts (the batch gathered: passages and postings), the peak during the commit
(``commit.write``), and the peak between commits; then the largest of each. Set
``LNKMEM_WORKER=0`` to gather every batch in this process (with the worker, batches are
counted in the child, which tracemalloc does not see: only what arrives).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import tracemalloc

MiB = 1024 * 1024


def main() -> int:
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index import commit as commit_mod
    from lnkmem.index.build import indexer
    from lnkmem.index import store as store_mod

    home = sys.argv[1]
    agent = sys.argv[2] if len(sys.argv) > 2 else None
    places = {"home": LocalPlace(home)}
    if agent:
        places["chats"] = LocalPlace(os.path.join(agent, "chats"))
        places["skills"] = LocalPlace(os.path.join(agent, "skills"))
    rows = []
    S = store_mod.Store
    plain = commit_mod.write

    def commit(self, batch):
        held = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        try:
            return plain(self, batch)
        finally:
            cur, peak = tracemalloc.get_traced_memory()
            rows.append({"held_mib": round(held[0] / MiB, 1), "between_peak_mib": round(held[1] / MiB, 1),
                         "commit_peak_mib": round(peak / MiB, 1), "files": len(batch.files)})
            tracemalloc.reset_peak()

    commit_mod.write = commit
    with tempfile.TemporaryDirectory() as tmp:
        st = S.open(os.path.join(tmp, "index"))
        tracemalloc.start(1)
        t = time.process_time()
        indexer.build(st, places, indexer.plan(st, places), tmp)
        cpu = time.process_time() - t
        tracemalloc.stop()
        st.close()
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"worker": os.environ.get("LNKMEM_WORKER", "auto"), "commits": len(rows),
                      "max_held_mib": max(r["held_mib"] for r in rows),
                      "max_commit_peak_mib": max(r["commit_peak_mib"] for r in rows),
                      "max_between_peak_mib": max(r["between_peak_mib"] for r in rows),
                      "cpu_s_traced": round(cpu, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
