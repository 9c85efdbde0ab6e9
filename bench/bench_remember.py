"""`remember`'s own cost in-process: `LocalNotes.change` N times (an add and a remove
each) on a 60-line notes file, p50/p90/max in ms. Compare two trees of the code with
PYTHONPATH (docs/BENCHMARKS.md, "remember and the notes' history"):

    .venv/bin/python bench/bench_remember.py 300 [folder]
"""
import os, sys, tempfile, time, statistics
import lnkmem.memory.notes as N
d = tempfile.mkdtemp(dir=sys.argv[2] if len(sys.argv) > 2 else None)
notes = os.path.join(d, "agent", "memory", "notes.md"); os.makedirs(os.path.dirname(notes))
open(notes, "w").write("".join(f"- seed line {i} with a few words\n" for i in range(60)))
ln = N.LocalNotes(notes, os.path.join(d, "agent", "memory", "lnkmem"))
ts = []
for j in range(int(sys.argv[1])):
    t = time.perf_counter()
    ln.change(f"entry {j}", f"seed line {j} with a few words" if j < 60 else f"entry {j-60}", 1 << 20)
    ts.append((time.perf_counter() - t) * 1000)
ts.sort()
print(f"{N.__file__}: n={len(ts)} p50={statistics.median(ts):.2f} ms p90={ts[int(len(ts)*0.9)]:.2f} ms max={ts[-1]:.1f} ms")
