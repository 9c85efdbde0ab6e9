"""Issue 34: a signal ends `serve-many` and `serve` quietly: no traceback on stderr,
no false "damaged" index, whatever was under way (a session open, a storm of
`changed` controls just answered)."""

import signal
import threading

import pytest

from tests.helpers import Home, Many, Server, agent_entry, until


@pytest.fixture
def two(tmp_path):
    homes = {}
    for i in range(2):
        h = Home(tmp_path / f"a{i}")
        for j in range(30):
            h.write(f"d{j}.md", f"agent {i} file {j} marker{i} harbour {j}\n")
        homes[f"a{i}"] = h
    return homes


def _quiet(stderr: str) -> None:
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr[-3000:]
    assert "damaged" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_with_sessions_open_ends_serve_many_quietly(tmp_path, two, sig):
    m = Many(tmp_path / "run" / "m.sock", {a: agent_entry(h) for a, h in two.items()})
    clients = [m.hello("a0"), m.hello("a1"), m.hello("a0")]
    try:
        for c in clients:
            until(lambda: "indexing" not in c.search("probe")["structuredContent"], timeout=30)
        c = clients[0]
        c.send({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": "search", "arguments": {"query": "harbour"}}})  # one in flight too
        assert m.stop(sig) == 0
        _quiet(m.stderr())
    finally:
        for c in clients:
            c.close()


STORM = 600  # `changed` controls from 6 threads over 40 files, just answered at the signal (1800 once: the count is not what is checked)


def test_sigterm_after_a_storm_of_changed_controls(tmp_path, two):
    m = Many(tmp_path / "run" / "m.sock", {a: agent_entry(h) for a, h in two.items()})
    with m.hello("a0") as c:
        until(lambda: "indexing" not in c.search("probe")["structuredContent"], timeout=30)
        answers: list = []

        def storm(k: int) -> None:
            for i in range(k, STORM, 6):
                two["a0"].write(f"storm/s{i % 40}.md", f"storm {i} word{i}\n")
                with m.connect(timeout=60) as ctl:
                    answers.append(ctl.first({"changed": {"owner": "o1", "agent": "a0",
                                                          "path": f"home/storm/s{i % 40}.md"}}))

        ts = [threading.Thread(target=storm, args=(k,)) for k in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(answers) == STORM and all(a in ({"ok": True}, {"error": "the change is still being indexed"})
                                            for a in answers), [a for a in answers if a != {"ok": True}][:3]
        assert m.stop(signal.SIGTERM) == 0
    _quiet(m.stderr())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_serve_quietly(two, sig):
    s = Server.start(two["a0"])
    s.initialize()
    s.wait_indexed()
    s.call("remember", {"add": "before the signal"})
    s.proc.send_signal(sig)
    assert s.proc.wait(20) == 0
    _quiet(s.stderr_to_the_end().decode())
