"""The commands for people (§1.5, issue 14): help, search flags, the bar, status, mcp-config, bad paths.

Each test runs the real `lnk-lnkmem`; terminal behaviour is checked on a real
pseudo-terminal (python's `pty`), sized like a person's (40 or 100 columns).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from tests.helpers import PROGRAM, ROOT, Server, base_env, run_cli

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- driving the program on a terminal ------------------------------------------------

class Tty:
    """`lnk-lnkmem` with stderr (and stdout when ``stdout_tty``) on a pseudo-terminal."""

    def __init__(self, *args: str, cols: int = 100, env: dict | None = None, stdout_tty: bool = False,
                 cwd: str | None = None):
        e = base_env()
        e.pop("NO_COLOR", None)
        e["TERM"] = "xterm"
        e.update(env or {})
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        self.proc = subprocess.Popen([PROGRAM, *args], stdin=subprocess.DEVNULL, stderr=slave,
                                     stdout=slave if stdout_tty else subprocess.PIPE, env=e, cwd=cwd)
        os.close(slave)
        self.tty = b""
        self.stdout = b""

    def read_until(self, pred, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.tty):
                return True
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return pred(self.tty)
                if not data:
                    return pred(self.tty)
                self.tty += data
        return pred(self.tty)

    def finish(self, timeout: float = 60) -> int:
        self.read_until(lambda _: self.proc.poll() is not None, timeout)
        self.read_until(lambda _: False, 0.2)  # what is left in the terminal's buffer
        if self.proc.stdout:
            self.stdout = self.proc.stdout.read()
        rc = self.proc.wait(timeout)
        os.close(self.master)
        return rc

    @property
    def text(self) -> str:
        return self.tty.decode("utf-8", "replace")


def _screen_lines(text: str) -> list[str]:
    """What each redraw of the terminal's current line showed (\\r starts a redraw)."""
    return [seg for line in text.split("\r\n") for seg in line.split("\r") if seg.strip()]


def _many_files(home, n: int, size: int = 300) -> None:
    for i in range(n):
        home.write(f"d{i % 20}/f{i}.md", (f"note {i} about deploying service w{i} " * (size // 30 + 1))[:size] + "\n")


def _one_line_error(r, *words: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert r.stdout == b""
    return err


def _flags(home) -> list[str]:
    return [str(home.folder), str(home.state), "--agent", str(home.agent)]


# --- 1. help, version, usage ------------------------------------------------------------

COMMANDS = ["index", "search", "status", "mcp-config", "help", "install", "command", "serve", "serve-many"]


def test_help_names_every_command_and_version_answers():
    for flag in ("--help", "-h"):
        r = run_cli(flag)
        assert r.returncode == 0 and r.stderr == b""
        out = r.stdout.decode()
        for c in COMMANDS:
            assert re.search(rf"^\s+{re.escape(c)}\b", out, re.M), (c, out)
    r = run_cli("--version")
    assert r.returncode == 0 and re.fullmatch(rb"lnk-lnkmem \d+\.\d+\.\d+\n", r.stdout), r.stdout
    r = run_cli()  # no arguments: the usage, on stderr, and exit 2
    assert r.returncode == 2 and r.stdout == b""
    assert b"usage: lnk-lnkmem" in r.stderr and b"search" in r.stderr and b"Traceback" not in r.stderr
    r = run_cli("help", "search")
    assert r.returncode == 0 and b"--sources" in r.stdout
    _one_line_error(run_cli("help", "frobnicate"), "no command named 'frobnicate'")


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_has_a_line_per_argument_and_an_example(cmd):
    r = run_cli(cmd, "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert re.search(r"^examples?:\n[^\n]*\blnk-lnkmem " + re.escape(cmd), out, re.M), out
    lines = out.split("\n")
    # every argument listed under "positional arguments" / "options" has words beside or under it
    section = False
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            section = line in ("positional arguments:", "options:")
            continue
        if not section or not line.startswith("  ") or line.startswith("   "):
            continue
        described = re.match(r"^  \S.*?\s{2,}\S", line) or (i + 1 < len(lines) and lines[i + 1].startswith("    "))
        assert described, f"{cmd}: no help for {line.strip()!r}\n{out}"


# --- 2. search ---------------------------------------------------------------------------

def _search_home(home):
    home.write("docs/deploy.md", "How we deploy the service: tag, then run make release.\n")
    home.write("docs/other.md", "Lunch options near the office.\n")
    home.write("ops/deploy-notes.md", "Deploying on Fridays is forbidden.\n")
    home.write("skills/ship/SKILL.md", "To deploy, follow the release checklist.\n")
    home.chat("t1", [{"role": "user", "text": "when do we deploy next?", "at": "2026-11-01T10:00:00Z"}])


def test_search_json_is_the_mcp_tools_structured_content(home):
    _search_home(home)
    r = run_cli("search", *_flags(home), "deploy", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(b"\n") == 1  # one JSON document, one line
    doc = json.loads(r.stdout)
    with Server.start(home, notes=False) as s:
        s.initialize()
        s.wait_indexed()
        mcp = s.search("deploy", limit=10)["structuredContent"]
    assert doc == mcp
    assert {h["ref"] for h in doc["hits"]} == {"home/docs/deploy.md", "home/ops/deploy-notes.md",
                                                "skills/ship/SKILL.md", "chats/t1.jsonl"}


def test_search_filters_limit_and_plain_output_in_a_pipe(home):
    _search_home(home)
    refs = lambda r: [h["ref"] for h in json.loads(r.stdout)["hits"]]  # noqa: E731
    r = run_cli("search", *_flags(home), "deploy", "--sources", "chats,skills", "--json")
    assert sorted(refs(r)) == ["chats/t1.jsonl", "skills/ship/SKILL.md"]
    r = run_cli("search", *_flags(home), "deploy", "--sources", "home", "--sources", "chats", "--json")
    assert set(refs(r)) == {"home/docs/deploy.md", "home/ops/deploy-notes.md", "chats/t1.jsonl"}
    r = run_cli("search", *_flags(home), "deploy", "--under", "home/ops/", "--json")
    assert refs(r) == ["home/ops/deploy-notes.md"]
    r = run_cli("search", *_flags(home), "deploy", "--limit", "1", "--json")
    assert len(refs(r)) == 1
    r = run_cli("search", *_flags(home), "deploy", "the", "service")
    assert r.returncode == 0 and r.stderr == b""  # the quiet refresh says nothing in a pipe
    out = r.stdout.decode()
    assert out.startswith("4 hits for 'deploy the service'") and "\x1b[" not in out
    assert "[1] home/docs/deploy.md lines 1-1" in out
    _one_line_error(run_cli("search", *_flags(home), "deploy", "--sources", "mail"), "sources")
    _one_line_error(run_cli("search", *_flags(home), "deploy", "--limit", "0"), "limit")
    _one_line_error(run_cli("search", *_flags(home), "deploy", "--budget", "0"), "--budget")


def _tool_has_dates() -> bool:
    from lnkmem.core.wire import SearchArgs
    return "after" in SearchArgs.__struct_fields__


@pytest.mark.skipif(not _tool_has_dates(), reason="the MCP search tool has no after/before yet (the search room adds them)")
def test_search_after_and_before_pass_through_to_the_tool(home):
    """Needs the search room's `after`/`before` on the MCP tool (PROTOCOL.md §4.1, rev. 2)."""
    home.chat("old", [{"role": "user", "text": "kiwi harvest plan", "at": "2025-01-05T10:00:00Z"}])
    home.chat("new", [{"role": "user", "text": "kiwi harvest done", "at": "2026-11-05T10:00:00Z"}])
    r = run_cli("search", *_flags(home), "kiwi", "--after", "2026-01-01", "--json")
    assert r.returncode == 0, r.stderr
    assert [h["ref"] for h in json.loads(r.stdout)["hits"]] == ["chats/new.jsonl"]
    r = run_cli("search", *_flags(home), "kiwi", "--before", "2026-01-01T00:00:00Z", "--json")
    assert [h["ref"] for h in json.loads(r.stdout)["hits"]] == ["chats/old.jsonl"]
    _one_line_error(run_cli("search", *_flags(home), "kiwi", "--after", "last tuesday"), "after")


def test_a_reader_that_stops_early_ends_search_quietly(home):
    for i in range(30):
        home.write(f"r{i}.md", "river delta sediment " * 100 + "\n")
    run_cli("index", *_flags(home))
    p = subprocess.Popen([PROGRAM, "search", *_flags(home), "river", "--limit", "30"], env=base_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.read(10)  # like `| head -c 10`: read a little, then stop
    p.stdout.close()
    assert p.wait(30) == 0 and p.stderr.read() == b""


def test_search_is_not_cut_by_the_agents_budget_unless_asked(home):
    para = "The ferry schedule changes in winter. " * 40  # ~1.5 KB a passage
    for i in range(12):
        home.write(f"ferry{i}.md", f"# Ferry {i}\n\n{para}\n")
    r = run_cli("search", *_flags(home), "ferry", "schedule", "--limit", "12", "--json")
    doc = json.loads(r.stdout)
    assert len(doc["hits"]) == 12 and doc["truncated"] is False
    assert all("…" not in h["text"] and h["text"].count("ferry schedule") >= 39 for h in doc["hits"])
    # an agent's budget (the spec's 2000 tokens) would cut them: --budget shows what it sees
    r = run_cli("search", *_flags(home), "ferry", "schedule", "--limit", "12", "--budget", "2000", "--json")
    cut = json.loads(r.stdout)
    assert cut["truncated"] is True and sum(len(h["text"].encode()) for h in cut["hits"]) <= 8000


def test_search_highlights_matched_words_on_a_terminal_only(home):
    _search_home(home)
    t = Tty("search", *_flags(home), "deploying", cols=100, stdout_tty=True)
    assert t.finish() == 0
    assert "\x1b[1;33mdeploy\x1b[0m the service" in t.text  # the stem matches: deploying ~ deploy
    assert "\x1b[1;33mDeploying\x1b[0m on Fridays" in t.text
    assert "listing" not in t.text and "reading" not in t.text  # a quick refresh draws no bar
    t = Tty("search", *_flags(home), "deploying", cols=100, stdout_tty=True, env={"NO_COLOR": "1"})
    assert t.finish() == 0
    assert "\x1b[" not in t.text and "Deploying on Fridays" in t.text


def test_a_files_escape_sequences_are_shown_on_a_terminal_never_obeyed(home):
    home.write("evil.md", "harmless words \x1b]0;pwned\x07 then \x1b[2J cleared \x9b31m\n")
    for env in ({}, {"NO_COLOR": "1"}):
        t = Tty("search", *_flags(home), "harmless", cols=100, stdout_tty=True, env=env)
        assert t.finish() == 0
        assert "\x1b]" not in t.text and "\x1b[2J" not in t.text and "\x9b" not in t.text
        assert "␛]0;pwned␇ then ␛[2J cleared" in t.text
    r = run_cli("search", *_flags(home), "harmless")  # a pipe gets the text as it is
    assert "\x1b]0;pwned\x07" in r.stdout.decode()


def test_an_output_that_is_not_utf8_gets_replacements_not_a_traceback(home):
    home.write("snow.md", "café ☃ snowman\n")
    r = run_cli("search", *_flags(home), "snowman", env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0 and b"caf? ? snowman" in r.stdout, r.stderr
    t = Tty("index", *_flags(home), cols=80, env={"PYTHONIOENCODING": "latin-1"})
    assert t.finish() == 0 and "Traceback" not in t.text


def test_a_mistyped_agent_folder_is_refused_not_searched_for(home):
    _search_home(home)
    mistyped = str(home.agent) + "t"
    _one_line_error(run_cli("search", str(home.folder), str(home.state), mistyped, "deploy"),
                    "agent folder does not exist", "--agent")
    _one_line_error(run_cli("search", str(home.folder), str(home.state), "--agent", mistyped, "deploy"),
                    "agent folder does not exist")
    # the old positional form still works for a folder that exists, and a quoted path is a query
    r = run_cli("search", str(home.folder), str(home.state), str(home.agent), "deploy", "--json")
    assert "chats/t1.jsonl" in [h["ref"] for h in json.loads(r.stdout)["hits"]]
    r = run_cli("search", *_flags(home), "docs/deploy.md")
    assert r.returncode == 0


# --- 3. index: the bar, the summary, Ctrl-C ------------------------------------------------

def test_index_bar_on_a_narrow_terminal_is_one_line_redrawn(home):
    _many_files(home, 1500)
    t = Tty("index", *_flags(home), cols=40)
    assert t.finish() == 0
    text = t.text
    bar, _, summary = text.rpartition("\r\n")[0].rpartition("\r\n")
    assert summary.startswith("indexed 1,500 files, 0 unchanged, 0 removed, skipped 0"), text
    assert "\n" not in bar  # every update redraws the same line
    shown = _screen_lines(bar)
    assert any(s.startswith("listing") for s in shown) and any(s.startswith("reading") for s in shown)
    assert any(re.match(r"reading +\d+% \d+/1500 · \d\d:\d\d left", s) for s in shown), shown
    assert all(len(s.rstrip()) <= 40 for s in shown), [s for s in shown if len(s.rstrip()) > 40]
    assert text.endswith("\r\n")


def test_a_slow_refresh_before_search_shows_the_bar_on_stderr_then_the_answer(home):
    _many_files(home, 1500, size=3000)  # a fresh state: refreshing takes a while (0.2-1.5 s)
    t = Tty("search", *_flags(home), "w1499", "--json", cols=100, env={"LNKMEM_BAR_DELAY_S": "0.05"})
    assert t.finish() == 0
    shown = _screen_lines(t.text)
    assert any(re.search(r"reading +\d+% \d+/1500 files · \d\d:\d\d · (\d\d:\d\d|\?) left · [\d.?]+ ?files/s", s)
               for s in shown), shown
    assert t.text.endswith("\r\n") and "hits" not in t.text  # the bar's line ended; no answer on stderr
    assert {h["ref"] for h in json.loads(t.stdout)["hits"]} == {"home/d19/f1499.md"}


def test_index_summary_counts_indexed_unchanged_removed_and_skipped_by_reason(home):
    for i in range(5):
        home.write(f"n{i}.md", f"note {i}\n")
    (home.folder / "photo.bin").write_bytes(b"\x89PNG\0\0\0" * 100)
    (home.folder / "huge.log").write_bytes(b"x" * (4 * 1024 * 1024 + 1))
    r = run_cli("index", *_flags(home))
    assert r.returncode == 0 and r.stdout == b""
    err = r.stderr.decode()
    assert err.count("\n") == 1 and "\x1b" not in err and "\r" not in err  # a pipe gets no bar
    assert err.startswith("indexed 5 files, 0 unchanged, 0 removed, skipped 2 (1 binary, 1 too big)"), err
    (home.folder / "n0.md").unlink()
    home.write("n1.md", "note one, changed\n")
    home.write("n9.md", "a new note\n")
    r = run_cli("index", *_flags(home))
    assert r.stderr.decode().startswith("indexed 2 files, 4 unchanged, 1 removed, skipped 1 (1 too big)"), r.stderr
    assert "the index holds 6 files" in r.stderr.decode()  # 5 notes and the binary file's name


def test_index_of_many_batches_ends_merged_and_counts_every_file(home):
    """`index` merges once its files are all read (after letting go of its plan): the index
    it leaves holds one segment, and its summary still counts every file read."""
    from lnkmem.index.store import Store

    for i in range(60):
        home.write(f"notes/n{i:02d}.md", f"note {i} about the river crossing number {i}\n")
    r = run_cli("index", *_flags(home), env={"LNKMEM_BATCH_FILES": "5"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().startswith("indexed 60 files, 0 unchanged, 0 removed"), r.stderr
    st = Store.open(str(home.state / "index"))
    try:
        assert len(st.segment_sizes()) == 1 and st.merge_plan() == []
    finally:
        st.close()


def test_ctrl_c_stops_cleanly_and_the_next_run_finishes(home):
    _many_files(home, 2500, size=2000)
    t = Tty("index", *_flags(home), cols=100, env={"LNKMEM_BATCH_FILES": "50"})
    assert t.read_until(lambda b: re.search(rb"reading +\d+% [1-9]\d*/2500", b) is not None, 60), t.text
    t.proc.send_signal(signal.SIGINT)
    assert t.finish() == 130
    m = re.search(r"\r\nlnk-lnkmem: stopped; ([\d,]+) of 2,500 files indexed, run again to finish\r\n$", t.text)
    assert m, t.text[-500:]
    n = int(m.group(1).replace(",", ""))
    assert 0 < n < 2500
    r = run_cli("status", *_flags(home), "--json")
    st = json.loads(r.stdout)
    assert st["sources"]["home"]["files"] == n and st["pending"] == {"changed": 2500 - n, "removed": 0}
    r = run_cli("index", *_flags(home))
    assert r.stderr.decode().startswith(f"indexed {2500 - n:,} files, {n:,} unchanged, 0 removed"), r.stderr
    r = run_cli("search", *_flags(home), "w2499", "--json")
    assert [h["ref"] for h in json.loads(r.stdout)["hits"]] == ["home/d19/f2499.md"]


def test_a_state_folder_removed_while_indexing_ends_in_one_line_not_a_traceback(home):
    """The state folder taken away under a running `index` (a person's rm -rf, a volume
    gone): the run ends saying so in one line, never with a traceback."""
    import shutil
    _many_files(home, 2500, size=2000)
    env = base_env()
    env["LNKMEM_BATCH_FILES"] = "50"
    p = subprocess.Popen([PROGRAM, "index", *_flags(home)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    data = home.state / "index" / "data.mdb"
    deadline = time.monotonic() + 60
    while not data.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert p.poll() is None, "the index finished before its state could be taken away"
    shutil.rmtree(home.state)
    out, err = p.communicate(timeout=120)
    text = err.decode()
    assert "Traceback" not in text, text[-2000:]
    lines = [x for x in text.splitlines() if x.strip()]
    if p.returncode != 0:  # (the store's own warning that it found its files gone may come first)
        assert p.returncode == 2 and lines[-1].startswith("lnk-lnkmem: state: indexing stopped"), text
        assert all(x.startswith(("lnkmem: WARNING", "lnk-lnkmem: state:")) for x in lines), text


def test_index_embeds_with_a_phase_of_its_own_and_says_how_much(home, tmp_path):
    from fakes.harness import FakeServer
    for i in range(6):
        home.write(f"e{i}.md", f"passage {i} about orchards\n")
    spec = {"LNK_MEMORY_SPEC": '{"model": "fake-mini"}'}
    srv = FakeServer.start("fakes.embedding_server", "--unix", tmp_path / "e.sock", "--dim", "32", "--model", "fake-mini")
    try:
        env = {**spec, "LNK_MEMORY_MODEL": srv.listen}
        t = Tty("index", *_flags(home), cols=100, env=env)
        assert t.finish() == 0
        assert any(re.match(r"embedding 100% 6/6 passages", s) for s in _screen_lines(t.text)), t.text
        assert t.text.endswith("\r\nembedded 6 of 6 passages with fake-mini\r\n"), t.text[-300:]
        st = json.loads(run_cli("status", *_flags(home), "--json", env=env).stdout)
        assert st["model"] == {"name": "fake-mini", "served": True, "vectors_of": "fake-mini", "embedded": 6}
        r = run_cli("search", *_flags(home), "orchards", "--json", env=env)
        assert json.loads(r.stdout)["ranked"] == "meaning+words"
    finally:
        srv.stop()
    home.write("e9.md", "one more\n")
    r = run_cli("index", *_flags(home), env={**spec, "LNK_MEMORY_MODEL": f"unix:{tmp_path}/nobody.sock"})
    assert r.returncode == 0
    assert r.stderr.decode().split("\n")[1].startswith("embedded 6 of 7 passages with fake-mini; the model is not answering")


def test_the_bar_is_never_imported_by_serve(home):
    home.write("a.md", "alpha\n")
    env = {"PYTHONPROFILEIMPORTTIME": "1"}
    r = run_cli("serve", *home.args(), env=env)  # stdin closed at once: serve ends
    assert r.returncode == 0, r.stderr[-2000:]
    assert b"tqdm" not in r.stderr and b"lnkmem.cli.progress" not in r.stderr
    r = run_cli("index", *_flags(home), env=env)  # not on a terminal: no bar, no tqdm either
    assert r.returncode == 0 and b"tqdm" not in r.stderr


def test_demo_prints_the_bar_on_its_own_line_then_the_answer():
    """What `make demo` runs, on a terminal: the bar ends its line before anything else."""
    state = ROOT / ".demo-state-test"
    subprocess.run(["rm", "-rf", str(state)], check=True)
    try:
        t = Tty("index", "examples/home", str(state), "--agent", "examples/agent", cols=80, cwd=ROOT)
        assert t.finish() == 0
        assert re.search(r"\r\nindexed \d+ files, 0 unchanged, 0 removed, skipped 0; the index holds", t.text), t.text
        t = Tty("search", "examples/home", str(state), "--agent", "examples/agent", "how do we deploy the service",
                cwd=ROOT)
        assert t.finish() == 0
        assert t.text == ""  # no bar for a quick refresh: stderr stays empty
        assert re.match(rb"\d+ hits for 'how do we deploy the service' \(ranked by words\)\n\n\[1\] home/projects/",
                        t.stdout), t.stdout[:200]
    finally:
        subprocess.run(["rm", "-rf", str(state)], check=True)


# --- 4. status --------------------------------------------------------------------------------

def test_status_says_what_is_indexed_how_fresh_and_who_is_building(home):
    _search_home(home)
    (home.agent / "memory" / "notes.md").write_text("- the release manager is Ada\n")
    home.write("sub/.gitignore", "*.tmp\n")
    home.write(".lnkmemignore", "drafts/\n")
    r = run_cli("status", *_flags(home), "--json")
    st = json.loads(r.stdout)
    assert st["indexed"] is False and not home.state.exists()  # status changes nothing
    keys = {"folder", "state", "agent", "indexed", "damaged", "files", "passages", "sources", "by_kind", "index_bytes",
            "last_change", "pending", "model", "building", "ignore_files", "skipped_by_default",
            "notes_history", "copy", "watch", "moved_aside"}
    assert set(st) == keys  # the same keys, indexed or not: stable for scripts
    run_cli("index", *_flags(home), env={"LNK_MEMORY_SPEC": '{"model": "mini-lm"}'})
    home.write("docs/new.md", "fresh\n")
    r = run_cli("status", *_flags(home), "--json", env={"LNK_MEMORY_SPEC": '{"model": "mini-lm"}'})
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert set(st) == keys
    assert st["indexed"] and st["files"] == 6 and st["passages"] >= 6
    assert st["sources"]["home"]["files"] == 3 and st["sources"]["chats"]["files"] == 1
    assert st["sources"]["skills"]["files"] == 1 and st["sources"]["notes"]["files"] == 1
    assert st["index_bytes"] > 0 and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", st["last_change"])
    assert st["pending"] == {"changed": 1, "removed": 0}
    assert st["model"]["name"] == "mini-lm" and st["model"]["embedded"] == 0 and st["model"]["served"] is False
    assert st["building"] is None
    assert sorted(st["ignore_files"]) == [".lnkmemignore", "sub/.gitignore"]
    # another process building: the lock file in <state>
    fd = os.open(home.state / "build.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"4242\n", 0)
    try:
        st = json.loads(run_cli("status", *_flags(home), "--json").stdout)
        assert st["building"] == {"pid": 4242}
        text = run_cli("status", *_flags(home)).stdout.decode()
        assert "process 4242 is building this index now" in text
        _one_line_error(run_cli("index", *_flags(home)), "process 4242 is building this index")
        r = run_cli("search", *_flags(home), "deploy", "--json")  # answers from what is indexed
        assert r.returncode == 0 and json.loads(r.stdout)["hits"]
        assert b"being built by process 4242" in r.stderr
    finally:
        os.close(fd)
    text = run_cli("status", *_flags(home)).stdout.decode()
    assert "no other process is building it" in text and "1 new or changed" in text
    assert "home    3 files" in text and ".lnkmemignore, sub/.gitignore" in text


# --- 5. mcp-config -------------------------------------------------------------------------------

def test_mcp_config_prints_a_snippet_that_starts_a_working_server(home, monkeypatch):
    home.write("a.md", "the quarterly report is due friday\n")
    monkeypatch.chdir(home.base)  # relative paths in, absolute paths out
    r = run_cli("mcp-config", "json", "home", "--agent", "agent")
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["mcpServers"]["lnkmem"]
    assert entry == {"command": PROGRAM,
                     "args": ["serve", str(home.folder), str(home.state), str(home.agent)],
                     "env": {"LNK_MEMORY_NOTES": str(home.notes)}}
    env = base_env()
    env.update(entry["env"])
    with Server([entry["command"], *entry["args"]], env) as s:  # what a client would start
        s.initialize()
        s.wait_indexed()
        assert [h["ref"] for h in s.search("quarterly")["structuredContent"]["hits"]] == ["home/a.md"]
    cursor = json.loads(run_cli("mcp-config", "cursor", "home").stdout)["mcpServers"]["lnkmem"]
    assert cursor["args"][:2] == ["serve", str(home.folder)] and os.path.isabs(cursor["args"][2])
    assert not os.path.commonpath([cursor["args"][2], str(home.folder)]) == str(home.folder)  # state not in Home
    vscode = json.loads(run_cli("mcp-config", "vscode", "home", "--state", "st").stdout)["servers"]["lnkmem"]
    assert vscode == {"type": "stdio", "command": PROGRAM, "args": ["serve", str(home.folder), str(home.base / "st")]}
    line = run_cli("mcp-config", "claude", "home", "--agent", "agent", "--name", "mem").stdout.decode()
    words = shlex.split(line)
    assert words[:4] == ["claude", "mcp", "add-json", "mem"] and len(words) == 5 and line.endswith("\n")
    assert json.loads(words[4]) == {"type": "stdio", **entry}
    _one_line_error(run_cli("mcp-config", "emacs", "home"), "unknown client 'emacs'", "claude, cursor, vscode, json")
    _one_line_error(run_cli("mcp-config", "json", "home", "--name", "a b"), "--name")


# --- 6. bad paths and environments: one line, exit 2, nothing written ------------------------------

BAD = [
    # (what, argv template, words in the message)
    ("folder is a file", ["{cmd}", "/etc/passwd", "{state}"], "not a folder"),
    ("folder missing", ["{cmd}", "/proc/nope", "{state}"], "does not exist"),
    ("agent missing", ["{cmd}", "{folder}", "{state}", "--agent", "{base}/agentt"], "agent folder does not exist"),
    ("agent is a file", ["{cmd}", "{folder}", "{state}", "--agent", "/etc/passwd"], "agent folder is not a folder"),
    ("state is a file", ["{cmd}", "{folder}", "/etc/passwd"], "state is not a folder"),
    ("state under a file", ["{cmd}", "{folder}", "/etc/passwd/state"], "state"),
    ("state is Home", ["{cmd}", "{folder}", "{folder}"], "is Home or holds it"),
    ("state holds Home", ["{cmd}", "{folder}/sub/..", "{base}"], "is Home or holds it"),
    ("agent is Home", ["{cmd}", "{folder}", "{state}", "--agent", "{folder}"], "agent folder: "),
    ("folder not UTF-8", ["{cmd}", "{base}/odd\udcff", "{state}"], "folder: the path is not valid UTF-8"),
    ("state not UTF-8", ["{cmd}", "{folder}", "{base}/st\udcff"], "state: the path is not valid UTF-8"),
]


@pytest.mark.parametrize("cmd", ["index", "search", "status"])
@pytest.mark.parametrize("what, argv, words", BAD, ids=[b[0] for b in BAD])
def test_bad_paths_are_one_line_and_exit_2(home, cmd, what, argv, words):
    state = home.base / "st"
    args = [a.format(cmd=cmd, folder=home.folder, state=state, base=home.base) for a in argv]
    args = [os.fsencode(a) for a in args]  # (undecodable bytes travel as bytes)
    if "not UTF-8" in what:
        (home.base / "odd\udcff").mkdir()
    (home.folder / "sub").mkdir(exist_ok=True)
    if cmd == "search":
        args.append(b"deploy")
    r = run_cli(*args)
    if cmd == "status" and what == "state under a file":
        words = "state"
    _one_line_error(r, words)
    assert not state.exists()


@pytest.mark.parametrize("cmd", ["index", "search"])
def test_a_state_that_cannot_be_written_is_refused(home, cmd):
    for state in ("/proc/nope", "/proc/1", "/sys/kernel"):
        args = [cmd, str(home.folder), state] + (["x"] if cmd == "search" else [])
        _one_line_error(run_cli(*args), "state cannot be written", state)


@pytest.mark.parametrize("args, words", [
    (["mcp-config", "/etc/passwd"], "folder is not a folder"),
    (["mcp-config", "claude", "/proc/nope"], "folder does not exist"),
    (["mcp-config", "cursor", "{folder}", "--agent", "{base}/nope"], "agent folder does not exist"),
    (["mcp-config", "json", "{folder}", "--state", "/etc/passwd"], "state is not a folder"),
    (["mcp-config", "a", "b", "c"], "too many arguments"),
    (["mcp-config", "{folder}", "--state", "{folder}"], "is Home or holds it"),
    (["mcp-config", "{base}/agent\udcff"], "not valid UTF-8"),
    (["command", "/etc/passwd", "{base}/st"], "folder"),
    (["serve", "/proc/nope", "{base}/st"], "folder"),
    (["index", "{folder}", "{base}/st", "--budget", "3"], "unrecognized arguments"),
    (["search", "{folder}", "{base}/st", "q", "--limit", "ten"], "--limit"),
    (["index", "{folder}", "{base}/st", "{base}/agent", "--agent", "{base}/agent"], "given twice"),
    (["index", "{folder}", "{base}/st"], "LNK_MEMORY_SPEC"),
    (["index", "{folder}", "{base}/st"], "LNKMEM_LOG"),
    (["search", "{folder}", "{base}/st", "q"], "LNKMEM_BATCH_FILES"),
])
def test_other_bad_arguments_are_one_line_and_exit_2(home, args, words):
    args = [a.format(folder=home.folder, base=home.base) for a in args]
    env = {"LNK_MEMORY_SPEC": "{oops", "LNKMEM_LOG": "loud", "LNKMEM_BATCH_FILES": "abc"}.get(words)
    r = run_cli(*args, env={words: env} if env else {})
    if words == "LNK_MEMORY_SPEC":
        words = "JSON"
    _one_line_error(r, words)
    assert not (home.base / "st").exists()


# --- 7. the README stands alone -------------------------------------------------------------------

def test_readme_opens_with_demo_and_test_and_links_only_inside_the_repository():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert not re.match(r"[a-z]+:", target) and not target.startswith(".."), target
        assert (ROOT / target.split("#")[0]).exists(), target
    assert "mcp-config" in text and "docs/CONTRACT.md" in text
    shared = ROOT.parent / "shared" / "contract" / "PROTOCOL.md"  # the authoritative text, where present
    if shared.exists():
        vendored = (ROOT / "docs" / "CONTRACT.md").read_text()
        assert vendored.split("-->\n\n", 1)[1] == shared.read_text(), "docs/CONTRACT.md is not the shared contract"
