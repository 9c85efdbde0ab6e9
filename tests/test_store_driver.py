"""Conversations kept by a store driver (§3.5, rev. 3), against the fake driver
`fakes/bin/lnk-store-driver` run by the real engine: `serve`, `serve-many`
Hello and Bound, under bubblewrap, and every fault the fake can make."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.bridges import Bridges
from tests.helpers import PROGRAM, ROOT, Home, Many, Server, base_env, refs, run_cli, tree_digest, until

DRIVER = str(ROOT / "fakes" / "bin" / "lnk-store-driver")
AT1, AT2, AT3 = "2026-05-01T10:00:00Z", "2026-05-01T10:05:00Z", "2026-06-20T08:00:00Z"
T1 = [{"role": "user", "text": "where do narwhals sleep in winter", "at": AT1},
      {"role": "assistant", "text": "Narwhals sleep near the ice edge.", "at": AT2},
      {"role": "user", "text": "and the walrus herd?", "at": AT3}]
T2 = [{"role": "user", "text": "the lighthouse keeper wrote a letter", "at": AT3}]
COMPACT = [{"role": "system", "text": "Summary: narwhals and a walrus herd, asked in spring."}]


class Driver:
    """The fake driver's own store, fault file and call log, in a folder of the test's."""

    def __init__(self, base: Path):
        base.mkdir(parents=True, exist_ok=True)
        self.store = base / "store.json"
        self.fault_file = base / "fault.json"
        self.log = base / "calls.jsonl"
        self.convs: dict = {}

    def put(self, thread: str, messages: list, version: str, compact=None) -> None:
        self.convs[thread] = {"version": version, "messages": messages}
        if compact is not None:
            self.convs[thread]["compact"] = {"version": compact[0], "messages": compact[1]}
        self.save()

    def remove(self, thread: str) -> None:
        del self.convs[thread]
        self.save()

    def save(self) -> None:
        tmp = self.store.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.convs))
        os.replace(tmp, self.store)

    def fault(self, mode=None, **kw) -> None:
        self.fault_file.write_text(json.dumps({"mode": mode, **kw}) if mode else "")

    def env(self, log: bool = True) -> dict:
        e = {"FAKE_DRIVER_STORE": str(self.store), "FAKE_DRIVER_FAULT": str(self.fault_file)}
        if log:
            e["FAKE_DRIVER_LOG"] = str(self.log)
        return e

    def calls(self) -> list:
        return [json.loads(x) for x in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def driver(tmp_path):
    d = Driver(tmp_path / "driver")
    d.put("t1", T1, "1", compact=("c1", COMPACT))
    d.put("t2", T2, "1")
    d.fault()
    return d


def _start(home: Home, driver: Driver, env=None, names=True) -> Server:
    e = driver.env()
    if names:
        e.update({"LNK_AGENT": "scout", "LNK_AGENT_ID": "a1", "LNK_OWNER": "o1"})
    e.update(env or {})
    return Server.start(home, env=e, extra_argv=["--store-driver", DRIVER])


def _hits(s, query, **kw) -> list:
    return s.search(query, **kw)["structuredContent"]["hits"]


def _strip(hit: dict) -> dict:
    return {k: v for k, v in hit.items() if k != "score"}


def _copies(home: Home) -> dict:
    d = home.state / "conversations"
    if not d.exists():
        return {}
    return {p.name: p.read_bytes() for p in d.iterdir() if not p.name.startswith(".")}


def test_command_writes_the_store_driver_into_argv(home):
    r = run_cli("command", *home.args(), env={"LNK_STORE_DRIVER": DRIVER})
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["argv"]
    assert argv[argv.index("--store-driver") + 1] == DRIVER
    r = run_cli("command", *home.args())
    assert "--store-driver" not in json.loads(r.stdout)["argv"]
    for bad in ("relative/driver", "lnk-store-driver"):
        r = run_cli("command", *home.args(), env={"LNK_STORE_DRIVER": bad})
        assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and "LNK_STORE_DRIVER" in r.stderr.decode()
    r = run_cli("serve", *home.args(), "--store-driver", "rel/x")
    assert r.returncode == 2 and "--store-driver" in r.stderr.decode()


def test_conversations_from_the_driver_are_served_exactly_as_chats_files(home, tmp_path, driver):
    """Hits (thread, role, time, lines), `read`, `list` and `after`/`before` are those of the
    same conversation as a `chats/` file; `<agent>/chats/` is not read for such an agent;
    the driver is run with the agent's names and an empty standard input."""
    plain = Home(tmp_path / "plain")  # the same conversations as chats/ files, no driver
    plain.chat("t1", T1)
    (plain.agent / "chats" / "t1.compact.jsonl").write_text("".join(json.dumps(m) + "\n" for m in COMPACT))
    plain.chat("t2", T2)
    home.chat("local-only", [{"role": "user", "text": "narwhals in a local chats file"}])
    with _start(home, driver) as s, Server.start(plain) as p:
        s.initialize()
        p.initialize()
        p.wait_indexed()
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals")), timeout=20)
        for query, kw in (("narwhals sleep", {}), ("walrus herd", {}), ("lighthouse letter", {}),
                          ("narwhals", {"after": "2026-05-01T10:03:00Z"}), ("narwhals", {"before": "2026-05-02"}),
                          ("walrus", {"after": "2026-06-01"}), ("summary", {"sources": ["chats"]})):
            got, want = _hits(s, query, **kw), _hits(p, query, **kw)
            assert [_strip(h) for h in got] == [_strip(h) for h in want], (query, kw)
        hit = next(h for h in _hits(s, "narwhals ice edge") if h["ref"] == "chats/t1.jsonl")
        assert (hit["thread"], hit["role"], hit["at"]) == ("t1", "assistant", AT2)
        assert "chats/local-only.jsonl" not in refs(s.search("narwhals local chats file"))  # chats/ not read
        for args in ({"ref": "chats/t1.jsonl"}, {"ref": "chats/t1.jsonl", "lines": [2, 3]},
                     {"ref": "chats/t1.compact.jsonl"}):
            assert s.call("read", args)["structuredContent"] == p.call("read", args)["structuredContent"]
        listed = s.call("list", {"ref": "chats"})["structuredContent"]
        assert listed == p.call("list", {"ref": "chats"})["structuredContent"]
        assert "conversations" not in s.search("narwhals")["structuredContent"]  # all is well: nothing said
    assert set(_copies(home)) == {"t1.jsonl", "t1.compact.jsonl", "t2.jsonl"}
    calls = driver.calls()
    assert calls and all(c["names"] == {"LNK_AGENT": "scout", "LNK_AGENT_ID": "a1", "LNK_OWNER": "o1"}
                         and c["stdin"] is False for c in calls)
    assert sorted(c["argv"] for c in calls if c["argv"][0] == "conversation") == [
        ["conversation", "t1"], ["conversation", "t1", "--compact"], ["conversation", "t2"]]


def test_a_driver_is_run_with_the_engines_environment_as_it_was_started(home, driver):
    """The engine sets OPENBLAS_NUM_THREADS=1 for its own processes (numpy's BLAS threads
    would only spin there), but a store driver is someone else's program: it gets the
    name as the engine's starter gave it, or not at all."""
    for given in (None, "3"):
        n = len(driver.calls())
        env = {"LNKMEM_DRIVER_S": "0.2"} | ({} if given is None else {"OPENBLAS_NUM_THREADS": given})
        with _start(home, driver, env=env) as s:
            s.initialize()
            assert until(lambda: "chats/t2.jsonl" in refs(s.search("lighthouse")))
            assert until(lambda: len(driver.calls()) > n)
        calls = driver.calls()[n:]
        assert calls and {c["blas"] for c in calls} == {given}, (given, calls)


def test_fetched_again_only_when_a_version_changes(home, driver):
    """Listed every LNKMEM_DRIVER_S; a conversation is fetched again only when its listed
    version changes; a thread no longer listed leaves the copy and the index."""
    with _start(home, driver, env={"LNKMEM_DRIVER_S": "0.2"}) as s:
        s.initialize()
        assert until(lambda: "chats/t2.jsonl" in refs(s.search("lighthouse")), timeout=20)
        n = len(driver.calls())
        assert until(lambda: sum(c["argv"] == ["conversations"] for c in driver.calls()[n:]) >= 3, timeout=10)
        assert [c for c in driver.calls()[n:] if c["argv"][0] == "conversation"] == []
        driver.put("t2", T2 + [{"role": "user", "text": "the keeper mailed it by schooner", "at": AT3}], "2")
        assert until(lambda: "chats/t2.jsonl" in refs(s.search("schooner")), timeout=10)
        assert [c["argv"] for c in driver.calls()[n:] if c["argv"][0] == "conversation"] == [["conversation", "t2"]]
        shutil.rmtree(home.state / "conversations")  # a person removes the copies: made again
        assert until(lambda: set(_copies(home)) == {"t1.jsonl", "t1.compact.jsonl", "t2.jsonl"}, timeout=10)
        assert "chats/t2.jsonl" in refs(s.search("schooner"))
        driver.remove("t2")
        assert until(lambda: refs(s.search("lighthouse")) == [], timeout=10)
        assert "t2.jsonl" not in _copies(home)
        driver.put("t1", T1, "1")  # its compact version is no longer listed: that copy goes
        assert until(lambda: refs(s.search("summary")) == [], timeout=10)
        assert set(_copies(home)) == {"t1.jsonl"}


def test_a_changed_control_lists_again_and_serve_many_names_the_agent(tmp_path, driver):
    """`serve-many` with the driver named by an agent's argv (`command` with
    $LNK_STORE_DRIVER) and its names in the Agents env; a `changed` control naming
    `chats/<thread>` lists the driver again, and the change is in the index at `ok`."""
    h = Home(tmp_path / "a")
    h.write("docs/plan.md", "The narwhal migration plan.\n")
    out = run_cli("command", *h.args(), env={"LNK_STORE_DRIVER": DRIVER})
    names = {"LNK_AGENT": "scout", "LNK_AGENT_ID": "a1", "LNK_OWNER": "o1"}
    agents = {"a1": {"argv": json.loads(out.stdout)["argv"], "env": names}}
    env = driver.env()
    env.update({"LNKMEM_DRIVER_S": "600", "LNK_AGENT": "someone-else"})  # the service's own: never passed on
    with Many(tmp_path / "run" / "m.sock", agents, env=env) as m, m.hello("a1") as c:
        assert until(lambda: "chats/t1.jsonl" in refs(c.search("narwhals")), timeout=20)
        assert "home/docs/plan.md" in refs(c.search("narwhal migration"))
        driver.put("t3", [{"role": "user", "text": "a quokka smiled at the camera", "at": AT3}], "1")
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "chats/t3.jsonl"}}) == {"ok": True}
        hits = c.search("quokka")["structuredContent"]["hits"]
        assert [(x["ref"], x["thread"], x["role"], x["at"]) for x in hits] == [("chats/t3.jsonl", "t3", "user", AT3)]
    assert {json.dumps(c["names"], sort_keys=True) for c in driver.calls()} == {json.dumps(names, sort_keys=True)}
    assert (h.state / "conversations" / "t3.jsonl").exists()


FAULTS = [
    ("slow", {"on": "conversations"}, "longer than 1s"),
    ("slow", {"on": "conversation"}, "longer than 1s"),
    ("fail", {}, "the store is locked"),
    ("garbage", {"on": "conversations"}, "not JSON"),
    ("garbage", {"on": "conversation"}, "not JSON"),
    ("huge", {"on": "conversations"}, "more than 64 MiB"),
    ("huge", {"on": "conversation"}, "more than 64 MiB"),
]


@pytest.mark.parametrize("mode, kw, why", FAULTS, ids=[f"{m}-{k.get('on', 'all')}" for m, k, _ in FAULTS])
def test_a_failing_driver_leaves_every_other_source_and_the_kept_copies(home, driver, mode, kw, why):
    """Each fault: the search still answers from Home and from the copies kept, says
    `conversations: unavailable: <why>`, loses no copy; once the driver works again it is
    picked up without a restart."""
    home.write("docs/plan.md", "The narwhal migration plan.\n")
    env = {"LNKMEM_DRIVER_S": "0.3", "LNKMEM_DRIVER_TIMEOUT_S": "1"}
    with _start(home, driver, env=env) as s:
        s.initialize()
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals sleep")), timeout=20)
        kept = _copies(home)
        driver.fault(mode, **kw)
        driver.put("t1", T1 + [{"role": "user", "text": "a quokka joined", "at": AT3}], "2", compact=("c1", COMPACT))
        driver.put("t4", [{"role": "user", "text": "a quokka in another thread", "at": AT3}], "1")

        def said():
            r = s.search("narwhals")["structuredContent"]
            return r.get("conversations", "")
        assert until(lambda: said().startswith("unavailable:") and why in said(), timeout=60), said()  # (a huge
        # answer read within the driver's limit takes a while on a busy machine: one generous deadline)
        r = s.search("narwhals")
        assert {"home/docs/plan.md", "chats/t1.jsonl", "chats/t1.compact.jsonl"} <= set(refs(r))
        assert "conversations unavailable" in r["content"][0]["text"]
        assert refs(s.search("quokka")) == []
        assert _copies(home) == kept  # nothing lost, nothing half-written
        driver.fault()  # the driver works again: no restart
        assert until(lambda: set(refs(s.search("quokka"))) == {"chats/t1.jsonl", "chats/t4.jsonl"}, timeout=20)
        assert until(lambda: "conversations" not in s.search("narwhals")["structuredContent"], timeout=10)
    err = s.stderr.decode()
    assert "Traceback" not in err and why in err  # said in the log too


def test_the_copies_kept_are_searched_at_a_restart_while_the_driver_fails(home, driver):
    with _start(home, driver) as s:
        s.initialize()
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals sleep")), timeout=20)
    kept = _copies(home)
    driver.fault("fail")
    with _start(home, driver) as s:
        s.initialize()
        r = s.search("narwhals sleep")["structuredContent"]
        assert "chats/t1.jsonl" in [h["ref"] for h in r["hits"]]  # the kept copy, even while the listing runs
        why = "unavailable: `lnk-store-driver conversations` failed (exit 1): the store is locked"
        # the first listing may outlast a search's 2 s on a loaded machine ("refreshing"): then it fails
        assert until(lambda: s.search("narwhals sleep")["structuredContent"].get("conversations") == why, timeout=20)
    assert _copies(home) == kept


def test_a_hanging_first_listing_costs_a_search_nothing_with_copies_kept(home, driver):
    """Issue 46: while the driver's first listing hung, every search waited its full 2 s for
    as long as the driver's limit (30 s), even with copies already on disk. With copies
    kept from an earlier start, a search answers from them at once, saying "refreshing".
    Said without a clock: a search's wait for a listing is made far longer than the hanging
    listing (LNKMEM_DRIVER_WAIT_S), so a search that waited would not answer within the
    client's deadline (20 s) at all."""
    with _start(home, driver) as s:
        s.initialize()
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals sleep")), timeout=20)
    driver.fault("slow")
    with _start(home, driver, env={"LNKMEM_DRIVER_WAIT_S": "3600"}) as s:
        s.initialize()
        assert until(lambda: driver.calls(), timeout=10)  # the first listing is under way
        said = [s.search("narwhals sleep")["structuredContent"] for _ in range(5)]
        assert all("chats/t1.jsonl" in [h["ref"] for h in r["hits"]] for r in said)
        assert all(r.get("conversations") == "refreshing" for r in said)
        assert s.close() == 0


def test_a_missing_driver_is_unavailable_and_the_rest_is_served(home, tmp_path, driver):
    home.write("docs/plan.md", "The narwhal migration plan.\n")
    missing = str(tmp_path / "no-such-driver")
    e = driver.env()
    e["LNKMEM_DRIVER_S"] = "0.3"
    with Server.start(home, env=e, extra_argv=["--store-driver", missing]) as s:
        s.initialize()
        assert until(lambda: "unavailable: cannot run" in s.search("narwhal")["structuredContent"].get("conversations", ""),
                     timeout=10)
        assert refs(s.search("narwhal migration")) == ["home/docs/plan.md"]
        os.symlink(DRIVER, missing)  # it appears: picked up at the next interval
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals sleep")), timeout=20)


def test_a_driver_call_under_way_ends_with_the_engine(home, driver):
    """A hanging driver never holds a search (the first listing: 2 s at most, then
    "refreshing") nor outlives the engine."""
    home.write("docs/plan.md", "The narwhal migration plan.\n")
    driver.fault("slow")
    with _start(home, driver) as s:
        s.initialize()
        r = s.call("search", {"query": "narwhal migration"}, timeout=10)["structuredContent"]  # (never the hang)
        assert [h["ref"] for h in r["hits"]] == ["home/docs/plan.md"] and r["conversations"] == "refreshing"
        assert until(lambda: driver.calls(), timeout=30)
        pid = driver.calls()[0]["pid"]
        assert s.close() == 0

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    assert until(gone, timeout=30)


def test_churning_versions_and_threads_that_are_not_ids(home, tmp_path, driver):
    """A version that changes at every listing is fetched again, but a copy whose bytes
    are the same is left as it is (the index does not read it again); threads that are
    not IDs are skipped: never asked for, never a path, the others served."""
    driver.fault("churn")
    with _start(home, driver, env={"LNKMEM_DRIVER_S": "0.2"}) as s:
        s.initialize()
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals sleep")), timeout=20)
        copy = home.state / "conversations" / "t1.jsonl"
        before = copy.stat()
        n = len(driver.calls())
        assert until(lambda: sum(c["argv"] == ["conversation", "t1"] for c in driver.calls()[n:]) >= 2, timeout=10)
        after = copy.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        # (listed every 0.2 s: a search may find a listing under way, "refreshing"; never a failure)
        assert "unavailable" not in s.search("narwhals")["structuredContent"].get("conversations", "")
        driver.fault("bad-thread")
        n = len(driver.calls())
        assert until(lambda: sum(c["argv"] == ["conversations"] for c in driver.calls()[n:]) >= 2, timeout=10)
        assert "chats/t1.jsonl" in refs(s.search("narwhals sleep"))
        assert "unavailable" not in s.search("narwhals")["structuredContent"].get("conversations", "")
    assert not Path(str(driver.log) + ".asked-bad").exists()
    assert sorted(_copies(home)) == ["t1.compact.jsonl", "t1.jsonl", "t2.jsonl"]
    assert not list(tmp_path.rglob("escape*")) and not (home.state / "conversations" / "a").exists()
    assert "not IDs" in s.stderr.decode()


def test_a_bound_agent_reads_the_driver_unless_storage_keeps_its_conversations(tmp_path, driver):
    """§3.5: a bound agent named in <agents> with a driver in its argv reads its
    conversations from the driver; a storage place `conversations` wins over it."""
    bridges = Bridges(tmp_path / "link")
    try:
        bridges.write_home("docs/plan.md", "The narwhal migration plan.\n")
        (bridges.store("conversations") / "s1.jsonl").write_text('{"role": "user", "text": "narwhals in storage"}\n')
        h = Home(tmp_path / "a")
        out = run_cli("command", *h.args(), env={"LNK_STORE_DRIVER": DRIVER})
        agents = {"a1": {"argv": json.loads(out.stdout)["argv"], "env": {"LNK_AGENT": "scout"}}}
        env = driver.env()
        env["LNKMEM_WRITEBACK_S"] = "0.3"
        with Many(tmp_path / "run" / "m.sock", agents, bridges.flags(), env=env) as m:
            with m.connect() as c:
                assert c.first(bridges.bound(places=("memory",))) == {"ok": True}
                assert until(lambda: "chats/t1.jsonl" in refs(c.search("narwhals sleep")), timeout=20)
                assert "chats/s1.jsonl" not in refs(c.search("narwhals storage"))
                with m.connect() as ctl:
                    assert ctl.first({"end": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
            with m.connect() as c:
                assert c.first(bridges.bound(places=("conversations", "memory"))) == {"ok": True}
                assert until(lambda: "chats/s1.jsonl" in refs(c.search("narwhals storage")), timeout=20)
                assert "chats/t1.jsonl" not in refs(c.search("narwhals sleep"))
        assert (h.state / "bound" / "conversations" / "t1.jsonl").exists()
        assert {c["names"].get("LNK_OWNER") for c in driver.calls()} == {"o1"}  # the Bound line's owner
    finally:
        bridges.stop()


@pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"), reason="bubblewrap is not installed")
def test_serve_confined_with_a_store_driver(home, tmp_path, driver):
    """Link's sandbox: everything read-only (the driver's program among it) but `<state>`;
    the driver runs, the copies are made in `<state>/conversations`, nothing else is written."""
    bwrap = shutil.which("bwrap")
    assert bwrap, "bubblewrap (bwrap) must be installed: apt-get install -y bubblewrap"
    home.write("docs/a.md", "The lighthouse keeper logs the weather.\n")
    home.state.mkdir(parents=True, exist_ok=True)
    watched = (home.folder, home.agent / "chats", home.agent / "skills", driver.store.parent, ROOT / "fakes",
               ROOT / "lnkmem", sys.prefix)
    before = tree_digest(*watched)
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(home.state), str(home.state),
            "--unshare-net", "--die-with-parent", "--new-session",
            PROGRAM, "serve", *home.args(), "--store-driver", DRIVER]
    env = base_env()
    env.pop("PYTHONDONTWRITEBYTECODE")
    env.update(driver.env(log=False))
    env["LNK_AGENT"] = "scout"
    with Server(argv, env) as s:
        s.initialize()
        assert until(lambda: sorted(refs(s.search("lighthouse"))) == ["chats/t2.jsonl", "home/docs/a.md"], timeout=30)
        hit = next(h for h in _hits(s, "narwhals ice edge") if h["ref"] == "chats/t1.jsonl")
        assert (hit["thread"], hit["role"], hit["at"]) == ("t1", "assistant", AT2)
        assert "conversations" not in s.search("lighthouse")["structuredContent"]
        assert s.close() == 0
    err = s.stderr.decode()
    assert "Traceback" not in err and "Read-only" not in err, err
    assert tree_digest(*watched) == before
    assert sorted(p.name for p in home.state.parent.iterdir()) == ["lnkmem"]
    assert set(_copies(home)) == {"t1.jsonl", "t1.compact.jsonl", "t2.jsonl"}


def test_no_listing_or_answer_names_a_path(tmp_path):
    """Any bytes as the driver's answers: a listing is either refused whole (DriverFailed)
    or names threads that are IDs only (the copies' names), never a path; a
    conversation's answer either passes as JSON object lines or is refused."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from lnkmem.bridges.store_driver import CopyFolder, DriverFailed, check_conversation, nameable, parse_listing

    threads = st.text(max_size=12) | st.sampled_from(["../x", "/etc/passwd", "a/b", "x.compact", ".hidden", "t1",
                                                       "a" * 129, "t\n", "\u2025", "ok.1"])
    items = st.fixed_dictionaries({"thread": threads}, optional={"version": st.text(max_size=5) | st.integers(),
                                                                 "compact": st.none() | st.text(max_size=5)})
    lines = st.lists(st.one_of(items.map(json.dumps), st.binary(max_size=20).map(lambda b: b.decode("latin-1"))),
                     max_size=6)
    copies = CopyFolder(str(tmp_path / "conversations"))

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(lines)
    def one(ls):
        out = "\n".join(ls).encode("utf-8", "surrogatepass")
        try:
            listed, skipped = parse_listing(out)
        except DriverFailed:
            return
        for t in listed:
            assert nameable(t) and "/" not in t and not t.startswith(".")
            assert os.path.dirname(os.path.join(copies.path, copies.name(t, True))) == copies.path
        try:
            check_conversation(out, "t1", False)
        except DriverFailed:
            pass
    one()


def test_a_thread_named_like_a_compact_copy_is_served(home, driver):
    """Issue 46 (§3.5): `delta.compact` is an ID (§Words), so the driver's thread of that name
    is served -- found, read and listed as `chats/delta.compact.jsonl` -- not dropped as "not
    an ID". Where thread `x` has a compact version and thread `x.compact` is listed too, both
    would be kept as `x.compact.jsonl`: the thread is kept (a whole conversation), `x`'s
    compact version skipped with a line in the log, and neither copy drops the other's."""
    driver.put("delta.compact", [{"role": "user", "text": "the okapi hides in the forest", "at": AT1}], "1")
    driver.put("x", [{"role": "user", "text": "a plain thread about ibises", "at": AT1}], "1",
               compact=("c1", [{"role": "system", "text": "Summary: ibises, and a capybara"}]))
    driver.put("x.compact", [{"role": "user", "text": "the quetzal sings at dawn", "at": AT1}], "1")
    with _start(home, driver) as s:
        s.initialize()
        assert until(lambda: "chats/delta.compact.jsonl" in refs(s.search("okapi forest")), timeout=20), \
            s.stderr[-2000:]
        assert "okapi" in s.call("read", {"ref": "chats/delta.compact.jsonl"})["content"][0]["text"]
        assert until(lambda: "chats/x.compact.jsonl" in refs(s.search("quetzal dawn")), timeout=20)
        assert "chats/x.jsonl" in refs(s.search("ibises"))
        assert refs(s.search("capybara")) == []  # x's compact version: skipped, its name is thread x.compact's
        listed = s.call("list", {"ref": "chats"})["structuredContent"]
        assert "delta.compact.jsonl" in json.dumps(listed), listed
        assert s.close() == 0
    assert {"delta.compact.jsonl", "x.jsonl", "x.compact.jsonl"} <= set(_copies(home))
    assert b"quetzal" in _copies(home)["x.compact.jsonl"]
    assert b"compact version" in s.stderr and b"x.compact" in s.stderr


@pytest.mark.parametrize("name", ["memory/lnkmem/conversations", "memory/lnkmem", "memory"])
def test_the_copies_folder_swapped_for_a_link_while_serving_reaches_nothing_of_the_other_agents(
        tmp_path, driver, name):
    """Issue 46, one way in: the copies' folder (or <state>, or memory/) swapped while serving
    for a link to another agent's. The copies were read by the folder's name (the other
    agent's conversation found), and a refresh wrote there. Now the folder opened at the
    start is read and written, and the other agent's copies are byte for byte as they were."""
    from tests.test_state_names import hashes
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    other = Driver(tmp_path / "other-driver")
    other.put("b1", [{"role": "user", "text": "the okapi is the other agent's secret", "at": AT1}], "1")
    other.fault()
    with _start(b, other) as s:
        s.initialize()
        assert until(lambda: "chats/b1.jsonl" in refs(s.search("okapi")), timeout=20)
        assert s.close() == 0
    before = hashes(b.agent)
    with _start(a, driver, env={"LNKMEM_DRIVER_S": "0.2"}) as s:
        s.initialize()
        assert until(lambda: "chats/t1.jsonl" in refs(s.search("narwhals sleep")), timeout=20)
        os.rename(a.agent / name, tmp_path / "away")
        os.symlink(b.agent / name, a.agent / name)
        driver.put("t3", [{"role": "user", "text": "a quokka arrived after the swap", "at": AT3}], "1")
        assert until(lambda: "chats/t3.jsonl" in refs(s.search("quokka")), timeout=20), s.stderr[-2000:]
        assert refs(s.search("okapi")) == [] and "chats/t1.jsonl" in refs(s.search("narwhals sleep"))
        assert "unavailable" not in s.search("narwhals")["structuredContent"].get("conversations", "")
        assert s.close() == 0
    assert hashes(b.agent) == before
