"""A team's copy: one writer, N readers (issue 45). `serve-many` against the fake bridges.

Run: ``.venv/bin/python bench/bench_team.py --scale 1 [--scale 4 ...] [--readers N] [--versions V] [--record]``

The team folder's ``memory/`` holds ``bench/corpus.py``'s Home at scale S (in the fake
files bridge); the team's copy lives in the fake storage bridge. One writer (its own
``serve-many`` and cache, ``writes: true``) indexes it and flushes the first copy; N
readers (each its own ``serve-many`` and cache, ``writes: false``, re-checking the
copy every ``LNKMEM_RECHECK_S`` = 2 s) load it cold. Then V one-file versions: the
writer appends a paragraph with a word of its own to one file, is told (``changed``),
and flushes. Measured per version, from the bridges' request logs and /proc:

- the writer's PUTs (files, bytes);
- each reader's GETs of the copy (files, bytes: the manifest's 200s and every file),
  and its listings of the team folder (requests, bytes answered);
- flush answered -> the reader's search finds the word (the re-check's wait included:
  up to 2 s), and that time less the wait for its re-check (from the reader's manifest
  GET that answered 200 to the word found);
- the reader's RSS idle before the version -> its peak meanwhile (sampled every 50 ms).

Also the first copy: bytes the writer PUT for it against the copy's size (goal: at
most 1.2x), and the readers' idle re-checks: a minute's worth of 304s moving no listing.

With ``--writers 2``, then a second writer (its own ``serve-many`` and cache) joins; it
writes a one-file version, and the first writer, one version behind, writes another:
its write-back meets a 412, and what it fetches for it is measured (files, bytes, its
listings, the flush's time); then the first writer is stopped, the second writes once
more, and the first is started again one version behind: what it fetches until it
answers the new word.

Prints a markdown table; ``--record`` writes it to the ``bench:team`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE, ROOT  # noqa: E402
from bench_bound import control  # noqa: E402
from bench_many import loadavg, log, machine, record  # noqa: E402
from tests.bridges import KEY, Bridges  # noqa: E402
from tests.helpers import Many  # noqa: E402

OUT = os.path.join(HERE, "out", "team")
RECHECK_S = 2.0
ENV = {"LNKMEM_WRITEBACK_S": "3600", "LNKMEM_QUIET_S": "3600"}


def key(i: int) -> str:
    return KEY if i == 0 else f"{i:02x}" * 32


def agents(n_readers: int) -> list[str]:
    return [f"a{i + 1}" for i in range(n_readers + 1)]  # a1 writes, the others read


def team_line(br: Bridges, agent: str, i: int, writes: bool) -> dict:
    first = br.bound(agent=agent, owner="o1", key=key(i), notes=None)
    first["team"] = {"id": "t1", "named": "crew", "writes": writes}
    return first


def place(scale: float, br: Bridges) -> int:
    import corpus
    src = os.path.join(HERE, "out", f"corpus-{scale:g}")
    corpus.generate(src, scale, 7, log=log)
    dst = br.team_folder("t1") / "memory"
    n = 0
    for d, _, names in os.walk(os.path.join(src, "home")):
        rel = os.path.relpath(d, os.path.join(src, "home"))
        os.makedirs(dst / rel, exist_ok=True)
        for name in names:
            shutil.copyfile(os.path.join(d, name), dst / rel / name)
            n += 1
    return n


def ready(c, line: dict) -> float:
    t0 = time.perf_counter()
    r = c.first(line)
    if r != {"ok": True}:
        raise RuntimeError(f"Bound: {r}")
    while "indexing" in c.search("zzzzprobe")["structuredContent"]:
        time.sleep(0.05)
    return time.perf_counter() - t0


def found(c, word: str) -> bool:
    return word in json.dumps(c.search(word)["structuredContent"])


def copy_size(br: Bridges) -> tuple[int, int]:
    d = br.team_copy("t1")
    files = [p for p in d.iterdir() if p.is_file()] if d.exists() else []
    return sum(p.stat().st_size for p in files), len(files)


def gets_of(br: Bridges, agent: str) -> tuple[int, int]:
    """(files, bytes) of the copy ``agent`` fetched (GETs answered 200)."""
    es = [e for e in br.storage.log() if e.get("agent") == agent and e["method"] == "GET"
          and "/lnkmem/" in e["path"] and e["status"] == 200]
    return len(es), sum(e.get("sent") or 0 for e in es)


def lists_of(br: Bridges, agent: str) -> tuple[int, int]:
    es = [e for e in br.files.log() if e.get("agent") == agent and e["path"].startswith("/v1/list")]
    return len(es), sum(e.get("sent") or 0 for e in es)


def append(br: Bridges, files: list, n: int, word: str) -> str:
    """A paragraph with ``word`` appended to the team folder's n-th file; its path below memory/."""
    f = files[(n * 7919 + 13) % len(files)]
    with open(f, "a") as fh:
        fh.write(f"\n\nA late paragraph on the {word}, added by the benchmark.\n")
    return f.relative_to(br.team_folder("t1") / "memory").as_posix()


def second_writer(br: Bridges, base: Path, w, cw, files: list, names: list, running: list) -> dict:
    """A writer's 412 and its restart one version behind: what it fetches for each."""
    out: dict = {}
    a2 = names[-1]  # (granted like the readers; its own serve-many and cache, writing)
    m2 = Many(base / "w2" / "mem.sock", {}, br.flags() + ["--cache", str(base / "cache-w2"), "--stay"], env=ENV)
    running.append(m2)
    c2 = m2.connect(timeout=3600)
    ready(c2, team_line(br, a2, len(names) - 1, True))
    for who, m, c, agent, n in ((a2, m2, c2, a2, 1001), ("a1", w, cw, "a1", 1002)):
        word = f"quokkawriter{n}"
        control(m, {"changed": {"owner": "o1", "agent": agent, "path": append(br, files, n, word), "team": "t1"}})
        while not found(c, word):
            time.sleep(0.05)
        br.storage.request("DELETE", "/_log")
        br.files.request("DELETE", "/_log")
        t = time.perf_counter()
        control(m, {"flush": {"owner": "o1", "agent": agent}})
        out[f"flush_{who}_s"] = time.perf_counter() - t
    out["w412_gets"], out["w412_lists"] = gets_of(br, "a1"), lists_of(br, "a1")
    out["w412_conflicts"] = sum(1 for e in br.storage.log() if e.get("agent") == "a1" and e["status"] == 412
                                and e["path"].endswith("manifest.json"))
    out["w412_taken"] = sum(1 for e in br.storage.log() if e.get("agent") == "a1" and e["status"] == 412
                            and not e["path"].endswith("manifest.json"))
    cw.close()
    w.stop()
    word = "quokkawriter1003"
    control(m2, {"changed": {"owner": "o1", "agent": a2, "path": append(br, files, 1003, word), "team": "t1"}})
    while not found(c2, word):
        time.sleep(0.05)
    control(m2, {"flush": {"owner": "o1", "agent": a2}})
    br.storage.request("DELETE", "/_log")
    br.files.request("DELETE", "/_log")
    t = time.perf_counter()
    w = Many(base / "w" / "mem.sock", {}, br.flags() + ["--cache", str(base / "cache-w"), "--stay"], env=ENV)
    running.append(w)
    cw = w.connect(timeout=3600)
    ready(cw, team_line(br, "a1", 0, True))
    while not found(cw, word):
        time.sleep(0.05)
    out["restart_s"] = time.perf_counter() - t
    out["restart_gets"], out["restart_lists"] = gets_of(br, "a1"), lists_of(br, "a1")
    cw.close(), c2.close()
    log(f"  writer's 412: {out['w412_conflicts']} conflicts, GET {out['w412_gets'][0]} files, "
        f"{out['w412_gets'][1]} B, {out['w412_lists'][0]} listings, flush {out['flush_a1_s']:.2f} s; restart one "
        f"version behind: GET {out['restart_gets'][0]} files, {out['restart_gets'][1]} B, answered in "
        f"{out['restart_s']:.1f} s")
    return out


def bench_team(scale: float, n_readers: int, versions: int, writers: int = 1) -> dict:
    base = Path(OUT + f"-scale-{scale:g}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    names = agents(n_readers) + ([f"a{n_readers + 2}"] if writers > 1 else [])
    br = Bridges(base / "link", bindings={a: {"owner": "o1", "key": key(i)} for i, a in enumerate(names)},
                 teams={"t1": {"folder": "teams/t1", "names": {a: "crew" for a in names},
                               "grants": {a: "all" for a in names}}})
    r: dict = {"scale": scale, "readers": n_readers, "load": [loadavg()], "versions": []}
    running: list = []
    try:
        r["files"] = place(scale, br)
        log(f"scale {scale:g}: {r['files']} files in the team folder")
        w = Many(base / "w" / "mem.sock", {}, br.flags() + ["--cache", str(base / "cache-w"), "--stay"], env=ENV)
        running.append(w)
        cw = w.connect(timeout=3600)
        r["index_s"] = ready(cw, team_line(br, "a1", 0, True))
        br.storage.request("DELETE", "/_log")
        r["first_flush_s"] = control(w, {"flush": {"owner": "o1", "agent": "a1"}})
        puts = [e for e in br.storage.log() if e["method"] == "PUT" and "/lnkmem/" in e["path"]]
        r["first_put_bytes"] = sum(e["size"] for e in puts)
        r["copy_bytes"], r["copy_files"] = copy_size(br)
        log(f"  writer: indexed {r['index_s']:.1f} s, first copy {r['first_put_bytes'] / 1e6:.1f} MB PUT for a "
            f"{r['copy_bytes'] / 1e6:.1f} MB copy of {r['copy_files']} files")
        readers = []
        for i, a in enumerate(names[1:n_readers + 1], start=1):
            m = Many(base / f"r{i}" / "mem.sock", {}, br.flags() + ["--cache", str(base / f"cache-r{i}"), "--stay"],
                     env={**ENV, "LNKMEM_RECHECK_S": str(RECHECK_S)})
            running.append(m)
            c = m.connect(timeout=3600)
            t = ready(c, team_line(br, a, i, False))
            readers.append((a, m, c, common.MemorySampler(m.proc.pid, every=0.05)))
            log(f"  reader {a}: cold load {t:.1f} s")
        # idle: re-checks answered 304, nothing listed
        br.storage.request("DELETE", "/_log")
        br.files.request("DELETE", "/_log")
        time.sleep(3 * RECHECK_S)
        a0 = readers[0][0]
        r["idle_304"] = sum(1 for e in br.storage.log() if e.get("agent") == a0 and e["status"] == 304)
        r["idle_lists"] = lists_of(br, a0)
        files = sorted((br.team_folder("t1") / "memory").rglob("*.md"))
        for v in range(versions):
            word = f"quokkateam{v}"
            rel = append(br, files, v, word)
            control(w, {"changed": {"owner": "o1", "agent": "a1", "path": rel, "team": "t1"}})
            while not found(cw, word):
                time.sleep(0.05)
            time.sleep(1.0)  # (the readers idle a moment: their RSS before)
            idle = {a: s.mark().get("VmRSS", 0) for a, _, _, s in readers}
            br.storage.request("DELETE", "/_log")
            br.files.request("DELETE", "/_log")
            control(w, {"flush": {"owner": "o1", "agent": "a1"}})
            t_flushed = time.time()
            puts = [e for e in br.storage.log() if e["method"] == "PUT" and "/lnkmem/" in e["path"]]
            row = {"v": v, "put_files": len(puts), "put_bytes": sum(e["size"] for e in puts), "readers": []}
            for a, m, c, s in readers:
                while not found(c, word):
                    time.sleep(0.02)
                seen = time.time()
                got_manifest = [e["time"] for e in br.storage.log() if e.get("agent") == a and e["status"] == 200
                                and e["path"].endswith("manifest.json")]
                gets = gets_of(br, a)
                lists = lists_of(br, a)
                row["readers"].append({"agent": a, "see_s": seen - t_flushed,
                                       "load_s": seen - min(got_manifest) if got_manifest else None,
                                       "get_files": gets[0], "get_bytes": gets[1],
                                       "lists": lists[0], "list_bytes": lists[1],
                                       "rss_idle": idle[a] * 1024, "rss_peak": s.peak("VmRSS") * 1024})
            r["versions"].append(row)
            rr = row["readers"][0]
            log(f"  v{v}: writer PUT {row['put_files']} files, {row['put_bytes']} B; reader {rr['agent']} GET "
                f"{rr['get_files']} files, {rr['get_bytes']} B, {rr['lists']} listings; sees it {rr['see_s']:.2f} s "
                f"after the flush ({rr['load_s'] or 0:.2f} s after its manifest), RSS {rr['rss_idle'] / 2**20:.0f} -> "
                f"{rr['rss_peak'] / 2**20:.0f} MiB")
        r["copy_after_bytes"], _ = copy_size(br)
        for _, _, c, s in readers:
            c.close()
            s.stop()
        if writers > 1:
            r["writers"] = second_writer(br, base, w, cw, files, names, running)
        else:
            cw.close()
    finally:
        for m in running:
            m.stop()
        br.stop()
    r["load"].append(loadavg())
    return r


def mib(b: float) -> str:
    return f"{b / 2**20:.0f}"


def table(rs: list) -> str:
    out = ["| scale | version | writer PUT | reader GET (files, bytes; % of the copy) | listings | flush -> found "
           "(after its manifest) | reader RSS idle -> peak, MiB |", "|---|---|---|---|---|---|---|"]
    for r in rs:
        for row in r["versions"]:
            for rr in row["readers"]:
                pct = 100.0 * rr["get_bytes"] / max(r["copy_bytes"], 1)
                out.append(f"| {r['scale']:g}x | v{row['v']} ({rr['agent']}) | {row['put_files']} files, "
                           f"{row['put_bytes']:,} B | {rr['get_files']}, {rr['get_bytes']:,} B ({pct:.2f} %) | "
                           f"{rr['lists']} ({rr['list_bytes']:,} B) | {rr['see_s']:.2f} s "
                           f"({rr['load_s'] or 0:.2f} s) | {mib(rr['rss_idle'])} -> {mib(rr['rss_peak'])} |")
    out.append("")
    for r in rs:
        ok = r["first_put_bytes"] <= 1.2 * r["copy_bytes"]
        out.append(f"- {r['scale']:g}x, {r['files']} files: the writer indexed in {r['index_s']:.1f} s; its first copy "
                   f"PUT {r['first_put_bytes'] / 1e6:.1f} MB for a {r['copy_bytes'] / 1e6:.1f} MB copy of "
                   f"{r['copy_files']} files ({r['first_put_bytes'] / max(r['copy_bytes'], 1):.2f}x; goal <= 1.2x: "
                   f"{'met' if ok else 'NOT met'}); idle, a reader's {r['idle_304']} re-checks answered 304 made "
                   f"{r['idle_lists'][0]} listings. Load average {r['load']}.")
    for r in rs:
        wr = r.get("writers")
        if wr:
            out.append(f"- {r['scale']:g}x, a second writer: the first writer's write-back one version behind met "
                       f"{wr['w412_conflicts']} 412 (and {wr.get('w412_taken', 0)} of its own files found there: sent anew) and fetched {wr['w412_gets'][0]} files, {wr['w412_gets'][1]:,} B "
                       f"({100.0 * wr['w412_gets'][1] / max(r['copy_bytes'], 1):.2f} % of the copy), "
                       f"{wr['w412_lists'][0]} listings ({wr['w412_lists'][1]:,} B), its flush {wr['flush_a1_s']:.2f} s; "
                       f"restarted one version behind, it fetched {wr['restart_gets'][0]} files, "
                       f"{wr['restart_gets'][1]:,} B ({100.0 * wr['restart_gets'][1] / max(r['copy_bytes'], 1):.2f} %), "
                       f"and answered the other's word {wr['restart_s']:.1f} s after its start.")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: a team's copy, one writer and N readers")
    ap.add_argument("--scale", type=float, action="append", metavar="S", help="bench/corpus.py's scale (repeatable)")
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--writers", type=int, default=1, choices=(1, 2),
                    help="2: a second writer joins; the first meets its version (412), then restarts behind it")
    ap.add_argument("--record", action="store_true", help="write the table into docs/BENCHMARKS.md")
    ap.add_argument("--json", help="also write the raw figures to this file")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = machine()
    rs = [bench_team(s, a.readers, a.versions, a.writers) for s in (a.scale or [1.0])]
    text = table(rs)
    common.report("lnkmem team copy: one writer, N readers", when, mach, text, {"runs": rs}, t0, a.json)
    if a.record:
        import subprocess
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "?"
        cmd = ".venv/bin/python bench/bench_team.py" + "".join(f" --scale {s:g}" for s in (a.scale or [1.0])) + \
            f" --readers {a.readers} --versions {a.versions}" + (" --writers 2" if a.writers > 1 else "")
        record(text, cmd, when, mach, "team", "A team's copy: one writer, N readers", commit)
        log("recorded in docs/BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
