"""§2.2 confinement: `serve` under bubblewrap, read-only everywhere but `<state>`
and the notes' folder, with no network, works and writes nothing else."""

import hashlib
import os
import shutil
import sys

import pytest

from tests.helpers import PROGRAM, ROOT, Server, base_env, refs

bwrap = shutil.which("bwrap")
pytestmark = pytest.mark.skipif(bwrap is None and not os.environ.get("CI"), reason="bubblewrap is not installed")


def _tree(*roots) -> dict:
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for n in filenames + dirnames:
                p = os.path.join(dirpath, n)
                if os.path.isfile(p) and not os.path.islink(p):
                    out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
                else:
                    out[p] = "dir"
    return out


def test_serve_confined(home, tmp_path):
    assert bwrap, "bubblewrap (bwrap) must be installed: apt-get install -y bubblewrap"
    home.write("docs/a.md", "The lighthouse keeper logs the weather.\n")
    home.chat("o1", [{"role": "user", "text": "lighthouse at dawn"}])
    home.write("skills/s/SKILL.md", "lighthouse skill\n")
    home.notes.write_text("- first note\n")
    before = _tree(home.folder, home.agent / "chats", home.agent / "skills", ROOT / "lnkmem", sys.prefix)
    # everything read-only (the program and its venv wherever they are), but the notes' folder
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(home.state.parent), str(home.state.parent),
            "--unshare-net", "--die-with-parent", "--new-session",
            PROGRAM, "serve", *home.args()]
    home.state.mkdir(parents=True, exist_ok=True)
    env = base_env()
    env["LNK_MEMORY_NOTES"] = str(home.notes)
    env.pop("PYTHONDONTWRITEBYTECODE")  # the engine itself must not write bytecode
    with Server(argv, env) as s:
        s.initialize()
        s.wait_indexed()
        assert sorted(refs(s.search("lighthouse"))) == ["chats/o1.jsonl", "home/docs/a.md", "skills/s/SKILL.md"]
        assert s.call("remember", {"add": "second note"})["isError"] is False
        assert refs(s.search("second"))[0] == "notes"
        assert s.close() == 0
    assert "Traceback" not in s.stderr.decode(), s.stderr.decode()
    assert "Read-only" not in s.stderr.decode(), s.stderr.decode()
    assert home.notes.read_text() == "- first note\n- second note\n"
    after = _tree(home.folder, home.agent / "chats", home.agent / "skills", ROOT / "lnkmem", sys.prefix)
    assert after == before
    written = sorted(p.name for p in home.state.parent.iterdir())
    assert written == ["lnkmem", "notes.md"]
