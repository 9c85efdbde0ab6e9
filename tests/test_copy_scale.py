"""§7.2-7.3 rev. 3 (issue 33): the copy at any size.

Every file of the copy is bounded whatever the index's size (a segment is sent
as several parts), the file table is paged so a small change sends about what
changed, every file the new manifest no longer names is deleted once it has
landed (or at the next write-back after a kill), a file named over the bound is
refused before it is fetched, and a copy of the previous format is read once
and written back in this one. Against the real `serve-many` (or the real store
in-process) and the fake storage bridge over Unix sockets.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pytest

from lnkmem.bridges.http import BridgeClient
from lnkmem.bridges.remote import Collection
from lnkmem.replica.checks import blob_size
from lnkmem.replica.export import export, written
from lnkmem.replica.load import CHECK_POSTINGS, load
from lnkmem.replica.manifest import FORMAT, Manifest, blob_name, encode_manifest
from lnkmem.replica.state import CopyState, copy_state
from lnkmem.index.rank.search import bm25
from lnkmem.index.store import Store
from lnkmem.replica.sync import Replica, WriteBack
from tests.bridges import KEY, Bridges, Layout, hits
from tests.helpers import Home, until
from tests.test_copy_verify import check_copy, manifest, named_files

OF = "agent o1/a1"
WORDS = ("narwhal walrus penguin orca seal krill plankton kelp reef tide current salt shore "
         "harbor beacon anchor rope sail keel mast hull deck cabin galley chart compass").split()


BRIDGES = Layout(bindings={"a1": {"owner": "o1", "key": KEY}},
                 conversations={"t1.jsonl": '{"role": "user", "text": "where do narwhals sleep"}\n'})


def text(i: int, paragraphs: int = 3) -> str:
    """A file of a few paragraphs, its words drawn from a seeded mix (and a word of its own)."""
    rng = np.random.default_rng(i)
    out = [f"# Note {i}\n"]
    for p in range(paragraphs):
        out.append(" ".join(WORDS[k] for k in rng.integers(0, len(WORDS), 40)) + f" uniq{i}x{p}.\n")
    return "\n".join(out)


def memory(tmp_path: Path, files: dict, batches: int = 1):
    """A real Memory with its store built from ``files`` (in ``batches`` commits: as many segments)."""
    from lnkmem.memory.config import from_args
    from lnkmem.memory.memory import Memory
    h = Home(tmp_path)
    items = list(files.items())
    mem = None
    for b in range(batches):
        for rel, t in items[b::batches]:
            h.write(rel, t)
        if mem is None:
            mem = Memory(from_args(*h.args(), {}))
            mem.store = mem.open_store()
        mem.refresh_all()
    return mem, h


def replica(bridges: Bridges) -> Replica:
    client = BridgeClient(str(bridges.storage_sock), "storage", "o1", "a1", KEY)
    return Replica(Collection(client, "memory", root="lnkmem"), of=OF)


def puts(bridges, kind: str = "") -> list:
    return [e for e in bridges.storage.log() if e["method"] == "PUT" and e["status"] in (200, 201)
            and f"/lnkmem/{kind}" in e["path"]]


def _quietly(f, *a) -> None:
    try:
        f(*a)
    except (OSError, EOFError, ValueError):
        pass


# --- the format at its bounds ---------------------------------------------------------

def test_segments_split_at_a_small_bound_load_back_the_same(tmp_path):
    """A part bound far below a segment's size: each segment is sent as several parts (one
    of them holding the end of the passages and the start of the postings), no file over
    the bound by more than one item, and the copy loads into a cache that answers alike;
    a cache loaded from the copy has nothing to write back."""
    mem, _ = memory(tmp_path / "a", {f"n/f{i}.md": text(i) for i in range(60)}, batches=2)
    st = mem.store
    bound = 3000
    exp = export(st, CopyState(), OF, part=bound)
    files = {}
    largest_item = 0
    for name, blob in exp.blobs:
        files[name] = blob
    files["manifest.json"] = encode_manifest(exp.manifest)
    m = exp.manifest
    assert len(m.segments) == 2 and all(len(parts) >= 3 for parts in m.segments), [len(p) for p in m.segments]
    kinds = []
    for parts in m.segments:
        for n in parts:
            s = msgspec.msgpack.decode(zlib.decompress(files[n]))
            kinds.append((bool(s[0]), bool(s[3])))
            largest_item = max([largest_item] + [len(p) for p in s[5]] + [len(p) for p in s[4]])
    assert (True, True) in kinds and (False, True) in kinds and (True, False) in kinds, kinds
    assert all(blob_size(n) == len(b) for n, b in files.items() if n != "manifest.json")
    assert max(len(b) for b in files.values()) <= bound + largest_item + 1024
    v = check_copy(files)
    dst = Store(str(tmp_path / "cache"))
    try:
        load(dst, v, "v1")
        alive = [int(p) for p in np.flatnonzero(st.snapshot.alive)]
        assert len(alive) >= 60 and dst.passages_of(alive) == st.passages_of(alive)
        assert dst.all_files() == st.all_files()
        for q in ("narwhal kelp", "uniq7x1", "compass galley", "note"):
            assert bm25(dst, q, 10) == bm25(st, q, 10), q
        again = export(dst, copy_state(dst), OF, part=bound)
        assert list(again.blobs) == []  # every file of it is the copy's already
        assert sorted(again.manifest.names()) == sorted(m.names())
    finally:
        dst.close()
        st.close()


def test_the_table_made_a_group_of_pages_at_a_time_is_the_same_table(tmp_path):
    """An export that holds a few bytes of the file table at once (each group of pages
    a walk of the table) makes the very pages one holding the whole table makes."""
    mem, _ = memory(tmp_path / "a", {f"n/f{i}.md": text(i) for i in range(300)})
    st = mem.store
    try:
        whole = export(st, CopyState(), OF)
        files = dict(whole.blobs)
        assert len(whole.manifest.pages) >= 2
        for group in (1, 6000):  # a page a walk; two or three pages a walk
            some = export(st, CopyState(), OF, page_group=group)
            assert dict(some.blobs) == files
            assert some.manifest.pages == whole.manifest.pages
    finally:
        st.close()


def test_one_changed_file_sends_one_page_of_the_table(bridges, tmp_path):
    """A Home of 600 files: the table is several pages; one changed file sends one page, the
    head, its segment and the manifest -- a small part of the table -- and the page and head
    it replaced are deleted."""
    for i in range(600):
        bridges.write_home(f"notes/f{i:03}.md", text(i, 1))
    with bridges.serve_many(tmp_path, "p") as m, m.connect() as c:
        bridges.bound_and_flushed(m, c, ("home/notes/f599.md", "uniq599x0"))
        before = manifest(bridges)
        assert len(before["pages"]) >= 4, before["pages"]
        table_bytes = sum(blob_size(n) for n in before["pages"])
        bridges.storage.request("DELETE", "/_log")
        bridges.changed_and_flushed(m, c, "notes/f123.md", text(123, 1) + "\nA new line about lighthouses.\n",
                                    "lighthouses", timeout=20)
    page_puts = puts(bridges, "page-")
    assert len(page_puts) == 1, [e["path"] for e in page_puts]
    assert page_puts[0]["size"] * 3 < table_bytes, (page_puts[0]["size"], table_bytes)
    sent = sum(e["size"] for e in puts(bridges))
    assert sent < table_bytes, (sent, table_bytes)
    after = manifest(bridges)
    assert len(set(after["pages"]) - set(before["pages"])) == 1
    assert set(bridges.copy_files()) == named_files(after)  # the page and head replaced are gone


# --- orphans ----------------------------------------------------------------------------

def test_the_copy_keeps_its_segments_through_local_merges_and_drops_them_once_dead(bridges, tmp_path):
    """The local merger folds the segments a write-back is sending: the copy does not follow
    (the next write-back sends no segment: the merged one's passages are the copy's, by id and
    digest); a copy segment whose passages all died is deleted once the manifest no longer names
    it; and once most of the copy is dead it is written anew whole, every old file deleted."""
    mem, h = memory(tmp_path / "a", {f"n0/f{i}.md": text(i) for i in range(8)})
    for b in range(1, 5):  # five segments, one a folder
        for i in range(8):
            h.write(f"n{b}/f{i}.md", text(10 * b + i))
        mem.refresh_all()
    st = mem.store
    assert len(st.segment_sizes()) == 5
    rep = replica(bridges)
    wb = WriteBack(lambda: st, rep, reload=lambda: None, every=0, quiet_s=0)
    bridges.storage.request("POST", "/_fault", json.dumps(
        {"mode": "slow", "delay": 0.3, "path": "/v1/c/memory/lnkmem/seg-"}).encode())
    errors = []
    t = threading.Thread(target=lambda: errors.append(wb.write() is not True))
    t.start()
    assert until(lambda: puts(bridges, "seg-"), timeout=20)
    assert st.merge(sorted(st.segment_sizes()))  # while the write-back is sending
    t.join(60)
    bridges.storage.request("POST", "/_fault", json.dumps({"mode": "ok"}).encode())
    assert errors == [False]
    first = manifest(bridges)
    assert len(st.segment_sizes()) == 1 and len(first["segments"]) == 5
    bridges.storage.request("DELETE", "/_log")
    assert wb.write() is True
    assert puts(bridges, "seg-") == []  # the merged segment is the copy's already
    assert manifest(bridges)["segments"] == first["segments"]
    # one folder's files gone: the copy segment that held only them is deleted
    n0 = [parts for parts in first["segments"]
          if all(r.startswith("home/n0/") for r in msgspec.msgpack.decode(zlib.decompress(
              (bridges.copy_dir() / parts[0]).read_bytes()))[2])]
    assert n0
    for i in range(8):
        (h.folder / f"n0/f{i}.md").unlink()
    mem.refresh_all()
    assert wb.write() is True
    after = manifest(bridges)
    assert not any(parts in after["segments"] for parts in n0)
    assert set(bridges.copy_files()) == named_files(after)
    assert not set(check_copy(bridges.copy_files()).refs) & {f"home/n0/f{i}.md" for i in range(8)}
    # three more folders gone: their segments go, the one left is whole
    for b in range(1, 4):
        for i in range(8):
            (h.folder / f"n{b}/f{i}.md").unlink()
    mem.refresh_all()
    assert wb.write() is True
    assert len(manifest(bridges)["segments"]) == 1
    assert set(bridges.copy_files()) == named_files(manifest(bridges))
    # most of what the copy holds dead: written anew whole, nothing of the old files left
    before = named_files(manifest(bridges))
    for i in range(6):
        (h.folder / f"n4/f{i}.md").unlink()
    mem.refresh_all()
    assert wb.write() is True
    last = manifest(bridges)
    assert not {n for n in named_files(last) & before if n.startswith("seg-")}
    assert set(bridges.copy_files()) == named_files(last)
    dst = Store(str(tmp_path / "cache"))
    load(dst, check_copy(bridges.copy_files()), "v")
    assert dst.all_files() == st.all_files()
    assert bm25(dst, "uniq47x0", 5) == bm25(st, "uniq47x0", 5) and bm25(dst, "uniq47x0", 5)
    dst.close()
    st.close()


def test_files_of_a_killed_write_back_are_deleted_at_the_next(bridges, tmp_path):
    """`serve-many` killed while it sends the table's pages: the pages it sent are named by
    no manifest. After files changed, the next start's write-back deletes them: the bucket
    holds the copy and nothing more."""
    for i in range(400):
        bridges.write_home(f"notes/f{i:03}.md", text(i, 1))
    bridges.storage.request("POST", "/_fault", json.dumps(
        {"mode": "slow", "delay": 1.0, "path": "/v1/c/memory/lnkmem/page-"}).encode())
    m = bridges.serve_many(tmp_path, "k")
    try:
        with m.connect() as c:
            assert c.first(bridges.bound()) == {"ok": True}
            assert until(lambda: len(puts(bridges, "page-")) >= 2, timeout=60)
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(10)
    finally:
        m.__exit__(None, None, None)
    time.sleep(1.5)  # kept: a page PUT the bridge held (1 s) when the engine was killed lands first,
    # as a real bridge's would; landing after the next start's write-back it would stay a file no
    # version names until the write-back after that (a fast machine did that, and the test failed)
    bridges.storage.request("POST", "/_fault", json.dumps({"mode": "ok"}).encode())
    sent = {e["path"].rsplit("/", 1)[1] for e in puts(bridges, "page-")}
    named_then = named_files(manifest(bridges)) if "manifest.json" in bridges.copy_files() else set()
    assert sent - named_then  # pages no manifest names
    for i in range(0, 400, 7):  # every page changes
        bridges.write_home(f"notes/f{i:03}.md", text(i, 1) + "\nmore about lighthouses\n")
    with bridges.serve_many(tmp_path, "k") as m2, m2.connect() as c:
        bridges.bound_and_flushed(m2, c, ("home/notes/f007.md", "lighthouses"))
    after = manifest(bridges)
    assert sent - set(after["pages"]), "the pages sent before the kill were all sent again"
    assert set(bridges.copy_files()) == named_files(after)
    check_copy(bridges.copy_files())


@pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
def test_a_version_landing_after_its_writer_was_killed_leaves_no_orphan(bridges, tmp_path, cold):
    """The manifest's PUT held by the bridge, `serve-many` killed meanwhile, then the PUT
    lands (as a request a real bridge received does): the next start loads that version,
    and the files of the version it replaced -- which the dead writer never got to delete
    -- are deleted by the next write-back: the bucket holds the copy and nothing more.
    Cold (a new machine, no cache): the place is listed once to find them."""
    for i in range(200):
        bridges.write_home(f"notes/f{i:03}.md", text(i, 1))
    with bridges.serve_many(tmp_path, "k") as m, m.connect() as c:
        bridges.bound_and_flushed(m, c, ("home/notes/f007.md", "uniq7x0"))
    first = named_files(manifest(bridges))
    for i in range(0, 200, 5):  # pages and the head change
        bridges.write_home(f"notes/f{i:03}.md", text(i, 1) + "\nmore about lighthouses\n")

    def held() -> bool:
        return json.loads(bridges.storage.request("GET", "/_fault")[2])["mode"] == "ok"

    m = bridges.serve_many(tmp_path, "k", env={"LNKMEM_WRITEBACK_S": "3600", "LNKMEM_QUIET_S": "3600"})
    try:
        with m.connect() as c:
            assert c.first(bridges.bound()) == {"ok": True}
            assert until(lambda: "home/notes/f005.md" in hits(c, "lighthouses"), timeout=60)
            bridges.storage.request("POST", "/_fault", json.dumps(
                {"mode": "slow", "delay": 4.0, "count": 1, "path": "/v1/c/memory/lnkmem/manifest.json"}).encode())
            ctl = m.connect()
            threading.Thread(target=lambda: _quietly(ctl.first, {"flush": {"owner": "o1", "agent": "a1"}}),
                             daemon=True).start()
            assert until(held, timeout=60)  # the manifest's PUT is in the bridge's hands
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(10)
    finally:
        m.__exit__(None, None, None)
    assert until(lambda: named_files(manifest(bridges)) != first, timeout=60)  # the held PUT lands
    if cold:  # the agent's next machine: no cache, nothing known of the files the dead writer replaced
        import shutil
        shutil.rmtree(tmp_path / "cache-k")
    bridges.write_home("notes/f001.md", text(1, 1) + "\nand a word of harbours\n")  # a write-back, not only a sweep
    landed = named_files(manifest(bridges))
    assert landed != first and first - landed  # the dead writer's version, some files of the first gone from it
    assert first - landed <= set(bridges.copy_files())  # ... but still in the bucket
    with bridges.serve_many(tmp_path, "k") as m2, m2.connect() as c:
        bridges.bound_and_flushed(m2, c, ("home/notes/f005.md", "lighthouses"), ("home/notes/f001.md", "harbours"))
    assert set(bridges.copy_files()) == named_files(manifest(bridges))
    check_copy(bridges.copy_files())


def test_a_cold_writers_sweep_never_deletes_what_a_manifest_on_its_way_names(bridges, tmp_path):
    """Issue 45: two writers of one copy, one of them with a new (cold) cache. While the
    other's manifest PUT is held by the bridge, the cold writer's flush listed the place,
    took the other's new files (named by no manifest yet) for orphans and deleted them; the
    manifest then landed naming missing files, and the next reader called the copy damaged.
    Now files found that way are deleted only once the copy is another version than the one
    they were found at (a manifest on its way is conditional on that one): the held
    manifest lands whole, and once the copy moves on, the bucket holds the copy only."""
    for i in range(60):
        bridges.write_home(f"notes/f{i:03}.md", text(i, 1))
    quiet = {"LNKMEM_WRITEBACK_S": "3600", "LNKMEM_QUIET_S": "3600"}
    with bridges.serve_many(tmp_path, "p", env=quiet) as p, p.connect() as cp, \
            bridges.serve_many(tmp_path, "q", env=quiet) as q, q.connect() as cq:
        bridges.bound_and_flushed(p, cp, ("home/notes/f007.md", "uniq7x0"))
        assert cq.first(bridges.bound()) == {"ok": True}  # a new machine: loads it cold
        assert until(lambda: "home/notes/f007.md" in hits(cq, "uniq7x0"), timeout=60)
        for i in range(0, 60, 6):  # pages, a segment and the head change
            bridges.write_home(f"notes/f{i:03}.md", text(i, 1) + "\nmore about lighthouses\n")
        with p.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "home/notes"}}) == {"ok": True}
        assert until(lambda: "home/notes/f006.md" in hits(cp, "lighthouses"), timeout=60)
        bridges.storage.fault("slow", delay=6.0, count=1, path="/v1/c/memory/lnkmem/manifest.json")
        flushed: list = []
        ctl = p.connect(timeout=60)
        flusher = threading.Thread(target=lambda: flushed.append(
            ctl.first({"flush": {"owner": "o1", "agent": "a1"}})), daemon=True)
        flusher.start()
        assert until(lambda: json.loads(bridges.storage.request("GET", "/_fault")[2])["mode"] == "ok",
                     timeout=60)  # the PUT is in the bridge's hands
        on_its_way = set(bridges.copy_files()) - named_files(manifest(bridges))
        assert on_its_way  # the held manifest's files, named by no manifest yet
        with q.connect() as qc:  # the cold writer's first flush: nothing to write, the place listed
            assert qc.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert on_its_way <= set(bridges.copy_files())  # nothing on its way deleted
        flusher.join(60)
        assert flushed == [{"ok": True}]
        landed = named_files(manifest(bridges))
        assert on_its_way <= landed <= set(bridges.copy_files())
        check_copy(bridges.copy_files())  # whole: what it names is there
        # the copy moves on (the cold writer writes after a change): what no version names goes
        bridges.changed_and_flushed(q, cq, "notes/f001.md", text(1, 1) + "\nand a word of harbours\n", "harbours")
        ctl.close()
    assert {"home/notes/f006.md", "home/notes/f001.md"} <= bridges.copy_refs()
    assert set(bridges.copy_files()) == named_files(manifest(bridges))
    check_copy(bridges.copy_files())


def test_a_write_back_never_relies_on_a_file_it_did_not_make(bridges, tmp_path):
    """Issue 45: a file already in the place under the name a write-back makes (one no
    version it read names: an orphan or a doomed file another writer may be deleting) was
    taken as sent; once deleted, the manifest named a missing file. The same content goes
    under another name instead, which the copy's checks take as any other."""
    rep = replica(bridges)
    blob = zlib.compress(b"\x93" + b"x" * 5000, 3)
    name = blob_name("page", blob)
    (bridges.copy_dir()).mkdir(parents=True, exist_ok=True)
    (bridges.copy_dir() / name).write_bytes(blob)  # there already, named by nothing
    sent = rep.put_blob(name, blob)
    assert sent != name and sent.startswith("page-")
    got = bridges.copy_files()
    assert got[name] == blob  # the other file untouched
    assert zlib.decompress(got[sent]) == zlib.decompress(blob) and blob_name("page", got[sent]) == sent
    assert rep.put_blob(sent, got[sent]) not in (name, sent)  # taken too: yet another


# --- bounds and the previous format ------------------------------------------------------

def test_a_file_named_over_the_bound_is_refused_before_it_is_fetched(bridges, tmp_path):
    bridges.write_home("docs/plan.md", "The narwhal migration plan.\n")
    with bridges.serve_many(tmp_path, "make") as m, m.connect() as c:
        bridges.bound_and_flushed(m, c, ("home/docs/plan.md", "narwhal"), timeout=20)
    big = f"seg-{'0' * 40}-{300_000_000}.bin"  # 300 MB, by its name
    man = manifest(bridges)
    man["segments"].append([big])
    (bridges.copy_dir() / "manifest.json").write_bytes(json.dumps(man).encode())
    (bridges.copy_dir() / big).write_bytes(b"x")  # what a GET would get (never asked for)
    bridges.storage.request("DELETE", "/_log")
    with bridges.serve_many(tmp_path, "t") as m, m.connect() as c:
        bridges.bound_and_flushed(m, c, ("home/docs/plan.md", "narwhal"), timeout=20)
    assert not [e for e in bridges.storage.log() if e["method"] == "GET" and big in e["path"]]
    after = manifest(bridges)
    assert big not in named_files(after) and set(bridges.copy_files()) == named_files(after)
    check_copy(bridges.copy_files())


def _as_previous_format(bridges) -> dict:
    """The copy in the bucket rewritten as lnkmem-copy-3 (one file a segment, one table)."""
    d = bridges.copy_dir()
    files = bridges.copy_files()
    m = json.loads(files["manifest.json"])

    def put(obj) -> bytes:
        return zlib.compress(msgspec.msgpack.encode(obj), 3)

    def old_name(kind: str, blob: bytes) -> str:
        return f"{kind}-{hashlib.sha256(blob).hexdigest()[:40]}.bin"
    segs = []
    for parts in m["segments"]:
        whole = [b"", b"", [], [], [], []]
        for n in parts:
            s = msgspec.msgpack.decode(zlib.decompress(files[n]))
            for k in range(6):
                whole[k] = whole[k] + s[k]
        blob = put(whole)
        segs.append(old_name("seg", blob))
        (d / segs[-1]).write_bytes(blob)
    head = msgspec.msgpack.decode(zlib.decompress(files[m["head"]]))
    zdict = msgspec.msgpack.decode(zlib.decompress(files[m["dict"]])) if m.get("dict") else None
    rows = sorted(r for n in m["pages"] for r in msgspec.msgpack.decode(zlib.decompress(files[n]))[0])
    dead = np.sort(np.concatenate([np.frombuffer(t, "<u4") for t in head[0]] + [np.empty(0, "<u4")]))
    table = put([rows, dead.astype(">u4").tobytes(), head[1], head[2], head[3], zdict])
    tname = old_name("table", table)
    (d / tname).write_bytes(table)
    vecs = []
    for n in m["vectors"]:
        vecs.append(old_name("vec", files[n]))
        (d / vecs[-1]).write_bytes(files[n])
    for n in named_files(m) - {"manifest.json"}:
        os.unlink(d / n)
    old = {"format": "lnkmem-copy-3", "segments": segs, "table": tname, "vectors": vecs,
           "model": m["model"], "made": m["made"], "of": m["of"]}
    (d / "manifest.json").write_bytes(json.dumps(old).encode())
    return old


def test_a_copy_of_the_previous_format_is_read_once_and_written_in_this_one(bridges, tmp_path):
    bridges.write_home("docs/plan.md", "The narwhal migration plan.\n")
    bridges.write_home("docs/other.md", "Penguins prefer the south.\n")
    with bridges.serve_many(tmp_path, "make") as m, m.connect() as c:
        bridges.bound_and_flushed(m, c, ("home/docs/plan.md", "narwhal"), timeout=20)
    old = _as_previous_format(bridges)
    bridges.storage.request("DELETE", "/_log")
    bridges.files.request("DELETE", "/_log")
    with bridges.serve_many(tmp_path, "t") as m, m.connect() as c:
        bridges.bound_and_flushed(m, c, ("home/docs/plan.md", "narwhal"), timeout=20)
    log = bridges.storage.log()
    table_gets = [e for e in log if e["method"] == "GET" and old["table"] in e["path"]]
    assert len(table_gets) == 1 and table_gets[0]["status"] == 200  # read, once
    reads = [e for e in bridges.files.log() if "/v1/read" in e["path"]]
    assert reads == [], reads  # loaded, not indexed again from the sources
    after = manifest(bridges)
    assert after["format"] == FORMAT
    assert set(bridges.copy_files()) == named_files(after)  # nothing of the old format is left
    assert {"home/docs/plan.md", "home/docs/other.md", "chats/t1.jsonl"} <= set(check_copy(bridges.copy_files()).refs)


def written_into_a_dict(st: Store):
    """(a bucket as a dict, a write-back of ``st`` into it returning the manifest written)."""
    bucket: dict = {}

    def write_back() -> Manifest:
        exp = export(st, copy_state(st), OF)
        bucket.update(exp.blobs)
        bucket["manifest.json"] = encode_manifest(exp.manifest)
        written(st, exp, f"v{len(bucket)}")
        return exp.manifest
    return bucket, write_back


@pytest.mark.parametrize("batch", [CHECK_POSTINGS, 3])
def test_a_copys_dead_passages_load_dead_and_find_nothing_before_and_after_a_merge(tmp_path, monkeypatch, batch):
    """A copy segment whose file stays while a changed file's old passages are marked dead
    in the head loads them as a local delete leaves them (dead, their lists as stored: not
    re-packed, the bulk of a 10x load's time with a few changed files): the old words find
    nothing, the new ones their file, the cache's files and live passages agree (the full
    check), and a merge of the loaded segments drops them for good."""
    mem, h = memory(tmp_path / "a", {"a.md": "alphaold words here\nsecond alphaold line\n",
                                     "b.md": "bravo stays words\n", "c.md": "charlie stays words\n"})
    st = mem.store
    bucket, write_back = written_into_a_dict(st)

    first = write_back()
    h.write("a.md", "alphanew words here\n")
    mem.refresh_all()
    m = write_back()
    assert first.segments[0] in m.segments  # kept: b and c live in it, a's old passages dead
    from lnkmem.replica import load as copy_load
    monkeypatch.setattr(copy_load, "CHECK_POSTINGS", batch)
    dst = Store(str(tmp_path / "cache"))
    try:
        load(dst, check_copy(bucket), "v")
        snap = dst.snapshot
        assert sum(snap.segs.values()) > snap.live  # the dead passages are in their segment

        def answers():
            return {q: [dst.passages_of([p])[0].ref for p, _ in bm25(dst, q, 5)]
                    for q in ("alphaold", "alphanew", "bravo", "charlie", "words")}
        want = {"alphaold": [], "alphanew": ["home/a.md"], "bravo": ["home/b.md"], "charlie": ["home/c.md"]}
        got = answers()
        assert {q: got[q] for q in want} == want and sorted(got["words"]) == ["home/a.md", "home/b.md", "home/c.md"]
        assert dst.all_files() == st.all_files()
        dst.reload_snapshot(check=True)  # every live passage is a file's, and back
        dst.merge(sorted(dst.segment_sizes()))
        snap = dst.snapshot
        assert sum(snap.segs.values()) == snap.live  # merged: the dead are gone
        got = answers()
        assert {q: got[q] for q in want} == want
    finally:
        dst.close()
        st.close()


@pytest.mark.parametrize("batch", [CHECK_POSTINGS, 3])
def test_ids_dead_in_one_copy_segment_and_given_again_load_as_the_new_passages(tmp_path, monkeypatch, batch):
    """A copy segment keeps its file while some of its passages live; the others are marked dead
    in the head. Once the cache gives those ids to new passages (after a merge freed them), the
    copy holds each such id twice -- dead in the old segment, live in a new one -- and a cache
    loaded from it has the new passages only: the old ones' words find nothing."""
    mem, h = memory(tmp_path / "a", {"a.md": "alphaold words here\n", "b.md": "bravo stays\n",
                                     "c.md": "charlie stays\n"})
    st = mem.store
    bucket, write_back = written_into_a_dict(st)

    first = write_back()
    old_ids = set(st.all_files()["home/a.md"].pids)
    h.write("a.md", "alphanew words here\n")
    mem.refresh_all()
    write_back()
    st.merge(sorted(st.segment_sizes()))  # a's old passages dropped: their ids free
    h.write("d.md", "deltafresh arrives\n")
    mem.refresh_all()
    assert set(st.all_files()["home/d.md"].pids) & old_ids  # ids given again
    m = write_back()
    assert first.segments[0] in m.segments  # b and c still live in the first segment's file
    head = msgspec.msgpack.decode(zlib.decompress(bucket[m.head]))
    assert set(np.frombuffer(head[0][m.segments.index(first.segments[0])], "<u4").tolist()) >= old_ids
    from lnkmem.replica import load as copy_load
    monkeypatch.setattr(copy_load, "CHECK_POSTINGS", batch)  # (3: lists checked a few at a time)
    dst = Store(str(tmp_path / "cache"))
    load(dst, check_copy(bucket), "v")
    try:
        for q, want in (("alphaold", []), ("alphanew", ["home/a.md"]), ("bravo", ["home/b.md"]),
                        ("charlie", ["home/c.md"]), ("deltafresh", ["home/d.md"])):
            got = [dst.passages_of([p])[0].ref for p, _ in bm25(dst, q, 5)]
            assert got == want, (q, got)
        assert dst.all_files() == st.all_files()
    finally:
        dst.close()
        st.close()
