"""Issue 46: every path the notes code makes, in every bad shape.

The notes code makes, below the agent's own folders: ``<state>/notes-history/``
(a folder) and its version files, ``<state>/notes.lock`` (a file), and temp
files ``.notes.md.lnkmem-*`` beside the notes. A confused person or a buggy
tool may leave any of them missing, a file where a folder belongs, a folder
where a file belongs, a FIFO, or a symbolic link into another agent's folder
(or to nowhere). Whatever the shape, and whether it was there before the
engine started or appeared while it serves:

- `remember` answers sensibly, and a refused one changes nothing (retried, no
  note is doubled); a wrong shape at the history or the lock is moved aside
  and made anew (one line in the log), never followed;
- the text `remember` replaced is in the notes history;
- nothing outside the agent's own state and notes folder is written, made,
  removed or renamed (the other agent's tree, links' targets included, hashed
  before and after);
- `lnk-lnkmem notes-history` says so in one line on stderr (exit 2) while the
  history folder has a wrong shape, and lists the versions once it is made anew.
"""

import json
import os
import stat

import pytest

from tests.helpers import Home, Server, run_cli, tree_digest

SEED = "- first seed\n- second seed\n"
TEMP = ".notes.md.lnkmem-0123456789ab"  # the shape of the engine's own temp names


def _other(tmp_path):
    """Another agent's folder, with notes, a notes history and a lock of its own."""
    other = Home(tmp_path / "other")
    other.notes.write_text("- the other agent's note\n")
    hist = other.state / "notes-history"
    hist.mkdir(parents=True)
    (hist / "0000000000000000001-written-0123456789abcdef.md").write_text("- the other agent's version\n")
    (other.state / "notes.lock").write_text("")
    return other


def _make(path, shape: str, other: Home) -> None:
    """Put ``shape`` at ``path`` (nothing there before)."""
    if shape == "missing":
        return
    if shape == "file":
        path.write_text("- a file where a folder belongs\n")
    elif shape == "folder":
        path.mkdir()
        (path / "inside.md").write_text("- a folder where a file belongs\n")
    elif shape == "fifo":
        os.mkfifo(path)
    elif shape == "link-folder":  # into the other agent's history
        path.symlink_to(other.state / "notes-history")
    elif shape == "link-file":  # to the other agent's notes
        path.symlink_to(other.notes)
    elif shape == "link-nowhere":  # a dangling link into the other agent's folder: never made there
        path.symlink_to(other.state / "made-through-a-link")
    else:
        raise AssertionError(shape)


def _clear(path) -> None:
    if path.is_symlink() or path.is_file() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        for p in path.iterdir():
            p.unlink()
        path.rmdir()


HISTORY = ["missing", "file", "fifo", "link-folder", "link-file", "link-nowhere"]
LOCK = ["missing", "folder", "fifo", "link-file", "link-nowhere"]
VERSION = ["folder", "fifo", "link-file", "link-nowhere"]
NOTES_TEMP = ["folder", "fifo", "link-file", "link-nowhere"]
CASES = ([("history", s) for s in HISTORY] + [("lock", s) for s in LOCK]
         + [("version", s) for s in VERSION] + [("notes-temp", s) for s in NOTES_TEMP])


def _where(home: Home, target: str):
    return {
        "history": home.state / "notes-history",
        "lock": home.state / "notes.lock",
        # a version file's name, newest of all: listed first if it were taken for one
        "version": home.state / "notes-history" / "9999999999999999999-written-0123456789abcdef.md",
        "notes-temp": home.notes.parent / TEMP,
    }[target]


def _kept(home: Home) -> list[str]:
    out = run_cli("notes-history", str(home.state), "--json", "--texts")
    assert out.returncode == 0, out.stderr
    return [v["text"] for v in json.loads(out.stdout)["versions"]]


def _remember(s: Server, home: Home, note: str) -> None:
    """`remember` once, and again where it was refused: the note is in the notes exactly once."""
    before = home.notes.read_text()
    r = s.call("remember", {"add": note}, timeout=60)
    if r["isError"]:  # a refusal changed nothing
        said = r["content"][0]["text"]
        assert "nothing was changed" in said, r
        assert home.notes.read_text() == before, said
        r = s.call("remember", {"add": note}, timeout=60)
    assert r["isError"] is False, r
    assert home.notes.read_text().splitlines().count(f"- {note}") == 1, home.notes.read_text()


@pytest.mark.parametrize("target,shape", CASES)
def test_a_bad_shape_at_a_notes_path_is_never_followed_and_remember_recovers(tmp_path, target, shape):
    home = Home(tmp_path / "mine")
    other = _other(tmp_path)
    home.notes.write_text(SEED)
    home.state.mkdir(parents=True, exist_ok=True)
    if target == "version":
        (home.state / "notes-history").mkdir()
    where = _where(home, target)
    theirs = tree_digest(other.base)
    _make(where, shape, other)
    bad_history = target == "history" and shape != "missing"
    out = run_cli("notes-history", str(home.state))  # a person's look while it is damaged
    if bad_history:
        err = out.stderr.decode()
        assert out.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
        assert "notes-history" in err and "not a folder" in err, err
    else:
        assert out.returncode == 0, out.stderr
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        _remember(s, home, "note A")
        assert home.notes.read_text() == SEED + "- note A\n"
        assert SEED in _kept(home)  # the text it replaced
        # the same shape again while the engine serves (its folders already open): recovered again
        if where.is_symlink() or where.exists():
            _clear(where)
        if target == "version":
            (home.state / "notes-history").mkdir(exist_ok=True)
        _make(where, shape, other)
        _remember(s, home, "note B")
        assert home.notes.read_text() == SEED + "- note A\n- note B\n"
        assert SEED + "- note A\n" in _kept(home)
        log = s.stderr.decode()
    assert tree_digest(other.base) == theirs  # nothing of the other agent written, made or removed
    if target in ("history", "lock") and shape != "missing":
        assert "moved aside" in log and where.name in log, log
        moved = [p for p in home.state.iterdir() if p.name.startswith(where.name + ".")]
        assert len(moved) == 2, moved  # both kept as they were, beside: nothing of theirs deleted
        if shape.startswith("link"):
            assert all(p.is_symlink() for p in moved)
        hist = home.state / "notes-history"
        assert hist.is_dir() and not hist.is_symlink()
        if target == "lock":
            lock = home.state / "notes.lock"
            assert stat.S_ISREG(os.lstat(lock).st_mode)
    if target in ("version", "notes-temp"):  # not ours to remove: left as it is, and never read
        assert where.is_symlink() or where.exists()
    out = run_cli("notes-history", str(home.state))
    assert out.returncode == 0, out.stderr
    for v in json.loads(run_cli("notes-history", str(home.state), "--json").stdout)["versions"]:
        assert v["id"] != "9999999999999999999-written-0123456789abcdef"


@pytest.mark.parametrize("shape", ["file", "fifo", "link-folder", "link-nowhere"])
def test_notes_history_with_a_bad_history_folder_says_so_in_one_line(tmp_path, shape):
    """`notes-history` lists, shows and restores: with the history folder in a wrong
    shape each says so in one line (exit 2); `status` still answers."""
    home = Home(tmp_path / "mine")
    other = _other(tmp_path)
    home.notes.write_text(SEED)
    home.state.mkdir(parents=True)
    theirs = tree_digest(other.base)
    _make(home.state / "notes-history", shape, other)
    for extra in ([], ["--json"], ["--show", "1"], ["--restore", "1", "--agent", str(home.agent)]):
        out = run_cli("notes-history", str(home.state), *extra)
        err = out.stderr.decode()
        assert out.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, (extra, err)
        assert out.stdout == b""
    out = run_cli("status", str(home.folder), str(home.state), "--agent", str(home.agent))
    assert b"Traceback" not in out.stderr, out.stderr
    assert home.notes.read_text() == SEED
    assert tree_digest(other.base) == theirs


@pytest.mark.parametrize("shape", ["folder", "fifo", "link-file", "link-nowhere"])
def test_restore_recovers_a_bad_lock(tmp_path, shape):
    """`notes-history --restore` takes the notes lock too: a wrong shape there is moved aside."""
    home = Home(tmp_path / "mine")
    other = _other(tmp_path)
    home.notes.write_text(SEED)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        assert s.call("remember", {"add": "note A"})["isError"] is False
    theirs = tree_digest(other.base)
    (home.state / "notes.lock").unlink()
    _make(home.state / "notes.lock", shape, other)
    n = len(_kept(home))
    out = run_cli("notes-history", str(home.state), "--agent", str(home.agent), "--restore", str(n))
    assert out.returncode == 0, out.stderr
    assert home.notes.read_text() == SEED
    assert tree_digest(other.base) == theirs
    assert stat.S_ISREG(os.lstat(home.state / "notes.lock").st_mode)


@pytest.mark.parametrize("shape", ["folder", "fifo", "link-file", "link-nowhere"])
def test_notes_of_a_bad_shape_are_refused_and_nothing_changes(tmp_path, shape):
    """The notes file itself is the person's: in a wrong shape `remember` refuses (a clear
    message, nothing changed, nothing made), every time it is retried, and never follows
    a link; the engine's history and lock are left as they were."""
    home = Home(tmp_path / "mine")
    other = _other(tmp_path)
    _make(home.notes, shape, other)
    theirs = tree_digest(other.base)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        for _ in range(3):
            r = s.call("remember", {"add": "note A"}, timeout=60)
            said = r["content"][0]["text"]
            assert r["isError"] is True and "nothing was changed" in said and str(home.notes) in said, r
    assert tree_digest(other.base) == theirs
    assert home.notes.is_symlink() or home.notes.exists()
    if shape == "folder":
        assert [p.name for p in home.notes.iterdir()] == ["inside.md"]
    assert not [p for p in home.notes.parent.iterdir() if p.name.startswith(".notes.md.lnkmem-")]


def test_notes_history_of_a_state_that_is_not_a_folder_says_so(tmp_path):
    state = tmp_path / "state"
    state.write_text("not a folder\n")
    for extra in ([], ["--json"], ["--show", "1"]):
        out = run_cli("notes-history", str(state), *extra)
        err = out.stderr.decode()
        assert out.returncode == 2 and "not a folder" in err and len(err.splitlines()) == 1, (extra, err)
    out = run_cli("notes-history", str(tmp_path / "missing"), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["versions"] == []


def test_a_history_that_cannot_be_written_refuses_and_changes_nothing(tmp_path):
    """Where the text `remember` would replace cannot be copied into the history (here the
    engine may write no file over 1 KiB: EFBIG, while the new notes would fit), the change
    is either refused, changing nothing however often it is retried, or done with that
    text kept all the same; once the history can be written it is done once, and the
    text it replaced is kept."""
    import resource
    home = Home(tmp_path / "mine")
    long_line = "- " + "x" * 3000
    home.notes.write_text(f"- keep me\n{long_line}\n")
    before = home.notes.read_text()
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        limits = resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE, (1024, limits[1]))
        try:
            for _ in range(3):
                r = s.call("remember", {"remove": long_line}, timeout=60)
                if not r["isError"]:
                    assert before in _kept(home)
                    break
                said = r["content"][0]["text"]
                assert "nothing was changed" in said, r
                assert home.notes.read_text() == before
        finally:
            resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE, limits)
        if r["isError"]:
            r = s.call("remember", {"remove": long_line}, timeout=60)
            assert r["isError"] is False, r
        assert home.notes.read_text() == "- keep me\n"
    assert before in _kept(home)
    assert not [p for p in home.notes.parent.iterdir() if p.name.startswith(".notes.md.lnkmem-")]
