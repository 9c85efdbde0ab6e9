"""The state folder is the engine's alone (issue 46): whatever is planted at a name the
engine uses there -- a link to a file outside, a folder, a FIFO -- is never written
through, never waited on, and never disables a tool. Each case: the file the link leads
to is byte for byte as it was, every tool answers within 20 s, and the index works
(then and at the next start). In `<state>` (`lnk-lnkmem index`, `status`, `serve`) and
in a bound cache (`serve-many --cache`).

Every fixed name the engine makes in those folders is listed once below (from the code:
its constants where it has them), so a new one joins the matrix by joining the list.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from lnkmem.cli.common import LOCK_NAME
from lnkmem.index.lmdbfile import COMPACTING, LISTED, SEAL, SNAP
from lnkmem.index.store import Store
from lnkmem.memory.watch import WATCH_FILE
from lnkmem.memory.noteshistory import FOLDER as HISTORY_FOLDER
from lnkmem.replica.sync import StateFile
from tests.bridges import Layout
from tests.helpers import Home, Server, refs, run_cli, until

# the index's folder's own names: LMDB's two files; the seal, snapshot and listings saved
# at a clean close; the fixed temp names older versions wrote them through (a link there
# is what an attacker would plant); the folder a compaction is written in
INDEX_NAMES = ["data.mdb", "lock.mdb", SEAL, SNAP, LISTED, SEAL + ".tmp", SNAP + ".tmp", LISTED + ".tmp",
               COMPACTING]
# <state>: the build lock, the watch's state (for `status`), the index's folder, the folder a new version of the index is
# loaded in beside it, the temp folder, the index's names (a link or what is not a folder at
# the index's folder: removed, never followed, and the index made anew)
STATE_NAMES = [LOCK_NAME, WATCH_FILE, "index", "index" + Store.BESIDE, "tmp"] + [f"index/{n}" for n in INDEX_NAMES]
# a bound cache (<cache>/<owner>/<agent>): the write-back's state (and its older fixed temp
# name), the index's folder and its names, the temp folder
CACHE_NAMES = [StateFile.NAME, StateFile.NAME + ".tmp", "index", "tmp"] + [f"index/{n}" for n in INDEX_NAMES]
KINDS = ["link", "folder", "fifo"]

SECRET = b"a file outside the state folder, never to be written\n"
ANSWER_S = 20


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def plant(where: Path, kind: str, outside: Path) -> None:
    """Put ``kind`` at ``where`` in place of whatever the engine had there."""
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    elif os.path.lexists(where):
        os.unlink(where)
    where.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link":
        os.symlink(outside, where)
    elif kind == "folder":
        where.mkdir()
        (where / "left.txt").write_text("something a person left\n")
    else:
        os.mkfifo(where)


def _outside(tmp_path: Path) -> tuple[Path, str]:
    outside = tmp_path / "outside" / "precious.txt"
    outside.parent.mkdir()
    outside.write_bytes(SECRET)
    return outside, sha(outside)


def _served(home: Home, env=None, query: str = "pangolin", ref: str = "home/a.md") -> None:
    """A serve answers a search for the one file (``ref``) within 20 s, and closes cleanly."""
    with Server.start(home, env=env) as s:
        s.initialize()
        assert until(lambda: _hits(s, query) == [ref], timeout=ANSWER_S), (_hits(s, query), s.stderr[-2000:])
        assert s.close() == 0, s.stderr[-2000:]


# what meets each kind first: the people's read-only commands, the builder, a serve; the
# kinds take these in turn by the name's place in the list, so that across the names every
# kind is met first by every command (and each sequence ends with a start on what the last
# command left)
MEETS = [("status", "search", "index", "serve"), ("serve", "serve"), ("status", "search", "serve", "index")]


def _met(home: Home, command: str, kind: str) -> None:
    """``command`` run on ``home`` as it is: it succeeds (a search finds the one file)."""
    people = [str(home.folder), str(home.state), "--agent", str(home.agent)]
    if command == "serve":
        _served(home)
        return
    args = {"index": home.args(), "status": people, "search": [*people, "pangolin"]}[command]
    r = run_cli(command, *args, timeout=ANSWER_S)
    assert r.returncode == 0, (kind, command, r.stderr[-2000:])
    assert command != "search" or b"home/a.md" in r.stdout, (kind, r.stdout[-2000:], r.stderr[-2000:])


@pytest.mark.parametrize("name", STATE_NAMES)
def test_a_name_of_the_state_folder_planted_is_never_written_through_nor_fatal(tmp_path, name):
    """Each kind (a link, a folder, a FIFO) planted at ``name`` in turn, each over what the
    engine made of the last (two clean closes leave the state as a first serve's did), and
    met first by `status` and `search`, by `index` or by a serve (:data:`MEETS`): every
    command works, the index then and at the next start, and the file a link leads to is
    never written."""
    home = Home(tmp_path)
    home.write("a.md", "The pangolin eats ants.\n")
    r = run_cli("index", *home.args(), timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    _served(home)  # (a serve's clean close leaves the seal, the snapshot and the listings)
    outside, before = _outside(tmp_path)
    turn = STATE_NAMES.index(name)
    for i, kind in enumerate(KINDS):
        plant(home.state / name, kind, outside)
        for command in MEETS[(i + turn) % len(MEETS)]:
            _met(home, command, kind)
        assert outside.read_bytes() == SECRET and sha(outside) == before, kind
    _served(home)  # and at the next start
    assert outside.read_bytes() == SECRET and sha(outside) == before


BRIDGES = Layout(homes={"a1": {"a.md": "The pangolin eats ants.\n"}})


def _bound_served(bridges, tmp_path: Path) -> None:
    """A serve-many bound to a1 answers a search within 20 s, writes back, and stops."""
    with bridges.serve_many(tmp_path, "m", env={"LNKMEM_QUIET_S": "0.2"}) as m:
        with m.connect(timeout=ANSWER_S + 10) as c:
            assert c.first(bridges.bound()) == {"ok": True}
            got = until(lambda: _hits(c) == ["home/a.md"], timeout=ANSWER_S)
            assert got, _hits(c)
            with m.connect(timeout=ANSWER_S + 10) as ctl:
                assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert m.stop() == 0, m.stderr()[-2000:]


def _hits(c, query: str = "pangolin") -> list:
    """What a search for the one file answers: its refs, or the tool's error."""
    r = c.call("search", {"query": query}, **({"timeout": ANSWER_S} if isinstance(c, Server) else {}))
    return r["content"] if r.get("isError") else refs(r)


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_a_name_of_a_bound_cache_planted_is_never_written_through_nor_fatal(bridges, tmp_path, name):
    """As in <state>: each kind planted at ``name`` of a bound cache in turn, over what the
    engine made of the last; served and written back each time, and served again at the
    next start: right after one kind, in turn across the names, and after the last."""
    _bound_served(bridges, tmp_path)
    cache = tmp_path / "cache-m" / "o1" / "a1"
    assert (cache / "index" / "data.mdb").is_file()
    outside, before = _outside(tmp_path)
    turn = CACHE_NAMES.index(name)
    for i, kind in enumerate(KINDS):
        plant(cache / name, kind, outside)
        _bound_served(bridges, tmp_path)
        if i == turn % len(KINDS):
            _bound_served(bridges, tmp_path)  # and at the next start, before another kind is planted
        assert outside.read_bytes() == SECRET and sha(outside) == before, kind
    _bound_served(bridges, tmp_path)  # and at the next start
    assert outside.read_bytes() == SECRET and sha(outside) == before


def test_temp_files_of_a_write_killed_midway_are_removed_by_the_next(tmp_path):
    """A process killed between its temp file and the rename leaves the temp file: the
    next write of that name removes it (its writer has ended); a live writer's is kept."""
    import subprocess
    home = Home(tmp_path)
    home.write("a.md", "The pangolin eats ants.\n")
    _served(home)
    dead = subprocess.Popen(["true"])
    dead.wait()
    index = home.state / "index"
    left = [index / f".{n}.{dead.pid}.0123456789ab.tmp" for n in (SEAL, SNAP, LISTED)] + \
        [index / f"{n}.tmp" for n in (SEAL, SNAP, LISTED)]  # (an older version's names)
    live = index / f".{SEAL}.{os.getpid()}.0123456789ab.tmp"
    for p in left + [live]:
        p.write_bytes(b"half written")
    home.write("b.md", "The aardvark digs.\n")  # (a change: every file saved again at the close)
    # (a restart looks at the Home after its first answer: the change waited for, so that the close has it to save)
    _served(home, query="aardvark", ref="home/b.md")
    assert [p.name for p in left if p.exists()] == []
    assert live.exists()


def test_a_link_at_the_temp_folder_never_reaches_the_folder_it_leads_to(tmp_path):
    """Issue 46 (read from the code): a link at `<state>/tmp` to another folder had the
    start's clean-up list that folder (the link followed) and delete its files older than a
    minute. The link is removed, never followed; the folder it led to is as it was."""
    home = Home(tmp_path)
    home.write("a.md", "The pangolin eats ants.\n")
    other = tmp_path / "other-agent" / "memory"
    other.mkdir(parents=True)
    kept = other / "notes.md"
    kept.write_bytes(SECRET)
    os.utime(kept, (1_000_000_000, 1_000_000_000))  # old: what the clean-up would take for a temp left
    (other / "p999999").mkdir()  # a per-process folder of a process gone, by its name
    home.state.mkdir(parents=True, exist_ok=True)
    os.symlink(other, home.state / "tmp")
    _served(home)
    assert kept.read_bytes() == SECRET and (other / "p999999").is_dir()
    assert not (home.state / "tmp").is_symlink()


def test_a_folder_swapped_for_a_link_to_another_agents_while_serving_is_never_written_there(tmp_path):
    """Issue 46: while an agent is served, its `memory/` is replaced by a link to another
    agent's. The engine's clean close wrote its seal, snapshot and listings through the link
    into the other agent's index folder. What a close saves beside data.mdb goes only to the
    folder the index was opened in; the other agent's index is byte for byte as it was, and
    opens as it was left (sealed)."""
    from lnkmem.index.store import Store
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    a.write("a.md", "The pangolin eats ants.\n")
    b.write("a.md", "The pangolin of the other agent.\n")
    r = run_cli("index", *b.args(), timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    _served(b)
    theirs = b.state / "index"
    before = {p.name: sha(p) for p in theirs.iterdir() if p.is_file()}
    with Server.start(a) as s:
        s.initialize()
        assert until(lambda: _hits(s) == ["home/a.md"], timeout=ANSWER_S)
        os.rename(a.agent / "memory", tmp_path / "a-memory-away")
        os.symlink(b.agent / "memory", a.agent / "memory")
        assert _hits(s) == ["home/a.md"]  # its own index, still
        assert s.close() == 0, s.stderr[-2000:]
    after = {p.name: sha(p) for p in theirs.iterdir() if p.is_file()}
    assert after == before
    st = Store.open(str(theirs))
    try:
        assert st.opened_as == "sealed" and sorted(st.all_files()) == ["home/a.md"]
    finally:
        st.close()


# --- swapped while serving ---------------------------------------------------------------
# every folder the engine reaches below the agent folder while it serves, from the code: the
# notes' folder (`memory/`, <state>'s parent), <state>, and the folders it makes there (the
# index's, the temp folder, the notes history). Each is replaced, while an agent is served,
# by a link to another agent's same folder: the engine goes on in the folder it opened at its
# start (never the link), so nothing of the other agent's is read, written or deleted.
SWAPPED = ["memory", "memory/lnkmem", "memory/lnkmem/index", "memory/lnkmem/tmp",
           f"memory/lnkmem/{HISTORY_FOLDER}"]


def hashes(top: Path) -> dict:
    """Every file and folder below ``top``: a file's hash, a folder's or a link's kind."""
    out = {}
    for root, dirs, files in os.walk(top):
        for d in dirs:
            p = Path(root, d)
            out[str(p.relative_to(top))] = "link" if p.is_symlink() else "folder"
        for f in files:
            p = Path(root, f)
            out[str(p.relative_to(top))] = "link" if p.is_symlink() else sha(p)
    return out


def _swap_for_link(own: Path, theirs: Path, away: Path) -> None:
    os.rename(own, away)
    os.symlink(theirs, own)


def _found(c, query: str) -> list:
    r = c.call("search", {"query": query}, **({"timeout": ANSWER_S} if isinstance(c, Server) else {}))
    return r["content"] if r.get("isError") else refs(r)


@pytest.mark.parametrize("name", SWAPPED)
def test_a_folder_swapped_for_a_link_while_serving_changes_nothing_of_the_other_agents(tmp_path, name):
    """Issue 46: a folder of the engine's swapped after start for a link to another agent's
    same folder. The engine deleted the other agent's index files (data.mdb, lock.mdb, the
    seal, snapshot and listings) and answered "index is damaged" for good. Now the other
    agent's folder is as it was (every file's hash, no new name), and the served agent goes
    on answering -- a file written after the swap found within 20 s -- and `remember` too."""
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    a.write("a.md", "The pangolin eats ants.\n")
    b.write("a.md", "The pangolin of the other agent.\n")
    b.notes.write_text("the other agent's notes\n")
    _served(b)
    (a.state / "tmp").mkdir(parents=True)
    with Server.start(a) as s:
        s.initialize()
        assert until(lambda: _hits(s) == ["home/a.md"], timeout=ANSWER_S), _hits(s)
        # the other agent's folders hold what the served one would touch in its own: its
        # temp folder's name, a notes history
        (b.state / "tmp" / f"p{s.proc.pid}").mkdir(parents=True)
        (b.state / "tmp" / f"p{s.proc.pid}" / "kept.txt").write_bytes(SECRET)
        (b.state / HISTORY_FOLDER).mkdir(exist_ok=True)
        before = hashes(b.agent)
        r = s.call("remember", {"add": "a note kept before the swap"})
        assert not r.get("isError"), r
        _swap_for_link(a.agent / name, b.agent / name, tmp_path / "away")
        r = s.call("remember", {"add": "a note kept after the swap"})
        assert not r.get("isError"), (r, s.stderr[-3000:])
        a.write("b.md", "The aardvark digs at night.\n")
        assert until(lambda: _found(s, "aardvark") == ["home/b.md"], timeout=ANSWER_S), \
            (_found(s, "aardvark"), s.stderr[-3000:])
        # its own index found damaged (cut short): rebuilt where it was opened, never through the link
        own = [p for p in (tmp_path / "away").rglob("data.mdb")] or [a.state / "index" / "data.mdb"]
        os.truncate(own[0], 0)
        assert until(lambda: _found(s, "aardvark") == ["home/b.md"] and _hits(s) == ["home/a.md"],
                     timeout=ANSWER_S), (_found(s, "aardvark"), s.stderr[-3000:])
        assert s.close() == 0, s.stderr[-2000:]
    assert hashes(b.agent) == before


# a bound cache's folders (<cache>/<owner>/<agent>, its index's), each swapped while served
CACHE_SWAPPED = ["", "index"]


@pytest.mark.parametrize("name", CACHE_SWAPPED)
def test_a_bound_cache_folder_swapped_for_a_link_while_serving_changes_nothing_of_the_other_agents(
        bridges, tmp_path, name):
    """Issue 46, in a bound cache: its folder (or its index's) swapped while the agent is served
    for a link to another agent's same folder. Nothing of the other agent's is touched (every
    file's hash, no new name), and the served agent goes on: a change after the swap found
    within 20 s, its index found damaged rebuilt where it was opened, written back."""
    _bound_served(bridges, tmp_path)
    root = tmp_path / "cache-m" / "o1"
    shutil.copytree(root / "a1", root / "a2")  # (another agent's cache, as the engine leaves one)
    before = hashes(root / "a2")
    with bridges.serve_many(tmp_path, "m", env={"LNKMEM_QUIET_S": "0.2"}) as m:
        with m.connect(timeout=ANSWER_S + 10) as c:
            assert c.first(bridges.bound()) == {"ok": True}
            assert until(lambda: _hits(c) == ["home/a.md"], timeout=ANSWER_S), _hits(c)
            own, theirs = root / "a1" / name, root / "a2" / name
            _swap_for_link(own, theirs, tmp_path / "away")
            bridges.changed_and_flushed(m, c, "b.md", "The aardvark digs at night.\n", "aardvark", timeout=ANSWER_S)
            os.truncate(next((tmp_path / "away").rglob("data.mdb")), 0)
            assert until(lambda: _found(c, "aardvark") == ["home/b.md"] and _hits(c) == ["home/a.md"],
                         timeout=ANSWER_S), (_found(c, "aardvark"), m.stderr()[-3000:])
        assert m.stop() == 0, m.stderr()[-2000:]
    assert hashes(root / "a2") == before


# --- status: the watch's state and what was moved aside ------------------------------------

def _status(home: Home) -> str:
    r = run_cli("status", str(home.folder), str(home.state), "--agent", str(home.agent), timeout=ANSWER_S)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.decode()


def test_status_shows_each_folders_watch_watched_then_re_arming_then_watched_again(tmp_path):
    """Issue 46: a watched folder deleted and made again is watched again, and `status` says
    so: each folder's watch (watched / polling / re-arming) as the serve keeps it."""
    home = Home(tmp_path)
    home.write("a.md", "The pangolin eats ants.\n")
    chats = home.agent / "chats"
    with Server.start(home) as s:
        s.initialize()
        assert until(lambda: _hits(s) == ["home/a.md"], timeout=ANSWER_S)
        line = f"watch   {chats}: "
        assert until(lambda: line + "watched" in _status(home), timeout=ANSWER_S), _status(home)
        shutil.rmtree(chats)
        assert until(lambda: line + "re-arming" in _status(home), timeout=ANSWER_S), _status(home)
        chats.mkdir()
        home.chat("t1", [{"role": "user", "content": "The aardvark digs at night."}])
        assert until(lambda: _found(s, "aardvark") == ["chats/t1.jsonl"], timeout=ANSWER_S), s.stderr[-2000:]
        assert until(lambda: line + "watched" in _status(home), timeout=ANSWER_S), _status(home)
        assert s.close() == 0
    assert "it has ended" in _status(home)


def test_a_link_at_the_index_folder_is_moved_aside_shown_in_status_and_the_newest_two_kept(tmp_path):
    """Issue 46: a link found at <state>/index at start is moved aside (never followed) and
    the index made anew; `status` lists what was moved aside; planted again and again, only
    the newest two moved aside of a name are kept (the disk never fills)."""
    home = Home(tmp_path)
    home.write("a.md", "The pangolin eats ants.\n")
    outside, before = _outside(tmp_path)
    for _ in range(4):
        plant(home.state / "index", "link", outside.parent)
        _served(home)
        assert not (home.state / "index").is_symlink()
    moved = sorted(p.name for p in home.state.iterdir() if ".moved-" in p.name)
    assert len(moved) == 2 and all(n.startswith("index.moved-") for n in moved), moved
    assert all((home.state / n).is_symlink() for n in moved)
    text = _status(home)
    assert "2 things found in a wrong shape" in text and all(n in text for n in moved), text
    assert sha(outside) == before and sorted(os.listdir(outside.parent)) == ["precious.txt"]
