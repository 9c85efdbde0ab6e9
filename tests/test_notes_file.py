"""§2.2 rev. 2: the notes are read with care and replaced beside themselves.

A notes.md that is a symbolic link is never followed, one over 4 MiB is never
read whole, a temp file left by a kill is removed at start, and a person's
editor saving (truncate, then write) while `remember` runs loses nothing.
"""

import os
import random
import threading
import time

from tests.helpers import Server, refs, until


def _text(r: dict) -> str:
    return r["content"][0]["text"]


def test_notes_link_is_not_followed(home, tmp_path):
    secret = tmp_path / "outside.txt"
    secret.write_text("- the vault code is 4417 zebrafish\n")
    home.notes.symlink_to(secret)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        r = s.call("remember", {"add": "copy me"})
        assert r["isError"] is True and "symbolic link" in _text(r), r
        r = s.call("read", {"ref": "notes"})
        assert r["isError"] is True and "symbolic link" in _text(r), r
        assert "zebrafish" not in str(s.search("zebrafish vault")["structuredContent"]["hits"])
    assert os.path.islink(home.notes)
    assert secret.read_text() == "- the vault code is 4417 zebrafish\n"


def test_huge_notes_are_not_read_whole(home):
    with open(home.notes, "wb") as f:  # 5 MiB, sparse: costs no disk
        f.truncate(5 << 20)
        f.seek((5 << 20) - 20)
        f.write(b"- quokka at the end\n")
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        r = s.call("remember", {"add": "more"})
        assert r["isError"] is True and "bytes" in _text(r) and "4194304" in _text(r), r
        r = s.call("read", {"ref": "notes"})
        assert r["isError"] is True and "4194304" in _text(r), r
        assert "notes" not in refs(s.search("quokka"))
        rss = int(open(f"/proc/{s.proc.pid}/status").read().split("VmHWM:")[1].split()[0])  # KiB
        assert rss < 200 * 1024, rss
    assert os.path.getsize(home.notes) == 5 << 20


def test_temp_file_left_by_a_kill_is_removed_at_start(home):
    home.notes.write_text("- kept\n")
    left = home.notes.parent / ".notes.md.lnkmem-abc123"
    left.write_text("- half")
    other = home.notes.parent / ".notes.md.other"  # not ours: left alone
    other.write_text("x")
    with Server.start(home) as s:
        s.initialize()
        assert until(lambda: not left.exists(), timeout=30)
        assert not _text(s.call("remember", {"add": "new"})).startswith("the notes could not")
    assert other.exists()
    assert home.notes.read_text() == "- kept\n- new\n"
    assert sorted(p.name for p in home.notes.parent.iterdir() if p.name.startswith(".notes")) == [".notes.md.other"]


def test_editor_saves_racing_remember_lose_nothing(home):
    """A plain editor save (open, truncate, write) in a loop races `remember`:
    every line the editor saved and every entry remembered survives."""
    home.notes.write_text("- seed entry\n")
    stop = threading.Event()
    saved: list[str] = []
    errors: list[BaseException] = []

    def editor():
        rng = random.Random(7)
        i = 0
        try:
            while not stop.is_set():
                line = f"- editor line {i}"
                with open(home.notes, "r+b") as f:  # what an editor without backup files does
                    text = f.read()
                    f.seek(0)
                    f.truncate()
                    f.flush()
                    time.sleep(rng.random() * 0.002)  # caught mid-write: empty
                    f.write(text + line.encode() + b"\n")
                saved.append(line)
                i += 1
                time.sleep(rng.random() * 0.01)  # kept: the editor's pause between saves
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    with Server.start(home, env={"LNK_MEMORY_SPEC": '{"notes": "1 MiB"}'}) as s:
        s.initialize()
        s.wait_indexed()
        t = threading.Thread(target=editor)
        t.start()
        remembered = []
        deadline = time.monotonic() + 4
        j = 0
        try:
            # at least six remembers beside the editor, however loaded the machine
            while time.monotonic() < deadline or (len(remembered) <= 5 and time.monotonic() < deadline + 60):
                r = s.call("remember", {"add": f"engine entry {j}"}, timeout=30)
                assert r["isError"] is False, _text(r)
                remembered.append(f"- engine entry {j}")
                j += 1
        finally:
            stop.set()
            t.join()
    assert not errors, errors
    assert len(saved) > 20 and len(remembered) > 5, (len(saved), len(remembered))
    lines = home.notes.read_text().splitlines()
    missing = [x for x in ["- seed entry"] + saved + remembered if x not in lines]
    assert not missing, missing
    assert len(lines) == len(set(lines)) == 1 + len(saved) + len(remembered)


def test_notes_held_open_for_writing_do_not_block_remember(home):
    """A program that keeps notes.md open for writing (idle) holds `remember` up only
    for the wait it is given (rev. 3: held open for writing is waited for until it is
    closed, at most LNKMEM_NOTES_WAIT_S; here 1 s), then the notes are judged by their
    times; the text replaced is kept either way."""
    home.notes.write_text("- held\n")
    held = open(home.notes, "ab")
    try:
        with Server.start(home, env={"LNKMEM_NOTES_WAIT_S": "1"}) as s:
            s.initialize()
            r = s.call("remember", {"add": "still works"}, timeout=30)  # (held open until the end: a wait for
            assert r["isError"] is False, _text(r)  # its close would meet the call's 30 s deadline)
    finally:
        held.close()
    assert home.notes.read_text() == "- held\n- still works\n"
