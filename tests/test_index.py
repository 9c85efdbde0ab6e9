"""The index over time (§3.2, §7.1): incremental, live, and never wrong after a kill."""

import os
import random
import signal
import subprocess
import time

import pytest


from tests.helpers import PROGRAM, Server, base_env, refs, run_cli, until


def test_live_changes_land_while_serving(home):
    home.write("a.md", "apples and pears\n")
    with Server.start(home) as s:
        s.wait_indexed()
        assert refs(s.search("apples")) == ["home/a.md"]
        home.write("new/b.md", "bananas from the market\n")
        assert until(lambda: refs(s.search("bananas")) == ["home/new/b.md"], timeout=30)
        home.write("a.md", "cherries only now\n")
        assert until(lambda: refs(s.search("cherries")) == ["home/a.md"] and not refs(s.search("apples")), timeout=30)
        os.unlink(home.folder / "new" / "b.md")
        assert until(lambda: not refs(s.search("bananas")), timeout=30)
        home.chat("t9", [{"role": "user", "text": "kiwis are green"}])
        assert until(lambda: refs(s.search("kiwis")) == ["chats/t9.jsonl"], timeout=30)
        home.notes.write_text("- mangoes\n")
        assert until(lambda: refs(s.search("mangoes")) == ["notes"], timeout=30)


def test_restart_reads_no_content_of_unchanged_files(home):
    p = home.write("a.md", "original words here\n")
    home.write("b.md", "other file\n")
    assert run_cli("index", *home.args()).returncode == 0
    st = os.stat(p)
    p.write_text("modified words here\n")  # same size...
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # ...same mtime: only a read would notice
    with Server.start(home) as s:
        s.wait_indexed()
        assert refs(s.search("original")) == ["home/a.md"]
        assert refs(s.search("modified")) == []
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with Server.start(home) as s:
        s.wait_indexed()
        assert refs(s.search("modified")) == ["home/a.md"]


def test_a_changed_file_reindexes_only_itself(home):
    for i in range(20):
        home.write(f"f{i}.md", f"file number {i} talks about topic{i}\n")
    r = run_cli("index", *home.args())
    assert r.stderr.startswith(b"indexed 20 files, 0 unchanged, 0 removed")
    home.write("f3.md", "file three now talks about zebras\n")
    os.unlink(home.folder / "f7.md")
    r = run_cli("index", *home.args())
    assert r.stderr.startswith(b"indexed 1 file, 18 unchanged, 1 removed")  # one changed, one deleted
    out = run_cli("search", *home.args(), "zebras").stdout.decode()
    assert "home/f3.md" in out
    assert "home/f7.md" not in run_cli("search", *home.args(), "topic7").stdout.decode()


def test_hidden_state_agent_and_binary_files_are_not_indexed(home, tmp_path):
    home.write(".secret/key.md", "hidden needle\n")
    home.write(".dot.md", "hidden needle\n")
    (home.folder / "bin.dat").write_bytes(b"needle\0\0\0binary")
    (home.folder / "huge.md").write_bytes(b"needle " * (700 * 1024))  # over 4 MiB
    outside = tmp_path / "outside.md"
    outside.write_text("needle outside\n")
    (home.folder / "out-link.md").symlink_to(outside)
    home.write("real.md", "needle inside\n")
    (home.folder / "in-link.md").symlink_to(home.folder / "real.md")
    with Server.start(home) as s:
        s.wait_indexed()
        assert sorted(refs(s.search("needle"))) == ["home/in-link.md", "home/real.md"]


def test_state_and_agent_inside_home_are_skipped(tmp_path):
    home = tmp_path / "h"
    agent = home / "agent"
    (agent / "chats").mkdir(parents=True)
    (home / "doc.md").write_text("walrus facts\n")
    (agent / "chats" / "t.jsonl").write_text('{"role": "user", "text": "walrus chat"}\n')
    state = home / "state"
    with Server([PROGRAM, "serve", str(home), str(state), str(agent)], base_env()) as s:
        s.wait_indexed()
        assert sorted(refs(s.search("walrus"))) == ["chats/t.jsonl", "home/doc.md"]


def test_documents_by_name_without_converter(home):
    (home.folder / "Quarterly Report.pdf").write_bytes(b"%PDF-1.4 binary stuff")
    with Server.start(home) as s:
        s.wait_indexed()
        assert refs(s.search("quarterly report")) == ["home/Quarterly Report.pdf"]


def _corpus(home, n=120):
    rng = random.Random(7)
    words = [f"w{i}" for i in range(300)] + ["alpha", "beta", "gamma", "delta"]
    for i in range(n):
        body = "\n\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(6))
        home.write(f"d{i % 7}/f{i}.md", f"# File {i}\n\n{body}\n")
    for t in range(10):
        home.chat(f"t{t}", [{"role": "user", "text": " ".join(rng.choice(words) for _ in range(30))}
                            for _ in range(8)])


QUERIES = ["alpha", "beta gamma", "w1 w2 w3", "delta w17", "w299 alpha"]


def _answers(home) -> list[str]:
    return [run_cli("search", *home.args(), q, "--limit", "20").stdout.decode() for q in QUERIES]


@pytest.mark.parametrize("worker", ["0", "1"], ids=["in-thread", "worker"])
def test_sigkill_while_indexing_never_leaves_a_wrong_index(home, tmp_path, worker):
    _corpus(home)
    env = base_env()
    env["LNKMEM_BATCH_FILES"] = "5"
    env["LNKMEM_WORKER"] = worker  # the files read and counted here, or in the forked worker
    rng = random.Random(11)
    for k in range(12):
        p = subprocess.Popen([PROGRAM, "index", *home.args()], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.9))  # kept: the kill at a random moment of the build
        p.send_signal(signal.SIGKILL)
        p.wait()
        if k % 4 == 3:  # change the tree between kills too
            home.write(f"d1/f{k}.md", f"rewritten after kill {k} alpha\n")
    killed = _answers(home)
    # the same tree indexed once, cleanly, in another state
    clean_state = tmp_path / "clean"
    clean = [run_cli("search", str(home.folder), str(clean_state), str(home.agent), q, "--limit", "20").stdout.decode()
             for q in QUERIES]
    assert killed == clean
    assert all(a.strip() for a in killed)


def test_damaged_index_is_rebuilt(home):
    home.write("a.md", "sturgeon\n")
    assert run_cli("index", *home.args()).returncode == 0
    data = home.state / "index" / "data.mdb"
    with open(data, "r+b") as f:
        f.seek(0)
        f.write(b"\xff" * 8192)  # smash the meta pages
    with Server.start(home) as s:
        s.wait_indexed()
        assert refs(s.search("sturgeon")) == ["home/a.md"]


@pytest.mark.parametrize("worker", ["", "1"], ids=["auto", "worker"])
def test_documents_converted_with_lnk_documents(home, worker):
    from fakes.lnk_documents import make_docx, make_pdf
    from tests.helpers import ROOT
    (home.folder / "report.pdf").write_bytes(make_pdf("The albatross census counted 412 birds."))
    (home.folder / "memo.docx").write_bytes(make_docx("Budget memo: the heron survey needs funds."))
    (home.folder / "page.html").write_text("<html><body><h1>Puffins</h1><p>Puffins nest in burrows.</p></body></html>")
    (home.folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf at all")
    env = {"PATH": f"{ROOT / 'fakes' / 'bin'}:{os.environ['PATH']}", "LNKMEM_WORKER": worker}
    with Server.start(home, env=env) as s:
        s.wait_indexed()
        assert refs(s.search("albatross census")) == ["home/report.pdf"]
        assert refs(s.search("heron survey")) == ["home/memo.docx"]
        assert refs(s.search("burrows")) == ["home/page.html"]
        assert refs(s.search("broken")) == ["home/broken.pdf"]  # failed conversion: by name
        text = s.call("read", {"ref": "home/report.pdf"})["structuredContent"]["text"]
        assert "412 birds" in text
