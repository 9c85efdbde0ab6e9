"""Building the index on two cores (issue 12): the C Snowball stems as the pure one
does; a large build's files are read and counted in a forked worker while the
parent commits, with the same index as a build in one thread; killing either
process leaves a consistent index and no worker behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import lmdb
import pytest

from tests.helpers import PROGRAM, ROOT, base_env, run_cli, until


def _flags(home) -> list[str]:
    return [str(home.folder), str(home.state), "--agent", str(home.agent)]


# --- 1. PyStemmer ---------------------------------------------------------------------


def test_the_c_stemmer_is_used_and_stems_every_word_as_the_pure_one():
    import snowballstemmer
    from snowballstemmer.english_stemmer import EnglishStemmer

    from lnkmem.index.text import analyze

    c = snowballstemmer.stemmer("english")
    assert type(c).__module__ == "Stemmer", type(c)  # PyStemmer, the C Snowball
    assert analyze._stemmer.__class__ is c.__class__
    words = set()
    for folder in ("docs", "lnkmem", "tests"):
        for p in (ROOT / folder).rglob("*"):
            if p.suffix in (".md", ".py", ".txt"):
                words.update(w for w in analyze.words(p.read_text(errors="replace")) if w.isalpha())
    words.update("running runner ran generously generalizations caresses ponies ties caress cats feed agreed "
                 "disabled matting mating meeting milling messing meetings happy sky news innings outing canning "
                 "herring earring proceed exceed succeed dying lying tying skies spied façade naïve résumé "
                 "straße ǆemal weißbier".split())
    assert len(words) > 3000
    pure = EnglishStemmer()
    differ = [w for w in sorted(words) if c.stemWord(w) != pure.stemWord(w)]
    assert differ == []


# --- 2. the worker gives the index a build in one thread gives --------------------------


def _fill(home, n: int) -> None:
    """A Home of every kind of file a build meets: notes with headings, identifiers,
    other scripts, long lines; conversations; skills; a binary file; an empty one."""
    for i in range(n):
        body = "\n\n".join(
            f"## Part {k} of note {i}\n\nDeploying service-{i}.{k} to host w{i}x{k} (ticket PIO-{1000 + i}); "
            f"the runners were running, café naïve 東京 {k}. " * (1 + (i * 7 + k) % 5)
            for k in range(1 + i % 4))
        home.write(f"d{i % 9}/note_{i}.md", body + "\n")
    home.write("long.txt", "x" * 9000 + "\n" + "wordy line " * 600 + "\n")
    home.write("empty.md", "")
    (home.folder / "blob.bin").write_bytes(bytes(range(256)) * 40)
    for t in range(6):
        home.chat(f"t{t}", [{"role": "user" if j % 2 == 0 else "assistant", "text": f"message {j} about w{t}x{j} deploys",
                             "at": f"2026-0{1 + t}-1{j % 9}T10:00:00Z"} for j in range(12)])
    home.write(f"skills/s/SKILL.md", "A skill about deploying the lighthouse.\n")


def _dump(state: Path) -> dict:
    """What an index holds, named by (ref, its n-th passage) rather than by ids: which
    process counted which file (and so the ids and segments) is a matter of timing."""
    import msgspec

    from lnkmem.index.codec import postings, textpack
    from lnkmem.index.format import FileRec, Passage, seg_codec

    env = lmdb.open(str(state / "index"), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin() as txn:
            def rows(name):
                return list(txn.cursor(db=env.open_db(name, txn=txn, create=False)))
            files = {k.decode(): msgspec.msgpack.decode(v, type=FileRec) for k, v in rows(b"files")}
            name = {p: (ref, i) for ref, f in files.items() for i, p in enumerate(f.pids)}
            zdict = txn.get(b"zdict", db=env.open_db(b"meta", txn=txn, create=False))
            passages = {name[int.from_bytes(k, "big")]: msgspec.msgpack.decode(textpack.unpack(v, zdict), type=Passage)
                        for k, v in rows(b"passages")}
            lens = {}
            for _, v in rows(b"segments"):
                m = seg_codec.decode(v)
                lens.update(zip(map(name.__getitem__, memoryview(m.pids).cast("I").tolist()),
                                memoryview(m.lens).cast("I").tolist()))
            post = set()
            for k, v in rows(b"postings"):
                pids, tfs = postings.unpack(v)
                post.update((bytes(k[4:]), name[p], tf) for p, tf in zip(pids.tolist(), tfs.tolist()))
            assert rows(b"dead") == []
    finally:
        env.close()
    return {"files": {r: (f.version, f.size, len(f.pids), f.kind, f.mtime) for r, f in files.items()},
            "passages": passages, "lengths": lens, "postings": post}


def test_a_build_with_the_worker_holds_exactly_what_a_build_in_one_thread_holds(home, tmp_path):
    _fill(home, 120)
    states = {}
    for how in ("0", "1"):
        state = tmp_path / f"state{how}"
        r = run_cli("index", str(home.folder), str(state), "--agent", str(home.agent),
                    env={"LNKMEM_WORKER": how, "LNKMEM_BATCH_FILES": "17"})
        assert r.returncode == 0, r.stderr
        assert r.stderr.decode().startswith("indexed 129 files, 0 unchanged, 0 removed, skipped 1 (1 binary)"), r.stderr
        states[how] = _dump(state)
    here, there = states["0"], states["1"]
    assert len(here["passages"]) > 300 and len(here["postings"]) > 5_000
    assert set(here["lengths"]) == set(here["passages"])
    for part in here:
        assert here[part] == there[part], part


# --- 3. kills: of the parent, of the worker -------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid:
                out.append(int(d))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


def _many(home, n: int) -> None:
    for i in range(n):
        home.write(f"d{i % 20}/f{i}.md", (f"note {i} about deploying service w{i} " * 70)[:2000] + "\n")


def _start_index(home, **env) -> subprocess.Popen:
    e = base_env()
    e.update(env)
    return subprocess.Popen([PROGRAM, "index", *_flags(home)], env=e, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _worker_of(p: subprocess.Popen) -> int:
    found = until(lambda: [c for c in _children(p.pid) if _comm(c) == "lnkmem-worker"], timeout=30, step=0.01)
    assert found, "no worker started"
    return found[0]


def test_a_killed_parent_takes_its_worker_with_it_and_leaves_a_consistent_index(home):
    _many(home, 1500)
    p = _start_index(home, LNKMEM_WORKER="1", LNKMEM_BATCH_FILES="100")
    w = _worker_of(p)
    until(lambda: (home.state / "index" / "data.mdb").exists() and
          (home.state / "index" / "data.mdb").stat().st_size > 500_000, timeout=30, step=0.01)
    p.kill()
    p.wait()
    assert until(lambda: not _alive(w), timeout=30, step=0.02), "the worker outlived its parent"
    r = run_cli("status", *_flags(home), "--json")
    st = json.loads(r.stdout)
    n = st["sources"]["home"]["files"]
    assert st["pending"] == {"changed": 1500 - n, "removed": 0}
    r = run_cli("index", *_flags(home))
    assert r.returncode == 0 and r.stderr.decode().startswith(f"indexed {1500 - n:,} files, {n:,} unchanged"), r.stderr
    r = run_cli("search", *_flags(home), "w1499", "--json")
    assert [h["ref"] for h in json.loads(r.stdout)["hits"]] == ["home/d19/f1499.md"]


def test_a_killed_worker_leaves_the_parent_to_finish_the_build_itself(home):
    _many(home, 1500)
    p = _start_index(home, LNKMEM_WORKER="1", LNKMEM_BATCH_FILES="100")
    w = _worker_of(p)
    time.sleep(0.05)  # kept: pacing, the kill under way (its share of 1,500 files takes well over this; 0.3 s was once all of it)
    os.kill(w, signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert err.decode().startswith("indexed 1,500 files, 0 unchanged, 0 removed"), err
    assert "Traceback" not in err.decode()
    for q, ref in (("w0", "home/d0/f0.md"), ("w1499", "home/d19/f1499.md"), ("w777", "home/d17/f777.md")):
        r = run_cli("search", *_flags(home), q, "--json")
        assert [h["ref"] for h in json.loads(r.stdout)["hits"]] == [ref]


def test_a_one_file_change_stays_in_the_thread_and_a_large_plan_goes_to_the_worker(home, monkeypatch):
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.build import indexer, worker
    from lnkmem.index.store import Store

    _many(home, 300)
    monkeypatch.delenv("LNKMEM_WORKER", raising=False)
    monkeypatch.setattr(worker, "_cores", lambda: 2)
    places = {"home": LocalPlace(str(home.folder)), "notes": object()}
    store = Store.open(str(home.state / "index"))
    try:
        plan = indexer.plan(store, {"home": places["home"]})
        assert len(worker.share(places, plan.todo)) == 300
        one = indexer.plan(store, {"home": places["home"]}, only="home/d0/f0.md")
        assert worker.share(places, one.todo) == []
        monkeypatch.setattr(worker, "_cores", lambda: 1)  # one core: nothing to overlap
        assert worker.share(places, plan.todo) == []
    finally:
        store.close()


@pytest.mark.parametrize("window", [None, 50])
def test_packing_a_commits_lists_at_once_gives_each_lists_bytes(window, monkeypatch):
    import numpy as np

    from lnkmem.index.codec import postings
    from lnkmem.index.codec.postings import encode

    rng = np.random.default_rng(5)
    lens = np.concatenate((rng.integers(1, 40, 300), rng.integers(100, 400, 10)))
    rng.shuffle(lens)
    ends = np.cumsum(lens)
    starts = ends - lens
    pids = np.concatenate([np.sort(rng.choice(10**6, n, replace=False)) for n in lens]).astype(np.uint32)
    tfs = rng.integers(1, 70000, len(pids)).astype(np.uint32)  # some above u16: held at 65535
    if window:  # the columns made Python integers a few at a time: lists across the windows' edges
        monkeypatch.setattr(encode, "WINDOW", window)
    many = list(postings.pack_many(pids, tfs, starts.tolist(), ends.tolist()))
    assert many == [postings.pack(pids[a:b], tfs[a:b]) for a, b in zip(starts, ends)]


@pytest.mark.parametrize("seed", range(6))
def test_packing_lists_of_every_width_at_once_gives_each_lists_bytes(seed, monkeypatch):
    """Lists of one block packed together (one gather a window of lists) make the bytes
    each makes alone: counts 1 to 128 (128's count is two bytes), gaps and tfs of every
    width a run may have, dense ids (no gap bits), the largest ids, lists longer than a
    block among them."""
    import numpy as np

    from lnkmem.index.codec import postings
    from lnkmem.index.codec.postings import encode

    rng = np.random.default_rng(seed)
    lists = []
    for _ in range(400):
        n = int(rng.choice([1, 1, 2, 3, 7, 8, 9, 31, 127, 128, 129, 300]))
        kind = int(rng.integers(0, 4))
        if kind == 0:  # dense
            p = np.arange(n, dtype=np.int64) + int(rng.integers(0, 10**6))
        elif kind == 1:  # the largest ids there are
            p = np.sort(rng.choice(2**20, n, replace=False)).astype(np.int64) + 2**32 - 2**20
        else:  # gaps of up to 2**bits
            p = np.cumsum(rng.integers(1, 2 ** int(rng.integers(1, 32 // max(1, n.bit_length() - 2))) + 1, n))
            p = p[p < 2**32] if p[-1] >= 2**32 else p
        t = rng.integers(1, 2 ** int(rng.integers(1, 18)), len(p))  # some above u16: held at 65535
        lists.append((p, t))
    lens = np.array([len(p) for p, _ in lists])
    ends = np.cumsum(lens)
    starts = ends - lens
    pids = np.concatenate([p for p, _ in lists]).astype(np.uint32)
    tfs = np.concatenate([t for _, t in lists]).astype(np.uint32)
    if seed % 2:
        monkeypatch.setattr(encode, "WINDOW", 1000)  # windows' edges among the lists
    many = list(postings.pack_many(pids, tfs, starts.tolist(), ends.tolist()))
    assert many == [postings.pack(pids[a:b], tfs[a:b]) for a, b in zip(starts, ends)]
    for v, (p, t) in zip(many, lists):
        got_p, got_t = postings.unpack(v)
        assert np.array_equal(got_p, p.astype(np.uint32)) and np.array_equal(got_t, np.minimum(t, 65535))


def _counts_by_the_rules(ref, passages):
    """What a file's passages hold, counted plainly by the rules (term -> tf, length):
    the file's name words once in each passage, its path whole; a conversation
    message's own words twice beside its context's; a file's title twice."""
    from lnkmem.index.build import count
    from lnkmem.index.text import analyze, chats

    path = ref.split("/", 1)[-1]
    name, name_len = analyze.term_counts(path.replace("/", " "))
    for i in analyze.idents(path, inner=True):
        name[i] = name.get(i, 0) + 1
    conversation = ref.startswith("chats/")
    title = None if conversation and passages[0].role is not None else count.title_of(passages)
    title_terms = analyze.term_counts(title)[0] if title else {}
    out = []
    for p in passages:
        if conversation and p.role is not None:
            cut = chats.own_start(p.text)
            own, length = analyze.term_counts(p.text[cut:])
            counts = {t: n * chats.OWN_WEIGHT for t, n in own.items()}
            ctx, ctx_len = analyze.term_counts(p.text[:cut])
            for t, n in ctx.items():
                counts[t] = counts.get(t, 0) + n
            length += ctx_len
        else:
            counts, length = analyze.term_counts(p.text)
            counts = dict(counts)
            if p is passages[0]:
                for t, n in title_terms.items():
                    counts[t] = counts.get(t, 0) + n * (count.TITLE_WEIGHT - 1)
        for t, n in name.items():
            counts[t] = counts.get(t, 0) + n
        out.append((counts, length + name_len))
    return out


def test_a_files_counted_columns_hold_what_the_counting_rules_say(tmp_path):
    """A file is counted straight into term ids with repeats (byte tables for ASCII,
    one sort a file); what its columns hold, passage by passage, is what counting each
    passage by the rules gives: titles, a conversation's context, identifiers in text
    and name, stop words, non-ASCII text, a message with no context."""
    import numpy as np

    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.build import count

    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    files = {
        "docs/plan-b.md": "# The Plan B for PIO-1384\n\nWe run the runners; see docs/api/v2.3.1.md and x_y.\n\n"
                          + "\n\n".join(f"Part {i}: café — “quoted” naïve résumé of IL-6 and the the the." for i in range(60)),
        "notes.txt": "Short title\n\nbody text with foo@example.com and a:b and ~tilde~ words\n",
        "chats/2025-01-01-talk-0001.jsonl": "\n".join(json.dumps(m) for m in [
            {"role": "user", "text": "Where is PIO-1384 deployed?", "at": "2025-01-01T10:00:00Z"},
            {"role": "assistant", "text": "On host-7.example.com … " + "and more words " * 40, "at": "2025-01-01T10:01:00Z"},
            {"role": "user", "text": "Thanks! Über gut.", "at": "2025-01-02T09:00:00Z"}]) + "\n",
    }
    for path, text in files.items():
        (home / path).parent.mkdir(parents=True, exist_ok=True)
        (home / path).write_text(text, encoding="utf-8")
    place = LocalPlace(str(home))
    vocab = count.Vocab()
    for path in files:
        source, sub = ("chats", path.split("/", 1)[1]) if path.startswith("chats/") else ("home", path)
        if source == "chats":
            place = LocalPlace(str(home / "chats"))
        else:
            place = LocalPlace(str(home))
        e = next(x for x in place.list("") if x.path == sub)
        nf = count.index_file(source, e, place, str(tmp_path), vocab)
        terms, tids, npost, tfs, lens = nf.columns()
        want = _counts_by_the_rules(nf.ref, nf.passages)
        assert len(npost) == len(want) == len(nf.passages) > 0
        at = 0
        for k, (counts, length) in enumerate(want):
            got = {terms[t]: int(n) for t, n in zip(tids[at:at + npost[k]].tolist(), tfs[at:at + npost[k]].tolist())}
            at += int(npost[k])
            assert got == counts, (path, k)
            assert int(lens[k]) == length, (path, k)
        assert at == len(tids)
    assert len(nf.passages) == 3 and nf.passages[0].role == "user"


def test_a_batch_counted_at_once_holds_what_each_file_counted_by_the_rules_holds(tmp_path, monkeypatch):
    """A build counts a batch's files together (groups of GROUP_CHARS split at once), its
    vocabulary kept from batch to batch: each file's columns, in each batch, hold what
    counting its passages by the rules gives -- across group ends, with tokens seen in an
    earlier batch (identifiers, punctuation alone, NUL, non-ASCII), a file of no passage,
    the vocabulary made anew when full."""
    import numpy as np

    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.build import count

    monkeypatch.setattr(count, "GROUP_CHARS", 300)
    monkeypatch.setattr(count, "VOCAB_MAX", 120)
    home = tmp_path / "home"
    home.mkdir()
    texts = {
        "a.md": "# Deploy PIO-1384\n\nThe runners ran -- see docs/api/v2.3.1.md, x_y and a:b.\n",
        "b.txt": "Runners RUN; PIO-1384 again... and café naïve “quoted” … words\n\n" + "more text here " * 30,
        "c.md": "nul \0 inside, ... --- ### !!! and the the the\n",
        "empty.md": "",
        "d-e_f.md": "Short\n\n" + "\n\n".join(f"part {i} of PIO-{i} and x.y.z" for i in range(40)),
    }
    for name, text in texts.items():
        (home / name).write_text(text, encoding="utf-8")
    place = LocalPlace(str(home))
    entries = sorted(place.list(""), key=lambda e: e.path)
    vocab = count.Vocab()
    for round_ in range(3):  # the same files again: every token seen before
        files = [count.read_file("home", e, place, str(tmp_path)) for e in entries]
        count.count_files(files, vocab)
        for nf in files:
            terms, tids, npost, tfs, lens = nf.columns()
            assert len(set(terms)) == len(terms)
            want = _counts_by_the_rules(nf.ref, nf.passages) if nf.passages else []
            assert len(npost) == len(lens) == len(want) == len(nf.passages)
            at = 0
            for k, (counts, length) in enumerate(want):
                got = {terms[t]: int(n) for t, n in zip(tids[at:at + npost[k]].tolist(), tfs[at:at + npost[k]].tolist())}
                at += int(npost[k])
                assert got == counts, (nf.ref, k, round_)
                assert int(lens[k]) == length, (nf.ref, k, round_)
            assert at == len(tids)
        if vocab.full():
            vocab = count.Vocab()


def test_a_builds_vocabulary_of_long_tokens_is_made_anew_by_their_bytes(tmp_path, monkeypatch):
    """The vocabulary kept from batch to batch is bounded by the bytes of what it holds,
    not only by its count: a Home of blobs (few tokens, each long and seen once) starts a
    new one once they add up, as a Home of many short words does by their number."""
    import secrets

    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.build import count

    monkeypatch.setattr(count, "VOCAB_BYTES", 20_000)
    home = tmp_path / "home"
    home.mkdir()
    for i in range(4):
        (home / f"blob{i}.txt").write_text("\n".join(secrets.token_hex(150) for _ in range(20)) + "\n")
    place = LocalPlace(str(home))
    files = [count.read_file("home", e, place, str(tmp_path)) for e in place.list("")]
    vocab = count.Vocab()
    count.count_files(files[:1], vocab)
    assert len(vocab.tokens) + len(vocab) < 100 and not vocab.full()  # 20 tokens of 300 bytes
    count.count_files(files[1:], vocab)
    assert len(vocab.tokens) + len(vocab) < count.VOCAB_MAX and vocab.full()


def test_a_bad_worker_setting_is_one_line_and_exit_2(home):
    home.write("a.md", "alpha\n")
    r = run_cli("index", *_flags(home), env={"LNKMEM_WORKER": "yes"})
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and "LNKMEM_WORKER" in err and "Traceback" not in err, err
    assert not (home.state / "index").exists()


_NO_MASKED_ARRAYS = r"""
import os, sys
from lnkmem.bridges.local import LocalPlace
from lnkmem.index.build import indexer
from lnkmem.index.rank import search
from lnkmem.index.store import Store
home, state = sys.argv[1], sys.argv[2]
st = Store.open(state)
places = {"home": LocalPlace(home)}
indexer.build(st, places, indexer.plan(st, places), state + "-tmp")
search.bm25(st, "river", 10)
search.scores_of(st, "river", [1, 2, 3])
for i in range(12):  # changes (a file's old passages dead) and the merges they call for
    with open(os.path.join(home, f"f{i % 3}.md"), "a") as f:
        f.write(f"\nriver bank number{i}\n")
    indexer.build(st, places, indexer.plan(st, places, only=f"home/f{i % 3}.md"), state + "-tmp")
    assert search.bm25(st, f"number{i}", 10)
st.merge(sorted(st.segment_sizes()))
st.close()
print("numpy.ma" in sys.modules)
"""


def test_a_change_and_a_search_import_no_masked_arrays(tmp_path):
    """numpy's masked arrays (imported by a plain ``np.unique``: 12-40 ms) never load on
    the path of a search, a change or a merge: a serving engine's first change would
    wait for them."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    for i in range(3):
        (home / f"f{i}.md").write_text(f"# File {i}\n\nThe river and the bank, file {i}.\n")
    (tmp_path / "state-tmp").mkdir()
    p = subprocess.run([sys.executable, "-c", _NO_MASKED_ARRAYS, str(home), str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "False"
