"""Names are names (issue 45): a file's name reaches a bridge as itself.

A name holding ``#``, ``?``, ``%``, ``%25``, ``&``, ``=``, ``+``, a space or letters
beyond ASCII is sent percent-encoded (in the URL path of the storage bridge, in the
``path=``/``folder=``/``prefix=`` queries of both) and names that file and no other:
a conversation and a Home file of such a name are indexed, found by their own words
and read back with their own text; every verb of both bridges (list, read, write,
delete; a team's copy; a team folder of such a name) reaches the file named.
Real fake bridges over Unix sockets, a real `serve-many`.
"""

from __future__ import annotations

import json

import pytest

from lnkmem.bridges.http import BridgeClient
from lnkmem.bridges.place import NotFound
from lnkmem.bridges.remote import Collection, FilesPlace
from tests.bridges import KEY, Layout, hits
from tests.helpers import until

# each name beside a word of its own; "c%3" and "c%253" both exist (one decoded too often reads the other)
ODD = ["c#1", "c?2", "c%23", "c%3", "c%253", "c%2F4", "c d", "c+e", "a&b=c;d", "café", "日本"]
CHAT_WORDS = ["aardvark", "bittern", "caracal", "dugong", "echidna", "fossa", "gharial", "hoatzin",
              "ibisbill", "jacana", "kakapo"]
HOME_WORDS = ["lammergeier", "margay", "numbat", "okapi", "pangolin", "quokka", "radiolarian", "saiga",
              "tapir", "uakari", "vaquita"]
NESTED = ("docs/odd #dir ?x/日本 %25 y.md", "wombat")  # odd folder names too
TEAM_NAME = "crew #1 é+x&y=z?"  # a team folder's name for the agent, sent as folder=

BRIDGES = Layout(
    homes={"a1": {**{f"docs/{n}.md": f"The {w} hunts at dusk.\n" for n, w in zip(ODD, HOME_WORDS)},
                  NESTED[0]: f"The {NESTED[1]} digs at night.\n"}},
    conversations={f"{n}.jsonl": json.dumps({"role": "user", "text": f"where does the {w} sleep"}) + "\n"
                   for n, w in zip(ODD, CHAT_WORDS)},
    teams={"t1": {"folder": "teams/t1", "names": {"a1": TEAM_NAME}}},
    team_files={"t1": {"memory/c#1 é.md": "team text one\n", "memory/c%3.md": "team text three\n",
                       "memory/c%253.md": "team text two-five-three\n"}})


def read_text(c, ref: str) -> str:
    r = c.call("read", {"ref": ref})
    assert not r["isError"], (ref, r)
    return r["structuredContent"]["text"]


def test_odd_names_through_both_bridges_are_found_and_read_as_themselves(bridges, tmp_path):
    chats = [(f"chats/{n}.jsonl", n, w) for n, w in zip(ODD, CHAT_WORDS)]
    home = [(f"home/docs/{n}.md", n, w) for n, w in zip(ODD, HOME_WORDS)] + [(f"home/{NESTED[0]}", None, NESTED[1])]
    every_word = CHAT_WORDS + HOME_WORDS + [NESTED[1]]
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: all(hits(c, w) == [ref] for ref, _, w in chats + home), timeout=60), \
            {ref: hits(c, w) for ref, _, w in chats + home}
        for ref, thread, word in chats + home:
            found = c.search(word)["structuredContent"]["hits"]
            assert [h["ref"] for h in found] == [ref], (word, found)
            if thread is not None and ref.startswith("chats/"):
                assert found[0]["thread"] == thread
            text = read_text(c, ref)
            assert word in text and not [w for w in every_word if w != word and w in text], (ref, text)
        listed = c.call("list", {"ref": "chats"})["structuredContent"]["entries"]
        assert sorted(e["ref"] for e in listed) == sorted(ref for ref, _, _ in chats)
        listed = c.call("list", {"ref": "home/docs"})["structuredContent"]["entries"]
        assert sorted(e["ref"] for e in listed) == sorted([ref for ref, _, _ in home[:-1]] + ["home/docs/odd #dir ?x"])
    # every name went out percent-encoded; every conversation read found its file
    for e in bridges.storage.log() + bridges.files.log():
        assert all(ch not in e["path"] for ch in " #é日") and e["status"] != 400, e
        assert not (e["path"].startswith("/v1/c/conversations/") and e["status"] == 404), e


def _client(bridges, purpose: str) -> BridgeClient:
    sock = bridges.storage_sock if purpose == "storage" else bridges.files_sock
    return BridgeClient(str(sock), purpose, "o1", "a1", KEY, timeout=10.0, patience=10.0)


@pytest.mark.parametrize("where", ["storage", "team", "files"])
def test_every_verb_reaches_the_file_of_an_odd_name(bridges, where):
    """Write, list (whole and by prefix), read, rewrite and delete each odd name, with the
    names ``c%3`` and ``c%253`` side by side: each verb finds its own file and no other,
    on disk and through the bridge."""
    client = _client(bridges, "files" if where == "files" else "storage")
    try:
        if where == "storage":
            place, disk = Collection(client, "memory", root="lnkmem"), bridges.store("memory") / "lnkmem"
        elif where == "team":
            place, disk = Collection(client, "memory", team="t1", root="lnkmem"), bridges.team_copy("t1")
        else:
            place, disk = FilesPlace(client, root="memory/lnkmem"), bridges.home() / "memory" / "lnkmem"
        names = [f"{n}.bin" for n in ODD] + ["sub #?/é %25.bin"]
        versions = {}
        for i, name in enumerate(names):
            versions[name] = place.write(name, f"first {i}".encode(), None)
        for i, name in enumerate(names):
            assert (disk / name).read_bytes() == f"first {i}".encode(), name
            assert place.read(name) == (f"first {i}".encode(), versions[name]), name
            assert [e.path for e in place.list(name)] == [name], name
            assert place.stat(name).version == versions[name]
        assert sorted(e.path for e in place.list()) == sorted(names)
        for i, name in enumerate(names):
            versions[name] = place.write(name, f"second {i}".encode(), versions[name])
            assert place.read(name)[0] == f"second {i}".encode()
        for i, name in enumerate(names):
            place.delete(name, versions[name])
            assert not (disk / name).exists(), name
            with pytest.raises(NotFound):
                place.read(name)
            for other in names[i + 1:]:
                assert (disk / other).exists(), (name, other)  # only the file named was deleted
    finally:
        client.close()


def test_a_team_folder_of_an_odd_name_and_its_odd_files(bridges):
    """``folder=`` names the agent's team folder as itself, and each of its files reads as itself."""
    client = _client(bridges, "files")
    try:
        team = FilesPlace(client, folder=TEAM_NAME, root="memory")
        assert sorted(e.path for e in team.list()) == ["c#1 é.md", "c%253.md", "c%3.md"]
        assert team.read("c#1 é.md")[0] == b"team text one\n"
        assert team.read("c%3.md")[0] == b"team text three\n"
        assert team.read("c%253.md")[0] == b"team text two-five-three\n"
        assert [e.path for e in team.list("c%3.md")] == ["c%3.md"]
    finally:
        client.close()
