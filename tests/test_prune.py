"""MaxScore (prune.maxscore) answers exactly what scoring every posting answers.

Real LMDB stores built through Store.commit, with segments holding dead passages
(replaced and removed files), merged and unmerged, filters by source, folder and
exclusion, and repeated query words; each query is ranked with pruning off and on.
"""

from __future__ import annotations

import random
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lnkmem.index.codec import postings
from lnkmem.index.rank import prune, scratch, search, terms
from lnkmem.index.text import query as qlang
from lnkmem.index.commit import Batch
from lnkmem.index.store import Store
from tests.helpers import RandomText, random_file

# a Zipf-like vocabulary: a few words in most passages, many in few
WORDS = [f"t{i}" for i in range(400)]
WEIGHTS = [1.0 / (i + 1) ** 1.1 for i in range(len(WORDS))]


TEXT = RandomText(WORDS, (3, 40), WEIGHTS)


def _store_with_dead_passages(path: str, rng: random.Random, merge: bool) -> Store:
    st = Store.open(path)
    for i in range(6):
        src = "chats" if i % 3 == 2 else "home"
        st.commit(Batch(files=[TEXT.file(rng, f"{src}/d{i}/f{j}.md", "v1", rng.randint(20, 60)) for j in range(25)]))
    # dead passages in several segments: files replaced and removed
    st.commit(Batch(files=[TEXT.file(rng, f"home/d{i}/f{j}.md", "v2", 30) for i in (0, 1, 3) for j in range(0, 25, 4)]))
    st.commit(Batch(removed=[f"home/d4/f{j}.md" for j in range(0, 25, 3)]))
    if merge:
        st.merge(sorted(st.snapshot.segs)[:3])
    return st


def _query(rng: random.Random) -> str:
    rare = rng.sample(WORDS[150:], rng.randint(1, 2))
    common = rng.sample(WORDS[:12], rng.randint(1, 5))
    words = rare + common + rng.sample(WORDS[12:150], rng.randint(0, 3))
    if rng.random() < 0.3:
        words.append(rng.choice(common))  # a repeated word weighs more
    rng.shuffle(words)
    if rng.random() < 0.2:
        words.append("-" + rng.choice(WORDS[:40]))
    return " ".join(words)


@pytest.fixture(autouse=True)
def _pruning_on_short_lists(monkeypatch):
    """The lists here are a few thousand postings at most: MaxScore would score them whole
    (prune.SCORE_WHOLE); these tests are of its pruning, so it prunes whatever their length."""
    monkeypatch.setattr(prune, "SCORE_WHOLE", 0)


def _both(st: Store, q: str, limit: int, **kw):
    out = []
    for on in (False, True):
        out.append(search.words(st, q, limit, prune=on, **kw)[0])
    return out


def _counting(monkeypatch, name: str) -> list:
    """postings.<name>(v, want) as it is, each call's number of passages asked noted."""
    calls: list = []
    real = getattr(postings, name)

    def counting(v, want):
        calls.append(len(want))
        return real(v, want)

    monkeypatch.setattr(postings, name, counting)
    return calls


@pytest.mark.parametrize("merge,kept", [(False, False), (True, False), (True, True)])
def test_pruned_answers_are_every_postings_answers(tmp_path, monkeypatch, merge, kept):
    """MaxScore ranks as scoring every posting does, with its terms left looked up block
    by block (no list decoded whole is kept) or, ``kept``, short ones decoded once and kept
    apart (``Store.caches.looked_up``)."""
    rng = random.Random(11 if merge else 12)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, merge)
    st.caches.decoded.CACHE_BYTES = 0  # every list read from its bytes: the block lookups run
    if not kept:
        st.caches.looked_up.CACHE_BYTES = 0
    looked = _counting(monkeypatch, "lookup")
    bounded = _counting(monkeypatch, "block_tf")
    try:
        assert len(st.snapshot.segs) > 1 and not st.snapshot.alive[1:].all()  # dead passages, several segments
        pruned_some = 0
        for i in range(150):
            q = _query(rng)
            limit = rng.choice([1, 5, 10, 30])
            kw = {}
            if i % 5 == 1:
                kw["sources"] = ["home"]
            if i % 7 == 3:
                kw["under"] = "home/d1/"
            before = len(looked)
            off, on = _both(st, q, limit, **kw)
            pruned_some += len(looked) > before
            assert [p for p, _ in on] == [p for p, _ in off], (q, kw)
            assert all(abs(a - b) <= 1e-4 * max(1.0, abs(a)) for (_, a), (_, b) in zip(on, off)), q
        if kept:  # terms were pruned, and each list they were looked up in (all short here) kept
            assert not looked and len(st.caches.looked_up.lists) >= 20
        else:
            assert pruned_some >= 20  # the lookups ran: terms were pruned, blocks looked up
            assert len(bounded) >= 20  # and passages were bounded by their blocks' largest tf
    finally:
        st.close()


@pytest.mark.parametrize("merge", [False, True])
def test_terms_left_scored_whole_answer_as_pruned_to_the_last_bit(tmp_path, monkeypatch, merge):
    """Where the terms left are short (prune.SCORE_WHOLE), MaxScore scores them whole
    rather than looking them up for its candidates: the same passages in the same order
    with the same scores, bit for bit (they are added in the same order), and no lookup."""
    rng = random.Random(41 if merge else 42)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, merge)
    st.caches.decoded.CACHE_BYTES = st.caches.looked_up.CACHE_BYTES = 0
    looked = _counting(monkeypatch, "lookup")
    try:
        for i in range(120):
            q = _query(rng)
            limit = rng.choice([1, 5, 10, 30])
            kw = {"sources": ["home"]} if i % 5 == 1 else {}
            monkeypatch.setattr(prune, "SCORE_WHOLE", 0)
            pruned = search.words(st, q, limit, **kw)[0]
            monkeypatch.setattr(prune, "SCORE_WHOLE", 1 << 30)
            before = len(looked)
            whole = search.words(st, q, limit, **kw)[0]
            assert len(looked) == before, q  # nothing looked up: every list scored whole
            assert whole == pruned, q  # (pairs compared with ==: scores to the last bit)
        assert len(looked) >= 20  # (and the pruned runs did prune)
    finally:
        st.close()


def test_a_long_list_looked_up_for_many_passages_is_decoded_once_and_kept(tmp_path, monkeypatch):
    """A list too long to be decoded whole for a lookup (prune.LOOKUP_WHOLE, lowered here so
    that every list here is) looked up for at least one passage a block's worth of its
    postings (prune.LOOKUP_DENSE) is decoded whole and kept: the same searches again look
    nothing up block by block, and every answer is still scoring every posting's."""
    monkeypatch.setattr(prune, "LOOKUP_WHOLE", 64)
    rng = random.Random(51)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, True)
    looked = _counting(monkeypatch, "lookup")
    try:
        queries = [(_query(rng), rng.choice([1, 5, 10, 30])) for _ in range(80)]
        first = [search.words(st, q, limit)[0] for q, limit in queries]
        assert len(st.caches.decoded.lists) >= 20
        before = len(looked)
        assert [search.words(st, q, limit)[0] for q, limit in queries] == first
        assert len(looked) == before  # (every list the first round looked up densely is held)
        for (q, limit), on in zip(queries, first):
            off = search.words(st, q, limit, prune=False)[0]
            assert [p for p, _ in on] == [p for p, _ in off], q
            assert all(abs(a - b) <= 1e-4 * max(1.0, abs(a)) for (_, a), (_, b) in zip(on, off)), q
    finally:
        st.close()


def test_a_search_after_others_scores_from_zero(tmp_path):
    """The score arrays kept between searches never carry one search's scores into the next."""
    rng = random.Random(3)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, False)
    try:
        q = "t0 t1 t200 t300"
        first = search.words(st, q, 10)[0]
        for other in ("t2 t3 t4", "t0 t250", "t7"):
            search.words(st, other, 10)
        assert search.words(st, q, 10)[0] == first
    finally:
        st.close()


def test_the_score_arrays_held_between_searches_do_not_grow_with_the_threads_that_searched(tmp_path):
    """A search's arrays over every passage id (~8 MB a set at 1.27M passages) are held
    between searches, but not one set per thread that ever searched: `serve-many`'s 16
    tool threads kept ~100 MB of them at 10x. Twelve pool threads search at once; once
    they are done, at most a couple of sets stay, zeroed (the next searches still score
    from zero)."""
    rng = random.Random(5)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, False)
    threads = 12
    gate = threading.Barrier(threads)

    def held() -> int:  # bytes allocated by the scratch module and alive now
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, scratch.__file__)])
        return sum(s.size for s in snap.statistics("filename"))

    try:
        q = "t0 t1 t200 t300"
        first = search.words(st, q, 10)[0]
        tracemalloc.start()
        try:
            one_set = 6 * len(st.snapshot.alive)  # scores (float32) and two masks, an entry an id

            def one(_):
                gate.wait(10)  # every thread of the pool searches (they hold their sets at once)
                return search.words(st, "t0 t5 t9", 10)[0]
            with ThreadPoolExecutor(threads) as pool:
                answers = list(pool.map(one, range(threads)))
                assert all(a == answers[0] for a in answers)
                assert held() <= (scratch.KEEP_IDLE + 1) * one_set, (held(), one_set)  # the pool's threads still alive
        finally:
            tracemalloc.stop()
        assert search.words(st, q, 10)[0] == first
    finally:
        st.close()


@pytest.mark.parametrize("merge", [False, True])
def test_scores_of_given_passages_are_the_words_scores(tmp_path, merge):
    """search.scores_of (the fused ranking's BM25 for passages meaning found) gives each
    passage the score the words ranking gives it, 0 to one holding no query term, to a
    dead one and to an id past the index; prefixes are expanded and exclusions unranked
    as there; every list read from its bytes, so the block lookups run."""
    rng = random.Random(21 if merge else 22)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, merge)
    st.caches.decoded.CACHE_BYTES = st.caches.looked_up.CACHE_BYTES = 0
    try:
        snap = st.snapshot
        every = np.arange(len(snap.alive) + 5)
        assert not snap.alive[1:].all()
        for i in range(60):
            q = _query(rng)
            if i % 6 == 0:
                q += " t2*"
            # (read as syntax whatever its length: its -word excludes, its t2* is a prefix)
            text, q = q, qlang.parse(q, syntax=True)
            full = dict(search.words(st, q, len(snap.alive), candidates=len(snap.alive))[0])
            # a passage holding an excluded word is left out of the words ranking, but
            # scored (the caller's passages passed the checks): as without the exclusion
            excluded = {w[1:] for w in text.split() if w.startswith("-")}
            ranked = " ".join(w for w in text.split() if not w.startswith("-") and w not in excluded)
            unfiltered = dict(search.words(st, qlang.parse(ranked, syntax=True), len(snap.alive),
                                           candidates=len(snap.alive))[0])
            assert all(unfiltered[p] == s for p, s in full.items())
            some = rng.sample(range(len(every)), 80) + list(full)[:20]
            got = search.scores_of(st, q, some)
            want = [unfiltered.get(p, 0.0) for p in some]
            assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(got.tolist(), want)), text
            assert got.dtype == np.float32 and len(got) == len(some)
            dead = [p for p in some if p < len(snap.alive) and not snap.alive[p]]
            assert all(got[some.index(p)] == 0 for p in dead)
        assert not search.scores_of(st, "t0", []).size
    finally:
        st.close()


@pytest.mark.parametrize("merge", [False, True])
def test_one_word_ranks_its_passages_by_their_scores(tmp_path, merge):
    """A query of one word (ranked from its postings' own scores, no score array) gives
    the best of every passage's BM25 for it, as scores_of gives each one, best first."""
    rng = random.Random(31 if merge else 32)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, merge)
    try:
        every = np.flatnonzero(st.snapshot.alive)
        for word in ("t0", "t3", "t40", "t120", "t399"):
            all_scores = search.scores_of(st, word, every)
            for limit in (1, 10, 50):
                got = search.words(st, word, limit)[0]
                want = np.sort(all_scores[all_scores > 0])[::-1][:limit]
                assert len(got) == len(want), word
                assert all(abs(s - w) <= 1e-5 * max(1.0, w) for (_, s), w in zip(got, want.tolist())), word
                assert all(abs(all_scores[np.searchsorted(every, p)] - s) <= 1e-5 * max(1.0, s) for p, s in got)
    finally:
        st.close()


def test_a_few_dead_passages_in_a_large_segment_leave_its_lists_packed(tmp_path, monkeypatch):
    """After a change replaces a few passages of one large segment (a serve's edit of a
    file after a full index), its long lists stay packed (the dead ones counted by a
    lookup, never decoded and filtered at every search), and the answers are still
    those of scoring every live posting: no dead passage, the same scores."""
    rng = random.Random(31)
    st = Store.open(str(tmp_path / "index"))
    try:
        for i in range(4):
            st.commit(Batch(files=[TEXT.file(rng, f"home/d{i}/f{j}.md", "v1", 40) for j in range(60)]))
        # the file to be replaced: short passages dense in the common words, which would
        # rank first for them were its dead passages not dropped
        st.commit(Batch(files=[random_file(rng, "home/d0/f3.md", "v1", WORDS[:6], 40, (3, 6))]))
        st.merge(sorted(st.snapshot.segs))
        big = max(st.snapshot.segs)
        st.commit(Batch(files=[TEXT.file(rng, "home/d0/f3.md", "v2", 40)]))  # 40 dead in the big one
        st.commit(Batch(removed=["home/d2/f7.md"]))
        snap = st.refresh()
        dead = np.flatnonzero(~snap.alive[1:]) + 1
        dead = dead[snap.seg_of[dead] >= 0]  # (ids never used are not dead passages)
        assert len(dead) >= 40 and set(snap.seg_of[dead].tolist()) == {big}
        checked = 0
        for i in range(120):
            q = _query(rng) if i % 2 else " ".join(rng.sample(WORDS[:6], rng.randint(2, 3)))  # the dead ones' words
            limit = rng.choice([1, 5, 10, 30])
            off, on = _both(st, q, limit)
            assert [p for p, _ in on] == [p for p, _ in off], q
            assert all(abs(a - b) <= 1e-4 * max(1.0, abs(a)) for (_, a), (_, b) in zip(on, off)), q
            assert all(snap.alive[p] for p, _ in on)
            checked += len(on)
        assert checked > 500
        # the commonest words' lists in the big segment stay packed, their live counts exact
        st.caches.decoded = postings.Decoded()
        weights = {w: 1.0 for w in WORDS[:3]}
        with st.reading() as r:
            segs = r.segment_keys()
            ranked = terms.ranked_terms(st, r, snap, segs, weights, terms.K1, terms.B)
            live = {w: len(terms.live_postings(st, r, snap, segs, w)[0]) for w in weights}
        bk = big.to_bytes(4, "big")
        for tm in ranked:
            assert tm.dead and tm.df == live[tm.term]
            assert [dec for key, v, dec in tm.lists if key.startswith(bk)] == [None]
    finally:
        st.close()


@pytest.mark.parametrize("merge", [False, True])
def test_one_word_answers_drop_the_dead_alike_before_and_after_the_snapshot_s_facts(tmp_path, merge):
    """A one-word search drops dead passages by checking every posting against the live
    ones until a search has found which segments hold dead ones (terms.snapshot_facts), then by
    looking those dead up in each list: both give the same answers, with no dead passage."""
    st = _store_with_dead_passages(str(tmp_path / "ix"), random.Random(11), merge)
    try:
        snap = st.refresh()
        probe = WORDS[:20] + WORDS[150:170]
        assert terms.facts_known(snap) is None
        before = {w: search.words(st, w, 5000)[0] for w in probe}
        search.words(st, f"{WORDS[0]} {WORDS[200]}", 10)  # a ranked search of two words finds the facts
        assert terms.facts_known(snap) is not None and terms.facts_known(snap)[1]  # dead passages held
        for w in probe:
            after = search.words(st, w, 5000)[0]
            assert after == before[w], w
            assert all(snap.alive[p] for p, _ in after), w
        assert sum(len(v) for v in before.values()) > 500
    finally:
        st.close()


@pytest.mark.parametrize("merge,cached", [(False, True), (True, True), (True, False)])
def test_one_word_block_by_block_answers_as_every_posting(tmp_path, monkeypatch, merge, cached):
    """A one-word search over long lists scores only the blocks whose largest score may
    place (prune.one_word): its answers, ties by ref included, are those of scoring
    every posting, with dead passages in several segments, lists decoded and kept or read
    block by block from their bytes, after the mean passage length grew past the blocks'
    kept maxima, and for other k1 and b."""
    monkeypatch.setattr(prune, "LONG_LIST", 64)  # the test's lists are a few thousand long
    rng = random.Random(31 if merge else 32)
    st = _store_with_dead_passages(str(tmp_path / "index"), rng, merge)
    if not cached:
        st.caches.decoded.CACHE_BYTES = 0
    used = _counting(monkeypatch, "blocks") if not cached else []
    took = []
    real = prune._score_blocks
    monkeypatch.setattr(prune, "_score_blocks", lambda *a: (took.append(sum(map(len, a[2]))), real(*a))[1])

    def check(words, **kw):
        for w in words:
            for limit in (1, 7, 10, 40):
                off, on = _both(st, w, limit, **kw)
                assert [p for p, _ in on] == [p for p, _ in off], (w, limit, kw)
                assert all(abs(a - b) <= 1e-5 * max(1.0, abs(a)) for (_, a), (_, b) in zip(on, off)), w

    try:
        assert not st.snapshot.alive[1:].all()
        check(WORDS[:30])
        assert len(st.caches.block_max) >= 30 and len(took) >= 60, (len(st.caches.block_max), len(took))
        check(WORDS[:10], k1=0.9, b=0.4)
        # passages far longer than the mean: the mean grows past the kept maxima
        st.commit(Batch(files=[random_file(rng, f"home/long/f{j}.md", "v1", WORDS, 8, (900, 1200), WEIGHTS)
                               for j in range(6)]))
        check(WORDS[:30])
        if not cached:
            assert used  # blocks decoded alone, the lists never whole but for their maxima
    finally:
        st.close()
