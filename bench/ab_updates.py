"""One-file update latency of two code trees on one built index, alternated.

    git archive <commit> lnkmem bench | tar -x -C /tmp/before
    .venv/bin/python bench/ab_updates.py /tmp/before . --scale 0.25 --updates 30 --rounds 3

The index is the one ``bench_scale.py`` leaves under ``bench/out/scale/<scale>/`` (built with
``lnk-lnkmem index home state agent`` there when absent). Each tree runs bench_scale's ``ours``
worker with ``python -S`` and that tree first on the path (this venv's editable install is
bypassed), timing ``plan`` + ``build`` + ``bm25`` for each appended file (files put back after).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="code trees (each with lnkmem/ and bench/)")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    base = os.path.join(HERE, "out", "scale", f"{a.scale:g}")
    home, state, work = (os.path.join(base, x) for x in ("home", "state", "abtmp"))
    if not os.path.exists(os.path.join(state, "index", "data.mdb")):
        sys.exit(f"no index under {state}: run bench_scale.py --scale {a.scale:g} first, then "
                 f"lnk-lnkmem index home state agent in {base}")
    os.makedirs(work, exist_ok=True)
    names = sorted(os.path.relpath(os.path.join(d, f), home) for d, _, fs in os.walk(home) for f in fs
                   if f.endswith(".md"))
    updates = list(zip(random.Random(a.seed).sample(names, a.updates), (f"zqx{i}late" for i in range(a.updates))))
    site = sysconfig.get_paths()["purelib"]
    res: dict = {}
    for rnd in range(a.rounds):
        for tree in a.trees:
            tree = os.path.abspath(tree)
            args = dict(state=state, home=home, tmp=work, queries=["alpha"], updates=updates)
            p = subprocess.run([sys.executable, "-S", os.path.join(tree, "bench", "bench_scale.py"), "--worker", "ours",
                                "--args", json.dumps(args)], env=dict(os.environ, PYTHONPATH=tree + os.pathsep + site),
                               capture_output=True, text=True)
            if p.returncode:
                sys.exit(p.stderr[-2000:])
            ans = json.loads([x for x in p.stdout.splitlines() if x.startswith("{")][-1])
            u = [x * 1000 for x in ans["updates"]]
            res.setdefault(tree, []).extend(u)
            print(f"{tree} round {rnd}: median {statistics.median(u):.1f} ms, worst {max(u):.1f} ms, "
                  f"process CPU {ans['cpu_s']:.1f} s", flush=True)
    for tree, u in res.items():
        print(f"{tree}: median {statistics.median(u):.1f} ms, worst {max(u):.1f} ms over {len(u)} updates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
