"""The commands of §1: install, command, index, search; one-line refusals, exit 2."""

import json
import os

import pytest

from tests.helpers import PROGRAM, run_cli


def test_command_prints_serve(home):
    r = run_cli("command", *home.args(), env={"LNK_MEMORY_NOTES": str(home.notes)})
    assert r.returncode == 0, r.stderr
    serve = json.loads(r.stdout)
    assert serve == {"argv": [PROGRAM, "serve", str(home.folder), str(home.state), str(home.agent),
                              "--spec", '{"tokens":2000,"notes":"4 KB"}', "--notes", str(home.notes)],
                     "allow": ["search", "read", "list", "remember"], "shared": True,
                     "programs": ["link-documents"]}
    assert os.path.isabs(serve["argv"][0])
    assert not home.state.exists()  # state need not exist, and command makes none


def test_command_with_model_and_without_notes(home, tmp_path):
    os.chdir(tmp_path)
    r = run_cli("command", "home", "newstate", env={"LNK_MEMORY_SPEC": '{"model": "mini-lm"}'})
    serve = json.loads(r.stdout)
    assert serve["allow"] == ["search", "read", "list"]
    assert serve["models"] is True and serve["model"] == "mini-lm"
    assert serve["argv"][2:4] == [str(tmp_path / "home"), str(tmp_path / "newstate")]


@pytest.mark.parametrize("args, env, words", [
    (["command", "/no/such/folder", "/tmp/s"], {}, "folder does not exist"),
    (["command"], {}, "required"),
    (["command", "{folder}", "/tmp/s"], {"LNK_MEMORY_SPEC": '{"tokens": "many"}'}, "tokens"),
    (["command", "{folder}", "/tmp/s"], {"LNK_MEMORY_SPEC": '{"tokenz": 1}'}, "tokenz"),
    (["command", "{folder}", "/tmp/s"], {"LNK_MEMORY_SPEC": "not json"}, "JSON"),
    (["serve", "{folder}", "/tmp/s"], {"LNK_MEMORY_SPEC": '{"notes": "lots"}'}, "notes"),
    (["serve", "{folder}", "/tmp/s"], {"LNK_MEMORY_NOTES": "relative/notes.md"}, "LNK_MEMORY_NOTES"),
    # rev. 3: serve-many validates its own spec too (each agent is served with its argv's)
    (["serve-many", "{folder}/run/m.sock", "{}"], {"LNK_MEMORY_SPEC": '{"tokens": "lots"}', "LNKMEM_LINGER_S": "0.2"},
     "tokens"),
    (["serve-many", "{folder}/run/m.sock", "{}"], {"LNK_MEMORY_SPEC": "not json", "LNKMEM_LINGER_S": "0.2"}, "JSON"),
    (["index", "/no/such"], {}, "required"),
    (["search", "{folder}", "/tmp/s", "x" * 10_001], {}, "query"),  # rev. 2: up to 10,000
    (["frobnicate"], {}, "invalid choice"),
])
def test_refusals_are_one_line_and_exit_2(home, args, env, words):
    args = [a.replace("{folder}", str(home.folder)) for a in args]
    r = run_cli(*args, env=env)
    assert r.returncode == 2
    err = r.stderr.decode()
    assert err.count("\n") == 1 and words in err and "Traceback" not in err
    assert r.stdout == b""


# issue 36: one policy for the LNKMEM_* knobs. These were read deep inside a call and a bad
# value fell back to the default unseen (or with a logged warning); now every command checks
# every knob at its start: one line naming the variable, exit 2, nothing started.
@pytest.mark.parametrize("name, bad", [
    ("LNKMEM_NOTES_WAIT_S", "soon"), ("LNKMEM_NOTES_KEEP", "0"), ("LNKMEM_NOTES_KEEP_BYTES", "lots"),
    ("LNKMEM_DRIVER_S", "0"), ("LNKMEM_DRIVER_TIMEOUT_S", "-1"), ("LNKMEM_MAX_BODY", "1e6"),
    ("LNKMEM_ANN_THRESHOLD", "lots"), ("LNKMEM_WRITEBACK_S", "-5"), ("LNKMEM_QUIET_S", "x"),
    ("LNKMEM_RECHECK_S", "nan"), ("LNKMEM_BRIDGE_PATIENCE_S", "0"),
])
def test_a_bad_knob_is_refused_at_the_start_of_every_command(home, name, bad):
    for args in (["serve", *home.args()], ["index", *home.args()]):
        r = run_cli(*args, env={name: bad})
        err = r.stderr.decode()
        assert r.returncode == 2 and err.count("\n") == 1 and err.startswith(f"lnk-lnkmem: {name}: expected"), err
        assert "Traceback" not in err and r.stdout == b""
    assert not home.state.exists()


def test_install_in_home(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    r = run_cli("install", env={"HOME": str(state)})
    assert r.returncode == 0, r.stderr
    assert list(state.iterdir()) == []  # its check leaves nothing behind
    assert run_cli("install", env={"HOME": str(state)}).returncode == 0


def test_install_fails_with_a_reason_where_it_cannot_write(tmp_path):
    if os.geteuid() == 0:
        blocked = tmp_path / "file-not-folder"
        blocked.write_text("")
    else:
        blocked = tmp_path / "ro"
        blocked.mkdir(mode=0o500)
    r = run_cli("install", env={"HOME": str(blocked)})
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1


def test_index_and_search_for_people(home):
    home.write("a.md", "The quick brown fox jumps over the lazy dog.\n")
    home.write("b.md", "A slow red fox sleeps.\n")
    r = run_cli("index", *home.args())
    assert r.returncode == 0 and b"2 files" in r.stderr and r.stdout == b""
    r = run_cli("search", *home.args(), "lazy", "dog")
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "home/a.md" in out and "home/b.md" not in out
