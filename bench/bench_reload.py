"""A newer copy loaded into a cache that holds files (issue 33): time and memory.

Run: ``.venv/bin/python bench/bench_reload.py --scale S [--record]`` after
``bench/bench_bound.py --scale S`` (whose storage bridge folder holds the copy:
``bench/out/bound-scale-S/link/storage/stores/a1/memory/lnkmem``).

A team reader loads every version its writer sends, and a writer the version of
another engine that wrote first: the cache then holds files, and searches answer
from it while the new version is loaded. Each way is measured in a fresh Python
process of its own (the copy read from the folder, no bridge; VmRSS and its
anonymous part sampled every 20 ms), as the same three steps:

1. a cold load: the copy into an empty cache (8 MiB steps);
2. the same copy again, now into the cache that holds it:
   - ``beside``: written into an empty index beside the cache and put in its place
     (what the engine does: ``Store.open_beside``, ``Store.replaced_by``), or
   - ``one transaction``: the cache replaced in one write transaction (what it did
     before, and still does where two folders cannot swap names in one step);
3. what the process holds after it, anonymous memory and glibc's bytes in use.

``--record`` writes the table to the ``bench:reload`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import subprocess
import tempfile
import time

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE, load_note, machine, write_section  # noqa: E402

OF = "agent o1/a1"  # whose copy bench_bound's is

CHILD = r"""
import ctypes, json, os, shutil, sys, threading, time
from lnkmem.core import memtrim
memtrim.tune()
from lnkmem.replica.load import load_copy
from lnkmem.replica.manifest import decode_manifest
from lnkmem.replica.state import copy_state
from lnkmem.index.store import Store

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def in_use():
    m = libc.mallinfo2()
    return (m.uordblks + m.hblkhd) / 2**20

def rss():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "VmRSS:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) / 1024
    return out

peak = {"VmRSS": 0.0, "RssAnon": 0.0}
def sample():
    while True:
        r = rss()
        for k in peak:
            peak[k] = max(peak[k], r[k])
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()

folder, cache, of, way = sys.argv[1:5]
def fetch(name):
    with open(os.path.join(folder, name), "rb") as f:
        return f.read()
with open(os.path.join(folder, "manifest.json"), "rb") as f:
    m = decode_manifest(f.read())
out = {}
st = Store(cache)
t = time.monotonic()
load_copy(st, m, fetch, "v1", of, None)
memtrim.trim()
out["cold"] = {"s": time.monotonic() - t, "peak": dict(peak), "after": rss(), "in_use": in_use()}
for k in peak:
    peak[k] = 0.0
t = time.monotonic()
if way == "beside":
    side = st.open_beside()
    assert side is not None, "this file system cannot swap two folders' names in one step"
    load_copy(side, m, fetch, "v2", of, None, was=copy_state(st))
    st = st.replaced_by(side)
else:
    load_copy(st, m, fetch, "v2", of, None)
memtrim.trim()
out["warm"] = {"s": time.monotonic() - t, "peak": dict(peak), "after": rss(), "in_use": in_use(),
               "files": st.file_count()}
st.close()
print(json.dumps(out))
"""


def run(folder: str, way: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lnkmem-reload-") as tmp:
        p = subprocess.run([sys.executable, "-c", CHILD, folder, os.path.join(tmp, "index"), OF, way],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               p for p in (os.environ.get("PYTHONPATH"), common.ROOT) if p)})
    if p.returncode != 0:
        raise SystemExit(f"bench_reload: the {way} run failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, required=True, help="the scale bench_bound.py --scale ran at")
    ap.add_argument("--ways", default="beside,one transaction")
    ap.add_argument("--record", action="store_true", help="write the table into docs/BENCHMARKS.md")
    args = ap.parse_args()
    folder = os.path.join(HERE, "out", f"bound-scale-{args.scale:g}", "link", "storage", "stores", "a1",
                          "memory", "lnkmem")
    if not os.path.isfile(os.path.join(folder, "manifest.json")):
        print(f"bench_reload: no copy in {folder}: run bench/bench_bound.py --scale {args.scale:g} first",
              file=sys.stderr)
        return 2
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) / 2**20
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    mach = machine() + load_note()
    rows = []
    for way in args.ways.split(","):
        got = run(folder, way)
        c, w = got["cold"], got["warm"]
        rows.append(f"| {way} | {c['s']:.1f} s, {c['peak']['VmRSS']:.0f} / {c['peak']['RssAnon']:.0f} MiB "
                    f"| {w['s']:.1f} s | {w['peak']['VmRSS']:.0f} / {w['peak']['RssAnon']:.0f} MiB "
                    f"| {w['after']['RssAnon']:.0f} MiB ({w['in_use']:.0f}) |")
        print(rows[-1], flush=True)
    lines = [f"## A newer copy loaded into a cache that holds files, {args.scale:g}× (issue 33)", "",
             f"`.venv/bin/python bench/bench_reload.py --scale {args.scale:g}` — {when}, on {mach}; "
             f"the copy of `bench_bound.py --scale {args.scale:g}` ({size:.0f} MiB), each way in a process "
             "of its own.", "",
             "| way | cold load first: time, peak VmRSS / anon | the newer version: time | peak VmRSS / anon "
             "| after it: anon (malloc in use) |", "|---|---|---|---|---|", *rows]
    print("\n".join(lines))
    if args.record:
        write_section("reload", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
