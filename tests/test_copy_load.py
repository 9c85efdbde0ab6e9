"""§7.2 (issue 33): a cold load writes the copy into an empty cache in steps.

LMDB holds a write transaction's dirty pages in memory until its commit, so a
copy loaded in one transaction costs memory in proportion to the whole index.
An empty cache (a new machine: the common and large case) is written in
transactions of a bounded size instead, none of it seen by a search until the
last commit, and marked as loading until then: a load cut short (the process
killed) is wiped when the index is next opened, never taken for an index. A
cache that holds files is still replaced in one transaction, its readers seeing
the old version until the commit. Against real LMDB files, the real store and
a real child process killed mid-load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from lnkmem.bridges.remote import NotFound
from lnkmem.replica.export import export
from lnkmem.replica.load import load_copy
from lnkmem.replica.manifest import CopyDamaged, blob_name, decode_manifest, encode_manifest
from lnkmem.replica.state import CopyState, copy_state, note_sent
from lnkmem.index.rank.search import bm25
from lnkmem.index.store import Store
from tests.test_copy_scale import OF, memory, text
from tests.test_copy_verify import check_copy

QUERIES = ("narwhal kelp", "uniq7x1", "compass galley", "note", "uniq59x2")
STEP = 4000  # bytes a load's transaction writes before it commits (the engine's is 16 MiB)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A built memory of 60 files in two segments, and its copy as files."""
    tmp = tmp_path_factory.mktemp("src")
    mem, _ = memory(tmp / "a", {f"n/f{i}.md": text(i) for i in range(60)}, batches=2)
    st = mem.store
    exp = export(st, CopyState(), OF, part=3000)
    files = dict(exp.blobs)
    files["manifest.json"] = encode_manifest(exp.manifest)
    answers = {q: bm25(st, q, 10) for q in QUERIES}
    refs = sorted(st.all_files())
    st.close()
    return files, answers, refs


def fetcher(files: dict, each=None):
    def fetch(name):
        if name not in files:
            raise NotFound(name)
        if each is not None:
            each(name)
        return files[name]
    return fetch


def test_an_empty_cache_loads_in_steps_that_no_search_sees_until_the_last(source, tmp_path):
    files, answers, refs = source
    dst = Store(str(tmp_path / "cache"))
    seen = []

    def look(name):  # between two files of the load: what a search of the cache answers
        seen.append((dst.env.info()["last_txnid"], {q: bm25(dst, q, 10) for q in QUERIES}))

    try:
        start = dst.env.info()["last_txnid"]
        load_copy(dst, decode_manifest(files["manifest.json"]), fetcher(files, look),
                          "v1", OF, {"home", "chats", "skills", "notes"}, step=STEP)
        commits = dst.env.info()["last_txnid"] - start
        assert commits >= 5, commits  # written in steps, not in one transaction
        assert seen[-1][0] > seen[0][0]  # (some of the steps committed while files were still fetched)
        assert all(a == {q: [] for q in QUERIES} for _, a in seen)  # nothing of a version half loaded
        assert {q: bm25(dst, q, 10) for q in QUERIES} == answers
        assert sorted(dst.all_files()) == refs
        assert copy_state(dst).version == "v1"
    finally:
        dst.close()
    again = Store.open(str(tmp_path / "cache"))  # finished: an index, opened as such
    try:
        assert again.rebuilt_because is None and sorted(again.all_files()) == refs
    finally:
        again.close()


def test_a_cache_that_holds_files_loads_a_new_version_beside_it_in_steps_then_in_its_place(source, tmp_path):
    """A newer version of the copy for a cache that holds files (a team reader after each
    write, a writer after a conflict): written in steps into an index beside the cache
    (one transaction of the whole copy stayed in LMDB's memory: 800 MiB at 10x), the
    cache's searches answering from the version it held all along; then put in its place.
    A read begun on the old store before the swap, and the old store itself, still see
    the old version; once let go of, it is closed (no cycle waits for the collector: its
    unlinked file's space comes back); the folder holds the new index only, which opens
    as it was left."""
    import weakref
    files, answers, refs = source
    mem, _ = memory(tmp_path / "old", {"n/other.md": "narwhal kelp uniq7x1 compass galley note uniq59x2\n"})
    old = mem.store
    before = {q: bm25(old, q, 10) for q in QUERIES}
    assert all(before.values())
    path = old.path
    seen = []
    side = old.open_beside()
    assert side is not None and side.path == path + Store.BESIDE
    load_copy(side, decode_manifest(files["manifest.json"]),
                      fetcher(files, lambda n: seen.append({q: bm25(old, q, 10) for q in QUERIES})),
                      "v1", OF, {"home", "chats", "skills", "notes"}, step=STEP, was=copy_state(old))
    assert side.env.info()["last_txnid"] >= 5  # in steps, not one transaction
    assert seen and all(a == before for a in seen)
    with old.reading() as r:  # a read under way when the new version takes the old one's place
        new = old.replaced_by(side)
        assert r.count("files") == 1
    try:
        assert new.path == path and not new.retired and old.retired
        assert {q: bm25(new, q, 10) for q in QUERIES} == answers
        assert sorted(new.all_files()) == refs and copy_state(new).version == "v1"
        assert {q: bm25(old, q, 10) for q in QUERIES} == before  # a search begun on it ends on its version
        assert not os.path.lexists(path + Store.BESIDE)  # its files unlinked, mapped while read
        env = weakref.ref(old.env._env)
        mem.store = old = r = None  # (the read ended; nothing holds it now)
        assert env() is None  # closed by LMDB as the last reference went
    finally:
        new.close()
    again = Store.open(path)
    try:
        assert again.opened_as == "sealed" and sorted(again.all_files()) == refs
        assert {q: bm25(again, q, 10) for q in QUERIES} == answers
    finally:
        again.close()


def test_a_cache_that_holds_files_is_replaced_in_one_transaction(source, tmp_path):
    """Where a new version cannot be loaded beside it (a system that cannot swap two folders
    in one step): its searches keep answering from the version it held until the new one is whole."""
    files, answers, refs = source
    mem, _ = memory(tmp_path / "old", {"n/other.md": "narwhal kelp uniq7x1 compass galley note uniq59x2\n"})
    dst = mem.store
    before = {q: bm25(dst, q, 10) for q in QUERIES}
    assert all(before.values())
    seen = []
    load_copy(dst, decode_manifest(files["manifest.json"]),
                      fetcher(files, lambda n: seen.append({q: bm25(dst, q, 10) for q in QUERIES})),
                      "v1", OF, {"home", "chats", "skills", "notes"}, step=STEP)
    try:
        assert seen and all(a == before for a in seen)
        assert {q: bm25(dst, q, 10) for q in QUERIES} == answers
    finally:
        dst.close()


def test_a_damaged_copy_leaves_an_empty_cache_empty_and_an_index(source, tmp_path):
    """The last segment part's bytes changed: the load fails at it, after steps committed;
    the cache is empty again, not marked, and its copy state is as it was."""
    files, _, _ = source
    m = decode_manifest(files["manifest.json"])
    last = m.segments[-1][-1]
    bad = dict(files)
    bad[last] = files[last][:-8] + bytes(8)
    dst = Store(str(tmp_path / "cache"))
    state = copy_state(dst)
    try:
        with pytest.raises(CopyDamaged):
            load_copy(dst, m, fetcher(bad), "v1", OF, {"home", "chats", "skills", "notes"}, step=STEP)
        assert dst.file_count() == 0 and dst.live_count() == 0
        assert bm25(dst, "narwhal", 10) == []
        assert copy_state(dst) == state
    finally:
        dst.close()
    again = Store.open(str(tmp_path / "cache"))
    try:
        assert again.rebuilt_because is None
    finally:
        again.close()


CHILD = textwrap.dedent("""
    import os, signal, sys
    from lnkmem.replica.export import export
    from lnkmem.replica.load import load_copy
    from lnkmem.replica.manifest import CopyDamaged, blob_name, decode_manifest, encode_manifest
    from lnkmem.replica.state import CopyState, copy_state, note_sent
    from lnkmem.index.store import Store
    folder, cache, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fetched = []
    def fetch(name):
        fetched.append(name)
        if len(fetched) > after:
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-load, as a machine going away
        with open(os.path.join(folder, name), "rb") as f:
            return f.read()
    with open(os.path.join(folder, "manifest.json"), "rb") as f:
        m = decode_manifest(f.read())
    st = Store(cache)
    if len(sys.argv) > 4:  # beside the cache (it holds files), then in its place
        side = st.open_beside()
        load_copy(side, m, fetch, "v1", %r, None, step=%d, was=copy_state(st))
        st.replaced_by(side)
        print("finished")
        os.kill(os.getpid(), signal.SIGKILL)  # killed once the new version is in place (nothing closed)
    load_copy(st, m, fetch, "v1", %r, None, step=%d)
    print("finished")
""")


def test_a_load_killed_midway_is_wiped_at_the_next_open_and_loads_again(source, tmp_path):
    files, answers, refs = source
    folder = tmp_path / "copy"
    folder.mkdir()
    for n, b in files.items():
        (folder / n).write_bytes(b)
    cache = str(tmp_path / "cache")
    total = len(files) - 1
    p = subprocess.run([sys.executable, "-c", CHILD % (OF, STEP, OF, STEP), str(folder), cache, str(total - 2)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9 and "finished" not in p.stdout, (p.returncode, p.stderr[-2000:])
    st = Store.open(cache)
    try:
        # steps had committed passages of files whose other passages never came: never served
        assert st.rebuilt_because and "did not finish" in st.rebuilt_because
        assert st.file_count() == 0 and bm25(st, "narwhal", 10) == []
        assert copy_state(st).version is None  # so the copy is loaded again
        load_copy(st, decode_manifest(files["manifest.json"]), fetcher(files), "v1", OF,
                          None, step=STEP)
        assert {q: bm25(st, q, 10) for q in QUERIES} == answers
        assert sorted(st.all_files()) == refs
    finally:
        st.close()


@pytest.mark.parametrize("killed", ["loading", "placed"])
def test_a_load_beside_the_cache_killed_leaves_one_whole_index(source, tmp_path, killed):
    """The process killed while a newer version is loaded beside a cache that holds files:
    the memory's next open removes what was left beside it and serves the old version (the
    copy is loaded again later). Killed once it is in place: the new version, nothing beside."""
    files, answers, refs = source
    folder = tmp_path / "copy"
    folder.mkdir()
    for n, b in files.items():
        (folder / n).write_bytes(b)
    mem, h = memory(tmp_path / "old", {"n/other.md": "narwhal kelp uniq7x1 compass galley note uniq59x2\n"})
    path = mem.store.path
    before = {q: bm25(mem.store, q, 10) for q in QUERIES}
    mem.store.close()
    after = len(files) - 3 if killed == "loading" else len(files) + 5
    p = subprocess.run([sys.executable, "-c", CHILD % (OF, STEP, OF, STEP), str(folder), path, str(after),
                        "beside"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, (p.returncode, p.stderr[-2000:])
    assert ("finished" in p.stdout) == (killed == "placed")
    if killed == "loading":
        assert os.path.isdir(path + Store.BESIDE)  # what the killed load wrote
    st = mem.open_store()
    try:
        assert not os.path.lexists(path + Store.BESIDE)
        assert st.rebuilt_because is None
        if killed == "loading":
            assert {q: bm25(st, q, 10) for q in QUERIES} == before
            assert sorted(st.all_files()) == ["home/n/other.md"]
        else:
            assert {q: bm25(st, q, 10) for q in QUERIES} == answers
            assert sorted(st.all_files()) == refs
    finally:
        st.close()


@pytest.fixture(scope="module")
def zsource(tmp_path_factory):
    """A copy whose passages are packed with a zstd dictionary (enough text for one)."""
    tmp = tmp_path_factory.mktemp("zsrc")
    mem, _ = memory(tmp / "a", {f"n/f{i}.md": text(i, 12) for i in range(60)})
    exp = export(mem.store, CopyState(), OF, part=30000)
    files = dict(exp.blobs)
    files["manifest.json"] = encode_manifest(exp.manifest)
    mem.store.close()
    return files


def _with_passage(files: dict, change) -> dict:
    """The copy with one live passage of its first segment part replaced by
    ``change(value, zdict, other_value)``: the part and the manifest renamed to match."""
    import json
    import zlib

    import msgspec

    from lnkmem.index.codec import textpack
    m = json.loads(files["manifest.json"])
    zdict = msgspec.msgpack.decode(zlib.decompress(files[m["dict"]]))
    assert textpack.is_zstd_dict(zdict)
    first = m["segments"][0][0]
    part = msgspec.msgpack.decode(zlib.decompress(files[first]))  # [pids, lens, refs, terms, postings, passages]
    passages = part[5]
    assert passages[0][0] == textpack.ZSTD
    other = next(i for i, r in enumerate(part[2]) if r != part[2][0])
    passages[0] = change(passages[0], zdict, passages[other])
    blob = zlib.compress(msgspec.msgpack.encode(part), 3)
    out = {k: v for k, v in files.items() if k != first}
    name = blob_name("seg", blob)
    out[name] = blob
    m["segments"][0][0] = name
    out["manifest.json"] = json.dumps(m).encode()
    return out


def _packed(raw: bytes, zdict) -> bytes:
    from lnkmem.index.codec import textpack
    return textpack.Packer(zdict).pack(raw)


@pytest.mark.parametrize("damage, says", [
    (lambda v, z, o: b"", "has no text"),
    (lambda v, z, o: o, "names another ref than its segment"),
    (lambda v, z, o: v[:-3], "is not understood"),
    (lambda v, z, o: v + b"\x00\x01", "is not understood"),
    (lambda v, z, o: _packed(b"\xc1" * 400, z), "is not understood"),  # no msgpack
    (lambda v, z, o: _packed(bytes(8 << 20), z), "is not understood"),  # 8 MiB of zeros in a few KB
    (lambda v, z, o: bytes([9]) + v[1:], "is not understood"),
])
def test_a_copy_passage_that_is_not_one_the_engine_makes_is_never_loaded(zsource, tmp_path, damage, says):
    """One passage of a copy's segment damaged (empty, another file's, truncated, bytes
    after its end, not msgpack, a decompression bomb, a kind of value never made): the
    copy is refused naming the passage, and an empty cache stays empty."""
    assert check_copy(zsource).passages
    bad = _with_passage(zsource, damage)
    with pytest.raises(CopyDamaged, match=says):
        check_copy(bad)
    dst = Store(str(tmp_path / "cache"))
    try:
        with pytest.raises(CopyDamaged, match=says):
            load_copy(dst, decode_manifest(bad["manifest.json"]), fetcher(bad), "v1", OF,
                              {"home", "chats", "skills", "notes"}, step=STEP)
        assert dst.file_count() == 0 and bm25(dst, "narwhal", 10) == []
    finally:
        dst.close()


def test_a_cache_of_the_previous_formats_copy_keeps_its_version_once_a_write_back_has_begun(tmp_path):
    """A cache whose state an older engine wrote (a state this one cannot read) is of the
    version it names, with the copy's files not all known (so the write-back that replaces
    it lists the place). A write-back notes each file before it sends it; a kill after
    that note must leave the cache still of that version: it forgot it, and the next start
    took it for a cache of no version and loaded the whole copy again."""
    import msgspec
    st = Store(str(tmp_path / "cache"))
    try:
        with st.writing() as w:
            w.put_meta(b"copy", msgspec.msgpack.encode({"version": "v7", "gen": "of the old format"}))
        before = copy_state(st)
        assert (before.version, before.named_incomplete) == ("v7", True)
        note_sent(st, ["seg-" + "0" * 40 + "-10.bin"])  # a write-back's first file, then a kill
        after = copy_state(st)
        assert (after.version, after.named_incomplete) == ("v7", True)
        assert after.doomed == ["seg-" + "0" * 40 + "-10.bin"]
    finally:
        st.close()


def test_a_cache_state_written_before_the_flag_was_renamed_still_says_its_copys_files_are_not_all_known(tmp_path):
    """`CopyState.named_incomplete` was called `sweep` (issue 48 renamed it); the cache's
    meta keeps the name it was written under, so a cache written before the rename still
    lists the place at its next write-back, and one written after is read by either."""
    import msgspec
    st = Store(str(tmp_path / "cache"))
    try:
        with st.writing() as w:
            w.put_meta(b"copy", msgspec.msgpack.encode({"version": "v7", "named": ["manifest.json"], "sweep": True}))
        before = copy_state(st)
        assert (before.version, before.named, before.named_incomplete) == ("v7", ["manifest.json"], True)
        note_sent(st, ["seg-" + "0" * 40 + "-10.bin"])  # the state written again
        raw = msgspec.msgpack.decode(st.get_meta(b"copy"))
        assert raw["sweep"] is True and "named_incomplete" not in raw
        assert copy_state(st).named_incomplete
    finally:
        st.close()


def test_searches_straddling_many_loads_beside_the_cache_never_meet_damage(source, tmp_path):
    """Issue 45: a newer version loaded while searches run answered "the index is damaged
    (data.mdb holds N bytes but the index uses M)" and the healthy index was rebuilt: a
    search's guard on the store being replaced looked at data.mdb by its folder's name,
    which names the new index's file once the folders swap. Four threads search whichever
    store is current (and the one they held) through 12 loads beside it and swaps: no
    search meets damage, no store is marked damaged, every answer is of one version."""
    import threading
    from lnkmem.core.errors import DamagedIndex
    files, answers, refs = source
    mem, _ = memory(tmp_path / "old", {"n/other.md": "narwhal kelp uniq7x1 compass galley note uniq59x2\n"})
    exp = export(mem.store, CopyState(), OF)
    small = dict(exp.blobs)
    small["manifest.json"] = encode_manifest(exp.manifest)
    before = {q: bm25(mem.store, q, 10) for q in QUERIES}
    stores = [mem.store]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # (the threads interleave finely: the swap lands inside a guard)
    errors: list = []
    stop = threading.Event()

    def search() -> None:
        n = 0
        while not stop.is_set():
            st = stores[-1]
            try:
                st.refresh()
                got = {q: bm25(st, q, 10) for q in QUERIES[:2]}
            except DamagedIndex as e:
                errors.append(repr(e))
                continue
            assert got in ({q: before[q] for q in QUERIES[:2]}, {q: answers[q] for q in QUERIES[:2]})
            n += 1

    threads = [threading.Thread(target=search, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(12):  # the large version and the small one in turn (a file shorter than the other's pages)
            copy = files if i % 2 == 0 else small
            old = stores[-1]
            side = old.open_beside()
            assert side is not None
            load_copy(side, decode_manifest(copy["manifest.json"]), fetcher(copy), f"v{i}", OF,
                              {"home", "chats", "skills", "notes"}, step=STEP, was=copy_state(old))
            stores.append(old.replaced_by(side))
    finally:
        sys.setswitchinterval(switch)
        stop.set()
        for t in threads:
            t.join(30)
    try:
        assert errors == []
        assert all(s.damaged is None for s in stores)
        assert {q: bm25(stores[-1], q, 10) for q in QUERIES} == before
    finally:
        stores[-1].close()



def test_a_store_whose_folder_name_goes_to_another_index_searches_its_own_file(source, tmp_path):
    """Issue 45 (and 46): a search's guard looked at data.mdb by its folder's name, so once
    that name named another index's file -- a newer version put in the folder's place while
    a search was under way, a rebuild, a folder swapped by someone else -- a shorter file
    there was taken for this index's cut short: "the index is damaged (data.mdb holds N
    bytes but the index uses M)", and the healthy index rebuilt. The guard looks at the
    file the store maps."""
    files, answers, refs = source
    big = Store(str(tmp_path / "big"))
    load_copy(big, decode_manifest(files["manifest.json"]), fetcher(files), "v1", OF,
                      {"home", "chats", "skills", "notes"})
    mem, _ = memory(tmp_path / "small", {"n/other.md": "a walrus\n"})
    small = mem.store
    try:
        assert os.path.getsize(small.data) < os.path.getsize(big.data)
        os.rename(big.path, str(tmp_path / "aside"))  # the big index's folder name now the small one's
        os.rename(small.path, big.path)
        big.refresh()
        assert {q: bm25(big, q, 10) for q in QUERIES} == answers
        assert big.damaged is None and small.damaged is None
    finally:
        big.close()
        small.close()
