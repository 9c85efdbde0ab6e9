"""Build time of ours against SQLite FTS5 on the bench corpus (issue 12, room build).

``python bench/build_ab.py --scale 0.25 1 [--out DIR]``: for each scale, generates the
corpus (``bench/corpus.py``, seeded, reused when present), runs ours'
``lnk-lnkmem index`` once on a fresh state under ``nice /usr/bin/time -v`` (wall, user +
system CPU, peak RSS), then FTS5's reference builder (``bench_scale.py``'s) once on the
passages ours made. Prints one JSON line per scale with the load average before and after:
the machine is shared, so compare CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_local as bl  # noqa: E402
import bench_scale as bs  # noqa: E402
import corpus  # noqa: E402


def timed(argv: list[str], env: dict) -> dict:
    p = subprocess.run(["nice", "/usr/bin/time", "-v"] + argv, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    def field(name):
        m = re.search(re.escape(name) + r": (.*)", p.stderr)
        return m.group(1).strip() if m else None
    w = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
    return {"wall_s": round(wall, 2), "cpu_s": round(float(field("User time (seconds)")) + float(field("System time (seconds)")), 2),
            "user_s": float(field("User time (seconds)")), "rss_mib": round(int(field("Maximum resident set size (kbytes)")) / 1024),
            "cpu_pct": field("Percent of CPU this job got")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, nargs="*", default=[0.25])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "build"))
    ap.add_argument("--no-fts5", action="store_true")
    a = ap.parse_args()
    env = bl.clean_env()
    env.update({k: v for k, v in os.environ.items() if k.startswith("LNKMEM_")})
    prog = bl.program()
    for scale in a.scale:
        base = os.path.join(a.out, f"{scale:g}")
        corpus.generate(base, scale, 7, log=lambda *x: None)
        home, agent, state = (os.path.join(base, x) for x in ("home", "agent", "state"))
        shutil.rmtree(state, ignore_errors=True)
        r = {"scale": scale, "load_before": os.getloadavg()[0]}
        r["ours"] = timed([prog, "index", home, state, agent], env)
        if not a.no_fts5:
            work = os.path.join(base, "work")
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            npass, text_bytes, _, _ = bs.export_passages(state, os.path.join(work, "passages.jsonl"))
            r.update(passages=npass, text_mb=round(text_bytes / 1e6, 1))
            r["fts5"] = timed([sys.executable, os.path.join(HERE, "bench_scale.py"), "--worker", "fts5-build", "--args",
                               json.dumps({"passages": os.path.join(work, "passages.jsonl"), "db": os.path.join(work, "fts5.db")})],
                              dict(os.environ, PYTHONPATH=ROOT))
            shutil.rmtree(work, ignore_errors=True)
        r["load_after"] = os.getloadavg()[0]
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
