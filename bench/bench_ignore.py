"""The ignore matcher (``lnkmem/bridges/ignore.py``) beside ``pathspec``'s ``GitIgnoreSpec``
(issue 48): how fast each decides a Home's paths, and how often each disagrees with git.

Run: ``.venv/bin/python bench/bench_ignore.py [--scale 1.0] [--rules FILE ...] [--git DIR ...]``
(``pip install pathspec`` first to measure it too; lnkmem does not depend on it).

- speed: the corpus of ``bench/corpus.py``, listed once into memory, then walked as
  ``LocalPlace`` walks it (a folder's ignore files add a level, an ignored folder is not
  entered, a file is decided by the levels in force), once with our rules and once with
  one ``GitIgnoreSpec`` a level (a folder asked as ``name/``, as pathspec wants it). The
  root's ignore file is ``--rules`` (e.g. github/gitignore's Python, Node, macOS,
  JetBrains and VisualStudioCode templates) or a built-in set of common rules; three
  folders get one of their own. Best of 5 passes; the bare walk's time is taken off.
- correctness (``--git``, each a folder of ignore files such as github/gitignore's
  templates): each file put alone in a new repository as its ``.gitignore``, with files
  named after its patterns (a name made of each pattern, at the root and one folder down,
  as a file and as a folder), and ``git ls-files -o -i --exclude-standard`` asked which
  are ignored; each matcher's answer for every file compared with git's.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time

import common  # noqa: E402,F401  (puts the repository's root on the path)
import corpus  # noqa: E402
from lnkmem.bridges.ignore import DEFAULTS, NAMES, Ignorer, Level, decide, parse  # noqa: E402

try:
    import pathspec
except ImportError:
    pathspec = None

COMMON_RULES = """# a root .gitignore as projects write them (Python, Node, editors, OS)
__pycache__/
*.py[cod]
*$py.class
*.so
build/
dist/
*.egg-info/
.eggs/
.venv
venv/
.tox/
.coverage
.coverage.*
htmlcov/
.pytest_cache/
.mypy_cache/
*.log
npm-debug.log*
.npm
.env
.env.*
!.env.example
coverage/
.next/
out/
.cache/
*.tmp
*~
.*.swp
.DS_Store
Thumbs.db
Icon\r
.idea/
.vscode/*
!.vscode/settings.json
*.iml
**/drafts/**/*.bak
archive/**/old-*.md
/secret.md
"""
NESTED = {
    "projects": "*.log\n!keep.md\ndrafts/\n",
    "journal": "[0-9][0-9][0-9][0-9]-*.tmp\n",
    "reading": "**/private/\n*-copy.md\n",
}


def listing(root: str) -> dict[str, list[tuple[str, bool]]]:
    """Each folder (relative, "" the root) with its entries (name, is a folder)."""
    out = {}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root).replace(os.sep, "/")
        rel = "" if rel == "." else rel
        out[rel] = [(n, True) for n in sorted(dirs)] + [(n, False) for n in sorted(files)]
    return out


def walk(tree, levels_of, ignored) -> int:
    """Files kept, walking ``tree`` as LocalPlace does with ``ignored(stack, path, is_dir)``."""
    kept = 0
    todo = [("", levels_of(""))]
    while todo:
        rel, stack = todo.pop()
        for name, is_dir in tree.get(rel, ()):
            path = f"{rel}/{name}" if rel else name
            if ignored(stack, path, is_dir):
                continue
            if is_dir:
                todo.append((path, stack + levels_of(path)))
            else:
                kept += 1
    return kept


def ours(texts):
    levels = {d: ([Level("", parse("\n".join(DEFAULTS)))] if not d else []) + [Level(d, parse(t))] for d, t in texts.items()}
    return (lambda d: levels.get(d, [Level("", parse("\n".join(DEFAULTS)))] if not d else [])), decide


def ours_bare(texts):
    return (lambda d: []), (lambda stack, path, is_dir: False)


def theirs(texts):
    def spec(lines):
        # one bad line makes from_lines raise for the whole file: compiled line by line
        good = []
        for line in lines:
            try:
                pathspec.GitIgnoreSpec.from_lines([line])
                good.append(line)
            except Exception:
                pass
        return pathspec.GitIgnoreSpec.from_lines(good)

    levels = {d: ([("", spec(DEFAULTS))] if not d else []) + [(d, spec(t.split("\n")))] for d, t in texts.items()}
    root = [("", spec(DEFAULTS))]

    def ignored(stack, path, is_dir):
        got = None
        for base, sp in stack:
            sub = path[len(base) + 1:] if base else path
            r = sp.check_file(sub + "/" if is_dir else sub)
            if r.include is not None:
                got = r.include
        return bool(got)

    return (lambda d: levels.get(d, root if not d else [])), ignored


def best(fn, n=5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def speed(home: str, rules: str) -> None:
    tree = listing(home)
    texts = {"": rules, **NESTED}
    n = sum(len(v) for v in tree.values())
    bare = best(lambda: walk(tree, *ours_bare(texts)))
    kinds = [("ours", ours)] + ([("pathspec", theirs)] if pathspec else [])
    print(f"{n:,} entries in {len(tree):,} folders; root rules {len(parse(rules))}; nested {len(NESTED)}")
    for name, make in kinds:
        lv, ig = make(texts)
        kept = walk(tree, lv, ig)
        t = best(lambda: walk(tree, lv, ig)) - bare
        print(f"  {name:9s} {t * 1000:8.1f} ms  ({t / n * 1e6:.2f} us an entry), {kept:,} files kept")


def instantiate(line: str) -> list[tuple[str, bool]]:
    """Paths a pattern line plausibly names: (path, a folder)."""
    line = re.sub(r"(?<!\\) +$", "", line)
    if not line or line.startswith("#"):
        return []
    line = line[1:] if line.startswith("!") else line
    dir_only = line.endswith("/")
    line = line.strip("/")
    out = []
    for deep, star, one in (("a/b", "x", "q"), ("", "long_name", "Z")):
        p = line.replace("**", "\0")
        p = re.sub(r"\[!?\]?[^\]]*\]", lambda m: (m.group(0)[1:].lstrip("!^") or "c")[0], p)
        p = p.replace("*", star).replace("?", one).replace("\\", "")
        p = p.replace("\0/", deep + "/" if deep else "").replace("/\0", "/" + (deep or "z")).replace("\0", "y")
        p = re.sub("/+", "/", p).strip("/")
        if p and "\r" not in p and not any(s in (".", "..") for s in p.split("/")):
            out += [(p, dir_only), ("sub/" + p, dir_only)]
    return out


def against_git(path: str) -> tuple[int, list[str], list[str]]:
    """(files, those ours decides unlike git, those pathspec decides unlike git)."""
    text = open(path, encoding="utf-8", errors="replace").read()
    root = tempfile.mkdtemp(prefix="bench-ignore-")
    try:
        files = set()
        for p, d in (i for line in text.split("\n") for i in instantiate(line)):
            files.update((p + "/f.txt" if d else p, p + "/inner/g.md"))
        made = []
        for f in sorted(files, key=lambda s: (s.count("/"), s)):
            full = os.path.join(root, f)
            try:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                if not os.path.isdir(full):
                    open(full, "w").close()
                    made.append(f)
            except OSError:
                pass
        with open(os.path.join(root, ".gitignore"), "w") as f:
            f.write("\n".join(DEFAULTS) + "\n" + text)
        subprocess.run(["git", "init", "-q", root], check=True)
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "-o", "-i", "--exclude-standard"],
                             capture_output=True, check=True).stdout
        git = {p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p}
        ig = Ignorer(root)
        memo: dict = {}
        bad_ours = [m for m in made if ig.ignored(m, False, memo) != (m in git)]
        bad_theirs = []
        if pathspec:
            lv, dec = theirs({"": text})
            for m in made:
                parts, stack, got = m.split("/"), lv(""), False
                for i in range(1, len(parts) + 1):
                    if dec(stack, "/".join(parts[:i]), i < len(parts)):
                        got = True
                        break
                if got != (m in git):
                    bad_theirs.append(m)
        return len(made), bad_ours, bad_theirs
    finally:
        shutil.rmtree(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", default=os.path.join(corpus.DEFAULT_OUT, "..", "ignore"), help="the corpus' folder")
    ap.add_argument("--rules", nargs="*", default=[], help="ignore files joined as the root's")
    ap.add_argument("--git", nargs="*", default=[], help="folders of ignore files to check against git")
    a = ap.parse_args()
    corpus.generate(a.out, a.scale, log=lambda *_: None)  # reused as it is when already made
    home = os.path.join(a.out, "home")
    rules = "".join(open(f, encoding="utf-8", errors="replace").read() + "\n" for f in a.rules) or COMMON_RULES
    speed(home, rules)
    if a.git:
        total, wrong_ours, wrong_theirs = 0, 0, 0
        for folder in a.git:
            for dirpath, _, names in os.walk(folder):
                for name in sorted(names):
                    if name.endswith(".gitignore") or name in NAMES:
                        n, o, t = against_git(os.path.join(dirpath, name))
                        total, wrong_ours, wrong_theirs = total + n, wrong_ours + len(o), wrong_theirs + len(t)
                        for kind, bad in (("ours", o), ("pathspec", t)):
                            if bad:
                                print(f"  {kind} unlike git, {name}: {bad[:4]}")
        print(f"against git: {total:,} files; ours unlike git {wrong_ours}; "
              + (f"pathspec unlike git {wrong_theirs}" if pathspec else "pathspec not installed"))


if __name__ == "__main__":
    main()
