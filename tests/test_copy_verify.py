"""§7.2 rev. 2: the index copy is untrusted input.

Every file of a copy is checked before anything of it reaches the cache;
a copy that fails is never loaded and blocks nothing: the engine indexes its
sources, serves, and replaces the damaged copy at its next write-back,
conditionally on the version it saw. Each case of issue 11's copy paragraph is
reproduced here against the real `serve-many` and the fake storage bridge; a
few checks that need a model (vector widths) are driven in-process on a copy
made by the real export.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import msgspec
import pytest

from lnkmem.bridges.place import NotFound
from lnkmem.replica.export import export, written
from lnkmem.replica.load import Verified, load, verify
from lnkmem.replica.manifest import CopyDamaged, blob_name, decode_manifest, encode_manifest, page_of
from lnkmem.replica.state import CopyState, copy_state
from lnkmem.index.codec import textpack
from tests.bridges import KEY, OTHER_KEY, Bridges, Layout, hits
from tests.helpers import Home, deleted_indexes, until

OF = "agent o1/a1"


BRIDGES = Layout(bindings={"a1": {"owner": "o1", "key": KEY}, "a2": {"owner": "o1", "key": OTHER_KEY}},
                 homes={"a1": {"docs/plan.md": "The narwhal migration plan.\n",
                               "docs/other.md": "Penguins prefer the south.\n"}},
                 conversations={"t1.jsonl": '{"role": "user", "text": "where do narwhals sleep"}\n'})


def check_copy(files: dict, of: str = OF) -> Verified:
    """The copy passes every check (raises CopyDamaged when not)."""
    m = decode_manifest(files["manifest.json"])

    def fetch(n):
        if n not in files:
            raise NotFound(n)
        return files[n]
    return verify(m, fetch, of, {"home", "chats", "skills", "notes"})


def unpack(blob: bytes) -> list:
    return msgspec.msgpack.decode(zlib.decompress(blob))


def put(bridges, kind: str, obj, agent="a1", raw: bytes = None) -> str:
    """Write one content-addressed file into the copy; its name."""
    blob = raw if raw is not None else zlib.compress(msgspec.msgpack.encode(obj), 3)
    name = blob_name(kind, blob)
    (bridges.copy_dir(agent) / name).write_bytes(blob)
    return name


def set_manifest(bridges, m: dict, agent="a1") -> None:
    (bridges.copy_dir(agent) / "manifest.json").write_bytes(json.dumps(m).encode())


def manifest(bridges, agent="a1") -> dict:
    return json.loads((bridges.copy_dir(agent) / "manifest.json").read_bytes())


def make_copy(bridges, tmp_path, agent="a1", key=KEY) -> None:
    """A valid copy, made by the engine itself."""
    with bridges.serve_many(tmp_path, f"make-{agent}") as m, m.connect() as c:
        assert c.first(bridges.bound(agent=agent, key=key)) == {"ok": True}
        assert until(lambda: c.search("narwhal")["structuredContent"]["hits"], timeout=20)
        with m.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": agent}}) == {"ok": True}
    check_copy(bridges.copy_files(agent), f"agent o1/{agent}")


def served_from_sources_and_replaced(bridges, tmp_path, name: str, bad_version: str, forbidden=(),
                                     env=None) -> None:
    """A fresh engine serves the sources, never the damaged copy, and replaces the
    copy at its next write-back, conditionally on the version it saw."""
    bridges.storage.request("DELETE", "/_log")
    with bridges.serve_many(tmp_path, name, env=env) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in hits(c, "narwhal"), timeout=20)
        for q, ref in forbidden:
            assert ref not in hits(c, q)
        with m.connect() as ctl:  # (within the control's 10 s deadline)
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert m.proc.poll() is None
    v = check_copy(bridges.copy_files())  # the copy is whole again
    assert set(v.refs) >= {"home/docs/plan.md", "home/docs/other.md", "chats/t1.jsonl"}
    puts = [e for e in bridges.storage.log() if e["method"] == "PUT" and e["path"].endswith("manifest.json")]
    assert puts and puts[0]["status"] == 200, puts
    assert puts[0].get("if_match", "").strip('"') == bad_version, puts[0]
    lists = [e for e in bridges.storage.log() if e["method"] == "GET" and "?prefix=" in e["path"]]
    assert len(lists) <= 4, len(lists)  # no re-listing loop (issue 11: ten times per try)


def named_files(m: dict) -> set:
    """Every file a manifest (as JSON) names, the manifest too."""
    out = {n for seg in m["segments"] for n in seg} | set(m["pages"]) | set(m["vectors"]) | {m["head"], "manifest.json"}
    return out | ({m["dict"]} if m.get("dict") else set())


def version_of(bridges) -> str:
    import hashlib
    return hashlib.sha256((bridges.copy_dir() / "manifest.json").read_bytes()).hexdigest()[:32]


# --- each case of issue 11's copy paragraph ---------------------------------------------

def test_table_naming_a_passage_beyond_next_pid_is_never_loaded(bridges, tmp_path):
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    head = unpack(bridges.copy_files()[m["head"]])
    head[1] = 1  # next_pid below the ids the segments use
    m["head"] = put(bridges, "head", head)
    set_manifest(bridges, m)
    served_from_sources_and_replaced(bridges, tmp_path, "t", version_of(bridges))
    with bridges.serve_many(tmp_path, "t") as s, s.connect() as c:  # and a restart opens the cache
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in hits(c, "narwhal"), timeout=20)


def test_lengths_that_disagree_and_negative_ids(bridges, tmp_path):
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    seg = unpack(bridges.copy_files()[m["segments"][0][0]])
    seg[1] = seg[1][:-4]  # one length fewer than passages
    m["segments"][0][0] = put(bridges, "seg", seg)
    head = unpack(bridges.copy_files()[m["head"]])
    head[1] = -5
    m["head"] = put(bridges, "head", head)
    set_manifest(bridges, m)
    served_from_sources_and_replaced(bridges, tmp_path, "t", version_of(bridges))


def test_huge_next_pid_never_sizes_memory(bridges, tmp_path):
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    head = unpack(bridges.copy_files()[m["head"]])
    head[1] = 300_000_000
    m["head"] = put(bridges, "head", head)
    set_manifest(bridges, m)
    with bridges.serve_many(tmp_path, "t") as s, s.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in hits(c, "narwhal"), timeout=20)
        peak = int(open(f"/proc/{s.proc.pid}/status").read().split("VmHWM:")[1].split()[0])  # KiB
        assert peak < 400 * 1024, peak
        with s.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
    m = manifest(bridges)
    assert unpack(bridges.copy_files()[m["head"]])[1] < 1000  # written back with ids that fit its passages


def test_zip_bomb_segment(bridges, tmp_path):
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    z = zlib.compressobj(9)
    zero = bytes(1 << 20)
    bomb = b"".join(z.compress(zero) for _ in range(300)) + z.flush()  # 300 MB in ~300 KB
    m["segments"].append([put(bridges, "seg", None, raw=bomb)])
    set_manifest(bridges, m)
    with bridges.serve_many(tmp_path, "t") as s, s.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in hits(c, "narwhal"), timeout=20)
        hits(c, "penguins")
        peak = int(open(f"/proc/{s.proc.pid}/status").read().split("VmHWM:")[1].split()[0])
        assert peak < 250 * 1024, peak
        with s.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
    check_copy(bridges.copy_files())


@pytest.mark.parametrize("damage", ["truncated segment", "manifest not JSON", "missing file", "manifest nested deep"])
def test_unreadable_copy_blocks_nothing(bridges, tmp_path, damage):
    """Issue 46 ("manifest nested deep"): a 4 kB manifest nested 2,000 levels was logged as
    "could not be read: maximum recursion depth", not as damage, and every flush gave up
    after 10 conflicting writes: the copy was never replaced. It is damaged like any other."""
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    if damage == "truncated segment":
        blob = bridges.copy_files()[m["segments"][0][0]]
        os.unlink(bridges.copy_dir() / m["segments"][0][0])
        m["segments"][0][0] = put(bridges, "seg", None, raw=blob[: len(blob) // 2])
        set_manifest(bridges, m)
    elif damage == "manifest not JSON":
        (bridges.copy_dir() / "manifest.json").write_bytes(b"{not json")
    elif damage == "manifest nested deep":
        (bridges.copy_dir() / "manifest.json").write_bytes(
            b'{"format": "lnkmem-copy-4", "segments": ' + b"[" * 2000 + b"]" * 2000 + b', "pages": [], "head": ""}')
    else:
        os.unlink(bridges.copy_dir() / m["segments"][0][0])
    served_from_sources_and_replaced(bridges, tmp_path, "t", version_of(bridges))


def test_refs_leaving_their_source_are_never_served(bridges, tmp_path):
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    files = bridges.copy_files()
    bad = "home/../../../../etc/passwd"
    zdict = msgspec.msgpack.decode(zlib.decompress(files[m["dict"]])) if m.get("dict") else None  # (textpack)

    def moved(p: bytes) -> bytes:
        return textpack.Packer(zdict).pack(msgspec.msgpack.encode([bad] + msgspec.msgpack.decode(textpack.unpack(p, zdict))[1:]))
    for i, parts in enumerate(m["segments"]):
        for j, name in enumerate(parts):
            seg = unpack(files[name])
            if "home/docs/plan.md" in seg[2]:
                seg[2] = [bad if r == "home/docs/plan.md" else r for r in seg[2]]
                seg[5] = [moved(p) if p else p for p in seg[5]]
                m["segments"][i][j] = put(bridges, "seg", seg)
    # the file table's pages, with the forged ref in the page it belongs to
    pages = [unpack(files[n])[0] for n in m["pages"]]
    rows = [[bad if r == "home/docs/plan.md" else r, rec] for page in pages for r, rec in page]
    pages = [sorted(r for r in rows if page_of(r[0], len(pages)) == i) for i in range(len(pages))]
    m["pages"] = [put(bridges, "page", [p]) for p in pages]
    set_manifest(bridges, m)
    served_from_sources_and_replaced(bridges, tmp_path, "t", version_of(bridges), forbidden=[("narwhal", bad)])


def test_rewritten_segment_is_never_served(bridges, tmp_path):
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    files = bridges.copy_files()
    for name in (n for parts in m["segments"] for n in parts):
        seg = unpack(files[name])
        seg[5] = [p.replace(b"narwhal", b"forgery") for p in seg[5]]
        seg[3] = [b"forgeri" if t == b"narwhal" else t for t in seg[3]]
        (bridges.copy_dir() / name).write_bytes(zlib.compress(msgspec.msgpack.encode(seg)))  # same name
    served_from_sources_and_replaced(bridges, tmp_path, "t", version_of(bridges))
    with bridges.serve_many(tmp_path, "t2") as s, s.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in hits(c, "narwhal"), timeout=20)
        assert hits(c, "forgery") == []


def test_a_copy_file_over_the_answer_limit_is_a_damaged_copy_and_its_files_go(bridges, tmp_path):
    """A file larger than the bridge client takes in one answer is a damaged copy (replaced from
    the sources), not "bridge down" forever; once the new manifest is in place, the files of the
    damaged version it does not name are deleted."""
    make_copy(bridges, tmp_path)
    m = manifest(bridges)
    big = m["segments"][0][0]
    (bridges.copy_dir() / big).write_bytes(os.urandom(300_000))  # over the limit set below
    extra = put(bridges, "seg", [b"", b"", [], [], [], []])  # named by the damaged version only
    m["segments"].append([extra])
    set_manifest(bridges, m)
    served_from_sources_and_replaced(bridges, tmp_path, "big", version_of(bridges),
                                     env={"LNKMEM_MAX_BODY": "200000"})
    after = manifest(bridges)
    named = named_files(after)
    assert set(bridges.copy_files()) == named  # nothing of the damaged version is left beside it
    assert extra not in named
    if big in named:  # the same segment made again: the huge file was overwritten with its true content
        assert len((bridges.copy_dir() / big).read_bytes()) < 200_000


def test_a_copy_never_holds_more_than_the_sources_it_was_made_from(bridges, tmp_path):
    """A file gone from Home while no engine ran: the copy loaded at the next start still names
    it, but the copy written back after re-indexing does not (and neither do searches)."""
    make_copy(bridges, tmp_path)
    assert "home/docs/other.md" in check_copy(bridges.copy_files()).refs
    (bridges.home() / "docs" / "other.md").unlink()
    with bridges.serve_many(tmp_path, "gone") as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: hits(c, "penguins") == [], timeout=20)
        with m.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
    held = set(check_copy(bridges.copy_files()).refs)
    assert "home/docs/other.md" not in held and "home/docs/plan.md" in held, held


def test_another_agents_copy_is_never_served(bridges, tmp_path):
    (bridges.store("conversations", "a2") / "p.jsonl").write_text('{"role": "user", "text": "my private zucchini"}\n')
    bridges.write_home("docs/plan.md", "The narwhal migration plan.\n", agent="a2")
    make_copy(bridges, tmp_path, agent="a2", key=OTHER_KEY)
    make_copy(bridges, tmp_path)
    for p in bridges.copy_dir().iterdir():  # a2's copy placed in a1's collection
        p.unlink()
    for p in bridges.copy_dir("a2").iterdir():
        (bridges.copy_dir() / p.name).write_bytes(p.read_bytes())
    served_from_sources_and_replaced(bridges, tmp_path, "t", version_of(bridges),
                                     forbidden=[("zucchini", "chats/p.jsonl")])


# --- in-process: vectors (the copy fuzzer is in tests/test_fuzz.py) -------------------

def store_copy(tmp_path: Path, text: dict, of: str, dim: int = 8) -> dict:
    """A copy made by the real indexer and export, with vectors of ``dim``."""
    import numpy as np
    from lnkmem.memory.config import from_args
    from lnkmem.memory.memory import Memory
    h = Home(tmp_path)
    for rel, t in text.items():
        h.write(rel, t)
    mem = Memory(from_args(*h.args(), {}))
    mem.store = mem.open_store()
    mem.refresh_all()
    mem.store.use_vector_model("m")
    alive = [int(p) for p in np.flatnonzero(mem.store.snapshot.alive)]
    vecs = np.eye(max(dim, len(alive)), dim, dtype=np.float32)[: len(alive)] + 0.01
    mem.store.put_vectors(alive, vecs)
    exp = export(mem.store, CopyState(), of)
    files = dict(exp.blobs)  # (made as they are asked for: before the store closes)
    mem.store.close()
    files["manifest.json"] = encode_manifest(exp.manifest)
    return files


def test_vectors_of_another_width(tmp_path):
    files = store_copy(tmp_path / "a", {f"f{i}.md": f"word{i} text\n" for i in range(5)}, OF)
    check_copy(files)
    m = decode_manifest(files["manifest.json"])
    vec = unpack(files[m.vectors[0]])
    n = len(vec[0]) // 4
    wide = 16
    vec[1] = bytes(n * (wide + 4))  # rows 16 wide under a dim of 8: misattributed rows
    blob = zlib.compress(msgspec.msgpack.encode(vec))
    name = blob_name("vec", blob)
    files2 = dict(files)
    files2[name] = blob
    files2["manifest.json"] = json.dumps({**json.loads(files["manifest.json"]), "vectors": [name]}).encode()
    with pytest.raises(CopyDamaged, match="rows and ids disagree"):
        check_copy(files2)
    vec[1], vec[2] = bytes(n * (wide + 4)), wide  # consistent, but not the model's width
    blob = zlib.compress(msgspec.msgpack.encode(vec))
    name = blob_name("vec", blob)
    files2[name] = blob
    files2["manifest.json"] = json.dumps({**json.loads(files["manifest.json"]), "vectors": [name]}).encode()
    check_copy(files2)
    m2 = decode_manifest(files2["manifest.json"])
    with pytest.raises(CopyDamaged, match="model's are 8"):
        verify(m2, files2.__getitem__, OF, None, ("m", 8))


# --- the copy while serving: re-checked (§7.2), written back debounced (§7.3) -------------

def manifest_puts(bridges) -> list:
    return [e for e in bridges.storage.log()
            if e["method"] == "PUT" and e["path"].endswith("manifest.json") and e["status"] == 200]


def test_a_burst_of_changes_makes_one_write_back(bridges, tmp_path):
    """1,000 changed files told in ten controls while the index never rests for
    the quiet time: one write-back after the burst, holding them all (not one for
    the first file and one for the rest)."""
    make_copy(bridges, tmp_path)  # the copy exists: the engine below starts clean
    with bridges.serve_many(tmp_path, "t", env={"LNKMEM_WRITEBACK_S": "120", "LNKMEM_QUIET_S": "10"}) as m, \
            m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "home/docs/plan.md" in hits(c, "narwhal"), timeout=20)
        assert until(lambda: "indexing" not in c.search("zzzzprobe")["structuredContent"], timeout=20)
        bridges.storage.request("DELETE", "/_log")
        for k in range(10):  # 1,000 files, told in ten controls
            for i in range(100):
                bridges.write_home(f"burst/b{k}/f{i}.md", f"burstword{k}x{i} arrives\n")
            with m.connect() as ctl:
                assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": f"home/burst/b{k}"}}) == {"ok": True}
            assert not manifest_puts(bridges)  # nothing is written while the burst goes on
        assert until(lambda: manifest_puts(bridges), timeout=60)
        with m.connect() as ctl:  # a change left unwritten (a second write-back due) the flush would write
            assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        puts = manifest_puts(bridges)
        assert len(puts) == 1, [p["time"] for p in puts]
        v = check_copy(bridges.copy_files())
        refs = set(v.refs)
        assert all(f"home/burst/b{k}/f{i}.md" in refs for k in range(10) for i in range(100))


def test_a_newer_copy_is_loaded_while_serving(bridges, tmp_path):
    env = {"LNKMEM_RECHECK_S": "0.5"}
    with bridges.serve_many(tmp_path, "a", env=env) as a, a.connect() as ca:
        bridges.bound_and_flushed(a, ca, ("home/docs/plan.md", "narwhal"), timeout=20)
        bridges.storage.request("DELETE", "/_log")

        def looks() -> list:
            return [e for e in bridges.storage.log() if e["method"] == "GET" and e["path"].endswith("manifest.json")]
        assert until(lambda: len(looks()) >= 2, timeout=30), looks()  # looked at again, and again
        assert all(e["if_none_match"] and e["status"] == 304 for e in looks()), looks()
        # another engine indexes a new file and writes the copy; nobody tells the first one
        bridges.write_home("docs/new.md", "Walruses arrive at dawn.\n")
        with bridges.serve_many(tmp_path, "b") as b, b.connect() as cb:
            bridges.bound_and_flushed(b, cb, ("home/docs/new.md", "walruses"), timeout=20)
        assert until(lambda: "home/docs/new.md" in hits(ca, "walruses"), timeout=30)
        # loaded beside the cache and put in its place: the old index's file, unlinked, is not
        # held open once the searches on it ended (its environment closed: its space came back)
        assert until(lambda: not deleted_indexes(a.proc.pid), timeout=30), deleted_indexes(a.proc.pid)
        assert "home/docs/plan.md" in hits(ca, "narwhal")


def test_a_team_reader_looks_at_the_copy_again_before_a_search(tmp_path):
    b = Bridges(tmp_path / "link", bindings={"a1": {"owner": "o1", "key": KEY}, "a2": {"owner": "o2", "key": OTHER_KEY}},
                teams={"t1": {"folder": "teams/t1", "names": {"a1": "crew", "a2": "o1/crew"},
                              "grants": {"a1": "all", "a2": "all"}}})
    try:
        (b.team_folder("t1") / "memory").mkdir()
        (b.team_folder("t1") / "memory" / "charter.md").write_text("The crew charters a schooner every July.\n")

        def line(agent, owner, key, named, writes):
            first = b.bound(agent=agent, owner=owner, key=key, notes=None)
            first["team"] = {"id": "t1", "named": named, "writes": writes}
            return first
        env = {"LNKMEM_RECHECK_S": "1"}
        with b.serve_many(tmp_path, "w", env=env) as mw, b.serve_many(tmp_path, "r", env=env) as mr, \
                mw.connect() as w, mr.connect() as r:
            assert w.first(line("a1", "o1", KEY, "crew", True)) == {"ok": True}
            assert until(lambda: hits(w, "schooner") == ["home/charter.md"], timeout=15)
            with mw.connect() as ctl:
                assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
            assert r.first(line("a2", "o2", OTHER_KEY, "o1/crew", False)) == {"ok": True}
            assert until(lambda: hits(r, "schooner") == ["home/charter.md"], timeout=15)
            # the writer indexes a new file and writes the copy; the reader is told nothing
            (b.team_folder("t1") / "memory" / "later.md").write_text("Barnacles on the schooner hull.\n")
            with mw.connect() as ctl:
                assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "later.md", "team": "t1"}}) == {"ok": True}
            with mw.connect() as ctl:
                assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
            b.storage.request("DELETE", "/_log")
            # told nothing, the reader looks again once its re-check interval (1 s) has passed
            assert until(lambda: hits(r, "barnacles") == ["home/later.md"], timeout=30), hits(r, "barnacles")
            looks = [e for e in b.storage.log() if e["agent"] == "a2" and e["path"].endswith("manifest.json")]
            assert any(e["status"] == 200 for e in looks), looks  # the newer version was fetched
    finally:
        b.stop()


def test_reused_passage_ids_never_carry_another_passages_vector_into_the_copy(tmp_path):
    """A bound cache whose copy holds vectors reuses passage ids like any other (ids follow live
    data, not edits); the copy's vector chunks name passages by id, so the write-back after a
    reuse sends all vectors anew: a reused id never gets the vector of the passage it had."""
    import numpy as np
    from lnkmem.memory.config import from_args
    from lnkmem.memory.memory import Memory
    from lnkmem.index.store import Store
    h = Home(tmp_path / "h")
    for i in range(8):
        h.write(f"f{i}.md", f"word{i} text\n")
    mem = Memory(from_args(*h.args(), {}))
    mem.store = mem.open_store()
    mem.refresh_all()
    st = mem.store
    st.use_vector_model("m")
    files: dict = {}

    def embed_missing() -> None:  # word<i> -> e_i: a vector says which passage it was made of
        with st.env.begin() as txn:
            todo = [int(p) for p in np.flatnonzero(st.snapshot.alive) if txn.get(int(p).to_bytes(4, "big"),
                                                                                  db=st.vectors) is None]
        ps = st.passages_of(todo)
        st.put_vectors(todo, np.stack([np.eye(32, dtype=np.float32)[int(p.text.split()[0][4:])] for p in ps]))

    def write_back() -> None:
        exp = export(st, copy_state(st), OF)
        files.update(exp.blobs)
        files["manifest.json"] = encode_manifest(exp.manifest)
        written(st, exp, f"v{len(files)}")

    def loaded() -> dict:
        """passage text -> the word its vector was made of, in a cache loaded from the copy"""
        s = Store(str(tmp_path / f"load{len(files)}"))
        load(s, check_copy(files), "x")
        out = {}
        with s.env.begin() as txn:
            for k, v in txn.cursor(db=s.vectors):
                text = s.passages_of([int.from_bytes(k, "big")])[0].text.strip()
                out[text] = f"word{int(np.frombuffer(bytes(v)[:-4], np.int8).argmax())}"
        s.close()
        return out

    embed_missing()
    write_back()
    assert loaded() == {f"word{i} text": f"word{i}" for i in range(8)}
    first_ids = int(st.get_meta(b"next_pid"))
    for i in range(8):  # every passage replaced: their segment dies, their ids are free
        (h.folder / f"f{i}.md").unlink()
        h.write(f"g{i}.md", f"word{i + 10} text\n")
    mem.refresh_all()
    assert int(st.get_meta(b"next_pid")) == first_ids  # the ids were reused, not grown
    write_back()  # nothing embedded yet: the copy must say so, not lend the old vectors
    assert loaded() == {}
    embed_missing()
    write_back()
    assert loaded() == {f"word{i + 10} text": f"word{i + 10}" for i in range(8)}
    st.close()
