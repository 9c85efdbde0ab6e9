"""Ignore files (§3.2 rev. 2: "A search never shows an ignored file") for a Home
served through the files bridge: the `.gitignore`/`.lnkmemignore` files are
read through the bridge too, and `search`, `list` and indexing honour them as
they do for a local Home. Real `lnk-lnkmem`, real fake bridges (fakes/)."""

from __future__ import annotations

from tests.bridges import Layout
from tests.helpers import until


BRIDGES = Layout(homes={"a1": {
    "docs/plan.md": "The narwhal migration plan.\n",
    "docs/draft.tmp": "narwhal draft, ignored by pattern\n",
    "build/out.md": "narwhal build output, ignored folder\n",
    "node_modules/pkg/readme.md": "narwhal package, skipped by default\n",
    "venv/pyvenv.cfg": "home = /usr/bin\n",
    "venv/lib/site.md": "narwhal inside a virtual environment\n",
    "notes/keep.md": "narwhal notes kept\n",
    "notes/secret.md": "narwhal secret, ignored below notes/\n",
    ".gitignore": "*.tmp\nbuild/\n",
    "notes/.lnkmemignore": "secret.md\n",
}}, conversations={"t1.jsonl": '{"role": "user", "text": "hello"}\n'})


def refs(c, query, **kw) -> list[str]:
    return [h["ref"] for h in c.search(query, **kw)["structuredContent"]["hits"]]


def listed(c, ref) -> list[str]:
    return [e["ref"] for e in c.call("list", {"ref": ref})["structuredContent"]["entries"]]


def test_bound_home_honours_ignore_files_read_through_the_bridge(bridges, tmp_path):
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in refs(c, "narwhal"), timeout=20)
        assert sorted(refs(c, "narwhal", limit=20)) == ["home/docs/plan.md", "home/notes/keep.md"]
        # `list` shows no ignored file or folder either
        assert listed(c, "home") == ["home/docs", "home/notes"]
        assert listed(c, "home/docs") == ["home/docs/plan.md"]
        assert listed(c, "home/notes") == ["home/notes/keep.md"]
        # an ignored file asked for by its exact path may still be read (the contract forbids
        # showing it in searches and listings only)
        assert "secret" in c.call("read", {"ref": "home/notes/secret.md"})["structuredContent"]["text"]

        # an ignore file changed later: its `changed` control takes the newly ignored file
        # out of searches and brings the newly allowed one in
        bridges.write_home("notes/.lnkmemignore", "keep.md\n")
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "notes/.lnkmemignore"}}) == {"ok": True}
        assert sorted(refs(c, "narwhal", limit=20)) == ["home/docs/plan.md", "home/notes/secret.md"]
        assert listed(c, "home/notes") == ["home/notes/secret.md"]

        # a rule of a folder above the one changed applies to the changed file's listing
        bridges.write_home(".gitignore", "*.tmp\nbuild/\nplan.md\n")
        bridges.write_home("docs/extra.md", "narwhal extra\n")
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "docs/extra.md"}}) == {"ok": True}
        assert "home/docs/extra.md" in refs(c, "narwhal", limit=20)
        assert "home/docs/plan.md" not in refs(c, "narwhal", limit=20)
