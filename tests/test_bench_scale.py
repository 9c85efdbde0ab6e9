"""bench/bench_scale.py runs end to end on a tiny corpus: every engine builds,
answers the queries and finds each one-file update's new word (the script
raises when one does not), and the table has every figure."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_scale_smoke(tmp_path):
    out = tmp_path / "figures.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--scale", "0.01", "--no-tantivy",
                        "--out", str(tmp_path / "out"), "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "| Build CPU (user + sys), s |" in p.stdout and "ours ÷ FTS5" in p.stdout
    r = json.loads(out.read_text())["scales"][0]
    assert r["ours"]["restart_reread"] == 0 and len(r["ours"]["mcp_changes"]) == 5
    assert len(r["ours"]["updates"]) == len(r["fts5"]["updates"]) == 10
    assert len(r["ours"]["passes"][0]) == len(r["fts5"]["passes"][0]) == r["queries"]
    # the Home is as it was: the updates were put back
    assert not any("zqx" in f.read_text() for f in (tmp_path / "out" / "0.01" / "home").rglob("*.md"))


def test_bench_scale_bad_arguments():
    for args in (["--scale", "0"], ["--scale"], ["--vectors", "-1"], ["--profile", "nothing"]):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), *args],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "Traceback" not in p.stderr and "error:" in p.stderr
