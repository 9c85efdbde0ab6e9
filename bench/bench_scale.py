"""Scale: ours beside SQLite FTS5 and tantivy, on the same passages, at several sizes.

Run: ``.venv/bin/python bench/bench_scale.py --scale 0.1`` (a couple of minutes on
2 cores); the issue's figures: ``--scale 1 4 10``; ``--profile --scale 0.25``
prints where ours spends indexing time, memory and one-file updates (the
figures of ``docs/SCALE-NOTES.md``); ``--record`` writes the
"Scale" section of ``docs/BENCHMARKS.md``. tantivy is an optional bench
dependency (``.venv/bin/pip install tantivy``): without it its column says so.
``--vectors 100000`` also measures the meaning vectors held in memory (int8 as
now, against the former float32 matrix) at that many 384-dimension vectors.

For each scale, on the corpus of ``bench/corpus.py`` (seeded; generated once
under ``--out``, then reused):

- ours: the tree read once (into the page cache, as the references' JSONL is
  when they build from it), then ``lnk-lnkmem index`` on a fresh state (build
  time, peak RSS as the child's VmHWM, ``data.mdb`` on disk); the restart as a user
  waits for it: a new ``serve`` on the unchanged index answering its first search
  (spawn -> `initialize` -> one search answered: ``common.first_answer``, which
  ``bench_first_answer.py`` runs too), what the references' restart is (a new process
  that opens its index and answers one query); ``index`` run again on the unchanged
  tree (listing and stat-ing the whole tree: a row of its own, "index again", which the
  references have no counterpart of); one process that opens the index and times the queries
  in-process (``bm25``, limit 10) on the index as built, as the references'
  are timed on theirs; ``serve`` answering the corpus queries over MCP
  (client-side p50/p99, its VmHWM) and a few files changed on disk (then put
  back); then one process that times the queries again (the index now holds
  those changes and their undoing: a row of its own) and then the one-file
  updates (a file of the Home gets a new word; timed from the write until
  ``bm25`` finds it, through ``indexer.plan``/``build`` as the engine's watcher
  path does, merges on the store's merger thread as in ``serve``); the files
  are put back as they were afterwards.
- FTS5 and tantivy: the passages our index made (read out of it), streamed
  from a JSONL file: one process builds (build time, VmHWM), one opens the
  index, times the same queries and then the same updates (the changed file's
  passages deleted and its new passages added, committed, searched), and a
  fresh process opening it and answering one query is the restart
  (``restart_ref.py``: it imports the engine and nothing of the bench).

Every engine runs in its own subprocess, one at a time; wall times include
Python's start where the figure is a whole process (ours' build, restart and
index again, the references' restart). The package is compiled first, as an
install compiles it (``bench_local.program``). Queries: each is timed in 3 passes, its median
taken, then p50 / p99 over the queries.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import threading
import time
from datetime import datetime, timezone
from typing import Optional

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE, ROOT  # noqa: E402
import corpus  # noqa: E402
from common import files_reread, pct  # noqa: E402
from restart_ref import FTS_SQL, fts_match, tantivy_query  # noqa: E402  (the references' queries, one definition)

from lnkmem.index.codec import textpack  # noqa: E402
from lnkmem.cli.status import disk_bytes  # noqa: E402  (what `status` reports: one measure)

SECTION = "scale"
PASSES = 3
UPDATES = 10
MCP_CHANGES = 5
REST_S = 4.0  # after the changes, seconds without a search before serve's memory is read again (it trims at rest)
MB = 1_000_000
MiB = 1 << 20
DEFAULT_OUT = os.path.join(HERE, "out", "scale")
WORDS = ["zqxalpha", "zqxbravo", "zqxcharly", "zqxdelta", "zqxecho", "zqxfoxtrot", "zqxgolf", "zqxhotel",
         "zqxindigo", "zqxjuliet", "zqxkilo", "zqxlima", "zqxmike", "zqxnovember", "zqxoscar", "zqxpapa"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pooled(passes: list[list[float]], p: float) -> float:
    """p-th percentile over the queries of each query's median across passes, in ms."""
    return pct([statistics.median(xs) for xs in zip(*passes)], p) * 1000


def have_tantivy() -> Optional[str]:
    try:
        import tantivy  # noqa: F401
    except ImportError:
        return None
    try:
        from importlib.metadata import version
        return version("tantivy")
    except Exception:
        return "?"


# --- a child process, measured ---------------------------------------------------------


def run_child(argv: list[str], env: Optional[dict] = None, timeout: float = 3600) -> tuple[float, int, dict, str]:
    """(wall seconds, peak RSS in KiB (the child's VmHWM), its JSON answer on stdout or {}, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    wall = time.perf_counter() - t0
    # each child reports its own peak (its VmHWM) in its answer
    text = err.decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {p.returncode}: {text.strip()[-1500:]}")
    ans = {}
    for line in out.decode().splitlines()[::-1]:
        if line.startswith("{"):
            ans = json.loads(line)
            break
    return wall, ans.get("maxrss_kib", 0), ans, text


def one_update(st, places: dict, home: str, tmp: str, path: str, word: str, saved: dict) -> float:
    """Seconds from appending a sentence with ``word`` to the Home file ``path`` until
    ``bm25`` finds that file (its old bytes go into ``saved``, to be put back)."""
    from lnkmem.index.build import indexer
    from lnkmem.index.rank.search import bm25
    full = os.path.join(home, path)
    with open(full, "rb") as f:
        saved[full] = f.read()
    ref = "home/" + path
    t = time.perf_counter()
    with open(full, "ab") as f:
        f.write(f"\n\nA late addition about {word}.\n".encode())
    plan = indexer.plan(st, places, only=ref)
    indexer.build(st, places, plan, tmp)
    hits = bm25(st, word, 10)
    took = time.perf_counter() - t
    snap = st.snapshot
    if not any(snap.refs[snap.refid[p]] == ref for p, _ in hits):
        raise RuntimeError(f"ours: {word!r} not found in {ref} after the update")
    return took


def worker(kind: str, **kw) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", kind, "--args", json.dumps(kw)]


def answer(d: dict) -> None:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM, not ru_maxrss: after vfork + exec, ru_maxrss starts at the bench process's own peak
    d["maxrss_kib"] = common.proc_memory().get("VmHWM", 0) or ru.ru_maxrss
    d.setdefault("cpu_s", ru.ru_utime + ru.ru_stime)
    print(json.dumps(d), flush=True)


def timed_index_run(argv: list[str], env: dict) -> tuple[float, int, int, str, float]:
    """(wall, exit code, peak RSS KiB, stderr, CPU seconds) of our ``index`` command.

    The peak is the largest VmHWM of the process and its children (the worker),
    sampled every 20 ms until it exits (a peak in its last 20 ms can be missed), not
    wait4's ru_maxrss: a child started by vfork + exec inherits the high-water mark of
    the bench's own process, which at scale 4 holds ~370 MiB of passages (every
    process then "peaked" at that)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err: list = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    peak = 0
    while True:
        peak = max(peak, _tree_hwm_kib(p.pid))
        done, status, ru = os.wait4(p.pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    reader.join()
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, p.returncode, peak, (err[0] if err else b"").decode(errors="replace"), ru.ru_utime + ru.ru_stime


def _tree_hwm_kib(pid: int) -> int:
    """The largest VmHWM of ``pid`` and its children (0 once it is gone)."""
    kids = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        pass
    return max([common.proc_memory(pid).get("VmHWM", 0)] + [common.proc_memory(k).get("VmHWM", 0) for k in kids])


# --- workers (each in its own process) ---------------------------------------------------


def w_ours(a: dict) -> None:
    """Open our index, time the queries, then the one-file updates (files put back after)."""
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.rank.search import bm25
    from lnkmem.index.store import Store
    t0 = time.perf_counter()
    st = Store.open(os.path.join(a["state"], "index"))
    open_s = time.perf_counter() - t0
    queries = a["queries"]
    passes = []
    for _ in range(PASSES):
        times = []
        for q in queries:
            t = time.perf_counter()
            bm25(st, q, 10)
            times.append(time.perf_counter() - t)
        passes.append(times)
    tops = [[p for p, _ in bm25(st, q, 10)] for q in queries]
    places = {"home": LocalPlace(a["home"])}
    from lnkmem.index.text import analyze
    for path, _ in a["updates"]:  # the stem memo as a `serve` that indexed these files has it
        with open(os.path.join(a["home"], path), encoding="utf-8", errors="replace") as f:
            analyze.term_counts(f.read())
    upd, saved = [], {}
    st.start_merger()  # as `serve` does: a merge a change calls for runs beside it, never in its way
    try:
        for path, word in a["updates"]:
            upd.append(one_update(st, places, a["home"], a["tmp"], path, word, saved))
    finally:
        for full, data in saved.items():
            with open(full, "wb") as f:
                f.write(data)
        st.stop_merger()
    st.close()
    answer({"open_s": open_s, "passes": passes, "updates": upd, "tops": tops})


def _stream(path: str):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)




def w_fts5_build(a: dict) -> None:
    db = sqlite3.connect(a["db"])
    t0 = time.perf_counter()
    db.execute("CREATE VIRTUAL TABLE p USING fts5(text, tokenize='porter unicode61')")
    batch = []
    for d in _stream(a["passages"]):
        batch.append((d["id"], d["t"]))
        if len(batch) >= 5000:
            db.executemany("INSERT INTO p(rowid, text) VALUES (?, ?)", batch)
            batch = []
    db.executemany("INSERT INTO p(rowid, text) VALUES (?, ?)", batch)
    db.commit()
    db.execute("INSERT INTO p(p) VALUES('optimize')")
    db.commit()
    db.close()
    answer({"build_s": time.perf_counter() - t0})


def w_fts5_query(a: dict) -> None:
    db = sqlite3.connect(a["db"])
    passes = []
    for _ in range(PASSES):
        times = []
        for q in a["queries"]:
            fq = fts_match(q)
            t = time.perf_counter()
            if fq:
                db.execute(FTS_SQL, (fq,)).fetchall()
            times.append(time.perf_counter() - t)
        passes.append(times)
    tops = [[r[0] for r in db.execute(FTS_SQL, (fts_match(q),)).fetchall()] if fts_match(q) else []
            for q in a["queries"]]
    upd = []
    for u in a["updates"]:
        t = time.perf_counter()
        db.executemany("DELETE FROM p WHERE rowid = ?", [(p,) for p in u["del"]])
        db.executemany("INSERT INTO p(rowid, text) VALUES (?, ?)", u["add"])
        db.commit()
        rows = db.execute(FTS_SQL, (fts_match(u["word"]),)).fetchall()
        took = time.perf_counter() - t
        if not {r[0] for r in rows} & {p for p, _ in u["add"]}:
            raise RuntimeError(f"fts5: {u['word']!r} not found after the update")
        upd.append(took)
    db.close()
    answer({"passes": passes, "updates": upd, "tops": tops})


def _tantivy_schema():
    import tantivy
    sb = tantivy.SchemaBuilder()
    sb.add_integer_field("id", stored=True, indexed=True, fast=True)
    sb.add_integer_field("file", indexed=True)
    sb.add_text_field("body", stored=True, tokenizer_name="en_stem")  # kept, as ours and FTS5 keep it
    return sb.build()


def w_tantivy_build(a: dict) -> None:
    import tantivy
    os.makedirs(a["dir"], exist_ok=True)
    t0 = time.perf_counter()
    index = tantivy.Index(_tantivy_schema(), path=a["dir"])
    writer = index.writer(heap_size=128 * MiB, num_threads=1)
    for d in _stream(a["passages"]):
        writer.add_document(tantivy.Document(id=d["id"], file=d["f"], body=d["t"]))
    writer.commit()
    writer.wait_merging_threads()
    answer({"build_s": time.perf_counter() - t0})


def w_tantivy_query(a: dict) -> None:
    import tantivy
    index = tantivy.Index.open(a["dir"])
    searcher = index.searcher()
    passes = []
    for _ in range(PASSES):
        times = []
        for q in a["queries"]:
            t = time.perf_counter()
            pq = tantivy_query(index, q)
            if pq is not None:
                searcher.search(pq, 10).hits
            times.append(time.perf_counter() - t)
        passes.append(times)
    tops = []
    for q in a["queries"]:
        pq = tantivy_query(index, q)
        hits = searcher.search(pq, 10).hits if pq is not None else []
        tops.append([searcher.doc(addr)["id"][0] for _, addr in hits])
    writer = index.writer(heap_size=64 * MiB, num_threads=1)
    upd = []
    for u in a["updates"]:
        t = time.perf_counter()
        writer.delete_documents_by_term("file", u["file"])
        for p, text in u["add"]:
            writer.add_document(tantivy.Document(id=p, file=u["file"], body=text))
        writer.commit()
        index.reload()
        s = index.searcher()
        hits = s.search(tantivy_query(index, u["word"]), 10).hits
        took = time.perf_counter() - t
        found = {s.doc(addr)["id"][0] for _, addr in hits}
        if not found & {p for p, _ in u["add"]}:
            raise RuntimeError(f"tantivy: {u['word']!r} not found after the update")
        upd.append(took)
    writer.wait_merging_threads()
    answer({"passes": passes, "updates": upd, "tops": tops})


def w_vectors(a: dict) -> None:
    """Load the stored vectors and search them, the former way (float32) or now (int8)."""
    import numpy as np
    from lnkmem.index.store import Store
    from lnkmem.index.rank.vectors import VectorIndex
    st = Store.open(a["index"])
    base = common.proc_memory().get("VmHWM", 0) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if a["how"] == "float32":  # the former load: every row joined, then widened
        pids, rows = [], []
        with st.env.begin() as txn:
            for k, v in txn.cursor(db=st.vectors):
                pids.append(int.from_bytes(k, "big"))
                rows.append(v)
        dim = len(rows[0]) - 4
        raw = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), dim + 4)
        del rows
        mat = raw[:, :dim].view(np.int8).astype(np.float32) * raw[:, dim:].copy().view("<f4")
        del raw
        n = max(pids) + 1
        held = np.zeros((n, dim), np.float32)
        held[np.asarray(pids)] = mat
        del mat
        held_bytes = held.nbytes

        def search(q):
            return np.argpartition(-(held @ q), 99)[:100]
    else:
        vi = VectorIndex()
        vi.load(st)
        held_bytes = vi.nbytes

        def search(q):
            return vi.search(st, q, 100)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(5)
    qs = rng.standard_normal((110, a["dim"])).astype(np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    best = None
    for _ in range(PASSES):
        lat = []
        for i, q in enumerate(qs):
            t = time.perf_counter()
            search(q)
            if i >= 10:
                lat.append(time.perf_counter() - t)
        p = (pct(lat, 50) * 1000, pct(lat, 99) * 1000)
        best = p if best is None or p[1] < best[1] else best
    answer({"load_s": load_s, "held_bytes": held_bytes, "base_kib": base, "p50": best[0], "p99": best[1]})


def w_vectors_make(a: dict) -> None:
    """A real index of ``n`` one-passage files with a random unit vector each."""
    import numpy as np
    from lnkmem.index.commit import Batch, NewFile
    from lnkmem.index.format import Passage
    from lnkmem.index.store import Store
    st = Store.open(a["index"])
    n, dim = a["n"], a["dim"]
    rng = np.random.default_rng(7)
    step = 10_000
    for s in range(0, n, step):
        files = [NewFile(f"home/v{i}.md", "1", 1, "text", [Passage(f"home/v{i}.md", 1, 1, "x")], [({"x": 1}, 1)])
                 for i in range(s, min(n, s + step))]
        st.commit(Batch(files=files))
    pids = [int(p) for p in np.flatnonzero(st.snapshot.alive)]
    for s in range(0, n, step):
        v = rng.standard_normal((len(pids[s:s + step]), dim)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        st.put_vectors(pids[s:s + step], v)
    st.close()
    answer({"n": len(pids)})


def w_profile(a: dict) -> None:
    """Where a full index spends its time (cProfile) or its memory (tracemalloc per phase),
    or where one-file updates spend their time (cProfile), on a built index."""
    import cProfile
    import io
    import pstats
    import tracemalloc
    import lnkmem.cli.main as cli
    from lnkmem.index import commit as commit_mod
    from lnkmem.index import store as store_mod
    argv = ["index", a["home"], a["state"], a["agent"]]
    res: dict = {}
    if a["what"] in ("time", "restart"):
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.runcall(cli.main, argv)
        res["wall_s"] = time.perf_counter() - t0
    elif a["what"] == "memory":
        tracemalloc.start(1)
        phases: list = []
        S = store_mod.Store

        def wrap(name, fn):
            def inner(self, *args, **kw):
                before = tracemalloc.get_traced_memory()
                phases.append(("between", before[1] / MiB, before[0] / MiB, common.proc_memory_mib()))  # peak since the last phase
                tracemalloc.reset_peak()
                t = time.perf_counter()
                try:
                    return fn(self, *args, **kw)
                finally:
                    cur, peak = tracemalloc.get_traced_memory()
                    phases.append((name, peak / MiB, cur / MiB, common.proc_memory_mib(), time.perf_counter() - t))
                    tracemalloc.reset_peak()
            return inner
        commit_mod.write = wrap("commit (one transaction)", commit_mod.write)
        S.load_snapshot = wrap("snapshot reload", S.load_snapshot)
        S.merge = wrap("merge", S.merge)
        t0 = time.perf_counter()
        cli.main(argv)
        res["wall_s"] = time.perf_counter() - t0
        # the final merge of a large build (maybe_merge at 4x and 10x) merges most segments:
        # merging every segment here shows what it holds
        st = store_mod.Store.open(os.path.join(a["state"], "index"))
        phases.append(("-- merge of every segment:", 0.0, 0.0, {}))
        st.merge(sorted(st.segment_sizes()))
        st.close()
        res["phases"] = phases
        snap = tracemalloc.take_snapshot()
        res["final_traced_mib"] = sum(st.size for st in snap.statistics("filename")) / MiB
        tracemalloc.stop()
        res["vm"] = common.proc_memory_mib()
        answer(res)
        return
    else:  # updates on a built index
        from lnkmem.bridges.local import LocalPlace
        from lnkmem.index.build import indexer
        from lnkmem.index.rank.search import bm25
        st = store_mod.Store.open(os.path.join(a["state"], "index"))
        places = {"home": LocalPlace(a["home"])}
        from lnkmem.index.text import analyze
        for path, _ in a["updates"]:  # the stem memo warm, as in the `serve` that indexed them
            with open(os.path.join(a["home"], path), encoding="utf-8", errors="replace") as f:
                analyze.term_counts(f.read())
        pr = cProfile.Profile()
        saved = {}
        t0 = time.perf_counter()
        try:
            for path, word in a["updates"]:
                full = os.path.join(a["home"], path)
                with open(full, "rb") as f:
                    saved[full] = f.read()
                pr.enable()
                with open(full, "ab") as f:
                    f.write(f"\n\nA late addition about {word}.\n".encode())
                indexer.build(st, places, indexer.plan(st, places, only="home/" + path), a["tmp"])
                bm25(st, word, 10)
                pr.disable()
        finally:
            for full, data in saved.items():
                with open(full, "wb") as f:
                    f.write(data)
        res["wall_s"] = time.perf_counter() - t0
        st.close()
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).strip_dirs().sort_stats(key).print_stats(a.get("top", 30))
        res[key] = buf.getvalue()
    res["vm"] = common.proc_memory_mib()
    answer(res)


def profile(out: str, scale: float, seed: int, a_what=("time", "memory", "updates", "restart")) -> None:
    """Profile ours at one scale; prints the figures (for docs/SCALE-NOTES.md)."""
    import bench_local as bl
    base = os.path.join(out, f"{scale:g}")
    corpus.generate(base, scale, seed, log=log)
    home, agent, state = (os.path.join(base, x) for x in ("home", "agent", "state"))
    work = os.path.join(base, "work")
    os.makedirs(work, exist_ok=True)
    env = bl.clean_env()
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, env.get("PYTHONPATH")) if x)
    kw = dict(home=home, agent=agent, state=state, tmp=work)
    for what in a_what:
        if what in ("time", "memory"):
            shutil.rmtree(state, ignore_errors=True)
        else:
            if not os.path.exists(os.path.join(state, "index", "data.mdb")):
                log("profile: a full index first ...")
                rc = timed_index_run([bl.program(), "index", home, state, agent], env)[1]
                if rc != 0:
                    raise RuntimeError(f"index failed (exit {rc})")
        if what == "restart":  # the tree as the index has it (an earlier part may have changed files)
            timed_index_run([bl.program(), "index", home, state, agent], env)
        if what == "updates":
            rng = random.Random(seed)
            names = sorted(os.path.relpath(os.path.join(d, f), home) for d, _, fs in os.walk(home) for f in fs
                           if f.endswith(".md"))
            kw["updates"] = [(p, WORDS[i]) for i, p in enumerate(rng.sample(names, UPDATES))]
        log(f"profile: {what} ...")
        wall, peak, ans, err = run_child(worker("profile", what=what, **kw), env=env)
        print(f"\n===== {what}: wall {ans['wall_s']:.1f}s in the child, peak RSS {peak / 1024:.0f} MiB, "
              f"at the end {ans['vm']}")
        if what == "memory":
            print(f"{'phase':28} {'traced peak MiB':>16} {'traced now':>11} {'secs':>6}  VmRSS / VmHWM / RssAnon / RssFile MiB")
            for ph in ans["phases"]:
                name, pk, cur, vm = ph[:4]
                if not vm:
                    print(name)
                    continue
                secs = f"{ph[4]:.2f}" if len(ph) > 4 else ""
                print(f"{name:28} {pk:16.1f} {cur:11.1f} {secs:>6}  {vm.get('VmRSS')} / {vm.get('VmHWM')} / "
                      f"{vm.get('RssAnon')} / {vm.get('RssFile')}")
        else:
            print(ans["cumulative"])
            print(ans["tottime"])
    shutil.rmtree(work, ignore_errors=True)


WORKERS = {"ours": w_ours, "fts5-build": w_fts5_build, "fts5-query": w_fts5_query,
           "tantivy-build": w_tantivy_build, "tantivy-query": w_tantivy_query,
           "vectors": w_vectors, "vectors-make": w_vectors_make, "profile": w_profile}


# --- one scale -----------------------------------------------------------------------------


def _zdict(env):
    """The passages' deflate dictionary of an index (lnkmem.index.codec.textpack), or None."""
    meta = env.open_db(b"meta", create=False)  # before the transaction: py-lmdb opens it in one of its own
    with env.begin() as txn:
        return txn.get(b"zdict", db=meta)


def export_passages(state: str, path: str) -> tuple[int, int, dict[str, list[int]], dict[str, int]]:
    """Our passages as JSONL ({"id", "f", "t"}); (passages, text bytes of files, ref -> pids, ref -> file no)."""
    import lmdb
    import msgspec
    env = lmdb.open(os.path.join(state, "index"), readonly=True, lock=False, max_dbs=8)
    try:
        files = env.open_db(b"files", create=False)
        passages = env.open_db(b"passages", create=False)
        zdict = _zdict(env)
        of_ref, fno, file_of = {}, {}, {}
        nbytes = n = 0
        with env.begin() as txn:
            for k, v in txn.cursor(db=files):
                rec = msgspec.msgpack.decode(v)  # [version, size, pids, kind]
                ref = k.decode()
                fno[ref] = len(fno)
                of_ref[ref] = rec[2]
                nbytes += rec[1]
                for p in rec[2]:
                    file_of[p] = fno[ref]
            with open(path, "w", encoding="utf-8") as f:
                for k, v in txn.cursor(db=passages):
                    pid = int.from_bytes(k, "big")
                    f.write(json.dumps({"id": pid, "f": file_of.get(pid, -1), "t": msgspec.msgpack.decode(textpack.unpack(v, zdict))[3]},
                                       ensure_ascii=False) + "\n")
                    n += 1
        return n, nbytes, of_ref, fno
    finally:
        env.close()


def new_passages(state: str, refs: list[str]) -> dict[str, list[tuple[int, str]]]:
    import lmdb
    import msgspec
    env = lmdb.open(os.path.join(state, "index"), readonly=True, lock=False, max_dbs=8)
    try:
        files = env.open_db(b"files", create=False)
        passages = env.open_db(b"passages", create=False)
        zdict = _zdict(env)
        out = {}
        with env.begin() as txn:
            for ref in refs:
                pids = msgspec.msgpack.decode(txn.get(ref.encode(), db=files))[2]
                out[ref] = [(p, msgspec.msgpack.decode(textpack.unpack(txn.get(p.to_bytes(4, "big"), db=passages), zdict))[3])
                            for p in pids]
        return out
    finally:
        env.close()


def warm_tree(*roots: str) -> tuple[int, int]:
    """Every file under ``roots`` read once (into the page cache); (files, bytes)."""
    files = size = 0
    for root in roots:
        for d, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(d, name), "rb") as f:
                    while chunk := f.read(1 << 20):
                        size += len(chunk)
                files += 1
    return files, size


def bench_scale(out: str, scale: float, seed: int, tantivy_version: Optional[str]) -> dict:
    import bench_local as bl
    env = bl.clean_env()
    prog = bl.program()
    base = os.path.join(out, f"{scale:g}")
    log(f"[{scale:g}] corpus: {base} (seed {seed})")
    stamp = corpus.generate(base, scale, seed, log=log)
    home, agent, state = (os.path.join(base, x) for x in ("home", "agent", "state"))
    work = os.path.join(base, "work")
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(base, "queries.json")) as f:
        queries = json.load(f)
    r: dict = {"scale": scale, "stamp": stamp, "queries": len(queries)}
    o: dict = {}
    r["ours"] = o

    # the tree read once into the page cache first: the references build from a JSONL file
    # the bench has just written (the page cache holds it), and this VM drops its page
    # cache within minutes, so ours would otherwise wait on the disk for every file
    t = time.perf_counter()
    nfiles, nbytes = warm_tree(home, agent)
    o["tree_read_s"] = time.perf_counter() - t
    log(f"[{scale:g}] the tree read once first (the page cache): {nfiles} files, {nbytes / MB:.0f} MB in "
        f"{o['tree_read_s']:.1f}s")
    log(f"[{scale:g}] ours: index on a fresh state ...")
    argv = [prog, "index", home, state, agent]
    wall, rc, peak, err, cpu = timed_index_run(argv, env)
    if rc != 0:
        raise RuntimeError(f"index failed (exit {rc}): {err.strip()[-1500:]}")
    o.update(build_s=wall, build_cpu_s=cpu, build_rss_kib=peak, disk=disk_bytes(os.path.join(state, "index", "data.mdb")))
    log(f"  {wall:.1f}s, peak RSS {peak / 1024:.0f} MiB, {o['disk'] / MB:.1f} MB on disk")
    # the restart a user waits for: a new serve answering its first search on the unchanged
    # index (as the references' restart: a new process opening its index, answering one query)
    wall, cpu, hits = common.first_answer(prog, home, state, agent, queries[0], env)
    o.update(restart_s=wall, restart_cpu_s=cpu, restart_hits=hits)
    # at once again: on this VM the page cache is dropped within minutes and a build evicts
    # the tree's metadata, so the first restart after a build mostly reads from disk
    o["restart_warm_s"] = common.first_answer(prog, home, state, agent, queries[0], env)[0]
    log(f"  restart (serve's first answer) {wall:.2f}s (CPU {cpu:.2f}s, {hits} hits), "
        f"again at once {o['restart_warm_s']:.2f}s")
    # `index` again on the unchanged tree: it lists and stats the whole tree (its own row)
    wall, rc, _, err, _ = timed_index_run(argv, env)
    if rc != 0:
        raise RuntimeError(f"index again failed (exit {rc}): {err.strip()[-1500:]}")
    o.update(again_s=wall, restart_reread=files_reread(err))
    o["again_warm_s"] = timed_index_run(argv, env)[0]
    log(f"  index again on the unchanged tree {wall:.2f}s ({o['restart_reread']} files re-read), "
        f"again at once {o['again_warm_s']:.2f}s")

    npass, text_bytes, of_ref, fno = export_passages(state, os.path.join(work, "passages.jsonl"))
    r.update(passages=npass, text_bytes=text_bytes)

    # the files changed: seeded, among the Home's files that made passages
    rng = random.Random(seed)
    homes = sorted(ref for ref, pids in of_ref.items() if ref.startswith("home/") and ref.endswith(".md") and pids)
    picked = rng.sample(homes, min(UPDATES + MCP_CHANGES, len(homes)))
    picked, live = picked[:UPDATES], picked[UPDATES:]
    updates = [(ref[len("home/"):], WORDS[i]) for i, ref in enumerate(picked)]

    # queries on the index as built, as the references' are on theirs (before any change)
    log(f"[{scale:g}] ours: in-process queries on the index as built ...")
    _, _, ans, _ = run_child(worker("ours", state=state, home=home, tmp=work, queries=queries, updates=[]),
                             env=dict(env, PYTHONPATH=ROOT))
    o.update(passes=ans["passes"], open_s=ans["open_s"], tops=ans["tops"])

    log(f"[{scale:g}] ours: serve, {len(queries)} queries over MCP x {PASSES}, then {len(live)} files changed ...")
    c = bl.Client([prog, "serve", home, state, agent], env, os.path.join(work, "serve.log"))
    saved: dict[str, bytes] = {}
    try:
        c.request("initialize", bl.INIT)
        c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        while "indexing" in bl.search_call(c, queries[0])[0]:
            time.sleep(0.02)
        passes = []
        for _ in range(PASSES):
            passes.append([bl.search_call(c, q)[1] for q in queries])
        o["mcp_passes"] = passes
        o["serve_hwm_kib"] = c.memory().get("VmHWM", 0)
        # a file changed on disk, found by the watcher, searchable over MCP
        o["mcp_changes"] = []
        for i, ref in enumerate(live):
            full = os.path.join(home, ref[len("home/"):])
            word = WORDS[UPDATES + i]
            with open(full, "rb") as f:
                saved[full] = f.read()
            t = time.perf_counter()
            with open(full, "ab") as f:
                f.write(f"\n\nA late addition about {word}.\n".encode())
            while ref not in [h.get("ref") for h in bl.search_call(c, word)[0].get("hits", [])]:
                if time.perf_counter() - t > 30:
                    raise RuntimeError(f"serve: {word!r} not found in {ref} 30 s after the change")
                time.sleep(0.005)
            o["mcp_changes"].append(time.perf_counter() - t)
        o["serve_after_changes"] = c.memory()
        time.sleep(REST_S)  # no search, no change: what serve holds at rest
        o["serve_at_rest"] = c.memory()
        for full, data in saved.items():  # put back, and wait until the index has them back
            with open(full, "wb") as f:
                f.write(data)
        t = time.perf_counter()
        for i, ref in enumerate(live):
            while ref in [h.get("ref") for h in bl.search_call(c, WORDS[UPDATES + i])[0].get("hits", [])]:
                if time.perf_counter() - t > 30:
                    raise RuntimeError("serve: the changed files were not indexed back")
                time.sleep(0.01)
        saved.clear()
    finally:
        for full, data in saved.items():
            with open(full, "wb") as f:
                f.write(data)
        c.close()

    log(f"[{scale:g}] ours: in-process queries after serve's changes, then {len(updates)} one-file updates ...")
    wall, peak, ans, _ = run_child(worker("ours", state=state, home=home, tmp=work, queries=queries, updates=updates),
                                   env=dict(env, PYTHONPATH=ROOT))
    o.update(passes_after=ans["passes"], updates=ans["updates"], query_rss_kib=peak)
    # what the references replay: the same files' passages replaced by those ours made
    after = new_passages(state, picked)
    tasks = [{"file": fno[ref], "del": of_ref[ref], "add": after[ref], "word": w}
             for ref, (_, w) in zip(picked, updates)]
    shutil.rmtree(state, ignore_errors=True)  # the tree is back as it was; the index is not

    engines = [("fts5", f"SQLite {sqlite3.sqlite_version}")]
    if tantivy_version:
        engines.append(("tantivy", f"tantivy {tantivy_version}"))
    for name, _ in engines:
        e: dict = {}
        r[name] = e
        where = os.path.join(work, name + (".db" if name == "fts5" else ""))
        key = "db" if name == "fts5" else "dir"
        log(f"[{scale:g}] {name}: build from {npass} passages ...")
        _, peak, ans, _ = run_child(worker(f"{name}-build", passages=os.path.join(work, "passages.jsonl"), **{key: where}))
        e.update(build_s=ans["build_s"], build_cpu_s=ans["cpu_s"], build_rss_kib=peak, disk=disk_bytes(where))
        log(f"  {e['build_s']:.1f}s, peak RSS {peak / 1024:.0f} MiB, {e['disk'] / MB:.1f} MB on disk")
        # the restart: a new process opening the index and answering one query, importing only the
        # engine (restart_ref.py), as ours' serve imports only itself
        lean = [sys.executable, os.path.join(HERE, "restart_ref.py"), name, where, queries[0]]
        wall, _, ans, _ = run_child(lean)
        e.update(restart_s=wall, restart_cpu_s=ans.get("cpu_s"))  # (its own getrusage, as it answered)
        e["restart_warm_s"] = run_child(lean)[0]
        log(f"[{scale:g}] {name}: queries, then {len(tasks)} updates ...")
        _, peak, ans, _ = run_child(worker(f"{name}-query", queries=queries, updates=tasks, **{key: where}))
        e.update(passes=ans["passes"], updates=ans["updates"], query_rss_kib=peak, tops=ans["tops"])
        e["overlap"] = overlap(o["tops"], ans["tops"])
    shutil.rmtree(work, ignore_errors=True)
    return r


def overlap(ours: list[list[int]], theirs: list[list[int]]) -> float:
    """Mean share of top-10 passages in common, over queries where either found something."""
    xs = [len(set(a) & set(b)) / max(len(a), len(b)) for a, b in zip(ours, theirs) if a or b]
    return statistics.mean(xs) if xs else 0.0


def bench_vectors(out: str, n: int, dim: int = 384) -> dict:
    where = os.path.join(out, f"vectors-{n}")
    idx = os.path.join(where, "index")
    shutil.rmtree(where, ignore_errors=True)
    log(f"vectors: a real index of {n} passages with {dim}-dimension vectors ...")
    env = dict(os.environ, PYTHONPATH=ROOT)
    run_child(worker("vectors-make", index=idx, n=n, dim=dim), env=env)
    res = {"n": n, "dim": dim}
    for how in ("float32", "int8"):
        _, peak, ans, _ = run_child(worker("vectors", index=idx, how=how, dim=dim), env=env)
        ans["peak_kib"] = peak
        res[how] = ans
        log(f"  {how}: held {ans['held_bytes'] / MiB:.0f} MiB, peak RSS {peak / 1024:.0f} MiB "
            f"(before loading {ans['base_kib'] / 1024:.0f}), load {ans['load_s']:.2f}s, "
            f"search p50 {ans['p50']:.2f} / p99 {ans['p99']:.2f} ms")
    shutil.rmtree(where, ignore_errors=True)
    return res


# --- the table ------------------------------------------------------------------------------


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or not b:
        return "—"
    x = a / b
    return f"{x:.0f}×" if x >= 10 else f"{x:.1f}×" if x >= 1 else f"{x:.2f}×"


def table(r: dict) -> str:
    s = r["stamp"]
    names = [n for n in ("fts5", "tantivy") if n in r]
    o = r["ours"]
    tb = r["text_bytes"]

    def fig(e: dict, what: str) -> Optional[float]:
        if what == "build_s":
            return e["build_s"]
        if what == "build_cpu":
            return e["build_cpu_s"]
        if what == "mbps":
            return tb / MB / e["build_s"]
        if what == "build_rss":
            return e["build_rss_kib"] / 1024
        if what == "disk":
            return e["disk"] / MB
        if what == "upd50":
            return statistics.median(e["updates"]) * 1000 if e.get("updates") else None
        if what == "updmax":
            return max(e["updates"]) * 1000 if e.get("updates") else None
        if what in ("q50", "q99"):
            return pooled(e["passes"], 50 if what == "q50" else 99)
        if what == "query_rss":
            return e["query_rss_kib"] / 1024
        if what == "restart":
            return e["restart_s"]
        if what == "restart_warm":
            return e.get("restart_warm_s")
        if what == "restart_cpu":
            return e.get("restart_cpu_s")
        if what == "again":
            return e.get("again_s")
        if what == "again_warm":
            return e.get("again_warm_s")
        return None

    rows = [("Build, s", "build_s", "{:.1f}"), ("Build CPU (user + sys), s", "build_cpu", "{:.1f}"), ("Build throughput, MB/s of text", "mbps", "{:.2f}"),
            ("Build peak RSS, MiB", "build_rss", "{:.0f}"), ("Index on disk, MB", "disk", "{:.1f}"),
            ("One-file update searchable, median ms", "upd50", "{:.1f}"),
            ("One-file update searchable, worst ms", "updmax", "{:.1f}"),
            ("Query p50, in-process, ms", "q50", "{:.2f}"), ("Query p99, in-process, ms", "q99", "{:.2f}"),
            ("Peak RSS, queries + updates process, MiB", "query_rss", "{:.0f}"),
            ("Restart (a new process, first answer; ours: `serve`), s", "restart", "{:.2f}"),
            ("Restart again at once (caches warm), s", "restart_warm", "{:.2f}"),
            ("Restart's CPU by its first answer, s", "restart_cpu", "{:.2f}"),
            ("Index again on the unchanged tree (ours' `index`: lists it), s", "again", "{:.2f}"),
            ("Index again at once (caches warm), s", "again_warm", "{:.2f}")]
    head = "| Figure | ours | " + " | ".join({"fts5": "FTS5", "tantivy": "tantivy"}[n] for n in names)
    head += " | " + " | ".join(f"ours ÷ {'FTS5' if n == 'fts5' else 'tantivy'}" for n in names) + " |"
    lines = [head, "|---" * (2 + 2 * len(names)) + "|"]
    for label, key, f in rows:
        ov = fig(o, key)
        cells = [f.format(ov) if ov is not None else "—"]
        refs = [fig(r[n], key) for n in names]
        cells += [f.format(v) if v is not None else "—" for v in refs]
        if key == "mbps":  # higher is better: the ratio of times says the same
            cells += [_ratio(v, ov) for v in refs]
        else:
            cells += [_ratio(ov, v) for v in refs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if o.get("passes_after"):  # (the index holding serve's changes and their undoing: more segments, dead passages)
        lines.append(f"| Query p50 / p99, in-process, after serve's changes (ours), ms | "
                     f"{pooled(o['passes_after'], 50):.2f} / {pooled(o['passes_after'], 99):.2f} |"
                     + " |" * (2 * len(names)))
    mp50, mp99 = pooled(o["mcp_passes"], 50), pooled(o["mcp_passes"], 99)
    lines.append(f"| Query p50 / p99 over MCP (ours' `serve`, client-side), ms | {mp50:.2f} / {mp99:.2f} |"
                 + " |" * (2 * len(names)))
    lines.append(f"| `serve` VmHWM after the MCP queries, MiB | {o['serve_hwm_kib'] / 1024:.0f} |"
                 + " |" * (2 * len(names)))
    if o.get("mcp_changes"):
        ch = [x * 1000 for x in o["mcp_changes"]]
        sa = o["serve_after_changes"]
        lines.append(f"| A file changed on disk, searchable over MCP (watcher included), median / worst ms | "
                     f"{statistics.median(ch):.0f} / {max(ch):.0f} |" + " |" * (2 * len(names)))
        lines.append(f"| `serve` RSS after {len(ch)} changes, MiB (VmHWM; RssAnon, not backed by a file) | "
                     f"{sa.get('VmRSS', 0) / 1024:.0f} ({sa.get('VmHWM', 0) / 1024:.0f}; "
                     f"{sa.get('RssAnon', 0) / 1024:.0f}) |" + " |" * (2 * len(names)))
        if o.get("serve_at_rest"):
            sr = o["serve_at_rest"]
            lines.append(f"| `serve` RSS {REST_S:g} s later, at rest, MiB (RssAnon) | "
                         f"{sr.get('VmRSS', 0) / 1024:.0f} ({sr.get('RssAnon', 0) / 1024:.0f}) |"
                         + " |" * (2 * len(names)))
    notes = [
        "",
        f"Scale {r['scale']:g}: {s['files']} markdown files and {s['threads']} conversations "
        f"({(s['home_bytes'] + s['chat_bytes']) / MB:.1f} MB) from `bench/corpus.py` (seed {s['seed']}); "
        f"{r['text_bytes'] / MB:.1f} MB of text in {r['passages']} passages, the same passages in every engine; "
        f"index on disk ÷ text: ours {o['disk'] / tb:.2f}×"
        + "".join(f", {'FTS5' if n == 'fts5' else 'tantivy'} {r[n]['disk'] / tb:.2f}×" for n in names)
        + (f". The tree read once before ours' build (into the page cache, not timed in it): {o['tree_read_s']:.1f} s"
           if "tree_read_s" in o else "")
        + f". Ours' index again re-read {o['restart_reread']} files. Top-10 in common with ours: "
        + ", ".join(f"{'FTS5' if n == 'fts5' else 'tantivy'} {r[n]['overlap'] * 100:.0f}%" for n in names)
        + " (each its own stemmer and BM25 variant; FTS5 and tantivy keep stop words and do not index file names).",
    ]
    return "\n".join(lines + notes)


def vectors_table(v: dict) -> str:
    f, i = v["float32"], v["int8"]
    rows = [
        ("Held in memory, MiB", f"{f['held_bytes'] / MiB:.0f}", f"{i['held_bytes'] / MiB:.0f}"),
        ("Process peak RSS after loading and searching, MiB (before loading)",
         f"{f['peak_kib'] / 1024:.0f} ({f['base_kib'] / 1024:.0f})", f"{i['peak_kib'] / 1024:.0f} ({i['base_kib'] / 1024:.0f})"),
        ("Load from the store, s", f"{f['load_s']:.2f}", f"{i['load_s']:.2f}"),
        ("Search k 100, p50 / p99 ms (best of 3 passes of 100)", f"{f['p50']:.2f} / {f['p99']:.2f}",
         f"{i['p50']:.2f} / {i['p99']:.2f}"),
    ]
    lines = [f"Meaning vectors, {v['n']:,} × {v['dim']} (random unit vectors stored int8 in a real index):", "",
             "| Figure | float32 (before) | int8 (now) |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def machine() -> str:
    load = common.load_note()
    tv = have_tantivy()
    return common.machine(f"SQLite {sqlite3.sqlite_version}", f"tantivy {tv}" if tv else "no tantivy") + load


NOTE = ("Each engine runs in its own subprocess, one at a time: ours' build is `lnk-lnkmem index` on a fresh "
        "state (reading and cutting the files, Python's start included; the tree read once just before, as the "
        "references' JSONL was just written: both inputs in the page cache); FTS5 (`porter unicode61`, `bm25()`, "
        "`LIMIT 10`, insert then `optimize`) and tantivy (`en_stem`, text stored, one indexing thread, 128 MiB heap) build from "
        "the passages ours made, streamed from JSONL (no reading or cutting of files). Peak RSS is each process's "
        "VmHWM (ours' build: the largest of its process and its worker's, sampled every 20 ms; not ru_maxrss, "
        "which after vfork + exec starts at the bench process's own peak). A one-file update: ours appends a sentence with a new word to a Home file and times, in one "
        "process, from the write through `indexer.plan`/`build` (a new segment, the snapshot) until "
        "`bm25` finds it, the store's merger thread running as in `serve` (a merge the changes call for runs "
        "beside them); the references delete that file's passages and add the passages ours made of it, "
        "commit, and search the word. Restart, what a user waits for: ours starts `serve` on the unchanged "
        "index and times from the spawn to its first search's answer (`initialize` answered first; the Home "
        "is listed and compared after that answer); the references open the index in a new process that imports the engine alone and answer "
        "one query; each once right after its build and once more at once (this VM drops its page cache "
        "within minutes). Index again: ours runs `index` on the unchanged tree (listing and stat-ing it; "
        "comparing versions only where a source's listing differs from the one the index last matched): "
        "the references have no such step. Over MCP, "
        "a changed file is timed from the write until `search` (polled every 5 ms) lists it: the watcher's "
        "100 ms debounce is part of it. The in-process queries of every engine are timed on its index as built "
        "(ours' once more after serve's changes: their own row). On this "
        "small shared VM (2 cores, other work running) every figure moves by ±30% or more from run to run, wall "
        "times most (CPU time is the steadier build figure): compare the columns of one run, not runs.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: ours beside SQLite FTS5 and tantivy at several scales")
    ap.add_argument("--scale", type=float, nargs="*", default=[1.0],
                    help="corpus sizes (1: 10,000 files, ~92 MB; 0.1 for a quick run); several: --scale 1 4 10; "
                         "none (a bare --scale): only --vectors")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=DEFAULT_OUT, help="corpora and work folders (default bench/out/scale/)")
    ap.add_argument("--vectors", type=int, default=0, metavar="N",
                    help="also measure N meaning vectors held in memory, float32 before / int8 now (e.g. 100000)")
    ap.add_argument("--profile", nargs="?", const="time,memory,updates,restart", metavar="WHAT",
                    help="instead: profile ours at the (first) scale: index time (cProfile), memory by phase "
                         "(tracemalloc, then a merge of every segment), one-file updates and a restart on the "
                         "unchanged tree (cProfile); WHAT: some of time,memory,updates,restart")
    ap.add_argument("--no-tantivy", action="store_true", help="leave tantivy out even when installed")
    ap.add_argument("--record", action="store_true", help="write the tables into docs/BENCHMARKS.md")
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        WORKERS[a.worker](json.loads(a.args))
        return 0
    if any(not 0 < s <= 10 for s in a.scale):
        ap.error("--scale: each between 0 and 10")
    if a.vectors < 0:
        ap.error("--vectors: a count of vectors")
    if not a.scale and not a.vectors:
        ap.error("nothing to measure: give --scale sizes or --vectors N")
    if a.profile:
        if not a.scale:
            ap.error("--profile: give one --scale")
        what = tuple(a.profile.split(","))
        if not set(what) <= {"time", "memory", "updates", "restart"}:
            ap.error("--profile: some of time,memory,updates,restart")
        profile(os.path.abspath(a.out), a.scale[0], a.seed, what)
        return 0
    t0 = time.monotonic()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = machine()
    tv = None if a.no_tantivy else have_tantivy()
    if tv is None and not a.no_tantivy:
        log("tantivy is not installed (.venv/bin/pip install tantivy): its column is left out")
    out = os.path.abspath(a.out)
    results = {"scales": [bench_scale(out, s, a.seed, tv) for s in a.scale]}
    parts = [f"### Scale {r['scale']:g}\n\n" + table(r) for r in results["scales"]]
    if a.vectors:
        results["vectors"] = bench_vectors(out, a.vectors)
        parts.append(vectors_table(results["vectors"]))
    if tv is None:
        parts.append("tantivy was not installed for this run (`.venv/bin/pip install tantivy`).")
    text = "\n\n".join(parts + [NOTE])
    import bench_local as bl
    common.report(f"lnkmem at scale, code {bl.code_version()}", when, mach, text, results, t0, a.json)
    if a.record:
        cmd = ".venv/bin/python bench/bench_scale.py --scale" + "".join(f" {s:g}" for s in a.scale)
        if a.vectors:
            cmd += f" --vectors {a.vectors}"
        if a.seed != 7:
            cmd += f" --seed {a.seed}"
        common.write_section(SECTION, ["## Scale: ours beside SQLite FTS5 and tantivy", "",
                                       f"`{cmd}` — {when}, code {bl.code_version()}, on {mach}.", "", text])
        log(f"recorded in {os.path.relpath(common.DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
