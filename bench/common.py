"""What the benchmarks share: percentiles, the machine's description, and
writing one benchmark's section of docs/BENCHMARKS.md."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "BENCHMARKS.md")
INTRO = ("# Benchmarks\n\n"
         "Measured figures for lnkmem, each produced by a script under `bench/` and recorded here by it\n"
         "(`--record`). Each benchmark owns one section between `<!-- bench:NAME -->` and\n"
         "`<!-- /bench:NAME -->` markers and replaces only that section; numbers depend on the machine,\n"
         "which every section names.\n")


def pct(xs, p: float) -> float:
    """The p-th percentile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(*extra: str) -> str:
    """CPU, cores, memory, kernel and Python, then ``extra`` (versions that matter)."""
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f", {int(f.readline().split()[1]) / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    tail = "".join(f", {e}" for e in extra if e)
    return (f"{cpu_model()}, {os.cpu_count()} cores{mem}; Linux {platform.release()}; "
            f"Python {platform.python_version()}{tail}")


def write_section(section: str, lines: list[str]) -> None:
    """Replace this benchmark's section (``lines`` between its markers), keeping the others;
    re-read right before writing, since other benchmarks own the other sections."""
    begin, end = f"<!-- bench:{section} -->", f"<!-- /bench:{section} -->"
    body = "\n".join([begin, *lines, end])
    os.makedirs(os.path.dirname(DOC), exist_ok=True)
    try:
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
    except FileNotFoundError:
        doc = INTRO
    i, j = doc.find(begin), doc.find(end)
    if i >= 0 and j > i:
        doc = doc[:i] + body + doc[j + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + body + "\n"
    tmp = f"{DOC}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(doc)
    os.replace(tmp, DOC)


def report(title: str, when: str, mach: str, text: str, figures: dict, t0: float,
           json_path: Optional[str] = None) -> None:
    """Print a benchmark's table, and write its raw figures when asked."""
    print(f"{title} — {when}")
    print(f"Machine: {mach}\n")
    print(text)
    print(f"\n(total {time.monotonic() - t0:.0f} s)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(figures, when=when, machine=mach), f, indent=1)


def files_reread(index_stderr: str) -> int:
    """How many files `lnk-lnkmem index` says it (re)indexed, from its summary line; -1 when absent."""
    import re
    m = re.search(r"indexed ([\d,]+) files?, [\d,]+ unchanged", index_stderr)
    return int(m.group(1).replace(",", "")) if m else -1


def load_note() -> str:
    """"; load average X at start" for a report's machine line ("" where /proc has none)."""
    try:
        with open("/proc/loadavg") as f:
            return f"; load average {f.read().split()[0]} at start"
    except OSError:
        return ""
