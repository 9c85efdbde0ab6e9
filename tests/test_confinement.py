"""§2.2 confinement: `serve` under bubblewrap as Link's sandbox runs it: read-only
everywhere but `<state>` and the notes' folder, bound as two SEPARATE writable
mounts (so a rename from one to the other fails with EXDEV), with no network;
it works and writes nothing else."""

import os
import shutil
import sys

import pytest

from tests.helpers import PROGRAM, ROOT, Server, base_env, refs, tree_digest

bwrap = shutil.which("bwrap")
pytestmark = pytest.mark.skipif(bwrap is None and not os.environ.get("CI"), reason="bubblewrap is not installed")


@pytest.mark.parametrize("worker", ["", "1"], ids=["auto", "worker"])
def test_serve_confined(home, tmp_path, worker):
    """(``worker``: the files read and counted in the forked worker of a large build.)"""
    assert bwrap, "bubblewrap (bwrap) must be installed: apt-get install -y bubblewrap"
    home.write("docs/a.md", "The lighthouse keeper logs the weather.\n")
    home.chat("o1", [{"role": "user", "text": "lighthouse at dawn"}])
    home.write("skills/s/SKILL.md", "lighthouse skill\n")
    home.notes.write_text("- first note\n")
    before = tree_digest(home.folder, home.agent / "chats", home.agent / "skills", ROOT / "lnkmem", sys.prefix)
    home.state.mkdir(parents=True, exist_ok=True)
    (home.state.parent / ".notes.md.lnkmem-left-by-a-kill").write_text("half a write")
    memory_before = tree_digest(home.state.parent)
    # everything read-only (the program and its venv wherever they are), but the notes' folder
    # and <state>, each its own mount as in Link's sandbox
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(home.state.parent), str(home.state.parent),
            "--bind", str(home.state), str(home.state),
            "--unshare-net", "--die-with-parent", "--new-session",
            PROGRAM, "serve", *home.args()]
    env = base_env()
    env["LNK_MEMORY_NOTES"] = str(home.notes)
    env.pop("PYTHONDONTWRITEBYTECODE")  # the engine itself must not write bytecode
    if worker:
        env["LNKMEM_WORKER"] = worker
    with Server(argv, env) as s:
        s.initialize()
        s.wait_indexed()
        assert sorted(refs(s.search("lighthouse"))) == ["chats/o1.jsonl", "home/docs/a.md", "skills/s/SKILL.md"]
        r = s.call("remember", {"add": "second note"})
        assert r["isError"] is False, r["content"][0]["text"]
        assert refs(s.search("second"))[0] == "notes"
        r = s.call("remember", {"add": "third note", "remove": "first note"})
        assert r["isError"] is False, r["content"][0]["text"]
        assert s.close() == 0
    assert "Traceback" not in s.stderr.decode(), s.stderr.decode()
    assert "Read-only" not in s.stderr.decode(), s.stderr.decode()
    assert home.notes.read_text() == "- second note\n- third note\n"
    after = tree_digest(home.folder, home.agent / "chats", home.agent / "skills", ROOT / "lnkmem", sys.prefix)
    assert after == before
    # in the notes' folder nothing but notes.md changed, and no temporary file is left
    # (the one a killed engine left is removed at start)
    written = sorted(p.name for p in home.state.parent.iterdir())
    assert written == ["lnkmem", "notes.md"]
    memory_after = tree_digest(home.state.parent)
    changed = {p for p in set(memory_before) | set(memory_after)
               if memory_before.get(p) != memory_after.get(p) and not p.startswith(str(home.state) + os.sep)}
    assert changed == {str(home.notes), str(home.state.parent / ".notes.md.lnkmem-left-by-a-kill")}


def test_a_merge_shared_with_its_helper_process_works_confined(home, tmp_path):
    """A build's final merge read by its helper process (``python -B -m
    lnkmem.index.merge.steps``) under the same sandbox: the helper starts, reads the
    index read-only through its own environment (its reader slot in `<state>`'s lock
    file) and its terms are searchable; nothing is written outside `<state>`."""
    import subprocess
    assert bwrap, "bubblewrap (bwrap) must be installed: apt-get install -y bubblewrap"
    words = ["lighthouse", "harbor", "lantern", "copper", "meadow", "quartz", "tundra", "willow"]
    for i in range(24):
        home.write(f"docs/n{i:02d}.md", f"# Note {i}\n\n{words[i % 8]} and {words[(i * 3) % 8]} note{i}x.\n")
    home.state.mkdir(parents=True, exist_ok=True)

    def outside() -> dict:
        return {p: h for p, h in tree_digest(home.folder, home.agent, ROOT / "lnkmem", sys.prefix).items()
                if not p.startswith(str(home.state))}

    before = outside()
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(home.state), str(home.state),
            "--unshare-net", "--die-with-parent", "--new-session",
            PROGRAM, "index", *home.args()]
    env = base_env()
    env.pop("PYTHONDONTWRITEBYTECODE")
    env["LNKMEM_WORKER"] = "1"  # every merge shared with a helper
    env["LNKMEM_BATCH_FILES"] = "3"  # segments enough to merge
    r = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "helper" not in err and "Traceback" not in err, err  # it started, and it did its share
    assert outside() == before
    from lnkmem.index.store import Store
    st = Store.open(str(home.state / "index"))
    try:
        assert len(st.snapshot.segs) == 1
        from lnkmem.index.rank.search import bm25
        for i in (0, 11, 23):
            hits = bm25(st, f"note{i}x", 5)
            assert [st.snapshot.refs[st.snapshot.refid[p]] for p, _ in hits] == [f"home/docs/n{i:02d}.md"]
    finally:
        st.close()
