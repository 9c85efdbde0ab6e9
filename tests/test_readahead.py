"""A build's readahead (lnkmem/index/build/readahead.py): the files about to be read are asked of
the kernel ahead of their reads, only beneath their place's root, never a FIFO or a link
leaving it; the thread keeps within its distance of where the build reads and ends
when the build's fronts meet; a build with it indexes exactly what one without it does."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lnkmem.bridges.local import LocalPlace  # noqa: E402
from lnkmem.index.build import readahead  # noqa: E402

from tests.helpers import Home, index_home, run_cli  # noqa: E402

needs_openat2 = pytest.mark.skipif(LocalPlace(".").open_root() is None, reason="no openat2 here: nothing is advised")


@needs_openat2
def test_advise_opens_only_regular_files_beneath_the_root(tmp_path):
    root = tmp_path / "home"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "a.md").write_text("inside\n")
    (tmp_path / "secret.md").write_text("outside\n")
    os.symlink("notes/a.md", root / "inner-link.md")  # stays inside: followed
    os.symlink(str(tmp_path / "secret.md"), root / "outer-link.md")  # leaves the root
    os.symlink("../secret.md", root / "dotdot.md")
    os.mkfifo(root / "pipe.md")  # opening it must neither block nor count
    place = LocalPlace(str(root))
    fd = place.open_root()
    try:
        got = {}
        asked = threading.Thread(target=lambda: got.update(
            {p: place.advise(fd, p) for p in ("notes/a.md", "inner-link.md", "outer-link.md",
                                              "dotdot.md", "pipe.md", "gone.md", "notes")}), daemon=True)
        asked.start()
        asked.join(60)  # a FIFO opened for reading blocks until a writer comes: never, here
        assert not asked.is_alive(), "advise blocked on the FIFO"
    finally:
        os.close(fd)
    assert got == {"notes/a.md": True, "inner-link.md": True, "outer-link.md": False,
                   "dotdot.md": False, "pipe.md": False, "gone.md": False, "notes": False}


class _Entry:
    def __init__(self, path: str, size: int):
        self.path, self.size = path, size


def _noted_place(root: Path, n: int, monkeypatch) -> tuple[LocalPlace, list[str]]:
    """A place of ``n`` small files whose advise (its own) notes each path asked for."""
    for i in range(n):
        (root / f"f{i:03}.md").write_text(f"file {i}\n")
    place = LocalPlace(str(root))
    asked: list[str] = []
    real = place.advise
    monkeypatch.setattr(place, "advise", lambda fd, path: asked.append(path) or real(fd, path))
    return place, asked


def _settle(asked: list[str], count: int) -> list[int]:
    """The files asked for once ``count`` were (10 s at most) and the thread had 0.1 s more
    to ask for any beyond, by number."""
    deadline = time.monotonic() + 10
    while len(asked) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # kept: an absence (nothing asked beyond) has no event to wait on
    return sorted(int(p[1:4]) for p in asked)


@needs_openat2
def test_readahead_keeps_ahead_of_both_fronts_and_ends_when_they_meet(tmp_path, monkeypatch):
    n = 400
    place, asked = _noted_place(tmp_path, n, monkeypatch)
    items = [("home", _Entry(f"f{i:03}.md", 8)) for i in range(n)]
    front = [0, n]
    ra = readahead.Readahead(items, {"home": place}, lambda: tuple(front)).start()
    try:
        idx = _settle(asked, 2 * readahead.AHEAD_FILES)  # at rest: the first and the last AHEAD_FILES, nothing further in
        assert idx == list(range(readahead.AHEAD_FILES)) + list(range(n - readahead.AHEAD_FILES, n))
        front[:] = [100, 300]  # both fronts moved on: the files ahead of them now
        idx = _settle(asked, 4 * readahead.AHEAD_FILES)
        assert len(idx) == len(set(idx)) == 4 * readahead.AHEAD_FILES  # each file asked once
        assert set(range(100, 100 + readahead.AHEAD_FILES)) <= set(idx)
        assert set(range(300 - readahead.AHEAD_FILES, 300)) <= set(idx)
        front[:] = [200, 200]  # met: the thread ends by itself
        ra.thread.join(5)
        assert not ra.thread.is_alive()
        assert ra.advised == len(asked)
    finally:
        ra.stop()


@needs_openat2
def test_readahead_asks_for_at_most_its_bytes_ahead_and_never_a_large_file(tmp_path, monkeypatch):
    n = 60
    place, asked = _noted_place(tmp_path, n, monkeypatch)
    mib = 1 << 20
    # as listed: 3 MiB each, but every fourth past the large-file bound
    items = [("home", _Entry(f"f{i:03}.md", readahead.LARGE + 1 if i % 4 == 3 else 3 * mib)) for i in range(n)]
    front = [0, n]
    ra = readahead.Readahead(items, {"home": place}, lambda: tuple(front)).start()
    try:
        got = _settle(asked, 10)
        # up from 0: 0, 1, 2 (9 MiB), 3 large (not asked, counts nothing), 4, 5 (15 MiB); 6 would pass 16 MiB
        assert got[:5] == [0, 1, 2, 4, 5] and all(i % 4 != 3 for i in got), got
        assert len([i for i in got if i >= 30]) == 5  # the same down from the last
        front[:] = [n, n]
    finally:
        ra.stop()


@needs_openat2
def test_one_front_going_up_asks_for_nothing_at_the_far_end(tmp_path, monkeypatch):
    n = 300
    place, asked = _noted_place(tmp_path, n, monkeypatch)
    items = [("home", _Entry(f"f{i:03}.md", 8)) for i in range(n)]
    ra = readahead.Readahead(items, {"home": place}, lambda: (0, n), down=False).start()
    try:
        assert _settle(asked, readahead.AHEAD_FILES) == list(range(readahead.AHEAD_FILES))
    finally:
        ra.stop()


def _built_and_searched(home: Home, state: Path, ahead: str) -> bytes:
    env = {"LNKMEM_READAHEAD": ahead, "LNKMEM_WORKER": "1"}
    index_home(home, env, state, timeout=120)
    r = run_cli("search", str(home.folder), str(state), "--agent", str(home.agent), "--json", "harbour lantern", env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_build_with_readahead_indexes_what_one_without_does(tmp_path):
    home = Home(tmp_path)
    for i in range(300):
        words = "harbour lantern" if i % 37 == 0 else "quiet field"
        home.write(f"d{i % 7}/n{i}.md", f"# note {i}\n\nA {words} note, number {i}, about tide {i % 11}.\n")
    on = _built_and_searched(home, tmp_path / "s1", "1")
    off = _built_and_searched(home, tmp_path / "s0", "0")
    assert b"harbour" in on and on == off


def test_a_bad_readahead_knob_is_one_line_and_exit_2(tmp_path):
    r = run_cli("index", str(tmp_path), str(tmp_path / "state"), env={"LNKMEM_READAHEAD": "yes"})
    assert r.returncode == 2
    err = r.stderr.decode()
    assert err.strip().count("\n") == 0 and "LNKMEM_READAHEAD" in err
