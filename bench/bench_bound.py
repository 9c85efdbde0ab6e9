"""Bound sessions' benchmark (issue 5): `serve-many` against the fake bridges.

Run: ``.venv/bin/python bench/bench_bound.py [--quick] [--record]``

A Home of 1,000 generated markdown files (``bench/corpus.py``'s vocabulary and
writer) lies in the fake files bridge (``<files_root>/homes/a1/``); the fake
storage bridge keeps the copy (``<storage_root>/stores/a1/memory/lnkmem/``);
``LNKMEM_WRITEBACK_S`` is 0.5. Each start is a new ``serve-many`` process, left
idle a moment before the Bound line is sent. Measures:

- Bound line sent -> ``{"ok": true}``, and -> the first search answering with
  no ``indexing`` (searches polled every 20 ms on the bound session), with
  - no copy at all (empty cache, nothing in the storage bridge),
  - a cold cache (empty ``--cache`` folder, the copy present),
  - a warm cache (the ``--cache`` of a previous run that flushed);
- after one changed file (a paragraph appended, then a ``changed`` control):
  the bytes PUT to the storage bridge (its request log) until a ``flush``
  control is answered, vs the copy's total size (the files under
  ``stores/a1/memory/lnkmem/``); the flush control's round trip.

Prints a markdown table with targets and pass/fail; ``--record`` writes it to
the ``bench:bound`` section of ``docs/BENCHMARKS.md``.

``--scale S`` (issue 33) measures the copy at scale instead: the Home is
``bench/corpus.py``'s at scale S (its ``home/`` in the files bridge, its
conversations in the storage bridge), and one ``serve-many`` after another
(``LNKMEM_QUIET_S`` and ``LNKMEM_WRITEBACK_S`` high, so the copy is written
only when asked), VmRSS of ``serve-many`` sampled every 50 ms:

- re-indexing from the sources: an empty cache, no copy: Bound -> nothing
  indexing, and peak RSS;
- the first write-back: a ``flush`` then: its time, peak RSS, bytes PUT, the
  largest file PUT, the copy's size and files;
- 30 changed files (a paragraph appended to each, one ``changed`` each), then a
  ``flush``: bytes PUT (of them the table's pages);
- a cold load: an empty cache, the copy present: Bound -> nothing indexing,
  peak RSS; the cold load against re-indexing (goal: at least 3x faster).

``--record`` writes that table to the ``bench:bound-scale`` section.

``--scale S --again N``: only N cold loads from the copy the last full run left;
``--scale S --reload``: only a newer version loaded while serving (``reload_again``:
one engine serves the cold-loaded cache and is searched while another changes a
file and flushes), printed, not recorded.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
from typing import Optional
import os
import shutil
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE, ROOT  # noqa: E402
from bench_many import Corpus, loadavg, log, machine, record  # noqa: E402
from tests.bridges import KEY, OTHER_KEY, Bridges  # noqa: E402
from tests.helpers import Many, deleted_indexes  # noqa: E402

OUT = os.path.join(HERE, "out", "bound")
WRITEBACK_S = "0.5"
T_BYTES_PCT = 5.0

FULL = dict(files=1000, warm=5, cold=5, nocopy=3, changes=10)
QUICK = dict(files=300, warm=1, cold=1, nocopy=1, changes=3)


class Run:
    """One serve-many process for the bound agent a1."""

    def __init__(self, base: Path, br: Bridges, cache: Path, name: str):
        env = {"LNKMEM_WRITEBACK_S": WRITEBACK_S}
        self.br = br
        self.m = Many(base / name / "mem.sock", {}, br.flags() + ["--cache", str(cache), "--stay"], env=env)
        if self.m.proc.poll() is not None:
            raise RuntimeError(f"serve-many did not start: {self.m.stderr()[-2000:]}")
        time.sleep(0.5)  # idle: the Bound line is timed, not the process start
        self.c = None

    def bind(self) -> tuple:
        """(seconds to ok, seconds to the first search with nothing indexing, polls)."""
        c = self.c = self.m.connect(timeout=300)
        t0 = time.perf_counter()
        r = c.first(self.br.bound())
        t_ok = time.perf_counter() - t0
        if r != {"ok": True}:
            raise RuntimeError(f"Bound: {r}")
        polls = 0
        while True:
            polls += 1
            sc = c.search("zzzzprobe")["structuredContent"]
            if "indexing" not in sc:
                break
            time.sleep(0.02)
        return t_ok, time.perf_counter() - t0, polls

    def control(self, obj: dict) -> float:
        return control(self.m, obj, timeout=300)

    def flush(self) -> float:
        return self.control({"flush": {"owner": "o1", "agent": "a1"}})

    def stop(self) -> None:
        if self.c is not None:
            self.c.close()
        if self.m.stop() != 0:
            log(self.m.stderr()[-3000:])


def copy_dir(br: Bridges) -> Path:
    return br.storage_root / "stores" / "a1" / "memory" / "lnkmem"


def copy_size(br: Bridges) -> tuple:
    d = copy_dir(br)
    files = [p for p in d.iterdir() if p.is_file()] if d.exists() else []
    return sum(p.stat().st_size for p in files), len(files)


def start(base, br, cache, name, label, r) -> Run:
    run = Run(base, br, cache, name)
    t_ok, t_ready, polls = run.bind()
    r.setdefault(label, []).append((t_ok, t_ready))
    log(f"  {label}: ok {t_ok * 1e3:.1f} ms, nothing indexing {t_ready * 1e3:.0f} ms ({polls} polls)")
    return run


def bench(P: dict) -> dict:
    base = Path(OUT)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    br = Bridges(base / "link", bindings={"a1": {"owner": "o1", "key": KEY}, "a2": {"owner": "o1", "key": OTHER_KEY}})
    br.write_home("notes/one.md", "A second agent's Home, with one file.\n", agent="a2")
    r: dict = {"P": P, "load": [loadavg()]}
    try:
        cp = Corpus(seed=23)
        r["home_bytes"] = cp.home(br.home("a1"), P["files"])
        homefiles = sorted(p for p in br.home("a1").rglob("*.md"))
        log(f"Home: {len(homefiles)} files, {r['home_bytes'] / 1e6:.1f} MB")
        warm_cache = base / "cache-warm"

        # no copy: index the sources through the bridge and create the copy
        run = start(base, br, warm_cache, "n0", "nocopy", r)
        br.storage.request("DELETE", "/_log")
        t = time.perf_counter()
        run.flush()
        r["first_flush"] = time.perf_counter() - t
        r["first_flush_bytes"] = sum(e["size"] for e in br.storage.log()
                                     if e["method"] == "PUT" and "/lnkmem/" in e["path"])
        r["copy_first"] = copy_size(br)
        log(f"  first flush {r['first_flush'] * 1e3:.0f} ms; copy {r['copy_first'][0] / 1e6:.2f} MB "
            f"in {r['copy_first'][1]} files")

        # one changed file: bytes written back, and the flush's round trip
        r["changes"] = []
        time.sleep(1.0)  # let the write-back loop settle (quiet, clean)
        for i in range(P["changes"]):
            f = homefiles[(i * 97 + 13) % len(homefiles)]
            ref = "home/" + f.relative_to(br.home("a1")).as_posix()
            word = f"zanzibarquokka{i}"
            br.storage.request("DELETE", "/_log")
            with open(f, "a") as fh:
                fh.write(f"\n\nA late paragraph on the {word}, added by the benchmark.\n")
            t_changed = run.control({"changed": {"owner": "o1", "agent": "a1", "path": ref}})
            t_flush = run.flush()
            entries = br.storage.log()
            puts = [e for e in entries if e["method"] == "PUT" and "/lnkmem/" in e["path"]]
            put_bytes = sum(e["size"] for e in puts)
            manifests = [e for e in puts if e["path"].endswith("manifest.json")]
            span = (max(e["time"] for e in puts) - min(e["time"] for e in puts)) if puts else 0.0
            total, nfiles = copy_size(br)
            hits = [h["ref"] for h in run.c.search(word)["structuredContent"]["hits"]]
            if hits[:1] != [ref]:
                raise RuntimeError(f"the changed file is not found: {word} -> {hits}")
            kinds: dict = {}
            for e in puts:
                k = e["path"].rsplit("/", 1)[-1].split("-", 1)[0].split(".", 1)[0]
                kinds[k] = kinds.get(k, 0) + e["size"]
            r["changes"].append(dict(changed=t_changed, flush=t_flush, bytes=put_bytes, puts=len(puts),
                                     writebacks=len(manifests), span=span, total=total, files=nfiles,
                                     kinds=kinds))
            log(f"  change {i}: changed {t_changed * 1e3:.1f} ms, flush {t_flush * 1e3:.1f} ms, "
                f"{put_bytes} B in {len(puts)} PUTs ({len(manifests)} write-backs, {kinds}) "
                f"of {total} B ({nfiles} files): {100 * put_bytes / total:.2f}%")
            time.sleep(0.6)
        run.flush()
        run.stop()

        # warm: the same cache, the copy unchanged since it flushed
        for k in range(P["warm"]):
            run = start(base, br, warm_cache, f"w{k}", "warm", r)
            with run.m.connect() as again:  # the binding is held: a new session of it
                t = time.perf_counter()
                if again.first(br.bound()) != {"ok": True}:
                    raise RuntimeError("a second Bound line was refused")
                r.setdefault("again", []).append(time.perf_counter() - t)
            with run.m.connect() as other:  # another agent's first Bound line, in a process past its first
                t = time.perf_counter()
                if other.first(br.bound(agent="a2", key=OTHER_KEY)) != {"ok": True}:
                    raise RuntimeError("agent a2's Bound line was refused")
                r.setdefault("second_agent", []).append(time.perf_counter() - t)
            run.stop()

        # cold: an empty cache, the copy present
        for k in range(P["cold"]):
            start(base, br, base / f"cache-cold{k}", f"c{k}", "cold", r).stop()

        # no copy at all again (and an empty cache)
        for k in range(1, P["nocopy"]):
            shutil.rmtree(copy_dir(br))
            start(base, br, base / f"cache-none{k}", f"n{k}", "nocopy", r).stop()
    finally:
        br.stop()
    r["load"].append(loadavg())
    return r


def ok(b: bool) -> str:
    return "pass" if b else "**FAIL**"


def ms(x: float) -> str:
    return f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}"


def row_times(label: str, xs: list) -> list:
    oks, readys = [a for a, _ in xs], [b for _, b in xs]
    n = len(xs)
    agg = "median" if n > 1 else "one run"
    return [
        f"| Bound → `ok`, {label} ({agg} of {n}) | {ms(statistics.median(oks))} ms "
        f"({', '.join(ms(x) for x in oks)}) | — |  |",
        f"| Bound → first search with nothing indexing, {label} ({agg} of {n}) | {ms(statistics.median(readys))} ms "
        f"({', '.join(ms(x) for x in readys)}) | — |  |",
    ]


def table(r: dict) -> str:
    P = r["P"]
    ch = r["changes"]
    pcts = [100 * c["bytes"] / c["total"] for c in ch]
    worst = max(pcts)
    flushes = [c["flush"] for c in ch]
    acked = [c["changed"] + c["flush"] for c in ch]
    kinds: dict = {}
    for c in ch:
        for k, v in c["kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
    kinds_txt = ", ".join(f"{k} {v / len(ch) / 1e3:.1f} kB" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    total = statistics.median(c["total"] for c in ch)
    each_kb = ", ".join(f"{c['bytes'] / 1e3:.1f}" for c in ch)
    wbs = [c["writebacks"] for c in ch]
    rows = ["| Figure | Value | Target | Result |", "|---|---|---|---|"]
    rows += row_times("warm cache", r["warm"])
    rows += row_times("cold cache, copy present", r["cold"])
    rows += row_times("no copy at all", r["nocopy"])
    rows += [f"| Bound → `ok`, the binding already held (a second session; median of {len(r['again'])}) "
             f"| {ms(statistics.median(r['again']))} ms | — |  |",
             f"| Bound → `ok`, another agent's first Bound line in a process that has bound one "
             f"(median of {len(r['second_agent'])}) | {ms(statistics.median(r['second_agent']))} ms | — |  |"]
    rows += [
        f"| Bytes written back after one changed file (median; each of {len(ch)}) "
        f"| {statistics.median(c['bytes'] for c in ch) / 1e3:.1f} kB "
        f"({each_kb}) | — |  |",
        f"| … as a share of the copy ({total / 1e6:.2f} MB in {ch[-1]['files']} files), worst of {len(ch)} "
        f"| {worst:.2f} % (median {statistics.median(pcts):.2f} %) | < {T_BYTES_PCT:g} % | {ok(worst < T_BYTES_PCT)} |",
        f"| Write-back: `flush` round trip after one change (median / max) | {ms(statistics.median(flushes))} / "
        f"{ms(max(flushes))} ms | — |  |",
        f"| One change acknowledged in the copy: `changed` + `flush` round trips (median / max) "
        f"| {ms(statistics.median(acked))} / {ms(max(acked))} ms | — |  |",
        f"| `flush` right after the first index (no copy before) | {ms(r['first_flush'])} ms "
        f"({r['first_flush_bytes'] / 1e6:.2f} MB PUT during it; the copy then {r['copy_first'][0] / 1e6:.2f} MB "
        f"in {r['copy_first'][1]} files) | — |  |",
    ]
    notes = [
        "",
        f"Home: {P['files']} generated markdown files, {r['home_bytes'] / 1e6:.1f} MB, in the fake files bridge; the copy "
        f"in the fake storage bridge's `memory` collection; the local cache under `--cache`; words ranking (no "
        f"model); `LNKMEM_WRITEBACK_S={WRITEBACK_S}`. Times are client-side from the Bound line's send; each start "
        f"is a fresh `serve-many` (idle 0.5 s first); \"nothing indexing\" polls `search` every 20 ms. Warm: the "
        f"`--cache` of the run that created and flushed the copy; cold: an empty `--cache`, the copy in the bridge; "
        f"no copy: an empty `--cache` and no copy (the first run, then the copy deleted). Bytes: the storage bridge's "
        f"log of PUT bodies below `lnkmem/` from the file's change to the `flush` answer (a paragraph appended to one "
        f"file, then a `changed` control, then `flush`; write-backs in that window: {', '.join(map(str, wbs))}; "
        f"the loop starts writing as soon as it is told of the change, so the `flush` mostly waits for that write "
        f"to finish; \"`changed` + `flush`\" is the change's whole way into the copy), by kind per change: {kinds_txt}; the copy's size is every file "
        f"under `stores/a1/memory/lnkmem/` after the flush. Load average (1 min) at the start / end: "
        f"{r['load'][0]:.2f} / {r['load'][1]:.2f}.",
    ]
    if statistics.median(r["second_agent"]) > 0.03:
        notes += ["", "Why Bound → `ok` takes tens of ms even warm (profiled 2026-12-02): a new binding makes one "
                  "`httpx.Client` per bridge, and `httpx.HTTPTransport(uds=...)` with the default `verify=True` "
                  "loads the CA bundle into an SSL context, 20–35 ms each, for HTTP over a Unix socket that never "
                  "uses TLS; `verify=False` (or one shared context) would save most of it. A second session of a "
                  "held binding needs none of it."]
    return "\n".join(rows + notes)


# --- the copy at scale (issue 33) ----------------------------------------------------------

SCALE_ENV = {"LNKMEM_WRITEBACK_S": "3600", "LNKMEM_QUIET_S": "3600"}
CHANGED = 30


def place_corpus(scale: float, br: Bridges) -> dict:
    """bench/corpus.py's Home at ``scale`` (made once, kept in bench/out/) placed in the
    fake bridges (copied: the bench changes files): home/ as a1's Home, agent/chats/ as its conversations."""
    import corpus
    src = os.path.join(HERE, "out", f"corpus-{scale:g}")
    stamp = corpus.generate(src, scale, 7, log=log)
    home, convs = br.home("a1"), br.store("conversations")
    n = 0
    for top, dst in ((os.path.join(src, "home"), home), (os.path.join(src, "agent", "chats"), convs)):
        for d, _, names in os.walk(top):
            rel = os.path.relpath(d, top)
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            for name in names:
                shutil.copyfile(os.path.join(d, name), os.path.join(dst, rel, name))
                n += 1
    return {"files": n, "stamp": stamp}


def scale_run(base: Path, br: Bridges, cache: Path, name: str, env: Optional[dict] = None):
    m = Many(base / name / "mem.sock", {}, br.flags() + ["--cache", str(cache), "--stay"], env={**SCALE_ENV, **(env or {})})
    if m.proc.poll() is not None:
        raise RuntimeError(f"serve-many did not start: {m.stderr()[-2000:]}")
    time.sleep(0.5)
    return m, common.MemorySampler(m.proc.pid, every=0.05)


def ready(m, br: Bridges) -> tuple:
    """Bound line -> the first search with nothing indexing: (seconds, the session)."""
    c = m.connect(timeout=3600)
    t0 = time.perf_counter()
    r = c.first(br.bound())
    if r != {"ok": True}:
        raise RuntimeError(f"Bound: {r}")
    while "indexing" in c.search("zzzzprobe")["structuredContent"]:
        time.sleep(0.05)
    return time.perf_counter() - t0, c


def control(m, obj: dict, timeout: float = 3600) -> float:
    """Send one control line to `serve-many` ``m``; the seconds its `ok` took."""
    with m.connect(timeout=timeout) as ctl:
        t0 = time.perf_counter()
        r = ctl.first(obj)
        dt = time.perf_counter() - t0
    if r != {"ok": True}:
        raise RuntimeError(f"{obj}: {r}")
    return dt


def copy_puts(br: Bridges) -> list:
    return [e for e in br.storage.log() if e["method"] == "PUT" and "/lnkmem/" in e["path"] and e["status"] in (200, 201)]


def bench_scale(scale: float) -> dict:
    base = Path(OUT + f"-scale-{scale:g}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    br = Bridges(base / "link", bindings={"a1": {"owner": "o1", "key": KEY}})
    r: dict = {"scale": scale, "load": [loadavg()]}
    flush = {"flush": {"owner": "o1", "agent": "a1"}}
    try:
        placed = place_corpus(scale, br)
        r["files"] = placed["files"]
        r["home_bytes"] = sum(p.stat().st_size for p in br.home("a1").rglob("*") if p.is_file())
        log(f"scale {scale:g}: {r['files']} files, {r['home_bytes'] / 1e6:.1f} MB")
        # re-indexing from the sources: no copy, an empty cache
        m, rss = scale_run(base, br, base / "cache-a", "a")
        r["reindex_rss_before"] = rss.mark().get("VmRSS", 0) * 1024
        r["reindex_s"], c = ready(m, br)
        r["reindex_rss"] = rss.peak("VmRSS") * 1024
        r["reindex_anon"] = rss.peak("RssAnon") * 1024
        log(f"  re-index {r['reindex_s']:.1f} s, peak RSS {r['reindex_rss'] / 2**20:.0f} MiB")
        # the first write-back
        br.storage.request("DELETE", "/_log")
        before = rss.mark()
        r["wb_rss_before"] = before.get("VmRSS", 0) * 1024
        r["wb_anon_before"] = before.get("RssAnon", 0) * 1024
        r["wb_s"] = control(m, flush)
        r["wb_rss"] = rss.peak("VmRSS") * 1024
        r["wb_anon"] = rss.peak("RssAnon") * 1024
        p = copy_puts(br)
        r["wb_bytes"] = sum(e["size"] for e in p)
        r["wb_largest"] = max(e["size"] for e in p)
        r["copy_bytes"], r["copy_files"] = copy_size(br)
        log(f"  first write-back {r['wb_s']:.1f} s, RSS {r['wb_rss_before'] / 2**20:.0f} -> "
            f"{r['wb_rss'] / 2**20:.0f} MiB (anonymous {r['wb_anon_before'] / 2**20:.0f} -> {r['wb_anon'] / 2**20:.0f}), "
            f"{r['wb_bytes'] / 1e6:.1f} MB PUT, largest {r['wb_largest'] / 1e6:.1f} MB")
        # 30 changed files, then a flush
        homefiles = sorted(p for p in br.home("a1").rglob("*.md"))
        br.storage.request("DELETE", "/_log")
        for i in range(CHANGED):
            f = homefiles[(i * 7919 + 13) % len(homefiles)]
            with open(f, "a") as fh:
                fh.write(f"\n\nA late paragraph on the zanzibarquokka{i}, added by the benchmark.\n")
            control(m, {"changed": {"owner": "o1", "agent": "a1", "path": "home/" + f.relative_to(br.home("a1")).as_posix()}})
        while "zanzibarquokka29" not in json.dumps(c.search("zanzibarquokka29")["structuredContent"]) \
                and "indexing" in c.search("zzzzprobe")["structuredContent"]:
            time.sleep(0.1)
        r["change_flush_s"] = control(m, flush)
        p = copy_puts(br)
        r["change_bytes"] = sum(e["size"] for e in p)
        r["change_pages"] = sum(e["size"] for e in p if "/lnkmem/page-" in e["path"])
        r["change_puts"] = len(p)
        log(f"  {CHANGED} changed files: {r['change_bytes'] / 1e6:.2f} MB PUT ({r['change_pages'] / 1e6:.2f} MB "
            f"of pages) in {len(p)} PUTs, flush {r['change_flush_s']:.1f} s")
        c.close()
        rss.stop()
        m.stop()
        r["copy_after_bytes"], r["copy_after_files"] = copy_size(br)
        # a cold load: an empty cache, the copy present
        br.storage.request("DELETE", "/_log")
        br.files.request("DELETE", "/_log")
        m, rss = scale_run(base, br, base / "cache-b", "b")
        r["cold_rss_before"] = rss.mark().get("VmRSS", 0) * 1024
        r["cold_s"], c = ready(m, br)
        r["cold_rss"] = rss.peak("VmRSS") * 1024
        r["cold_anon"] = rss.peak("RssAnon") * 1024
        r["cold_gets"] = sum(1 for e in br.storage.log() if e["method"] == "GET" and "/lnkmem/" in e["path"])
        r["cold_reads"] = sum(1 for e in br.files.log() if "/v1/read" in e["path"])  # sources read again: 0
        log(f"  cold load {r['cold_s']:.1f} s, peak RSS {r['cold_rss'] / 2**20:.0f} MiB (anonymous {r['cold_anon'] / 2**20:.0f})")
        c.close()
        rss.stop()
        m.stop()
    finally:
        br.stop()
    r["load"].append(loadavg())
    return r


def settled(pid: int, quiet_s: float = 5.0, most_s: float = 900.0) -> float:
    """Seconds until process ``pid`` used under 2 % of a core for ``quiet_s`` (its
    background work done: the merges after a load), at most ``most_s``."""
    def cpu() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < most_s:
        a = cpu()
        time.sleep(quiet_s)
        if cpu() - a < 0.02 * quiet_s:
            return time.perf_counter() - t0 - quiet_s
    return time.perf_counter() - t0


def cold_again(scale: float, runs: int = 1) -> dict:
    """Only the cold load, again, from the copy that the last full run at ``scale`` left in
    bench/out (its Home and copy kept there; each run a new empty cache): the time and peak
    RSS a change of the load makes, without the re-index and write-back (at 10x: 12 min)."""
    base = Path(OUT + f"-scale-{scale:g}")
    if not (base / "link").is_dir():
        raise SystemExit(f"no copy left at {base}: run --scale {scale:g} once first")
    br = Bridges(base / "link", bindings={"a1": {"owner": "o1", "key": KEY}})
    r: dict = {"scale": scale, "load": [loadavg()], "cold": []}
    try:
        for k in range(runs):
            cache = base / f"cache-again{k}"
            shutil.rmtree(cache, ignore_errors=True)
            m, rss = scale_run(base, br, cache, f"again{k}")
            before = rss.mark().get("VmRSS", 0) * 1024
            s, c = ready(m, br)
            one = {"s": s, "rss": rss.peak("VmRSS") * 1024, "anon": rss.peak("RssAnon") * 1024, "rss_before": before}
            # then the merges the load's segments ask for, until the process is idle
            rss.mark()
            one["settle_s"] = settled(m.proc.pid)
            one["settle_rss"] = rss.peak("VmRSS") * 1024
            r["cold"].append(one)
            log(f"  cold load {s:.1f} s, peak RSS {one['rss'] / 2**20:.0f} MiB (anonymous {one['anon'] / 2**20:.0f}); "
                f"then idle after {one['settle_s']:.0f} s more, peak RSS meanwhile {one['settle_rss'] / 2**20:.0f} MiB")
            c.close()
            rss.stop()
            m.stop()
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        br.stop()
    r["load"].append(loadavg())
    return r


RECHECK_S = 3  # the serving engine's look at the copy's version (LNKMEM_RECHECK_S) in reload_again


def reload_again(scale: float) -> dict:
    """A newer version of the copy loaded while serving, from what the last full run at
    ``scale`` left in bench/out: one engine serves the cold-loaded cache (``cache-b``,
    looking at the copy's version every RECHECK_S s) and is searched all along; another,
    on the writer's cache (``cache-a``), changes one file and flushes; the first loads
    that version beside its cache and serves it in its place. Measured on the first:
    the flush's answer → a search finding the changed file, peak RSS meanwhile, what it
    holds after, searches that failed, unlinked index files it still holds."""
    base = Path(OUT + f"-scale-{scale:g}")
    if not (base / "cache-a").is_dir() or not (base / "cache-b").is_dir():
        raise SystemExit(f"no caches left at {base}: run --scale {scale:g} once first")
    br = Bridges(base / "link", bindings={"a1": {"owner": "o1", "key": KEY}})
    r: dict = {"scale": scale, "load": [loadavg()]}
    flush = {"flush": {"owner": "o1", "agent": "a1"}}
    word = f"zanzibarwalrus{int(time.time())}"
    try:
        m, rss = scale_run(base, br, base / "cache-b", "reader", {"LNKMEM_RECHECK_S": str(RECHECK_S)})
        r["serve_s"], c = ready(m, br)
        log(f"  serving the cold-loaded cache after {r['serve_s']:.1f} s")
        w, wrss = scale_run(base, br, base / "cache-a", "writer")
        ready(w, br)[1].close()
        f = sorted(br.home("a1").rglob("*.md"))[4242 % 1000]
        with open(f, "a") as fh:
            fh.write(f"\n\nA later paragraph on the {word}, added by the benchmark.\n")
        control(w, {"changed": {"owner": "o1", "agent": "a1", "path": "home/" + f.relative_to(br.home("a1")).as_posix()}})
        time.sleep(1)
        control(w, flush)
        wrss.stop()
        w.stop()
        before = rss.mark()
        r["rss_before"], r["anon_before"] = before.get("VmRSS", 0) * 1024, before.get("RssAnon", 0) * 1024
        t0 = time.perf_counter()
        searches = failed = 0
        while time.perf_counter() - t0 < 1800:
            searches += 1
            try:
                if word in json.dumps(c.search(word)["structuredContent"]):
                    break
            except Exception:
                failed += 1
            time.sleep(0.2)
        else:
            raise RuntimeError("the newer version was never served")
        r["reload_s"] = time.perf_counter() - t0
        r["reload_rss"], r["reload_anon"] = rss.peak("VmRSS") * 1024, rss.peak("RssAnon") * 1024
        r["searches"], r["failed"] = searches, failed
        # then what the new version asks for (the loaded segments' merges), until the process is idle
        rss.mark()
        r["settle_s"] = settled(m.proc.pid)
        r["settle_rss"], r["settle_anon"] = rss.peak("VmRSS") * 1024, rss.peak("RssAnon") * 1024
        after = rss.mark()
        r["rss_after"], r["anon_after"] = after.get("VmRSS", 0) * 1024, after.get("RssAnon", 0) * 1024
        r["deleted_held"] = len(deleted_indexes(m.proc.pid))
        r["beside_left"] = os.path.lexists(base / "cache-b" / "o1" / "a1" / "index.next")
        mib = 2 ** 20
        log(f"  the newer version served {r['reload_s']:.1f} s after the flush; RSS {r['rss_before'] / mib:.0f} -> "
            f"peak {r['reload_rss'] / mib:.0f} MiB (anonymous {r['anon_before'] / mib:.0f} -> {r['reload_anon'] / mib:.0f}), "
            f"then idle {r['settle_s']:.0f} s later, peak meanwhile {r['settle_rss'] / mib:.0f} ({r['settle_anon'] / mib:.0f}), "
            f"after {r['rss_after'] / mib:.0f} ({r['anon_after'] / mib:.0f}); {searches} searches meanwhile, {failed} failed; "
            f"unlinked index files held {r['deleted_held']}")
        c.close()
        rss.stop()
        m.stop()
    finally:
        br.stop()
    r["load"].append(loadavg())
    return r


def table_scale(rs: list) -> str:
    mib = 2 ** 20
    head = "| | " + " | ".join(f"{r['scale']:g}× ({r['files']} files, {r['home_bytes'] / 1e6:.0f} MB)" for r in rs) + " |"
    rows = [head, "|---|" + "---|" * len(rs)]

    def row(label, f):
        rows.append(f"| {label} | " + " | ".join(f(r) for r in rs) + " |")
    row("re-indexing from the sources: time, peak RSS", lambda r: f"{r['reindex_s']:.1f} s, {r['reindex_rss'] / mib:.0f} MiB")
    row("first write-back (`flush`): time, RSS before → peak (anonymous)", lambda r: f"{r['wb_s']:.1f} s, "
        f"{r['wb_rss_before'] / mib:.0f} → {r['wb_rss'] / mib:.0f} MiB"
        + (f" ({r['wb_anon_before'] / mib:.0f} → {r['wb_anon'] / mib:.0f})" if "wb_anon" in r else ""))
    row("… bytes PUT, largest file PUT", lambda r: f"{r['wb_bytes'] / 1e6:.1f} MB, {r['wb_largest'] / 1e6:.1f} MB")
    row("… the copy: size, files", lambda r: f"{r['copy_bytes'] / 1e6:.1f} MB, {r['copy_files']}")
    row(f"{CHANGED} changed files, then `flush`: bytes PUT (table pages)", lambda r: f"{r['change_bytes'] / 1e6:.2f} MB "
        f"({r['change_pages'] / 1e6:.2f}) in {r['change_puts']} PUTs")
    row("cold load (empty cache, copy present): ready after, peak RSS (anonymous)", lambda r: f"{r['cold_s']:.1f} s, "
        f"{r['cold_rss'] / mib:.0f} MiB" + (f" ({r['cold_anon'] / mib:.0f})" if "cold_anon" in r else ""))
    row("… files GET from the copy; files read from the sources", lambda r: f"{r['cold_gets']}; "
        f"{r.get('cold_reads', '?')}")
    row("cold load vs re-indexing (goal ≥ 3×)", lambda r: f"{r['reindex_s'] / r['cold_s']:.1f}× "
        f"{ok(r['reindex_s'] >= 3 * r['cold_s'])}")
    row("peak RSS of write-back / cold load (goal ≤ 300 MiB at 10×)", lambda r: f"{r['wb_rss'] / mib:.0f} / "
        f"{r['cold_rss'] / mib:.0f} MiB")
    row("load average (1 min) at start / end", lambda r: f"{r['load'][0]:.1f} / {r['load'][1]:.1f}")
    notes = ["", "Each column one run: `serve-many` against the fake bridges over Unix sockets, "
             "`LNKMEM_QUIET_S`/`LNKMEM_WRITEBACK_S` 3600 (the copy written only on `flush`), words ranking (no model); "
             "RSS: `VmRSS` of `serve-many` every 50 ms; \"ready\": Bound line sent → the first search with nothing "
             "indexing; bytes: the storage bridge's log of PUT bodies below `lnkmem/`."]
    return "\n".join(rows + notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: bound sessions' benchmark")
    ap.add_argument("--quick", action="store_true", help="a 300-file Home, one start of each kind")
    ap.add_argument("--record", action="store_true", help="write the table into docs/BENCHMARKS.md")
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--scale", type=float, action="append", metavar="S",
                    help="the copy at scale S of bench/corpus.py instead (repeatable: 0.25, 1, 4, 10)")
    ap.add_argument("--again", type=int, metavar="N",
                    help="with --scale: only N cold loads, from the copy the last full run at that scale left")
    ap.add_argument("--reload", action="store_true",
                    help="with --scale: only a newer version loaded while serving, from what the last full run left")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = machine()
    if a.reload:
        for s in a.scale or []:
            r = reload_again(s)
            print(json.dumps(r))
        return 0
    if a.again:
        for s in a.scale or []:
            r = cold_again(s, a.again)
            print(f"scale {s:g}: cold load " + ", ".join(f"{c['s']:.1f} s / {c['rss'] / 2**20:.0f} MiB, idle "
                                                        f"{c['settle_s']:.0f} s later / {c['settle_rss'] / 2**20:.0f} MiB"
                                                        for c in r["cold"]) + f" (load {r['load']})")
        return 0
    if a.scale:
        rs = [bench_scale(s) for s in a.scale]
        text = table_scale(rs)
        common.report("lnkmem bound copy at scale", when, mach, text, {"runs": rs}, t0, a.json)
        if a.record:
            import subprocess
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip() or "?"
            cmd = ".venv/bin/python bench/bench_bound.py" + "".join(f" --scale {s:g}" for s in a.scale)
            record(text, cmd, when, mach, "bound-scale", "Bound copy at scale", commit)
            log("recorded in docs/BENCHMARKS.md")
        return 0
    r = bench(QUICK if a.quick else FULL)
    text = table(r)
    common.report("lnkmem bound sessions benchmark", when, mach, text, r, t0, a.json)
    if a.record:
        cmd = ".venv/bin/python bench/bench_bound.py" + (" --quick" if a.quick else "")
        record(text, cmd, when, mach, "bound", "Bound sessions: the copy, its cache and write-back")
        log("recorded in docs/BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
