"""Restart, `serve` memory and MCP latency on a built index (issue 12, docs/SCALE-NOTES.md).

Usage: ``python bench/bench_restart.py BASE [restart|serve|all]`` where BASE is a folder
made by ``bench/corpus.py`` (``home/``, ``agent/``, ``queries.json``) whose index was built
with ``lnk-lnkmem index BASE/home BASE/state BASE/agent``. Environment: ``PROG`` another
``lnk-lnkmem`` (the code before a change), ``STATE`` another state folder below BASE (each
program its own copy: their seals differ), ``CHANGES`` how many one-file changes (20).

- restart: ``index`` on the unchanged tree three times (wall), then three ``serve``
  restarts: the first search answered, and the first pass done (no ``indexing``);
- serve: a ``serve`` after its first pass, 200 queries x 3 over MCP (p50/p90/p99), then
  one-file changes found by the watcher, with VmRSS / RssAnon / RssFile of the process
  (RssFile: the mapped index's pages, page cache; RssAnon: the process's own memory).
  The changed files are put back and the index brought back in step at the end.
"""
import json, os, random, statistics, subprocess, sys, time
import bench_local as bl

base = sys.argv[1]
what = sys.argv[2] if len(sys.argv) > 2 else "all"
prog = os.environ.get("PROG") or bl.program()
home, agent, state = (os.path.join(base, x) for x in ("home", "agent", os.environ.get("STATE", "state")))
env = bl.clean_env()
queries = json.load(open(os.path.join(base, "queries.json")))


def mib(d, k):
    return d.get(k, 0) / 1024


if what in ("restart", "all"):
    ws = []
    for _ in range(3):
        t = time.perf_counter()
        r = subprocess.run([prog, "index", home, state, agent], env=env, capture_output=True)
        ws.append(time.perf_counter() - t)
        assert r.returncode == 0, r.stderr[-500:]
    print(f"index restart wall: {[round(w, 2) for w in ws]} median {statistics.median(ws):.2f}s", flush=True)
    fa, rd = [], []
    for _ in range(3):
        c = bl.Client([prog, "serve", home, state, agent], env, os.path.join(base, "serve-restart.log"))
        t = c.t_spawn
        c.request("initialize", bl.INIT)
        c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        res, _ = bl.search_call(c, queries[0])
        fa.append(time.perf_counter() - t)
        while "indexing" in res:
            time.sleep(0.01)
            res, _ = bl.search_call(c, queries[0])
        rd.append(time.perf_counter() - t)
        c.close()
    print(f"serve restart: first answer {[round(w, 2) for w in fa]} median {statistics.median(fa):.2f}s; "
          f"first pass done {[round(w, 2) for w in rd]} median {statistics.median(rd):.2f}s", flush=True)

if what in ("serve", "all"):
    c = bl.Client([prog, "serve", home, state, agent], env, os.path.join(base, "serve-rss.log"))
    saved = {}
    try:
        c.request("initialize", bl.INIT)
        c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        while "indexing" in bl.search_call(c, queries[0])[0]:
            time.sleep(0.05)
        m0 = c.memory()
        lat = []
        for p in range(3):
            for q in queries:
                lat.append(bl.search_call(c, q)[1] * 1000)
        m1 = c.memory()
        lat.sort()
        pct = lambda p: lat[min(len(lat) - 1, int(len(lat) * p / 100))]
        print(f"MCP search over {len(lat)}: p50 {pct(50):.2f} p90 {pct(90):.2f} p99 {pct(99):.2f} max {lat[-1]:.2f} ms")
        rng = random.Random(7)
        names = sorted(os.path.relpath(os.path.join(d, f), home) for d, _, fs in os.walk(home) for f in fs if f.endswith(".md"))
        nchg = int(os.environ.get("CHANGES", "20"))
        rows = []
        for i, rel in enumerate(rng.sample(names, nchg)):
            full = os.path.join(home, rel)
            saved[full] = open(full, "rb").read()
            word = f"zqx{i}restartword"
            with open(full, "ab") as f:
                f.write(f"\n\nA late addition about {word}.\n".encode())
            t = time.perf_counter()
            while "home/" + rel not in [h.get("ref") for h in bl.search_call(c, word)[0].get("hits", [])]:
                if time.perf_counter() - t > 30:
                    raise RuntimeError("change not found")
                time.sleep(0.005)
            for q in queries[i * 10:(i + 1) * 10]:
                bl.search_call(c, q)
            if i % 5 == 4 or i == 0:
                m = c.memory()
                rows.append((i + 1, mib(m, "VmRSS"), mib(m, "RssAnon"), mib(m, "RssFile")))
        m2 = c.memory()
        for label, m in (("after first pass", m0), ("after 600 searches", m1), (f"after {nchg} changes", m2)):
            print(f"{label:24} VmRSS {mib(m, 'VmRSS'):7.1f} RssAnon {mib(m, 'RssAnon'):7.1f} "
                  f"RssFile {mib(m, 'RssFile'):7.1f} VmHWM {mib(m, 'VmHWM'):7.1f} MiB")
        for r in rows:
            print(f"  change {r[0]:3}: VmRSS {r[1]:.1f} RssAnon {r[2]:.1f} RssFile {r[3]:.1f}")
    finally:
        for full, data in saved.items():
            with open(full, "wb") as f:
                f.write(data)
        c.close()
    # put the index back as the tree is
    subprocess.run([prog, "index", home, state, agent], env=env, capture_output=True)
