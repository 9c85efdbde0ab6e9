"""A large listing shared with a forked child (lnkmem/bridges/shared_walk.py) lists exactly
what the one-process walk lists, in its order, with the same skips: ignore files,
hidden and unnameable names, links inside and leaving the root, and a folder reachable
from two of the root's folders (the one-process walk lists it once, where it comes first)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lnkmem.bridges.local import LocalPlace  # noqa: E402


def _lay_out_sample_tree(root: Path) -> None:
    (root / "top.md").write_text("root file\n")
    for i, name in enumerate(["alpha", "beta", "gamma", "delta", "eps"]):
        for j in range(3):
            d = root / name / f"sub{j}" / "deep"
            d.mkdir(parents=True)
            for k in range(4):
                (d / f"n{k}.md").write_text(f"{name} {j} {k}\n")
            (root / name / f"sub{j}" / f"f{j}.txt").write_text("x\n")
        (root / name / ".hidden.md").write_text("hidden\n")
        (root / f"between{i}.md").write_text("between folders\n")
    (root / ".gitignore").write_text("*.log\nbeta/sub1/\n")
    (root / "gamma" / ".lnkmemignore").write_text("sub2/\n")
    (root / "alpha" / "a.log").write_text("ignored\n")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "m.js").write_text("ignored by default\n")
    os.symlink("../top.md", root / "delta" / "link-to-top.md")  # a file link inside the root
    os.symlink("/etc", root / "eps" / "outside")  # a link leaving the root: never listed
    os.symlink("sub0", root / "delta" / "same-folder")  # a folder reached twice within one folder
    bad = os.fsencode(root / "eps") + b"/caf\xe9.md"  # a name no ref can spell
    with open(bad, "wb") as f:
        f.write(b"latin-1\n")


def _both(root: Path, ignore: bool = True):
    one = LocalPlace(str(root), ignore=ignore)
    shared = LocalPlace(str(root), ignore=ignore)
    a = one.list()
    b = shared.list(share=True)
    return (a, one.skipped, one.skipped_by), (b, shared.skipped, shared.skipped_by)


@pytest.fixture(autouse=True)
def _always_shared(monkeypatch):
    monkeypatch.setenv("LNKMEM_WORKER", "1")  # shared whatever the machine's cores


def test_a_shared_listing_is_the_one_process_listing(tmp_path):
    _lay_out_sample_tree(tmp_path)
    one, shared = _both(tmp_path)
    assert shared == one
    paths = [e.path for e in one[0]]
    assert "top.md" in paths and "delta/link-to-top.md" in paths
    assert "beta/sub1/f1.txt" not in paths and "gamma/sub2/f2.txt" not in paths  # ignore files
    assert not any(p.endswith(".log") or p.startswith("node_modules") or "/." in p for p in paths)
    assert not any(p.startswith("eps/outside") for p in paths)
    assert one[2].get("name not UTF-8") == 1
    assert len(paths) == len(set(paths))
    # folders and files between them keep their places: root files where the walk met them
    assert [p for p in paths if "/" not in p] == [p for p in [e.path for e in shared[0]] if "/" not in p]


def test_a_folder_reached_from_two_of_the_roots_folders_is_listed_once_where_it_comes_first(tmp_path):
    _lay_out_sample_tree(tmp_path)
    # a link in one of the root's folders to a folder inside another: whichever the walk
    # meets first lists it, the other is left out (both walks went through it: the shared
    # listing is not trusted and walked again in order)
    os.symlink(str(tmp_path / "alpha" / "sub0"), tmp_path / "gamma" / "alias")
    os.symlink(str(tmp_path / "gamma" / "sub1"), tmp_path / "beta" / "alias")
    one, shared = _both(tmp_path)
    assert shared == one
    paths = [e.path for e in one[0]]
    for names in (("alpha/sub0/deep/n1.md", "gamma/alias/deep/n1.md"),
                  ("gamma/sub1/deep/n1.md", "beta/alias/deep/n1.md")):
        assert sum(p in names for p in paths) == 1, names


def test_a_shared_listing_without_ignore_rules_and_with_few_folders(tmp_path):
    _lay_out_sample_tree(tmp_path)
    one, shared = _both(tmp_path, ignore=False)
    assert shared == one
    assert any(p.path.endswith(".log") for p in one[0])
    solo = tmp_path / "solo"  # one folder (nothing to share) and none at all
    (solo / "only" / "x").mkdir(parents=True)
    (solo / "only" / "x" / "a.md").write_text("a\n")
    (solo / "b.md").write_text("b\n")
    one, shared = _both(solo)
    assert shared == one and [e.path for e in one[0]] == ["b.md", "only/x/a.md"] or \
        [e.path for e in one[0]] == ["only/x/a.md", "b.md"]
    one, shared = _both(solo / "only" / "x")
    assert shared == one and [e.path for e in one[0]] == ["a.md"]
