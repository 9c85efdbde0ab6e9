"""§2.2 rev. 3 (issue 34): an agent's notes and state are never reached through a
link below its agent folder. `<agent>/memory` swapped for a link to another
agent's memory folder made `read` serve the other agent's notes, `remember`
write into them and the index be created there; in `serve-many` one agent
reached another's notes. The folders are opened once, component by component
with O_NOFOLLOW from the agent folder's descriptor, and a link is refused for
that agent alone."""

import os
import shutil

from tests.helpers import Home, Many, Server, agent_entry, until


def _two(tmp_path):
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    a.write("doc.md", "agent a's own file\n")
    b.write("doc.md", "agent b's own file\n")
    a.notes.write_text("- a's note\n")
    b.notes.write_text("- b's secret: the vault code is 4417 zebrafish\n")
    return a, b


def _swap_memory_for_link(a: Home, b: Home) -> None:
    shutil.rmtree(a.agent / "memory")
    os.symlink(b.agent / "memory", a.agent / "memory")


def test_memory_swapped_for_a_link_is_refused_in_serve_many(tmp_path):
    a, b = _two(tmp_path)
    m = Many(tmp_path / "run" / "m.sock", {"a": agent_entry(a), "b": agent_entry(b)})
    try:
        _swap_memory_for_link(a, b)  # after the start: Agents were fine when read
        with m.connect() as c:
            r = c.first({"agent": "a"})
            assert "link" in r.get("error", ""), r
            assert c.closed()
        with m.connect() as c:  # a `changed` control for it: refused too, nothing opened
            r = c.first({"changed": {"owner": "o1", "agent": "a", "path": "memory/notes.md"}})
            assert "link" in r.get("error", ""), r
        assert not (b.agent / "memory" / "lnkmem").exists()  # no index made in b's folder
        with m.hello("b") as c:  # the other agent is served, its notes its own
            assert until(lambda: "indexing" not in c.search("probe")["structuredContent"], timeout=30)
            r = c.call("read", {"ref": "notes"})
            assert "zebrafish" in r["structuredContent"]["text"]
            assert c.call("remember", {"add": "b's own new note"})["isError"] is False
    finally:
        assert m.stop() == 0
    assert b.notes.read_text() == "- b's secret: the vault code is 4417 zebrafish\n- b's own new note\n"
    assert "Traceback" not in m.stderr()


def test_memory_swapped_for_a_link_is_refused_in_serve(tmp_path):
    a, b = _two(tmp_path)
    _swap_memory_for_link(a, b)
    with Server.start(a) as s:
        s.initialize()
        for tool, args in (("read", {"ref": "notes"}), ("remember", {"add": "into b?"}),
                           ("search", {"query": "zebrafish"}), ("list", {})):
            r = s.call(tool, args)
            assert r["isError"] is True and "link" in r["content"][0]["text"], (tool, r)
            assert "zebrafish" not in str(r)
        assert s.request("ping")["result"] == {}
    assert s.proc.returncode == 0 and b"Traceback" not in s.stderr
    assert b.notes.read_text() == "- b's secret: the vault code is 4417 zebrafish\n"
    assert not (b.agent / "memory" / "lnkmem").exists()


def test_state_folder_a_link_is_refused(tmp_path):
    a, b = _two(tmp_path)
    (b.agent / "memory" / "lnkmem").mkdir()
    os.symlink(b.agent / "memory" / "lnkmem", a.state)  # <agent>/memory/lnkmem -> b's state
    with Server.start(a) as s:
        s.initialize()
        r = s.call("remember", {"add": "x"})
        assert r["isError"] is True and "link" in r["content"][0]["text"], r
    assert os.listdir(b.agent / "memory" / "lnkmem") == []
    assert a.notes.read_text() == "- a's note\n"


def test_memory_swapped_while_serving_changes_nothing(tmp_path):
    """Resolved once: a swap after the start is never followed; `remember` goes on
    writing the agent's own notes (the folder it opened), never the other's."""
    a, b = _two(tmp_path)
    with Server.start(a) as s:
        s.initialize()
        s.wait_indexed()
        assert s.call("remember", {"add": "first"})["isError"] is False
        os.rename(a.agent / "memory", a.agent / "memory.moved")
        os.symlink(b.agent / "memory", a.agent / "memory")
        r = s.call("remember", {"add": "second"})
        assert r["isError"] is False, r
        r = s.call("read", {"ref": "notes"})
        assert "zebrafish" not in str(r)
    assert b.notes.read_text() == "- b's secret: the vault code is 4417 zebrafish\n"
    assert (a.agent / "memory.moved" / "notes.md").read_text() == "- a's note\n- first\n- second\n"


def test_chats_or_skills_a_link_to_another_agents_is_refused(tmp_path):
    """No agent's folder is reached through a link (issue 34): `<agent>/chats` or
    `<agent>/skills` swapped for a link to another agent's served that agent's
    conversations and skills to this one's searches and reads."""
    a, b = _two(tmp_path)
    (b.agent / "chats").mkdir(exist_ok=True)
    (b.agent / "chats" / "t1.jsonl").write_text(
        '{"role": "user", "content": "the zebrafish launch codes are private", "at": "2026-12-01T10:00:00Z"}\n')
    (b.agent / "skills" / "private").mkdir(parents=True, exist_ok=True)
    (b.agent / "skills" / "private" / "SKILL.md").write_text("zebrafish handling, b's alone\n")
    for name in ("chats", "skills"):
        for n in ("chats", "skills"):
            if (a.agent / n).is_symlink():
                os.unlink(a.agent / n)
                (a.agent / n).mkdir()
        shutil.rmtree(a.agent / name, ignore_errors=True)
        os.symlink(b.agent / name, a.agent / name)
        with Server.start(a) as s:
            s.initialize()
            for tool, args in (("search", {"query": "zebrafish"}), ("read", {"ref": f"{name}/x"}), ("list", {})):
                r = s.call(tool, args)
                assert r["isError"] is True and "link" in r["content"][0]["text"], (name, tool, r)
                assert "zebrafish" not in str(r)
        assert s.proc.returncode == 0 and b"Traceback" not in s.stderr
