"""Approximate vector search: usearch, faiss-cpu and hnswlib beside the engine's exact
int8 search, on real MiniLM vectors (issue 12).

Run: ``.venv/bin/python bench/bench_ann.py [--cache DIR] [--sizes 10000,50000,all] [--record]``

Vectors: all-MiniLM-L6-v2 embeddings of real text (BEIR SciFact titles, sentences and
two-sentence windows; LoCoMo messages and summaries; sentences of Python docstrings), made
beforehand by ``bench/ann_embed.py`` into ``--cache`` as ``c-NNNN.npy`` (1,024 rows each), the
1,109 SciFact queries as ``q-0000.npy`` and LoCoMo's questions as ``q-0001.npy``; nothing is
embedded here and nothing is shipped. Every size is a seeded sample of the rows there,
quantised as the engine stores them (``quantize_rows``); the queries a seeded mix of
SciFact's, LoCoMo's and docstring sentences held out of the rows.

For each size and library: build time (one thread, all but the last 1,000 rows), the
incremental add of the last 1,000, memory (the saved file's size, and the process's
resident-set growth while building), query p50/p99 (one query at a time, one thread), and
recall@10 against the engine's exact int8 search, for k 10 and for the engine's depth
(k 100: ``CANDIDATES``). usearch is measured through ``lnkmem.index.rank.ann.Ann`` as the engine
uses it (int8 rows, the neighbours re-scored exactly by ``VectorIndex.similarities``);
faiss as ``IndexHNSWSQ`` (8-bit scalar quantiser, inner product on unit vectors); hnswlib
(float32 only). All three: M 16, ef_construction 128, ef_search max(128, 2k).

The threshold: the exact search's p50 at the sizes here, and at 200k / 400k rows made by
repeating the real rows (its time depends on the row count only), against ~15 ms.
The libraries are bench dependencies: ``.venv/bin/pip install usearch faiss-cpu hnswlib``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from lnkmem.index.format import quantize_rows  # noqa: E402
from lnkmem.index.rank.vectors import VectorIndex  # noqa: E402

SECTION = "ann"
M, EF_ADD, EF_SEARCH = 16, 128, 128
INCREMENT = 1000
QUERIES = 300
TARGET_MS = 15.0


def log(msg: str) -> None:
    print(f"[bench_ann] {msg}", file=sys.stderr, flush=True)


def load(cache: str, rng) -> tuple[np.ndarray, np.ndarray, str]:
    """The rows, the queries and what they are: QUERIES a mix, seeded, of SciFact's queries,
    LoCoMo's questions and (a cache holding docstrings) sentences of docstrings held out of
    the rows; the first SciFact queries alone from a cache of only those."""
    parts = sorted(glob.glob(os.path.join(cache, "c-*.npy")))
    if not parts:
        raise SystemExit(f"bench_ann: no vectors in {cache} (c-NNNN.npy)")
    vecs = np.concatenate([np.load(p) for p in parts])
    vecs = vecs[np.linalg.norm(vecs, axis=1) > 0.5]
    sets = [np.load(p) for p in sorted(glob.glob(os.path.join(cache, "q-*.npy")))]
    if len(sets) < 2:
        return vecs, sets[0][:QUERIES], f"{QUERIES} SciFact queries"
    kinds = ["SciFact queries", "LoCoMo questions"]
    try:
        with open(os.path.join(cache, "sources.json")) as f:
            data = json.load(f)["data"]  # rows before the docstrings' (ann_embed.py)
    except (OSError, ValueError, KeyError):
        data = len(vecs)
    if len(vecs) - data >= QUERIES:
        out = rng.choice(np.arange(data, len(vecs)), QUERIES // 3, replace=False)
        sets.append(vecs[out])
        vecs = np.delete(vecs, out, axis=0)
        kinds.append("docstring sentences held out of the rows")
    each = QUERIES // len(sets)
    qs = np.concatenate([q[rng.choice(len(q), each, replace=False)] for q in sets])
    return vecs, qs, ", ".join(f"{each} {k}" for k in kinds)


def held_of(q8: np.ndarray, sc: np.ndarray) -> tuple:
    return q8, sc, np.ones(len(q8), bool)


def exact_top(vi: VectorIndex, held, q: np.ndarray, k: int) -> np.ndarray:
    sims = vi.similarities(q, n=len(held[0]), held=held)
    top = np.argpartition(-sims, k - 1)[:k]
    return top[np.argsort(-sims[top], kind="stable")]


def timed(fn, qs, cpu=None):
    """Results and wall ms of each query (and its thread's CPU ms into ``cpu``)."""
    out, ts = [], []
    for q in qs:
        c = time.thread_time()
        t = time.perf_counter()
        out.append(fn(q))
        ts.append((time.perf_counter() - t) * 1000)
        if cpu is not None:
            cpu.append((time.thread_time() - c) * 1000)
    return out, ts


def recall(got, want, k=10) -> float:
    return float(np.mean([len(set(g[:k].tolist()) & set(w[:k].tolist())) / k for g, w in zip(got, want)]))


def bench_size(n: int, vecs: np.ndarray, qs: np.ndarray, libs: list[str], rng) -> dict:
    idx = rng.choice(len(vecs), n, replace=False)
    f = vecs[idx]
    q8, sc = quantize_rows(f)
    held = held_of(q8, sc)
    vi = VectorIndex()
    r: dict = {"n": n, "libs": {}}
    truth = {}
    for k in (10, 100):
        truth[k], ts = timed(lambda q: exact_top(vi, held, q, k), qs)
        if k == 100:
            r["exact_p50"], r["exact_p99"] = common.pct(ts, 50), common.pct(ts, 99)
    base, inc = np.arange(n - INCREMENT), np.arange(n - INCREMENT, n)
    unit = (q8.astype(np.float32) * sc[:, None])
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    for lib in libs:
        log(f"{n:,}: {lib}")
        try:
            r["libs"][lib] = globals()["run_" + lib](held, unit, base, inc, qs, truth, vi)
        except ImportError as e:
            r["libs"][lib] = {"error": str(e)}
    return r


def _measure(build, add, search, save, qs, truth) -> dict:
    m0 = common.proc_memory().get("VmRSS", 0) * 1024
    t = time.perf_counter()
    build()
    t_build = time.perf_counter() - t
    grow = common.proc_memory().get("VmRSS", 0) * 1024 - m0
    t = time.perf_counter()
    add()
    t_add = time.perf_counter() - t
    res = {"build_s": t_build, "add_ms_each": t_add * 1000 / INCREMENT, "rss_mib": grow / 2**20}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x")
        save(p)
        res["file_mib"] = os.path.getsize(p) / 2**20
    for k in (10, 100):
        got, ts = timed(lambda q: search(q, k), qs)
        res[f"recall_k{k}"] = recall(got, truth[k])
        res[f"recall100_k{k}"] = recall(got, truth[k], k)
        res[f"p50_k{k}"], res[f"p99_k{k}"] = common.pct(ts, 50), common.pct(ts, 99)
    return res


def run_usearch(held, unit, base, inc, qs, truth, vi) -> dict:
    from lnkmem.index.rank import ann as annmod
    a = annmod.Ann(held[0].shape[1])
    q8 = held[0]

    def build():
        with a.lock:
            a.index.add(base.astype(np.uint64), q8[base], threads=1)

    def add():
        with a.lock:
            a.put(inc, q8[inc])

    def search(q, k):  # as VectorIndex._search_ann: neighbours, then exact scores
        count = max(2 * k, k + 32)
        keys = a.neighbours(quantize_rows(q)[0][0], count)
        sims = vi.similarities(q, rows=keys, held=held)
        return keys[np.argsort(-sims, kind="stable")[:k]]

    res = _measure(build, add, search, lambda p: a.index.save(p), qs, truth)
    # the graph's own top 10 (no over-fetch, no exact re-scoring), as the others answer
    a.index.expansion_search = EF_SEARCH
    raw = [np.asarray(a.index.search(quantize_rows(q)[0][0], 10, threads=1).keys, np.int64) for q in qs]
    res["raw_recall_k10"] = recall(raw, truth[10])
    return res


def run_faiss(held, unit, base, inc, qs, truth, vi) -> dict:
    import faiss
    faiss.omp_set_num_threads(1)
    d = unit.shape[1]
    ix = faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_8bit, M, faiss.METRIC_INNER_PRODUCT)
    ix.hnsw.efConstruction = EF_ADD

    def build():
        ix.train(unit[base])
        ix.add(unit[base])

    def search(q, k):
        ix.hnsw.efSearch = max(EF_SEARCH, 2 * k)
        _, i = ix.search(q[None, :].astype(np.float32), k)
        return i[0]

    return _measure(build, lambda: ix.add(unit[inc]), search, lambda p: faiss.write_index(ix, p), qs, truth)


def run_hnswlib(held, unit, base, inc, qs, truth, vi) -> dict:
    import hnswlib
    ix = hnswlib.Index(space="ip", dim=unit.shape[1])
    ix.init_index(max_elements=len(base) + len(inc), ef_construction=EF_ADD, M=M)
    ix.set_num_threads(1)

    def search(q, k):
        ix.set_ef(max(EF_SEARCH, 2 * k))
        i, _ = ix.knn_query(q[None, :], k)
        return i[0].astype(np.int64)

    return _measure(lambda: ix.add_items(unit[base], base), lambda: ix.add_items(unit[inc], inc), search,
                    lambda p: ix.save_index(p), qs, truth)


def exact_scaling(vecs: np.ndarray, qs: np.ndarray, sizes: list[int]) -> list[tuple[int, float, float]]:
    out = []
    vi = VectorIndex()
    q8, sc = quantize_rows(vecs)
    for n in sizes:
        reps = -(-n // len(q8))
        held = held_of(np.tile(q8, (reps, 1))[:n], np.tile(sc, reps)[:n])
        cpu: list = []
        # (held bound now: the lambda must not name what ``del`` unbinds below)
        _, ts = timed(lambda q, held=held: exact_top(vi, held, q, 100), qs[:100], cpu)
        out.append((n, common.pct(ts, 50), common.pct(ts, 99), common.pct(cpu, 50)))
        del held  # (the rows go before the next size's are made)
    return out


def table(rows: list[dict], scaling, nvec: int, what: str) -> str:
    from lnkmem.index.rank import ann as annmod
    source = "SciFact and LoCoMo text" + (", and sentences of Python docstrings (`bench/ann_embed.py`)"
                                          if "docstring" in what else "")
    lines = [f"Real vectors: {nvec:,} all-MiniLM-L6-v2 embeddings (384 dimensions) of {source}; "
             f"queries: {what}. One thread everywhere; M {M}, ef_construction {EF_ADD}; ef_search: for "
             f"usearch the engine's, max(neighbours asked, {annmod.EXPANSION_SEARCH}), for the others "
             f"max({EF_SEARCH}, 2k).", "",
             "| rows | library | build (s, 1 thread) | add, ms a vector | file MiB | RSS growth MiB "
             "| recall@10 (k 10) | p50 / p99 ms (k 10) | recall@10 / @100 (k 100) | p50 / p99 ms (k 100) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | exact int8 (`VectorIndex`) | — | — | {r['n'] * 389 / 2**20:.1f} (held) | — | 1 | — | 1 | "
                     f"{r['exact_p50']:.2f} / {r['exact_p99']:.2f} |")
        for lib, x in r["libs"].items():
            if "error" in x:
                lines.append(f"| {r['n']:,} | {lib} | not installed: {x['error']} |||||||| ")
                continue
            lines.append(f"| {r['n']:,} | {lib} | {x['build_s']:.1f} | {x['add_ms_each']:.2f} | {x['file_mib']:.1f} | "
                         f"{x['rss_mib']:.0f} | {x['recall_k10']:.3f} | {x['p50_k10']:.2f} / {x['p99_k10']:.2f} | "
                         f"{x['recall_k100']:.3f} / {x['recall100_k100']:.3f} | {x['p50_k100']:.2f} / {x['p99_k100']:.2f} |")
    raws = [f"{r['n']:,}: {r['libs']['usearch']['raw_recall_k10']:.3f}" for r in rows
            if "raw_recall_k10" in r["libs"].get("usearch", {})]
    lines += ["", "usearch is measured as the engine uses it: max(2k, k + 32) neighbours from the graph, re-scored "
              "exactly from the int8 rows held; its graph's own top 10 (ef 128, no re-scoring), recall@10: "
              + "; ".join(raws) + "."]
    lines += ["", "Exact int8 search, k 100, by rows (rows past the real ones repeat them: the time depends "
              "on the count only), wall p50 / p99 and CPU p50 ms of 100 queries: "
              + "; ".join(f"{n:,}: {a:.1f} / {b:.1f}, CPU {c:.1f}" for n, a, b, c in scaling) + "."]
    at = next((i for i, (_, a, _, _) in enumerate(scaling) if a >= TARGET_MS), None)
    if at:  # interpolated between the sizes either side (the time is linear in the rows)
        (n0, a0, _, _), (n1, a1, _, _) = scaling[at - 1], scaling[at]
        where = f"at about {n0 + (n1 - n0) * (TARGET_MS - a0) / (a1 - a0):,.0f} rows in this run ({n0:,}: {a0:.1f} ms, {n1:,}: {a1:.1f} ms)"
    else:
        where = "past the rows of this run" if at is None else f"already at {scaling[0][0]:,} rows"
    lines += ["", f"Threshold: the engine keeps the exact search below `ann.THRESHOLD` = {annmod.THRESHOLD:,} vectors "
              f"(knob `LNKMEM_ANN_THRESHOLD`): its p50 passes {TARGET_MS:.0f} ms {where}; on a busier machine "
              "sooner (wall time is the CPU's share of a loaded machine).", "", NOTES]
    return "\n".join(lines)


NOTES = ("Choice: usearch. It stores the int8 rows as the engine holds them (no float copy: hnswlib keeps "
         "float32, 3x the file; faiss's 8-bit scalar quantiser is trained on float input), removes and re-adds "
         "by key (the engine reuses passage ids: faiss's HNSW indexes, IDMap too, refuse `remove_ids`; hnswlib "
         "only marks deleted), saves one file that the engine vouches for by digest before loading, and ships "
         "cp311 wheels for Linux x86-64 and arm64 and macOS arm64 (2.3 MB; usearch 2.26.6, released 2026-10). "
         "faiss-cpu 1.15.1 answered and added a little faster there (p50 0.2-0.4 ms against usearch's 0.2-0.6 ms), but a 19 MB wheel and "
         "no removal; hnswlib 0.8.0 has had no release since 2023-12 and no wheels (built from source at install). "
         "In the run of 2026-12-03 (up to 50,000 rows of SciFact and LoCoMo, SciFact queries) every library was "
         "within recall@10 0.99 of exact; the engine re-scores usearch's neighbours exactly, so its scores are "
         "the exact ones.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: approximate vector search, measured")
    ap.add_argument("--cache", default="/work/cache/ann", help="folder of c-NNNN.npy and q-0000.npy")
    ap.add_argument("--sizes", default="10000,50000,all")
    ap.add_argument("--libs", default="usearch,faiss,hnswlib")
    ap.add_argument("--scaling", default="100000,200000,400000")
    ap.add_argument("--record", action="store_true", help="write the table into docs/BENCHMARKS.md")
    ap.add_argument("--ef", type=int, help="the engine's search breadth (ann.EXPANSION_SEARCH) for this run: a trial")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    if a.ef:
        from lnkmem.index.rank import ann as annmod
        annmod.EXPANSION_SEARCH = a.ef
    rng = np.random.default_rng(12)
    vecs, qs, what = load(a.cache, rng)
    log(f"{len(vecs):,} vectors, {len(qs)} queries ({what})")
    sizes = sorted({len(vecs) if s == "all" else int(s) for s in a.sizes.split(",")} )
    sizes = [s for s in sizes if s <= len(vecs)]
    rows = [bench_size(n, vecs, qs, a.libs.split(","), rng) for n in sizes]
    scaling = exact_scaling(vecs, qs, [int(s) for s in a.scaling.split(",") if s])
    text = table(rows, scaling, len(vecs), what)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = common.machine(f"numpy {np.__version__}") + common.load_note()
    common.report("Approximate vector search", when, mach, text, {}, t0)
    if a.record:
        cmd = " ".join([".venv/bin/python bench/bench_ann.py"] + (sys.argv[1:] if argv is None else list(argv)))
        common.write_section(SECTION, ["### Approximate vector search (issue 12)", "",
                                       f"`{cmd}` — {when}, on {mach}.", "", text])
        log(f"recorded in {common.DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
