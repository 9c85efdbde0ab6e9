"""§2.2 rev. 3 (issue 34): nothing of the notes is lost, whatever the editor does.

Before `remember` replaces the notes, the text it replaces is kept in
``<state>/notes-history/`` (and the text it writes); a notes file held open for
writing is waited for until it is closed; an emptied or much shorter file that
changed within seconds is a write in progress. How to recover any text: list
the kept versions with ``lnk-lnkmem notes-history <state> --json`` (or see them
in ``lnk-lnkmem status``), print one with ``--show N``, put it back with
``--restore N`` (N: its number in the list, 1 the newest).
"""

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import Home, Many, Server, agent_entry, run_cli, until

# an editor's pause between its truncate and its write: each within `remember`'s wait for it
# (LNKMEM_NOTES_WAIT_S); `make soak` runs the longest, 10 s, under the default wait of 15 s
SOAK = os.environ.get("NOTES_SOAK") == "1"
DELAYS = (0.2, 1.5, 3.0, 10.0) if SOAK else (0.2, 1.5, 3.0, 5.0)
WAIT_ENV = {} if SOAK else {"LNKMEM_NOTES_WAIT_S": "8"}
EDITOR_S = float(os.environ.get("NOTES_EDITOR_S", "3"))  # `make soak` runs the rename editor 20 s


def history(home: Home) -> list[dict]:
    out = run_cli("notes-history", str(home.state), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["versions"]


def shown(home: Home, n: int) -> str:
    out = run_cli("notes-history", str(home.state), "--show", str(n))
    assert out.returncode == 0, out.stderr
    return out.stdout.decode()


def kept_texts(home: Home) -> list[str]:
    out = run_cli("notes-history", str(home.state), "--json", "--texts")
    assert out.returncode == 0, out.stderr
    texts = [v["text"] for v in json.loads(out.stdout)["versions"]]
    vs = history(home)
    if vs:  # the same as --show prints
        assert shown(home, vs[-1]["n"]) == texts[-1]
    return texts


def _truncate_then_write(notes, delay: float, style: str, truncated: threading.Event, line: str) -> None:
    if style == "held":  # an editor that truncates its open file, then writes into it later
        with open(notes, "r+b") as f:
            text = f.read()
            f.seek(0)
            f.truncate()
            f.flush()
            truncated.set()
            time.sleep(delay)  # kept: the editor's pause between its truncate and its write
            f.write(text + line.encode() + b"\n")
    else:  # truncates by name, then opens and writes later (no descriptor held between)
        text = notes.read_bytes()
        os.truncate(notes, 0)
        truncated.set()
        time.sleep(delay)  # kept: the editor's pause between its truncate and its write
        with open(notes, "wb") as f:
            f.write(text + line.encode() + b"\n")


def test_truncate_then_write_editor_loses_nothing(tmp_path):
    """Eight agents of one `serve-many`, each with an editor that empties the notes
    and writes them back `delay` s later (0.2, 1.5, 3 and 5 s, within a wait of 8; 10 s
    within the default 15 in `make soak`; holding the file
    open, or not), and a `remember` landing 0.1 s after the truncate: every note
    of the editor and of `remember` is in the notes at the end, and the text
    `remember` replaced (the editor's, whole) is a kept version."""
    cases = [(d, style) for d in DELAYS for style in ("held", "apart")]
    homes = {}
    for i, (d, style) in enumerate(cases):
        h = Home(tmp_path / f"a{i}")
        h.notes.write_text(f"- seed entry {i}\n- second seed {i}\n")
        h.write("doc.md", f"agent {i}\n")
        homes[f"a{i}"] = h
    with ThreadPoolExecutor(4) as pool:  # (each entry a run of the program: side by side)
        entries = dict(zip(homes, pool.map(lambda h: agent_entry(h, WAIT_ENV), homes.values())))
    m = Many(tmp_path / "run" / "m.sock", entries, env=WAIT_ENV)
    results: dict = {}
    try:
        clients = {}
        for a in homes:
            c = m.connect(timeout=60)
            assert c.first({"agent": a}) == {"ok": True}
            assert until(lambda: "indexing" not in c.search("probe")["structuredContent"], timeout=30)
            clients[a] = c

        def one(i: int, a: str, delay: float, style: str) -> None:
            truncated = threading.Event()
            ed = threading.Thread(target=_truncate_then_write,
                                  args=(homes[a].notes, delay, style, truncated, f"- editor line {i}"))
            ed.start()
            truncated.wait(10)
            time.sleep(min(0.1, delay / 2))  # kept: `remember` lands inside the editor's pause
            results[a] = clients[a].call("remember", {"add": f"engine entry {i}"})
            ed.join()

        ts = [threading.Thread(target=one, args=(i, a, d, st)) for i, (a, (d, st)) in enumerate(zip(homes, cases))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for c in clients.values():
            c.close()
    finally:
        assert m.stop() == 0
    wants, lost = {}, {}
    for i, (a, (d, style)) in enumerate(zip(homes, cases)):
        assert results[a]["isError"] is False, (d, style, results[a])
        wants[a] = [f"- seed entry {i}", f"- second seed {i}", f"- editor line {i}", f"- engine entry {i}"]
        have = homes[a].notes.read_text().splitlines()
        if have != wants[a]:
            lost[(d, style)] = have
    print(f"truncate-then-write: {len(lost)} of {len(cases)} cases lost notes: {sorted(lost)}")
    assert not lost, lost
    with ThreadPoolExecutor(4) as pool:  # (each a few runs of the program: side by side)
        kept = dict(zip(homes, pool.map(kept_texts, homes.values())))
    for a, (d, style) in zip(homes, cases):  # the text remember replaced (the editor's, whole) is kept
        assert "\n".join(wants[a][:3]) + "\n" in kept[a], (d, style)


def test_rename_editor_at_full_speed_loses_nothing(home):
    """An editor saving by rename (write a temp file, rename it over the notes) as fast
    as it can while `remember` runs in a loop: every line either wrote is in the notes
    at the end or, where the editor itself saved over a `remember` it had not read,
    in a kept version (`notes-history --show N`)."""
    home.notes.write_text("- seed entry\n")
    stop = threading.Event()
    saved: list[str] = []
    errors: list[BaseException] = []

    def editor() -> None:
        i = 0
        tmp = home.notes.parent / ".notes.md.editor~"
        try:
            while not stop.is_set():
                try:
                    text = home.notes.read_bytes()
                except FileNotFoundError:
                    text = b""
                line = f"- editor line {i}"
                tmp.write_bytes(text + line.encode() + b"\n")
                os.replace(tmp, home.notes)
                saved.append(line)
                i += 1
                if time.monotonic() >= deadline:  # past EDITOR_S: still saving, a few times a
                    stop.wait(0.2)  # second, so that the remembers checked below can land (CI at
                    # load 4: one landed in 63 s against notes grown to 1 MB at full speed)
                elif i % 20 == 0:  # hundreds of saves a second, with a breath now and then: a
                    time.sleep(0.002)  # writer that never pauses at all leaves a change no moment
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    env = {"LNK_MEMORY_SPEC": '{"notes": "4 MiB"}', "LNKMEM_NOTES_KEEP": "1000000",
           "LNKMEM_NOTES_KEEP_BYTES": str(1 << 40)}  # nothing dropped: every version looked at
    with Server.start(home, env=env) as s:
        s.initialize()
        s.wait_indexed()
        deadline = time.monotonic() + EDITOR_S
        t = threading.Thread(target=editor)
        t.start()
        remembered, refused = [], []
        try:
            j = 0
            # at least three remembers land beside the editor, however loaded the machine
            while time.monotonic() < deadline or (len(remembered) < 3 and time.monotonic() < deadline + 60):
                r = s.call("remember", {"add": f"engine entry {j}"}, timeout=60)
                if r["isError"]:  # an editor saving without a pause can outrun a change: it says so
                    said = r["content"][0]["text"]
                    assert "kept changing" in said, r
                    if "nothing was changed" in said:  # never written: in no version of the notes
                        refused.append(f"- engine entry {j}")
                    else:  # written, then saved over: it says whether the notes hold it
                        assert "saved over" in said and "hold it" in said, r
                    j += 1
                    continue
                remembered.append(f"- engine entry {j}")
                j += 1
        finally:
            stop.set()
            t.join()
    assert not errors, errors
    assert len(saved) > 50 and len(remembered) >= 3, (len(saved), len(remembered))
    final = set(home.notes.read_text().splitlines())
    # an entry refused with "nothing was changed" was never written: in no version (a refusal
    # after a write says so instead; seen once under load, an editor saving it again)
    assert not [x for x in refused if x in final], refused
    missing = [x for x in ["- seed entry"] + saved + remembered if x not in final]
    if missing:  # the editor saved over what it had not read: recoverable, and found so
        texts = kept_texts(home)
        gone = [x for x in missing if not any(x in t.splitlines() for t in texts)]
        assert not gone, (len(missing), gone[:5])
    print(f"rename editor {EDITOR_S:g} s: {len(saved)} saves, {len(remembered)} remembers; "
          f"{len(missing)} lines not in the notes at the end, all in kept versions "
          f"({len(history(home))} kept)")


def test_status_lists_kept_versions_and_one_is_restored(home):
    """`status` lists the kept versions; `notes-history --restore N` puts one back
    (the text the restore replaces is kept too); the count is bounded."""
    home.notes.write_text("- written by a person\n")
    with Server.start(home, env={"LNKMEM_NOTES_KEEP": "4"}) as s:
        s.initialize()
        s.wait_indexed()
        for k in range(6):
            assert s.call("remember", {"add": f"note {k}"})["isError"] is False
    vs = history(home)
    assert len(vs) == 4, vs  # bounded: the newest four
    assert [v["n"] for v in vs] == [1, 2, 3, 4] and all(v["why"] for v in vs)
    assert shown(home, 1) == home.notes.read_text()
    out = run_cli("status", str(home.folder), str(home.state), "--agent", str(home.agent))
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode()
    assert "4 earlier versions kept" in text and "notes-history" in text, text
    st = json.loads(run_cli("status", str(home.folder), str(home.state), "--agent", str(home.agent),
                            "--json").stdout)
    assert [v["id"] for v in st["notes_history"]] == [v["id"] for v in vs]
    old = shown(home, 4)
    before = home.notes.read_text()
    out = run_cli("notes-history", str(home.state), "--agent", str(home.agent), "--restore", "4")
    assert out.returncode == 0, out.stderr
    assert home.notes.read_text() == old and old != before
    assert before in kept_texts(home)  # the text the restore replaced, kept
    for bad in (["--restore", "99"], ["--show", "0"], ["--restore", "x"]):
        out = run_cli("notes-history", str(home.state), "--agent", str(home.agent), *bad)
        assert out.returncode == 2 and b"Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
    assert home.notes.read_text() == old


def test_notes_emptied_on_purpose_are_built_on_after_the_wait_and_kept(home):
    """Notes a person emptied are a write in progress only for the wait (here 0.5 s):
    then `remember` builds on the empty file, and the text from before it was
    emptied is a kept version."""
    home.notes.write_text("- a\n- b\n- c\n")
    with Server.start(home, env={"LNKMEM_NOTES_WAIT_S": "0.5"}) as s:
        s.initialize()
        s.wait_indexed()
        home.notes.write_text("")  # a person empties them on purpose
        r = s.call("remember", {"add": "fresh start"}, timeout=30)
        assert r["isError"] is False
    assert home.notes.read_text() == "- fresh start\n"
    assert "- a\n- b\n- c\n" in kept_texts(home)  # what was there before it was emptied


@pytest.mark.parametrize("which", ["--show", "--restore"])
def test_notes_history_without_any(tmp_path, which):
    state = tmp_path / "state"
    state.mkdir()
    out = run_cli("notes-history", str(state), which, "1", "--notes", str(tmp_path / "notes.md"))
    assert out.returncode == 2 and b"no version" in out.stderr, out.stderr
    out = run_cli("notes-history", str(state), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["versions"] == []


def test_a_temp_file_left_by_a_kill_is_kept_before_it_is_removed(home):
    """A kill right after the exchange leaves the replaced text under the temp name:
    the next start keeps it as a version, then removes the file."""
    home.notes.write_text("- current\n")
    left = home.notes.parent / ".notes.md.lnkmem-0123456789ab"
    left.write_text("- the text an exchange swapped out\n")
    with Server.start(home) as s:
        s.initialize()
        assert until(lambda: not left.exists(), timeout=30)
    assert "- the text an exchange swapped out\n" in kept_texts(home)
    assert home.notes.read_text() == "- current\n"


TEN = "".join(f"- old entry {k}\n" for k in range(10))


def _editor(notes, style: str, truncated: threading.Event, go: threading.Event, text: bytes) -> None:
    """An editor that empties the notes, then saves ``text`` once ``go`` is set (after the
    `remember`, long past its wait): into the file it held open, or by name."""
    if style == "held":
        with open(notes, "r+b") as f:
            f.truncate(0)
            truncated.set()
            go.wait(60)
            f.write(text)
    else:
        os.truncate(notes, 0)
        truncated.set()
        go.wait(60)
        with open(notes, "wb") as f:
            f.write(text)


def _all_there(home: Home, want: list[str]) -> bool:
    have = home.notes.read_text().splitlines()
    return all(have.count(x) == 1 for x in want)


@pytest.mark.parametrize("style", ["held", "apart"])
def test_an_editor_saving_after_remember_gave_up_waiting_loses_nothing(home, style):
    """Issue 46: an editor empties the notes and saves long after `remember` stopped
    waiting (here 1 s): `remember` writes on the emptied file, then the editor's save
    lands (into the file it held open, which `remember` replaced, or over the notes by
    name). Both are in the notes at the end: the editor's ten entries and its new line,
    and the note `remember` added; the editor's save is a kept version too."""
    home.notes.write_text(TEN)
    save = (TEN + "- editor line\n").encode()
    with Server.start(home, env={"LNKMEM_NOTES_WAIT_S": "1"}) as s:
        s.initialize()
        s.wait_indexed()
        assert s.call("read", {"ref": "notes"})["isError"] is False  # the engine has read the ten
        truncated, go = threading.Event(), threading.Event()
        ed = threading.Thread(target=_editor, args=(home.notes, style, truncated, go, save))
        ed.start()
        assert truncated.wait(10)
        want = _remembered_then_saved(s, home, go, ed)
    assert _all_there(home, want), home.notes.read_text()
    kept = kept_texts(home)
    assert any(all(x in t.splitlines() for x in TEN.splitlines()) for t in kept), kept


def _remembered_then_saved(s, home, go: threading.Event, ed: threading.Thread) -> list[str]:
    """`remember` while the editor ``ed`` holds its save, then the save (``go``): both land in
    the notes (the lines wanted: the ten, the editor's, the engine's)."""
    try:
        r = s.call("remember", {"add": "engine entry"}, timeout=60)
    finally:
        go.set()
        ed.join()
    assert r["isError"] is False, r
    want = TEN.splitlines() + ["- editor line", "- engine entry"]
    assert until(lambda: _all_there(home, want), timeout=30), home.notes.read_text()
    return want


@pytest.mark.parametrize("style", ["held", "apart"])
def test_remember_before_the_engine_read_the_notes_loses_none_of_them(home, style):
    """Issue 46: an editor (holding the notes open, or not) has emptied them before the
    engine started, and saves its ten entries after the first `remember` (which came
    before the engine read anything): none of the ten is lost, nor the note remembered.
    The emptying is seconds older than the engine's wait for a writer (a start slowed by
    a busy machine): the note remembered was lost, saved over by name."""
    home.notes.write_text(TEN)
    truncated, go = threading.Event(), threading.Event()
    save = (TEN + "- editor line\n").encode()
    ed = threading.Thread(target=_editor, args=(home.notes, style, truncated, go, save))
    ed.start()
    assert truncated.wait(10)
    past = time.time() - 5  # emptied a while before the engine's start (past its 1 s wait: a slow start)
    os.utime(home.notes, (past, past))
    try:
        with Server.start(home, env={"LNKMEM_NOTES_WAIT_S": "1"}) as s:
            s.initialize()
            want = _remembered_then_saved(s, home, go, ed)
    finally:
        go.set()
        ed.join()
    assert _all_there(home, want), home.notes.read_text()


def test_a_note_removed_after_remember_on_emptied_notes_stays_removed(home):
    """What the engine watches after a change on emptied notes (an editor's save over
    it) is a save by someone else: the agent removing its own note afterwards, then a
    person saving, does not bring the note back; the person's save is kept whole."""
    home.notes.write_text(TEN)
    with Server.start(home, env={"LNKMEM_NOTES_WAIT_S": "0.5"}) as s:
        s.initialize()
        s.wait_indexed()
        assert s.call("read", {"ref": "notes"})["isError"] is False
        os.truncate(home.notes, 0)  # emptied, and no save follows
        assert s.call("remember", {"add": "short lived"}, timeout=60)["isError"] is False
        assert home.notes.read_text() == "- short lived\n"
        assert s.call("remember", {"remove": "short lived"}, timeout=60)["isError"] is False
        tmp = home.notes.parent / "editor~"
        tmp.write_text("- a person's line\n")
        os.replace(tmp, home.notes)
        # the save is looked at within a second: the note removed must not come back
        assert not until(lambda: "short lived" in home.notes.read_text(), timeout=5)
        assert home.notes.read_text() == "- a person's line\n"


def test_a_save_into_the_replaced_file_after_a_kill_is_kept_at_the_next_start(home):
    """The engine killed while it watches the file `remember` replaced (its editor still
    holding it open): the editor's save lands there, and the next start keeps it as a
    version (`notes-history --show N`), then removes the file."""
    home.notes.write_text(TEN)
    save = (TEN + "- editor line\n").encode()
    truncated, go = threading.Event(), threading.Event()
    with Server.start(home, env={"LNKMEM_NOTES_WAIT_S": "1"}) as s:
        s.initialize()
        s.wait_indexed()
        assert s.call("read", {"ref": "notes"})["isError"] is False
        ed = threading.Thread(target=_editor, args=(home.notes, "held", truncated, go, save))
        ed.start()
        assert truncated.wait(10)
        try:
            assert s.call("remember", {"add": "engine entry"}, timeout=60)["isError"] is False
            s.proc.kill()
            s.proc.wait()
        finally:
            go.set()
            ed.join()
    left = [p for p in home.notes.parent.iterdir() if p.name.startswith(".notes.md.lnkmem-")]
    assert len(left) == 1 and left[0].read_bytes() == save, left
    with Server.start(home) as s:
        s.initialize()
        assert until(lambda: not left[0].exists(), timeout=10)
    assert save.decode() in kept_texts(home)
    assert home.notes.read_text() == "- engine entry\n"
