"""A team's memory (§5.5): writers keep the team's copy, readers search it."""

import json

from tests.bridges import KEY, OTHER_KEY, Layout
from tests.helpers import until

BRIDGES = Layout(bindings={"a1": {"owner": "o1", "key": KEY}, "a2": {"owner": "o2", "key": OTHER_KEY},
                           "a3": {"owner": "o3", "key": "c3" * 32}},
                 teams={"t1": {"folder": "teams/t1", "names": {"a1": "crew", "a2": "o1/crew", "a3": "crew"},
                               "grants": {"a1": "all", "a2": "all", "a3": "part"}}},
                 team_files={"t1": {"memory/charter.md": "The crew charters a schooner every July.\n",
                                    "outside.md": "schooner gossip outside memory/\n"}})


def line(b, agent, owner, key, named, writes):
    first = b.bound(agent=agent, owner=owner, key=key, notes=None)
    first["team"] = {"id": "t1", "named": named, "writes": writes}
    return first


def refs(c, q):
    return [h["ref"] for h in c.search(q)["structuredContent"]["hits"]]


def first_copy_then_other(bridges, mw, w, other, word: str, ref: str, other_writes: bool) -> None:
    """The first member (a1, writing, session ``w`` of ``mw``) finds ``word`` in ``ref`` and
    flushes the team's first copy; then ``other`` (a2) binds and finds it too."""
    assert w.first(line(bridges, "a1", "o1", KEY, "crew", True)) == {"ok": True}
    assert until(lambda: refs(w, word) == [ref], timeout=15)
    with mw.connect() as ctl:
        assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
    assert other.first(line(bridges, "a2", "o2", OTHER_KEY, "o1/crew", other_writes)) == {"ok": True}
    assert until(lambda: refs(other, word) == [ref], timeout=15)


def copy_names(bridges) -> set:
    """Every file the team copy's manifest names now."""
    m = json.loads((bridges.team_copy("t1") / "manifest.json").read_bytes())
    return {n for parts in m["segments"] for n in parts} | set(m["pages"]) | {m["head"]} | \
        ({m["dict"]} if m.get("dict") else set()) | set(m.get("vectors") or [])


def writes_by(b, agent):
    return [e for e in b.storage.log() + b.files.log()
            if e.get("agent") == agent and e["method"] in ("PUT", "DELETE", "POST") and e["path"] != "/v1/bind"]


def test_writer_and_reader_on_one_team(bridges, tmp_path):
    with bridges.serve_many(tmp_path, "w") as mw, bridges.serve_many(tmp_path, "r") as mr:
        w = mw.connect()
        assert w.first(line(bridges, "a1", "o1", KEY, "crew", True)) == {"ok": True}
        assert until(lambda: refs(w, "schooner") == ["home/charter.md"], timeout=15)  # memory/ only
        with mw.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert (bridges.team_copy("t1") / "manifest.json").exists()
        r = mr.connect()
        assert r.first(line(bridges, "a2", "o2", OTHER_KEY, "o1/crew", False)) == {"ok": True}
        assert until(lambda: refs(r, "schooner") == ["home/charter.md"], timeout=15)
        # a file the writer has not indexed yet: the reader finds it by words after `changed`
        (bridges.team_folder("t1") / "memory" / "fresh.md").write_text("Barnacles on the schooner hull.\n")
        with mr.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o2", "agent": "a2", "path": "fresh.md", "team": "t1"}}) == {"ok": True}
        assert refs(r, "barnacles") == ["home/fresh.md"]
        for src in (["chats"], ["notes"], ["skills"]):
            assert r.search("schooner", sources=src)["structuredContent"]["hits"] == []
        names = [t["name"] for t in r.request("tools/list")["result"]["tools"]]
        assert "remember" not in names
        r.close(), w.close()  # (the engines' stop below waits for any write-back a session's end began)
    assert writes_by(bridges, "a2") == []  # a reader writes nothing, ever


def test_member_granted_part_is_refused_at_first_call(bridges, tmp_path):
    with bridges.serve_many(tmp_path, "p") as m, m.connect() as c:
        assert c.first(line(bridges, "a3", "o3", "c3" * 32, "crew", False)) == {"ok": True}
        for _ in range(2):
            r = c.call("search", {"query": "schooner"})
            assert r["isError"] and "not granted the whole team folder" in r["content"][0]["text"]
            assert "schooner" not in json.dumps(r)
        r = c.call("read", {"ref": "home/charter.md"})
        assert r["isError"] and "July" not in json.dumps(r)


def test_two_writers_race_and_converge(bridges, tmp_path):
    env = {"LNKMEM_WRITEBACK_S": "0.1"}
    with bridges.serve_many(tmp_path, "x", env=env) as m1, bridges.serve_many(tmp_path, "y", env=env) as m2:
        c1, c2 = m1.connect(), m2.connect()
        assert c1.first(line(bridges, "a1", "o1", KEY, "crew", True)) == {"ok": True}
        assert c2.first(line(bridges, "a2", "o2", OTHER_KEY, "o1/crew", True)) == {"ok": True}
        mem = bridges.team_folder("t1") / "memory"
        for i in range(5):
            for m, who, owner, agent in ((m1, "x", "o1", "a1"), (m2, "y", "o2", "a2")):
                (mem / f"{who}{i}.md").write_text(f"note{who}{i} for the crew\n")
                with m.connect() as ctl:
                    ctl.first({"changed": {"owner": owner, "agent": agent, "path": f"{who}{i}.md", "team": "t1"}})
        for m, owner, agent in ((m1, "o1", "a1"), (m2, "o2", "a2"), (m1, "o1", "a1")):
            with m.connect() as ctl:
                assert ctl.first({"flush": {"owner": owner, "agent": agent}}) == {"ok": True}
        c1.close(), c2.close()
    # a fresh reader sees everything both wrote, from the copy
    with bridges.serve_many(tmp_path, "z") as m3, m3.connect() as c3:
        assert c3.first(line(bridges, "a1", "o1", KEY, "crew", False)) == {"ok": True}
        for who in "xy":
            for i in range(5):
                assert until(lambda: refs(c3, f"note{who}{i}") == [f"home/{who}{i}.md"], timeout=15)
    puts = [e for e in bridges.storage.log() if "/teams/t1/" in e["path"] and e["method"] == "PUT"
            and e["path"].endswith("manifest.json")]
    assert all(e["if_match"] or e["if_none_match"] == "*" for e in puts)


def test_flush_and_end_cascade_to_teams(bridges, tmp_path):
    with bridges.serve_many(tmp_path, "f", env={"LNKMEM_WRITEBACK_S": "3600"}) as m:
        own = m.connect()
        assert own.first(bridges.bound(notes=None)) == {"ok": True}
        team = m.connect()
        assert team.first(line(bridges, "a1", "o1", KEY, "crew", True)) == {"ok": True}
        assert until(lambda: refs(team, "schooner") == ["home/charter.md"], timeout=15)
        with m.connect() as ctl:  # the first write-backs out of the way
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        bridges.storage.request("DELETE", "/_log")
        bridges.write_home("mine.md", "my own kayak\n")
        (bridges.team_folder("t1") / "memory" / "theirs.md").write_text("the team canoe\n")
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "home/mine.md"}}) == {"ok": True}
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "theirs.md", "team": "t1"}}) == {"ok": True}
        with m.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert (bridges.team_copy("t1") / "manifest.json").exists()
        assert (bridges.store("memory") / "lnkmem" / "manifest.json").exists()
        puts = [e for e in bridges.storage.log() if e["method"] == "PUT" and e["path"].endswith("manifest.json")]
        assert len(puts) == 2
        assert "/v1/c/memory/" in puts[0]["path"] and "/teams/t1/" in puts[1]["path"]  # its own first
        with m.connect() as ctl:
            assert ctl.first({"end": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert own.closed() and team.closed()


def test_a_readers_recheck_answered_304_lists_nothing_and_a_new_version_fetches_its_change(bridges, tmp_path):
    """Issue 45: every re-check of a team reader re-listed the whole team folder through the
    files bridge (1.63 MB at 1x every 30 s) even when the manifest answered 304, and every
    newer version was fetched whole. The copy unchanged, the reader moves nothing but the
    manifest's 304s; a newer version costs the files it names that the reader lacks, and
    no listing (it is what a writer indexed)."""
    env = {"LNKMEM_RECHECK_S": "0.5"}
    with bridges.serve_many(tmp_path, "w") as mw, bridges.serve_many(tmp_path, "r", env=env) as mr, \
            mw.connect() as w, mr.connect() as r:
        first_copy_then_other(bridges, mw, w, r, "schooner", "home/charter.md", other_writes=False)
        bridges.files.request("DELETE", "/_log")
        bridges.storage.request("DELETE", "/_log")

        def looks(status):
            return [e for e in bridges.storage.log() if e.get("agent") == "a2"
                    and e["path"].endswith("manifest.json") and e["status"] == status]
        assert until(lambda: len(looks(304)) >= 3, timeout=15)
        lists = [e for e in bridges.files.log() if e.get("agent") == "a2" and e["path"].startswith("/v1/list")]
        assert lists == []
        # a newer version: only what changed fetched, and no listing
        held = copy_names(bridges)
        (bridges.team_folder("t1") / "memory" / "later.md").write_text("Barnacles on the schooner hull.\n")
        with mw.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "later.md", "team": "t1"}}) == {"ok": True}
        with mw.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert until(lambda: refs(r, "barnacles") == ["home/later.md"], timeout=15)
        assert looks(200)
        got = {e["path"].rsplit("/", 1)[1] for e in bridges.storage.log() if e.get("agent") == "a2"
               and e["method"] == "GET" and e["path"].endswith(".bin")}
        assert got and not got & held and got <= copy_names(bridges) - held  # the version's new files only
        lists = [e for e in bridges.files.log() if e.get("agent") == "a2" and e["path"].startswith("/v1/list")]
        assert lists == []


def test_a_writers_412_and_a_restart_one_version_behind_fetch_only_the_other_writers_change(bridges, tmp_path):
    """Issue 45: a writer whose write-back met another writer's version (412), and a writer
    restarted one version behind, loaded the whole copy again (35 MB at 1x for a one-file
    version). Each now fetches only the files of the newer version it lacks, keeps its own
    change, and lists nothing for the 412; a fresh reader then finds both writers' changes."""
    env = {"LNKMEM_WRITEBACK_S": "3600", "LNKMEM_RECHECK_S": "3600"}
    mem = bridges.team_folder("t1") / "memory"

    def fetched(agent):
        return {e["path"].rsplit("/", 1)[1] for e in bridges.storage.log() if e.get("agent") == agent
                and e["method"] == "GET" and e["path"].endswith(".bin")}

    def change(m, owner, agent, name, words, then=lambda: None):
        (mem / name).write_text(words)
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": owner, "agent": agent, "path": name, "team": "t1"}}) == {"ok": True}
        then()  # (the change's own look at its folder done)
        with m.connect() as ctl:
            assert ctl.first({"flush": {"owner": owner, "agent": agent}}) == {"ok": True}

    with bridges.serve_many(tmp_path, "x", env=env) as m1, bridges.serve_many(tmp_path, "y", env=env) as m2:
        for i in range(40):  # a copy of some size, so that its change is a small part of it
            (mem / f"bulk{i}.md").write_text(f"bulk note {i} about ropes and the harbour, item{i}\n" * 20)
        c1, c2 = m1.connect(), m2.connect()
        first_copy_then_other(bridges, m1, c1, c2, "item39", "home/bulk39.md", other_writes=True)
        v1 = copy_names(bridges)
        change(m2, "o2", "a2", "second.md", "The second writer saw a narwhal.\n")  # v2, a2's
        v2 = copy_names(bridges)
        def forget():
            bridges.storage.request("DELETE", "/_log")
            bridges.files.request("DELETE", "/_log")
        change(m1, "o1", "a1", "first.md", "The first writer saw a walrus.\n", forget)  # a 412, then v3
        got = fetched("a1")
        assert got and got <= v2 - v1  # the other writer's new files only
        lists = [e for e in bridges.files.log() if e.get("agent") == "a1" and e["path"].startswith("/v1/list")]
        assert lists == []
        assert refs(c1, "narwhal") == ["home/second.md"] and refs(c1, "walrus") == ["home/first.md"]
        v3 = copy_names(bridges)
        c1.close()
        with m1.connect() as ctl:
            assert ctl.first({"end": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        change(m2, "o2", "a2", "third.md", "The second writer again: a penguin.\n")  # a2 meets v3 (412), writes v4
        v4 = copy_names(bridges)
        bridges.storage.request("DELETE", "/_log")
        c1 = m1.connect()  # the first writer again, its cache at v3
        assert c1.first(line(bridges, "a1", "o1", KEY, "crew", True)) == {"ok": True}
        assert until(lambda: refs(c1, "penguin") == ["home/third.md"], timeout=15)
        got = fetched("a1")
        assert got and got <= v4 - v3
        c1.close(), c2.close()
    with bridges.serve_many(tmp_path, "z") as m3, m3.connect() as c3:
        assert c3.first(line(bridges, "a1", "o1", KEY, "crew", False)) == {"ok": True}
        for word, ref in (("narwhal", "second"), ("walrus", "first"), ("penguin", "third"), ("item7", "bulk7")):
            assert until(lambda: refs(c3, word) == [f"home/{ref}.md"], timeout=15)
