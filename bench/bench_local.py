"""The local engine's benchmark: the real program, as subprocesses, on a generated Home.

Run: ``.venv/bin/python bench/bench_local.py [--scale 1.0] [--record]``

Measures, on the corpus of ``bench/corpus.py`` (generated once, then reused):

- full index time and MB/s of text (``lnk-lnkmem index`` on a fresh state);
- restart on the unchanged tree (the same command again: must re-read nothing);
- time to ``initialize`` (spawn ``serve``, send one line, wait for the answer;
  median of 10 spawns on the built index);
- search latency p50/p99 over the queries through MCP ``tools/call search`` on
  one ``serve`` (client-side, line sent -> answer line), after indexing is done;
- peak RSS of ``serve`` (VmHWM) and of ``index`` (the child's ru_maxrss);
- the reference: the same passages (read out of our LMDB) in SQLite FTS5
  (``porter unicode61``, ``bm25()`` order, ``LIMIT 10``), the same queries,
  in-process, beside our own BM25 in-process.

Prints a markdown table with targets and pass/fail; ``--record`` writes it to
the "Local engine" section of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # importing lnkmem here must leave no __pycache__

import argparse
import gc
import json
import os
import re
import select
import shutil
import sqlite3
import statistics
import subprocess
import time
from datetime import datetime, timezone
from typing import Optional

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import ROOT  # noqa: E402
import corpus  # noqa: E402
from common import files_reread, pct  # noqa: E402

DOC = common.DOC
SECTION = "local"
SPAWNS = 10
ROUNDS = 3  # passes over the queries, pooled
MB = 1_000_000

# targets
T_INIT_MS = 150
T_P50_MS = 10
T_P99_MS = 50
T_MBPS = 5
T_RSS_MB = 300
T_RATIO = 2.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def program() -> str:
    # the package's bytecode, as an install compiles it: the children run with
    # PYTHONDONTWRITEBYTECODE (nothing written into the tree by them), so in a fresh
    # checkout every start compiled every module from source (+0.25 s a restart)
    import compileall
    compileall.compile_dir(os.path.join(ROOT, "lnkmem"), quiet=1)
    beside = os.path.join(os.path.dirname(sys.executable), "lnk-lnkmem")
    if os.path.exists(beside):
        return beside
    found = shutil.which("lnk-lnkmem")
    if not found:
        sys.exit("bench: cannot find lnk-lnkmem (run with the venv's python: .venv/bin/python bench/bench_local.py)")
    return found


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LNK_", "LNKMEM_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


# --- running the program -------------------------------------------------------


def run_timed(argv: list[str], env: dict, errpath: str) -> tuple[float, int, dict, str]:
    """(wall seconds, exit code, memory in KiB, stderr) of one child run.

    memory: ``peak`` (the child's ru_maxrss), ``anon`` and ``file`` (the largest
    RssAnon and RssFile seen by polling).
    """
    with open(errpath, "wb") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        poll = common.MemorySampler(p.pid, every=0.02)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        poll.stop()
    p.returncode = os.waitstatus_to_exitcode(status)
    with open(errpath, errors="replace") as f:
        text = f.read()
    return wall, p.returncode, {"peak": ru.ru_maxrss, "anon": poll.peak("RssAnon"), "file": poll.peak("RssFile+RssShmem")}, text


def opened_files(argv: list[str], env: dict, roots: tuple[str, ...], logpath: str) -> Optional[int]:
    """How many regular files below ``roots`` a run opens (by strace), or None without strace."""
    strace = shutil.which("strace")
    if not strace:
        return None
    rc = subprocess.run([strace, "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", logpath] + argv,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env).returncode
    if rc != 0:
        return None
    pat = re.compile(r'open(?:at2?)?\((?:[^,]*, )?"([^"]*)", ([^,)]*)')
    n = 0
    with open(logpath, errors="replace") as f:
        for line in f:
            m = pat.search(line)
            if m and "O_DIRECTORY" not in m.group(2) and " = -1 " not in line:
                path = os.path.abspath(m.group(1))
                if any(path.startswith(r + os.sep) for r in roots):
                    n += 1
    os.unlink(logpath)
    return n


class Client:
    """A `serve` child spoken to line by line, with timeouts."""

    def __init__(self, argv: list[str], env: dict, errpath: str):
        self.err = open(errpath, "ab")
        self.t_spawn = time.perf_counter()
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                  env=env, bufsize=0)
        self.fd = self.p.stdout.fileno()
        self.buf = b""
        self.next_id = 1

    def send(self, obj: dict) -> None:
        self.p.stdin.write(json.dumps(obj).encode() + b"\n")

    def line(self, timeout: float = 60.0) -> bytes:
        end = time.perf_counter() + timeout
        while b"\n" not in self.buf:
            left = end - time.perf_counter()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError("serve did not answer in time")
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise EOFError("serve closed its output")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def request(self, method: str, params: dict, timeout: float = 60.0) -> tuple[dict, float]:
        """(the answer, seconds from sending the line to its answer line)."""
        rid = self.next_id
        self.next_id += 1
        data = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n"
        t0 = time.perf_counter()
        self.p.stdin.write(data)
        while True:
            msg = json.loads(self.line(timeout))
            if msg.get("id") == rid:
                return msg, time.perf_counter() - t0

    def memory(self) -> dict[str, int]:
        return common.proc_memory(self.p.pid)

    def close(self, timeout: float = 30.0) -> None:
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.terminate()
            self.p.wait(10)
        self.err.close()


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}


def time_initialize(argv: list[str], env: dict, errpath: str) -> float:
    c = Client(argv, env, errpath)
    try:
        c.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})
        msg = json.loads(c.line(30))
        took = time.perf_counter() - c.t_spawn
        if "result" not in msg:
            raise RuntimeError(f"initialize failed: {msg}")
        return took
    finally:
        c.close()


def search_call(c: Client, query: str, limit: int = 10) -> tuple[dict, float]:
    msg, took = c.request("tools/call", {"name": "search", "arguments": {"query": query, "limit": limit}})
    if "result" not in msg:
        raise RuntimeError(f"search {query!r} failed: {msg}")
    res = msg["result"]
    if res.get("isError"):
        raise RuntimeError(f"search {query!r}: tool error: {res}")
    return res.get("structuredContent") or {}, took


# --- reading our index ----------------------------------------------------------


def read_index(state: str) -> tuple[list[tuple[int, str]], int, int, int]:
    """(passages as (pid, text), text bytes of indexed files, files, generation)."""
    import lmdb
    import msgspec
    env = lmdb.open(os.path.join(state, "index"), readonly=True, lock=False, max_dbs=8)
    try:
        passages = env.open_db(b"passages", create=False)
        files = env.open_db(b"files", create=False)
        meta = env.open_db(b"meta", create=False)
        out = []
        nbytes = nfiles = 0
        from lnkmem.index.codec import textpack
        with env.begin() as txn:
            zdict = txn.get(b"zdict", db=meta)
            for k, v in txn.cursor(db=passages):
                out.append((int.from_bytes(k, "big"), msgspec.msgpack.decode(textpack.unpack(v, zdict))[3]))
            for _, v in txn.cursor(db=files):
                rec = msgspec.msgpack.decode(v)  # [version, size, pids, kind]
                nbytes += rec[1]
                nfiles += 1
            gen = int(txn.get(b"gen", db=meta))
        return out, nbytes, nfiles, gen
    finally:
        env.close()


def index_gen(state: str) -> int:
    return read_index(state)[3]


# --- the reference: SQLite FTS5 -------------------------------------------------

_FTS_WORD = re.compile(r"\w+")


def fts_query(q: str) -> Optional[str]:
    ws = _FTS_WORD.findall(q)
    return " OR ".join(f'"{w}"' for w in ws) if ws else None


class Fts5:
    """The reference: the same passages in SQLite FTS5, queried in-process."""

    SQL = "SELECT rowid, bm25(p) FROM p WHERE p MATCH ? ORDER BY bm25(p) LIMIT 10"

    def __init__(self, path: str):
        self.path = path
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass
        self.db = sqlite3.connect(path)

    def build(self, passages: list[tuple[int, str]]) -> float:
        t0 = time.perf_counter()
        self.db.execute("CREATE VIRTUAL TABLE p USING fts5(text, tokenize='porter unicode61')")
        self.db.executemany("INSERT INTO p(rowid, text) VALUES (?, ?)", passages)
        self.db.commit()
        self.db.execute("INSERT INTO p(p) VALUES('optimize')")
        self.db.commit()
        return time.perf_counter() - t0

    def run(self, queries: list[str], tops: dict) -> list[float]:
        times = []
        for q in queries:
            fq = fts_query(q)
            t = time.perf_counter()
            rows = self.db.execute(self.SQL, (fq,)).fetchall() if fq else []
            times.append(time.perf_counter() - t)
            tops[q] = [r[0] for r in rows]
        return times

    def close(self) -> int:
        self.db.close()
        size = os.path.getsize(self.path)
        os.unlink(self.path)
        return size


class Ours:
    """Our BM25 in-process, on the index the program built."""

    def __init__(self, state: str):
        from lnkmem.index.rank.search import bm25
        from lnkmem.index.store import Store
        self.bm25 = bm25
        t0 = time.perf_counter()
        self.st = Store.open(os.path.join(state, "index"))
        self.open_s = time.perf_counter() - t0

    def run(self, queries: list[str], tops: dict) -> list[float]:
        times = []
        for q in queries:
            t = time.perf_counter()
            hits = self.bm25(self.st, q, 10)
            times.append(time.perf_counter() - t)
            tops[q] = [p for p, _ in hits]
        return times

    def close(self) -> None:
        self.st.close()


# --- the machine -----------------------------------------------------------------


def machine() -> str:
    load = common.load_note()
    return common.machine(f"SQLite {sqlite3.sqlite_version}") + load


# --- the benchmark ---------------------------------------------------------------


def bench(out: str, scale: float, seed: int) -> dict:
    env = clean_env()
    prog = program()
    log(f"corpus: {out} (scale {scale}, seed {seed})")
    t0 = time.monotonic()
    stamp = corpus.generate(out, scale, seed, log=log)
    log(f"corpus ready in {time.monotonic() - t0:.1f}s: {stamp['files']} files, {stamp['threads']} conversations")
    home, agent, state = (os.path.join(out, x) for x in ("home", "agent", "state"))
    with open(os.path.join(out, "queries.json")) as f:
        queries = json.load(f)
    errlog = os.path.join(out, "stderr.log")
    shutil.rmtree(state, ignore_errors=True)
    r: dict = {"stamp": stamp, "queries": len(queries)}

    log("index: full build on a fresh state ...")
    argv = [prog, "index", home, state, agent]
    wall, rc, mem, err = run_timed(argv, env, errlog)
    if rc != 0:
        sys.exit(f"bench: index failed (exit {rc}): {err.strip()[-2000:]}")
    passages, text_bytes, nfiles, gen = read_index(state)
    r.update(index_s=wall, index_mem=mem, text_bytes=text_bytes, indexed_files=nfiles,
             passages=len(passages), index_bytes=os.path.getsize(os.path.join(state, "index", "data.mdb")),
             index_says=err.strip().splitlines()[-1] if err.strip() else "")
    log(f"  {wall:.1f}s, {text_bytes / MB / wall:.2f} MB/s, {len(passages)} passages, "
        f"peak RSS {mem['peak'] / 1024:.0f} MiB; {r['index_says']}")

    log("index: restart on the unchanged tree ...")
    wall, rc, _, err = run_timed(argv, env, errlog)
    reread = files_reread(err)
    r.update(restart_s=wall, restart_reread=reread, restart_gen_same=index_gen(state) == gen, restart_rc=rc)
    r["restart_opened"] = opened_files(argv, env, (home, agent), os.path.join(out, "strace.log"))
    log(f"  {wall:.2f}s, {reread} files re-read, index unchanged: {r['restart_gen_same']}"
        + ("" if r["restart_opened"] is None else f", files opened (strace): {r['restart_opened']}"))

    log(f"serve: time to initialize, {SPAWNS} spawns ...")
    sargv = [prog, "serve", home, state, agent]
    inits = [time_initialize(sargv, env, errlog) for _ in range(SPAWNS)]
    r.update(init_ms=[x * 1000 for x in inits])
    log(f"  median {statistics.median(inits) * 1000:.0f} ms (min {min(inits) * 1000:.0f}, max {max(inits) * 1000:.0f})")

    log(f"serve: search latency through MCP, {ROUNDS} passes ...")
    c = Client(sargv, env, errlog)
    try:
        c.request("initialize", INIT)
        c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        probes = 0
        while True:
            sc, _ = search_call(c, queries[0])
            probes += 1
            if "indexing" not in sc:
                break
            time.sleep(0.02)
        r["serve_ready_s"] = time.perf_counter() - c.t_spawn
        passes, hits = [], {}
        for _ in range(ROUNDS):
            times = []
            for q in queries:
                sc, took = search_call(c, q)
                times.append(took)
                hits[q] = len(sc.get("hits", []))
            passes.append(times)
        r["mcp_passes"] = passes
        r["zero_hit_queries"] = sum(1 for q in queries if hits[q] == 0)
        r["serve_mem"] = c.memory()
    finally:
        c.close()
    log(f"  p50 {pooled(passes, 50):.2f} ms, p99 {pooled(passes, 99):.2f} ms; "
        f"ready after {r['serve_ready_s']:.2f}s ({probes} probes); VmHWM {r['serve_mem'].get('VmHWM', 0) / 1024:.0f} MiB")

    log(f"in-process: SQLite FTS5 build on the same {len(passages)} passages ...")
    fts = Fts5(os.path.join(out, "fts5.db"))
    r["fts5_build_s"] = fts.build(passages)
    log(f"  {r['fts5_build_s']:.1f}s")
    del passages
    gc.collect()
    log(f"in-process: ours and FTS5, {ROUNDS} interleaved passes ...")
    ours = Ours(state)
    tops_o: dict = {}
    tops_f: dict = {}
    r["ours_passes"], r["fts5_passes"] = [], []
    try:
        for _ in range(ROUNDS):
            r["ours_passes"].append(ours.run(queries, tops_o))
            r["fts5_passes"].append(fts.run(queries, tops_f))
    finally:
        ours.close()
        r["fts5_bytes"] = fts.close()
    for k in ("ours", "fts5"):
        ps = r[f"{k}_passes"]
        log(f"  {k}: p50 {pooled(ps, 50):.2f} ms, p99 {pooled(ps, 99):.2f} ms")
    overlaps = []
    for q in queries:
        o, f = set(tops_o.get(q, [])), set(tops_f.get(q, []))
        if o or f:
            overlaps.append(len(o & f) / max(len(o), len(f)))
    r["overlap"] = statistics.mean(overlaps) if overlaps else 0.0
    return r


def ok(b: bool) -> str:
    return "pass" if b else "**FAIL**"


def pooled(passes: list[list[float]], p: float) -> float:
    """The p-th percentile over the queries of each query's median time across passes, in ms.

    The median of a query's passes drops a pass that the machine disturbed
    (other processes on a small VM) without hiding a query that is always slow.
    """
    return pct([statistics.median(xs) for xs in zip(*passes)], p) * 1000


def table(r: dict) -> str:
    s = r["stamp"]
    mbps = r["text_bytes"] / MB / r["index_s"]
    init = statistics.median(r["init_ms"])
    mp50, mp99 = (pooled(r["mcp_passes"], p) for p in (50, 99))
    op50, op99 = (pooled(r["ours_passes"], p) for p in (50, 99))
    fp50, fp99 = (pooled(r["fts5_passes"], p) for p in (50, 99))
    c50, c99 = (pct(r["mcp_passes"][0], p) * 1000 for p in (50, 99))
    sm = r["serve_mem"]
    rss_s = sm.get("VmHWM", 0) / 1024
    im = r["index_mem"]
    rss_i = im["peak"] / 1024
    n = r["queries"]
    rows = [
        ("Full index (fresh state)", f"{r['index_s']:.1f} s", "—", ""),
        ("Indexing throughput", f"{mbps:.2f} MB/s", f"≥ {T_MBPS} MB/s", ok(mbps >= T_MBPS)),
        ("Restart on the unchanged tree", f"{r['restart_s']:.2f} s, {r['restart_reread']} files re-read"
         + ("" if r.get("restart_opened") is None else f", {r['restart_opened']} opened (strace)"),
         "re-reads no file", ok(r["restart_reread"] == 0 and r["restart_gen_same"] and r["restart_rc"] == 0
                                and not r.get("restart_opened"))),
        (f"`initialize` on a built index (median of {len(r['init_ms'])} spawns)",
         f"{init:.0f} ms (min {min(r['init_ms']):.0f}, max {max(r['init_ms']):.0f})", f"< {T_INIT_MS} ms", ok(init < T_INIT_MS)),
        ("Search p50, MCP over a pipe (client-side)", f"{mp50:.2f} ms", f"< {T_P50_MS} ms", ok(mp50 < T_P50_MS)),
        ("Search p99, MCP over a pipe (client-side)", f"{mp99:.2f} ms", f"< {T_P99_MS} ms", ok(mp99 < T_P99_MS)),
        ("Search p50 / p99, ours in-process (`bm25`, limit 10)", f"{op50:.2f} / {op99:.2f} ms", "—", ""),
        ("Search p50 / p99, SQLite FTS5 in-process (`bm25()`, limit 10)", f"{fp50:.2f} / {fp99:.2f} ms", "reference", ""),
        ("Ours ÷ FTS5, p50 (in-process)", f"{op50 / fp50:.2f}×", f"≤ {T_RATIO:g}×", ok(op50 <= T_RATIO * fp50)),
        ("Ours ÷ FTS5, p99 (in-process)", f"{op99 / fp99:.2f}×", f"≤ {T_RATIO:g}×", ok(op99 <= T_RATIO * fp99)),
        ("Peak RSS, `serve` (VmHWM after the searches)",
         f"{rss_s:.0f} MiB (now: {sm.get('RssAnon', 0) / 1024:.0f} anon + {sm.get('RssFile', 0) / 1024:.0f} file-mapped)",
         f"< {T_RSS_MB} MB", ok(rss_s * 1.048576 < T_RSS_MB)),
        ("Peak RSS, `index` (full build, ru_maxrss)",
         f"{rss_i:.0f} MiB (sampled peaks: {im['anon'] / 1024:.0f} anon, {im['file'] / 1024:.0f} file-mapped)",
         f"< {T_RSS_MB} MB", ok(rss_i * 1.048576 < T_RSS_MB)),
        ("FTS5 build (insert + optimize)", f"{r['fts5_build_s']:.1f} s ({r['text_bytes'] / MB / r['fts5_build_s']:.2f} MB/s)", "reference", ""),
    ]
    lines = ["| Figure | Value | Target | Result |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    notes = [
        "",
        f"Corpus: {s['files']} markdown files ({s['home_bytes'] / MB:.1f} MB) and {s['threads']} conversations "
        f"({s['messages']} messages, {s['chat_bytes'] / MB:.1f} MB) from `bench/corpus.py` (seed {s['seed']}, scale {s['scale']:g}); "
        f"{r['indexed_files']} files and {r['text_bytes'] / MB:.1f} MB of text indexed into {r['passages']} passages; "
        f"index {r['index_bytes'] / MB:.0f} MB on disk (`data.mdb`), FTS5 {r['fts5_bytes'] / MB:.0f} MB.",
        "",
        f"Search: {n} queries of 1-4 words ({r['zero_hit_queries']} with no hit), limit 10; each query is timed in "
        f"{len(r['mcp_passes'])} passes and its median taken, then p50 / p99 over the {n} queries (the first MCP pass "
        f"alone: {c50:.2f} / {c99:.2f} ms); "
        f"ours and FTS5 in-process are interleaved pass by pass in one process. "
        f"`serve` answered searches without `indexing` {r['serve_ready_s']:.2f} s after spawn. "
        f"Top-10 overlap with FTS5: {r['overlap'] * 100:.0f}% (FTS5 keeps stop words and does not index file names). "
        f"Wall times include Python's start; the editable install has no `__pycache__` for `lnkmem` (the program "
        f"sets `dont_write_bytecode`), so each spawn compiles it. Restart: \"re-read\" is the program's own count of "
        f"changed files, and the index generation must not move. On a small shared VM, throughput, startup and p99 "
        f"figures move by ±30% from run to run: compare runs on one machine.",
    ]
    return "\n".join(lines + notes)


def code_version() -> str:
    """The commit measured, and whether lnkmem/ had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lnkmem"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" with uncommitted changes in lnkmem/" if dirty else "")


def record(text: str, command: str, when: str, mach: str) -> None:
    common.write_section(SECTION, [
        "## Local engine",
        "",
        f"`{command}` — {when}, code {code_version()}, on {mach}.",
        "",
        text,
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: the local engine's benchmark")
    ap.add_argument("--scale", type=float, default=1.0, help="corpus size (1.0: 10,000 files, ~50 MB; 0.1 for a quick run)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=corpus.DEFAULT_OUT, help="corpus and state folder (default bench/out/local/)")
    ap.add_argument("--record", action="store_true", help="write the table into docs/BENCHMARKS.md")
    ap.add_argument("--json", help="also write the raw figures to this file")
    a = ap.parse_args(argv)
    if not 0 < a.scale <= 10:
        ap.error("--scale: between 0 and 10")
    t0 = time.monotonic()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = machine()
    r = bench(os.path.abspath(a.out), a.scale, a.seed)
    text = table(r)
    common.report(f"lnkmem local engine benchmark, code {code_version()}", when, mach, text, r, t0, a.json)
    if a.record:
        cmd = ".venv/bin/python bench/bench_local.py" + ("" if a.scale == 1.0 else f" --scale {a.scale:g}")
        if a.seed != 7:
            cmd += f" --seed {a.seed}"
        record(text, cmd, when, mach)
        log(f"recorded in {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
