"""Ignore files decided as git decides them (§3.2: "git's syntax"): each case is the
ignore files, the files of the tree, and the files git ignores among them (what
``git ls-files -o -i --exclude-standard`` answered; the last test asks git again
where it is installed). Real files, the real ``Ignorer``."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from lnkmem.bridges.ignore import Ignorer

# (name, ignore files {path: text}, files, the files ignored)
CASES = [
    ("negation, last rule wins", {".gitignore": "*.log\n!keep.log\n"},
     ["a.log", "keep.log", "x/a.log", "x/keep.log"], {"a.log", "x/a.log"}),
    ("a file below an ignored folder stays ignored", {".gitignore": "build/\n!build/o.md\n"},
     ["build/o.md", "x/build/o.md", "o.md"], {"build/o.md", "x/build/o.md"}),
    ("folder-only rule leaves a file of that name", {".gitignore": "build/\n"},
     ["x/build", "build/o.md"], {"build/o.md"}),
    ("x/** is what is inside, a negation takes one back", {".gitignore": "foo/**\n!foo/z.md\n"},
     ["foo/z.md", "foo/bar/baz.md", "x/foo/y.md"], {"foo/bar/baz.md"}),
    ("a/**/b: zero or more folders between", {".gitignore": "a/**/b/c.md\n**/d.md\n"},
     ["a/b/c.md", "a/x/y/b/c.md", "z/a/b/c.md", "d.md", "q/r/d.md"],
     {"a/b/c.md", "a/x/y/b/c.md", "d.md", "q/r/d.md"}),
    ("anchored by a slash at the start or in the middle", {".gitignore": "/top.md\ndocs/tmp.md\n"},
     ["top.md", "x/top.md", "docs/tmp.md", "x/docs/tmp.md"], {"top.md", "docs/tmp.md"}),
    ("trailing spaces dropped, an escaped one kept", {".gitignore": "sp.md   \ntrail\\ .md\n"},
     ["sp.md", "sp.md   ", "trail .md", "trail.md"], {"sp.md", "trail .md"}),
    ("an escaped backslash does not keep the space after it", {".gitignore": "a\\\\ \n"},
     ["a\\", "a\\ "], {"a\\"}),
    ("escaped # and ! are names, a bare # a comment", {".gitignore": "\\#hash.md\n#plain.md\n\\!bang.md\n"},
     ["#hash.md", "plain.md", "#plain.md", "!bang.md"], {"#hash.md", "!bang.md"}),
    ("CRLF lines: one CR taken off", {".gitignore": "a.log\r\ntop.md\r\n"},
     ["a.log", "top.md"], {"a.log", "top.md"}),
    ("a CR inside a class is part of the pattern (macOS's Icon\\r)", {".gitignore": "Icon[\r]\n"},
     ["Icon\r", "Icon[", "]", "Icon"], {"Icon\r"}),
    ("an unclosed [ matches nothing", {".gitignore": "Icon[\n*.md\n"},
     ["Icon[", "x.md"], {"x.md"}),
    ("a lone trailing backslash matches nothing", {".gitignore": "back\\\n"},
     ["back\\", "back"], set()),
    ("one leading and one trailing slash only", {".gitignore": "//top.md\nbuild//\n"},
     ["top.md", "build/f.md"], set()),
    ("classes: negated, ranges, POSIX names; never a slash", {".gitignore": "[!a]1.md\n[[:upper:]][[:digit:]].md\nd[!x]e\n"},
     ["b1.md", "a1.md", "A2.md", "a2.md", "d/e", "d1e", "dxe"], {"b1.md", "A2.md", "d1e"}),
    ("an unknown POSIX class matches nothing", {".gitignore": "[[:nope:]]*.md\n"},
     ["[]x.md", "n.md"], set()),
    ("a deeper ignore file overrides", {".gitignore": "*.md\n", "sub/.gitignore": "!secret*.md\n"},
     ["a.md", "sub/secret.md", "sub/other.md"], {"a.md", "sub/other.md"}),
    ("a deeper file cannot take back what a folder above hid", {".gitignore": "dir2/\n", "dir2/.gitignore": "!f.md\n"},
     ["dir2/f.md", "dir2/sub/f.md", "f.md"], {"dir2/f.md", "dir2/sub/f.md"}),
    ("an allowlist: all ignored, folders and .md taken back", {".gitignore": "*\n!*/\n!*.md\n"},
     ["a.md", "b.txt", "d/c.md", "d/e.txt"], {"b.txt", "d/e.txt"}),
]


def _tree(root, ignores: dict, files: list):
    for f in files:
        p = os.path.join(root, f)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as fh:
            fh.write("x\n")
    for rel, text in ignores.items():
        with open(os.path.join(root, rel), "w", newline="") as fh:
            fh.write(text)


@pytest.mark.parametrize("name,ignores,files,want", CASES, ids=[c[0] for c in CASES])
def test_ignore_files_are_decided_as_git_decides(tmp_path, name, ignores, files, want):
    _tree(str(tmp_path), ignores, files)
    ig = Ignorer(str(tmp_path))
    got = {f for f in files if ig.ignored(f, False)}
    assert got == want, name


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_cases_are_gits_own_answers(tmp_path):
    """The table above is what git answers (so it is a check of git's rules, not ours)."""
    for i, (name, ignores, files, want) in enumerate(CASES):
        root = tmp_path / str(i)
        root.mkdir()
        _tree(str(root), ignores, files)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-o", "-i", "--exclude-standard"],
                             capture_output=True, check=True).stdout
        got = {p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p}
        assert got & set(files) == want, name
