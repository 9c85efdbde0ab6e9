"""Issue 45: `end`, `flush` and SIGTERM lose nothing (§5.5, §5.6, §7.3).

One way a binding ends, whatever ends it: every memory (its own, then its teams')
written back while the bridges are still open; one failure never skips the others
(each named in the answer); every memory stopped whatever happened, so the same
binding can be made again at once; a signal ends every binding at once."""

import signal
import subprocess

from tests.bridges import KEY, OTHER_KEY, Layout, hits
from tests.helpers import until

THIRD_KEY = "c3" * 32
AGENTS = {"a1": ("o1", KEY), "a2": ("o2", OTHER_KEY), "a3": ("o3", THIRD_KEY)}
BRIDGES = Layout(bindings={a: {"owner": o, "key": k} for a, (o, k) in AGENTS.items()},
                 teams={f"t{a[1]}": {"folder": f"teams/t{a[1]}", "names": {a: "crew"}, "grants": {a: "all"}}
                        for a in AGENTS},
                 team_files={f"t{a[1]}": {"memory/charter.md": "The crew charters a schooner every July.\n"}
                             for a in AGENTS})
SLOW_WRITEBACK = {"LNKMEM_WRITEBACK_S": "3600"}  # nothing written back unless asked
# a binding's end gives its write-backs 60 s (bound.close_s(); LNKMEM_CLOSE_S), then stops every
# memory whatever they did, waiting 15 s at most for them (LNKMEM_STOP_S); where a test only
# waits those times out, 8 s and 2 s
SHORT_CLOSE = {**SLOW_WRITEBACK, "LNKMEM_CLOSE_S": "8", "LNKMEM_STOP_S": "2"}
# end's answer awaited this long at most: far less than this is expected
END_DEADLINE_S = 120


def team_line(b, agent="a1"):
    owner, key = AGENTS[agent]
    first = b.bound(agent=agent, owner=owner, key=key, notes=None)
    first["team"] = {"id": f"t{agent[1]}", "named": "crew", "writes": True}
    return first


def own_line(b, agent="a1"):
    owner, key = AGENTS[agent]
    return b.bound(agent=agent, owner=owner, key=key, notes=None)


def control(m, kind, agent="a1", timeout=10, **more):
    with m.connect(timeout=timeout) as ctl:
        return ctl.first({kind: {"owner": AGENTS[agent][0], "agent": agent, **more}})


def bound_with_team(b, m, agent="a1"):
    """An own session and a team session of ``agent``, both indexed and written back once."""
    own, team = m.connect(), m.connect()
    assert own.first(own_line(b, agent)) == {"ok": True}
    assert team.first(team_line(b, agent)) == {"ok": True}
    assert until(lambda: hits(team, "schooner") == ["home/charter.md"], timeout=30)
    assert control(m, "flush", agent, timeout=60) == {"ok": True}
    return own, team


def pending_changes(b, m, agent="a1"):
    """A change of the agent's own Home and one of its team's folder, indexed, not written back."""
    b.write_home(f"mine-{agent}.md", f"my own kayak{agent}\n", agent=agent)
    (b.team_folder(f"t{agent[1]}") / "memory" / f"theirs-{agent}.md").write_text(f"the team canoe{agent}\n")
    assert control(m, "changed", agent, path=f"home/mine-{agent}.md") == {"ok": True}
    assert control(m, "changed", agent, path=f"theirs-{agent}.md", team=f"t{agent[1]}") == {"ok": True}


def team_puts(b, team="t1"):
    return [e for e in b.storage.log() if e["method"] == "PUT" and e["path"] == f"/v1/teams/{team}/c/memory/lnkmem/manifest.json"]


def test_end_writes_a_pending_team_change_back(bridges, tmp_path):
    with bridges.serve_many(tmp_path, "e", env=SLOW_WRITEBACK) as m:
        own, team = bound_with_team(bridges, m)
        before = len(team_puts(bridges))
        (bridges.team_folder("t1") / "memory" / "theirs.md").write_text("the team canoe\n")
        assert control(m, "changed", path="theirs.md", team="t1") == {"ok": True}
        assert "home/theirs.md" not in bridges.copy_refs(team="t1")  # pending, not written back
        assert control(m, "end", timeout=END_DEADLINE_S) == {"ok": True}  # no flush before it
        assert len(team_puts(bridges)) > before
        assert "home/theirs.md" in bridges.copy_refs(team="t1")
        assert own.closed() and team.closed()
        with m.connect() as again:  # bound again: served, the change in it
            assert again.first(team_line(bridges)) == {"ok": True}
            assert until(lambda: hits(again, "canoe") == ["home/theirs.md"], timeout=30)


def test_end_after_a_failed_own_write_back_still_ends_its_teams(bridges, tmp_path):
    """The agent's own write-back answered 500 at each try: its teams are written back and
    ended all the same, the failure named. (Each request is retried for the bridge client's
    patience before it fails, 30 s; here 2 s: what is checked is what follows the failure.)"""
    with bridges.serve_many(tmp_path, "f", env={**SLOW_WRITEBACK, "LNKMEM_BRIDGE_PATIENCE_S": "2"}) as m:
        own, team = bound_with_team(bridges, m)
        pending_changes(bridges, m)
        bridges.storage.fault("500", path="/v1/c/memory/lnkmem/manifest.json")  # the agent's own copy only
        answer = control(m, "end", timeout=END_DEADLINE_S)
        assert "error" in answer and "500" in answer["error"], answer  # the failure named
        assert "home/theirs-a1.md" in bridges.copy_refs(team="t1")  # its team written back all the same
        assert own.closed() and team.closed()
        bridges.storage.fault("ok")
        with m.connect() as again:  # the team's index was let go of: bound again and searched
            assert again.first(team_line(bridges)) == {"ok": True}
            assert until(lambda: hits(again, "canoea1") == ["home/theirs-a1.md"], timeout=30)
        with m.connect() as mine:  # and the agent's own, its change still there, written back at its end
            assert mine.first(own_line(bridges)) == {"ok": True}
            assert until(lambda: hits(mine, "kayaka1") == ["home/mine-a1.md"], timeout=30)
        assert control(m, "end", timeout=END_DEADLINE_S) == {"ok": True}
        assert "home/mine-a1.md" in bridges.copy_refs()


def test_sigterm_writes_every_agent_and_team_back(bridges, tmp_path):
    """Three agents, each with a change of its own and one of its team's waiting: a1 with its
    sessions open, a2 and a3 with none (their bindings held, their teams' changes told by
    `changed` alone). SIGTERM writes every one back and the process exits."""
    m = bridges.serve_many(tmp_path, "s", env=SLOW_WRITEBACK)
    try:
        sessions = {a: bound_with_team(bridges, m, a) for a in AGENTS}
        for a in ("a2", "a3"):
            for s in sessions[a]:
                s.close()
        for a in AGENTS:
            pending_changes(bridges, m, a)
            assert f"home/theirs-{a}.md" not in bridges.copy_refs(team=f"t{a[1]}")  # waiting
        m.proc.send_signal(signal.SIGTERM)
        try:
            rc = m.proc.wait(END_DEADLINE_S)
        except subprocess.TimeoutExpired:
            rc = None
        err = m.proc.stderr.read().decode() if rc is not None else ""
        assert rc == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        for a in AGENTS:
            assert f"home/mine-{a}.md" in bridges.copy_refs(a), a
            assert f"home/theirs-{a}.md" in bridges.copy_refs(team=f"t{a[1]}"), a
        for s in sessions["a1"]:
            s.close()
    finally:
        m.stop()


def test_sigterm_with_a_stalled_bridge_ends_within_bounds(bridges, tmp_path):
    """Team t1's copy stalls (its manifest never answered): SIGTERM still writes every other
    memory back, and the process exits, once the write-backs' time (bound.close_s()) is spent."""
    m = bridges.serve_many(tmp_path, "t", env=SHORT_CLOSE)
    try:
        sessions = [s for a in AGENTS for s in bound_with_team(bridges, m, a)]
        for a in AGENTS:
            pending_changes(bridges, m, a)
        bridges.storage.fault("slow", delay=3600, path="/v1/teams/t1/c/memory/lnkmem/manifest.json")
        m.proc.send_signal(signal.SIGTERM)
        try:
            rc = m.proc.wait(END_DEADLINE_S + 60)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0
        for a in AGENTS:
            assert f"home/mine-{a}.md" in bridges.copy_refs(a), a
        for a in ("a2", "a3"):
            assert f"home/theirs-{a}.md" in bridges.copy_refs(team=f"t{a[1]}"), a
        assert "home/theirs-a1.md" not in bridges.copy_refs(team="t1")  # (stalled: kept in the cache)
        for s in sessions:
            s.close()
    finally:
        m.stop()


def stall_ended(b) -> None:
    """The stalled request's connection dropped (a bridge restarted), the bridge answering
    again: the write-back that waited on it fails at once (not after the client's 30 s)."""
    b.storage.fault("down")  # (closes every open connection)
    b.storage.fault("ok")


def ended_while_stalled(b, m, manifest_path: str) -> dict:
    """a1 bound with its team, a change pending in each, then `end` while the manifest at
    ``manifest_path`` is never answered: end's answer."""
    bound_with_team(b, m)
    pending_changes(b, m)
    b.storage.fault("slow", delay=3600, path=manifest_path)
    return control(m, "end", timeout=END_DEADLINE_S)


def test_end_with_a_stalled_team_copy_answers_and_loses_nothing(bridges, tmp_path):
    """`end` while the team's copy stalls: answered once the write-backs' time is spent, the
    team named; the agent's own copy written; a Bound line right after is served (its memory
    waits for the stopping one to let go of the index: with a short close it was "already
    open in this process" for good), and its change, kept in the cache, is written back once
    the bridge answers again."""
    with bridges.serve_many(tmp_path, "g", env=SHORT_CLOSE) as m:
        answer = ended_while_stalled(bridges, m, "/v1/teams/t1/c/memory/lnkmem/manifest.json")
        assert "error" in answer and "team t1" in answer["error"] and "agent a1" not in answer["error"], answer
        assert "home/mine-a1.md" in bridges.copy_refs()
        assert "home/theirs-a1.md" not in bridges.copy_refs(team="t1")
        with m.connect() as again:
            again.send(team_line(bridges))  # while the stopping memory still waits on the stall
            stall_ended(bridges)
            assert again.recv() == {"ok": True}
            assert until(lambda: hits(again, "canoea1") == ["home/theirs-a1.md"], timeout=30)
            assert control(m, "flush", timeout=60) == {"ok": True}
        assert "home/theirs-a1.md" in bridges.copy_refs(team="t1")


def test_end_with_a_stalled_own_copy_still_writes_its_teams(bridges, tmp_path):
    """`end` while the agent's own copy stalls (its manifest never answered): its team's
    change is written back all the same. The own memory is flushed first (§5.5) and the teams
    after it, within the same patience, so a stalled own copy left them no time: "team t1:
    the write-back did not finish", its change not in the team's copy. Now they begin once
    half the patience is spent."""
    with bridges.serve_many(tmp_path, "h", env=SHORT_CLOSE) as m:
        answer = ended_while_stalled(bridges, m, "/v1/c/memory/lnkmem/manifest.json")
        assert "error" in answer and "agent a1" in answer["error"] and "team t1" not in answer["error"], answer
        assert "home/theirs-a1.md" in bridges.copy_refs(team="t1")
        stall_ended(bridges)
