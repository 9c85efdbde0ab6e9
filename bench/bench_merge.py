"""Merges at scale: peak memory of a full index and of a merge of every segment, and
the latency of a one-file change while a merge runs (issue 12, docs/SCALE-NOTES.md item 2).

Run: ``nice .venv/bin/python bench/bench_merge.py --scale 0.25 1`` (the corpus of
``bench/corpus.py``, seeded, generated once under ``--out``). For each scale, each
part in its own process:

- ``lnk-lnkmem index`` on a fresh state: wall time, peak RSS (the child's ru_maxrss),
  segments left, ``data.mdb`` size;
- a merge of every segment of a build's index (built again, its end-of-build merges left
  out, as code before tiered merging had none at these scales; ``Store.merge``): its time, the process's
  peak RSS (VmHWM: LMDB's mapped pages it touched included) and the peak of its
  anonymous memory (RssAnon, sampled every 20 ms: what the merge itself holds),
  both above the process before the merge, and ``data.mdb`` after;
- on such an index again, a merge of every segment started on a thread, and while
  it runs ten one-file changes (a Home file gets a new word; timed from the write
  until ``bm25`` finds it, through ``indexer.plan``/``build``): their latencies and
  the merge's time. The files are put back afterwards.

``--root DIR`` runs another checkout's code (e.g. an export of the commit before)
with this script, for before/after figures.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import random
import shutil
import statistics
import threading
import time

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE  # noqa: E402
import bench_local as bl  # noqa: E402
import corpus  # noqa: E402
from bench_scale import WORDS, log, one_update, run_child, timed_index_run  # noqa: E402

MiB = 1 << 20
CHANGES = 10


def _answer(d: dict) -> None:
    print(json.dumps(d), flush=True)


def w_merge(a: dict) -> None:
    from lnkmem.index.store import Store
    st = Store.open(os.path.join(a["state"], "index"))
    segs = sorted(st.segment_sizes())
    data = os.path.join(a["state"], "index", "data.mdb")
    size0 = os.path.getsize(data)
    vm0 = common.proc_memory_mib()
    s = common.MemorySampler(every=0.02)
    t0 = time.perf_counter()
    st.merge(segs)
    took = time.perf_counter() - t0
    anon = s.peak("RssAnon") // 1024
    s.stop()
    vm1 = common.proc_memory_mib()
    left = len(st.segment_sizes())
    st.close()
    _answer({"segments": len(segs), "left": left, "merge_s": took, "before": vm0, "after": vm1,
             "peak_anon": anon, "size0": size0, "size1": os.path.getsize(data)})


def w_during(a: dict) -> None:
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.text import analyze
    from lnkmem.index.store import Store
    st = Store.open(os.path.join(a["state"], "index"))
    places = {"home": LocalPlace(a["home"])}
    for path, _ in a["updates"]:  # the stem memo warm, as in the `serve` that indexed them
        with open(os.path.join(a["home"], path), encoding="utf-8", errors="replace") as f:
            analyze.term_counts(f.read())
    segs = sorted(st.segment_sizes())
    box: dict = {}

    def merging():
        t = time.perf_counter()
        st.merge(segs)
        box["merge_s"] = time.perf_counter() - t
        box["end"] = time.perf_counter()

    m = threading.Thread(target=merging)
    t_start = time.perf_counter()
    m.start()
    time.sleep(0.2)  # the merge under way
    upd, during, saved = [], 0, {}
    try:
        for path, word in a["updates"]:
            upd.append(one_update(st, places, a["home"], a["tmp"], path, word, saved))
            if m.is_alive():
                during += 1
    finally:
        for full, data in saved.items():
            with open(full, "wb") as f:
                f.write(data)
    m.join()
    st.close()
    _answer({"updates": upd, "during_merge": during, "merge_s": box.get("merge_s"),
             "segments": len(segs), "started_s": t_start})


def w_unmerged(a: dict) -> None:
    """``lnk-lnkmem index`` with its end-of-build merges left out: the segments of a build,
    for the merge of every segment to merge (code that merges at the end of a build, by
    tiers, would leave one)."""
    import lnkmem.cli.main as cli
    from lnkmem.index.store import Store
    Store.maybe_merge = lambda self, *args, **kw: False
    rc = cli.main(["index", a["home"], a["state"], a["agent"]])
    _answer({"rc": rc})


WORKERS = {"merge": w_merge, "during": w_during, "unmerged": w_unmerged}


def child(kind: str, env: dict, **kw) -> dict:
    _, _, ans, _ = run_child([sys.executable, os.path.abspath(__file__), "--worker", kind,
                              "--args", json.dumps(kw)], env=env)
    return ans


def fresh_index(home: str, state: str, agent: str, env: dict) -> dict:
    shutil.rmtree(state, ignore_errors=True)
    wall, rc, maxrss, err, cpu = timed_index_run([bl.program(), "index", home, state, agent], env)
    if rc != 0:
        raise RuntimeError(f"index failed (exit {rc}): {err[-800:]}")
    return {"wall_s": wall, "cpu_s": cpu, "maxrss_mib": maxrss / 1024,
            "mdb_mb": os.path.getsize(os.path.join(state, "index", "data.mdb")) / 1e6}


def one_scale(out: str, scale: float, seed: int, root: str) -> dict:
    base = os.path.join(out, f"{scale:g}")
    stamp = corpus.generate(base, scale, seed, log=log)
    home, agent, state = (os.path.join(base, x) for x in ("home", "agent", "state"))
    work = os.path.join(base, "work")
    os.makedirs(work, exist_ok=True)
    env = bl.clean_env()
    env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH")) if x)
    r: dict = {"scale": scale, "stamp": {k: stamp.get(k) for k in ("files", "passages", "home_bytes", "chat_bytes")
                                         if k in stamp}}
    log(f"[{scale:g}] index ...")
    r["index"] = fresh_index(home, state, agent, env)
    log(f"[{scale:g}] index: {r['index']}")
    shutil.rmtree(state, ignore_errors=True)
    child("unmerged", env, home=home, state=state, agent=agent)
    r["merge"] = child("merge", env, state=state)
    log(f"[{scale:g}] merge of every segment: {r['merge']}")
    shutil.rmtree(state, ignore_errors=True)
    child("unmerged", env, home=home, state=state, agent=agent)
    rng = random.Random(seed)
    names = sorted(os.path.relpath(os.path.join(d, f), home) for d, _, fs in os.walk(home) for f in fs
                   if f.endswith(".md"))
    updates = [(p, WORDS[i]) for i, p in enumerate(rng.sample(names, CHANGES))]
    r["during"] = child("during", env, state=state, home=home, tmp=work, updates=updates)
    log(f"[{scale:g}] changes during a merge: {r['during']}")
    shutil.rmtree(work, ignore_errors=True)
    return r


def report(r: dict) -> str:
    i, m, d = r["index"], r["merge"], r["during"]
    u = sorted(d["updates"])
    return (f"scale {r['scale']:g}: index {i['wall_s']:.1f} s wall, peak RSS {i['maxrss_mib']:.0f} MiB, "
            f"data.mdb {i['mdb_mb']:.1f} MB | merge of {m['segments']} segments: {m['merge_s']:.2f} s, "
            f"VmHWM {m['after']['VmHWM']} MiB (was {m['before']['VmRSS']} before), peak RssAnon "
            f"{m['peak_anon']} MiB (was {m['before']['RssAnon']}), data.mdb {m['size0'] / 1e6:.1f} -> "
            f"{m['size1'] / 1e6:.1f} MB | one-file change while a merge of {d['segments']} runs "
            f"({d['during_merge']} of {len(u)} during it; merge {d['merge_s']:.2f} s): median "
            f"{statistics.median(u) * 1000:.0f} ms, worst {u[-1] * 1000:.0f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, nargs="+", default=[0.25])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "scale"))
    ap.add_argument("--root", default=os.path.dirname(HERE), help="the checkout whose lnkmem runs")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker")
    ap.add_argument("--args")
    a = ap.parse_args(argv)
    if a.worker:
        WORKERS[a.worker](json.loads(a.args))
        return 0
    res = [one_scale(a.out, s, a.seed, os.path.abspath(a.root)) for s in a.scale]
    for r in res:
        print(report(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
