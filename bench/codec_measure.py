"""Index on disk against the text it holds, and query / snippet times in process.

Run: ``nice .venv/bin/python bench/codec_measure.py --scale 0.25`` (the corpus of
``bench/corpus.py``, generated once under bench/out/scale/<scale>, shared with
bench_scale.py). Builds a fresh index with ``lnk-lnkmem index`` (or measures the
one at ``--state``), then prints: ``data.mdb`` size, the pages each table uses
(LMDB's own stat: the file also holds freed pages), the passage text it holds
(UTF-8 bytes of every passage's text), their ratio, in-process ``bm25`` p50 / p99
over the corpus queries (3 passes, median per query; ``--no-cache``: no decoded
list kept between searches) and ``passages_of`` of 10 hits (the snippets of one
answer).
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import common  # noqa: E402
import corpus  # noqa: E402

MB = 1_000_000


def measure(state: str, queries: list[str], cache: bool = True) -> dict:
    from lnkmem.index.rank.search import bm25
    from lnkmem.index.store import Store
    path = os.path.join(state, "index")
    st = Store.open(path)
    if not cache and hasattr(st, "decoded"):
        st.decoded.CACHE_BYTES = 0  # every list decoded at every search
    r: dict = {"data_mdb": os.path.getsize(os.path.join(path, "data.mdb"))}
    psize = st.env.stat()["psize"]
    used = {}
    with st.env.begin() as txn:
        for name in ("meta", "files", "passages", "postings", "segments", "dead", "vectors", "vec_pending"):
            s = txn.stat(getattr(st, name))
            used[name] = (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * psize
        pids = [int.from_bytes(k, "big") for k in txn.cursor(db=st.passages).iternext(values=False)]
    r["used"] = used
    r["used_total"] = sum(used.values())
    text = 0
    for i in range(0, len(pids), 4096):
        text += sum(len(p.text.encode()) for p in st.passages_of(pids[i:i + 4096]) if p is not None)
    r["text"] = text
    r["passages"] = len(pids)
    passes = []
    for _ in range(3):
        t = []
        for q in queries:
            t0 = time.perf_counter()
            bm25(st, q, 10)
            t.append(time.perf_counter() - t0)
        passes.append(t)
    med = [statistics.median(x) for x in zip(*passes)]
    r["query_p50_ms"] = common.pct(med, 50) * 1e3
    r["query_p99_ms"] = common.pct(med, 99) * 1e3
    hits = [[p for p, _ in bm25(st, q, 10)] for q in queries]
    snip = []
    for h in hits:
        if h:
            t0 = time.perf_counter()
            st.passages_of(h)
            snip.append(time.perf_counter() - t0)
    r["snippets10_p50_ms"] = common.pct(snip, 50) * 1e3
    r["snippets10_p99_ms"] = common.pct(snip, 99) * 1e3
    r["tops"] = hits
    st.close()
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "scale"))
    ap.add_argument("--state", help="measure this state's index instead of building one")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--no-cache", action="store_true", help="decode every posting list at every search")
    a = ap.parse_args()
    base = os.path.join(a.out, f"{a.scale:g}")
    corpus.generate(base, a.scale, a.seed, log=lambda m: print(m, file=sys.stderr))
    with open(os.path.join(base, "queries.json")) as f:
        queries = json.load(f)
    state = a.state
    build = None
    if state is None:
        state = os.path.join(base, "codec-state")
        shutil.rmtree(state, ignore_errors=True)
        prog = os.path.join(os.path.dirname(sys.executable), "lnk-lnkmem")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LNK_", "LNKMEM_"))}
        t0 = time.perf_counter()
        subprocess.run([prog, "index", os.path.join(base, "home"), state, os.path.join(base, "agent")],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        build = time.perf_counter() - t0
    r = measure(state, queries, not a.no_cache)
    r["build_s"] = build
    tops = r.pop("tops")
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, indent=1))
    print(f"on disk {r['data_mdb'] / MB:.1f} MB ({r['data_mdb'] / r['text']:.2f}x the text), used pages "
          f"{r['used_total'] / MB:.1f} MB ({r['used_total'] / r['text']:.2f}x), text {r['text'] / MB:.1f} MB")
    if a.json:
        r["tops"] = tops
        with open(a.json, "w") as f:
            json.dump(r, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
