"""Issue 34: the binding key is compared in constant time (`hmac.compare_digest`);
what a client sees is unchanged: a wrong key of the same length is refused, the
same key in upper case is the same key, and neither ends the good binding."""

from tests.bridges import KEY, Bridges
from tests.helpers import Many, until


def test_a_wrong_key_of_the_same_length_is_refused_and_ends_nothing(tmp_path):
    b = Bridges(tmp_path / "link")
    b.write_home("docs/plan.md", "The narwhal migration plan.\n")
    try:
        with Many(tmp_path / "m" / "mem.sock", {}, b.flags() + ["--cache", str(tmp_path / "cache")],
                  env={"LNKMEM_WRITEBACK_S": "0.3"}) as m:
            with m.connect() as good:
                assert good.first(b.bound()) == {"ok": True}
                assert until(lambda: [h["ref"] for h in good.search("narwhal")["structuredContent"]["hits"]]
                             == ["home/docs/plan.md"], timeout=20)
                wrong = KEY[:-1] + ("0" if KEY[-1] != "0" else "1")  # 64 hex, one character off
                assert len(wrong) == len(KEY) and wrong != KEY
                with m.connect() as bad:
                    r = bad.first(b.bound(key=wrong))
                    assert "refused" in r.get("error", ""), r
                    assert wrong not in r["error"] and KEY not in r["error"]
                with m.connect() as upper:  # the same key, upper-cased: the same binding
                    assert upper.first(b.bound(key=KEY.upper())) == {"ok": True}
                    assert [h["ref"] for h in upper.search("narwhal")["structuredContent"]["hits"]] == ["home/docs/plan.md"]
                assert [h["ref"] for h in good.search("narwhal")["structuredContent"]["hits"]] == ["home/docs/plan.md"]
    finally:
        b.stop()
