"""Ranking by meaning (§2.4, §4.1 `ranked`, §6) against the fake embedding server."""


import pytest

from fakes.harness import FakeServer
from tests.helpers import Server, refs, until

SPEC = '{"model": "fake-mini"}'


@pytest.fixture
def model(tmp_path):
    sock = tmp_path / "embed.sock"
    srv = FakeServer.start("fakes.embedding_server", "--unix", sock, "--dim", "64", "--model", "fake-mini",
                           "--log", tmp_path / "embed.log")
    yield srv
    srv.stop()


def _env(model):
    return {"LNK_MEMORY_SPEC": SPEC, "LNK_MEMORY_MODEL": model.listen}


def _embedded(model) -> int:
    return sum(1 for e in model.log() if e["path"].startswith("/v1/embeddings"))


def _corpus(home):
    home.write("spring.md", "We purchased an automobile last spring; the vehicle runs well.\n")
    home.write("food.md", "Bread, cheese and olives for the picnic.\n")
    home.write("code.md", "The parser has a defect when the input is empty.\n")


def wait_meaning(s, query="buying a car"):
    assert until(lambda: s.search(query)["structuredContent"]["ranked"] == "meaning+words", timeout=10)


def test_meaning_beats_words_on_synonyms(home, model):
    _corpus(home)
    with Server.start(home, env=_env(model)) as s:
        s.wait_indexed()
        wait_meaning(s)
        r = s.search("buying a car")["structuredContent"]
        assert r["ranked"] == "meaning+words" and r["hits"][0]["ref"] == "home/spring.md"
        assert refs(s.search("bug in the code"))[0] == "home/code.md"
    with Server.start(home) as s:  # the same query by words alone misses
        s.wait_indexed()
        r = s.search("buying a car")["structuredContent"]
        assert r["ranked"] == "words" and "home/spring.md" not in refs({"structuredContent": r})


def test_initialize_is_fast_with_the_model_unreachable(home, tmp_path):
    _corpus(home)
    env = {"LNK_MEMORY_SPEC": SPEC, "LNK_MEMORY_MODEL": f"unix:{tmp_path}/nobody.sock"}
    with Server.start(home, env=env) as s:
        assert s.initialize()["result"]["protocolVersion"]  # (within the request's 10 s deadline)
        s.wait_indexed()
        r = s.call("search", {"query": "automobile"}, timeout=10)["structuredContent"]
        assert r["ranked"] == "words" and r["hits"][0]["ref"] == "home/spring.md"


def test_model_dying_falls_back_to_words_and_recovers(home, model):
    _corpus(home)
    with Server.start(home, env=_env(model)) as s:
        s.wait_indexed()
        wait_meaning(s)
        model.fault("503")
        r = s.search("a fresh query about vehicles")["structuredContent"]
        assert r["ranked"] == "words" and refs({"structuredContent": r})[0] == "home/spring.md"
        model.fault("ok")
        # the circuit tries the model again after its cool-down
        assert until(lambda: s.search("another vehicle question")["structuredContent"]["ranked"] == "meaning+words",
                     timeout=15, step=0.5)


def test_restart_embeds_nothing_and_model_change_reembeds(home, model, tmp_path):
    _corpus(home)
    with Server.start(home, env=_env(model)) as s:
        s.wait_indexed()
        wait_meaning(s)
        assert until(lambda: _embedded(model) >= 2)
    before = len(model.log())
    with Server.start(home, env=_env(model)) as s:
        s.wait_indexed()
        wait_meaning(s)
        assert s.search("a car")["structuredContent"]["ranked"] == "meaning+words"
    # after the restart only queries were embedded (one short text each), no passage
    new = [e for e in model.log()[before:] if e["path"] == "/v1/embeddings"]
    assert new and all(e["size"] < 80 for e in new)
    other = FakeServer.start("fakes.embedding_server", "--unix", tmp_path / "e2.sock", "--dim", "32",
                             "--model", "fake-other")
    try:
        env = {"LNK_MEMORY_SPEC": '{"model": "fake-other"}', "LNK_MEMORY_MODEL": other.listen}
        with Server.start(home, env=env) as s:
            s.wait_indexed()
            wait_meaning(s)
            # the passages were embedded again by the other model (a request holding them all)
            assert any(e["size"] > 150 for e in other.log() if e["path"] == "/v1/embeddings")
    finally:
        other.stop()


def test_a_passage_only_meaning_found_is_scored_by_words_too(home, model):
    """Fusion scores every passage of the union by both rankings. Two passages lie
    beyond the words ranking's first hundred (110 notes say "zebra" more often) and
    are found by meaning: one holds the query's word "zebra", the other, nearer by
    meaning, holds none of its words. Counted as the words ranking's last, both got
    the same words score and the nearer came first; scored by words, the one that
    holds the word comes first."""
    for i in range(110):
        home.write(f"herd/z{i:03d}.md", f"Zebra zebra, herd {i}, seen by the dusty savanna trees near the old well.\n")
    for i in range(300):
        home.write(f"notes/n{i:03d}.md", f"Notes on topic {i}: meeting agenda and lunch.\n")
    home.write("held.md", "Zebra: we purchase an automobile today, at the market by the river gate.\n")
    home.write("near.md", "We purchase an automobile.\n")
    query = "buying a car zebra"

    def fused():
        r = s.search(query, limit=50)
        text = r["content"][0]["text"]
        return r if r["structuredContent"]["ranked"] == "meaning+words" and "embedded so far" not in text else None

    with Server.start(home, env=_env(model)) as s:
        s.wait_indexed()
        assert until(fused, timeout=30, step=0.2)
        got = refs(fused())
        assert "home/held.md" in got
        assert "home/near.md" not in got or got.index("home/held.md") < got.index("home/near.md")
        # the query's checks still filter the union: an excluded phrase leaves it out
        r = s.search(f'{query} -"river gate"', limit=50)
        assert r["structuredContent"]["ranked"] == "meaning+words" and "home/held.md" not in refs(r)
