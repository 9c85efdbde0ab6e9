"""Where a one-process build's CPU goes, stage by stage (issue 47's recipe): ``LNKMEM_WORKER=0``
(no worker, no merge helper: every stage's CPU in this process), the plan and build of
``indexer`` in process on a corpus's home, each stage's CPU by ``time.process_time``.

    python bench/profile_build.py bench/out/corpus-1 [--runs 2] [--pyspy]

Stages (not nested): counting (``count.count_files``), reading and cutting
(``count.read_file``), commits (``commit.write``), the final merge (``Store.merge``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ["LNKMEM_WORKER"] = "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def once(corpus: str) -> dict:
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index import commit as commit_mod
    from lnkmem.index.build import count as count_mod
    from lnkmem.index.build import indexer
    from lnkmem.index.store import Store

    spent: dict[str, float] = {}

    def wrap(mod, name, stage):
        fn = getattr(mod, name)

        def inner(*a, **kw):
            t = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[stage] = spent.get(stage, 0.0) + time.process_time() - t
        setattr(mod, name, inner)
        return fn

    saved = [(count_mod, "count_files", wrap(count_mod, "count_files", "counting")),
             (indexer, "count_files", wrap(indexer, "count_files", "counting")),
             (indexer, "read_file", wrap(indexer, "read_file", "reading and cutting")),
             (commit_mod, "write", wrap(commit_mod, "write", "commits")),
             (Store, "merge", wrap(Store, "merge", "final merge"))]
    state = tempfile.mkdtemp(prefix="lnkmem-prof-")
    try:
        st = Store.open(os.path.join(state, "index"))
        places = {"home": LocalPlace(os.path.join(corpus, "home"))}
        for source in ("chats", "skills"):  # (as bench/index_digest.py: the agent's too)
            if os.path.isdir(os.path.join(corpus, "agent", source)):
                places[source] = LocalPlace(os.path.join(corpus, "agent", source))
        w0, c0 = time.perf_counter(), time.process_time()
        indexer.build(st, places, indexer.plan(st, places), state)
        spent["whole build"] = time.process_time() - c0
        spent["wall"] = time.perf_counter() - w0
        st.close()
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
        shutil.rmtree(state, ignore_errors=True)
    return spent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", help="a bench corpus (its home/ and agent/'s chats/ and skills/ are indexed)")
    a = ap.parse_args()
    out = once(a.corpus)
    print(json.dumps({k: round(v, 2) for k, v in out.items()}))


if __name__ == "__main__":
    main()
