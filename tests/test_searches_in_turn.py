"""Memories searched in turn in one process (as `serve-many` serves its agents): each
keeps what its searches worked out for its snapshot (its facts: shortest live length,
segments holding dead passages; its files' times), whatever another memory searched
in between, and each answers as it would alone."""

import random

from lnkmem.index.rank import checks, search, terms
from lnkmem.index.commit import Batch
from lnkmem.index.store import Store
from tests.helpers import random_file

VOCAB = [f"w{i}" for i in range(30)]
QUERIES = ["w1 w2", "w3", "w4 w5 w6", "w0 w7", "w8 w9 w10 w11", "w12 -w13", '"w14 w15"']
DATED = (None, 10 ** 9 + 40 * 86400)  # no date, or after a day some files are older than


def _memory(path, seed: int) -> Store:
    """An index of three commits and a removal (dead passages in its segments), its
    files dated a day apart from 2001-09-09 on."""
    st = Store.open(str(path))
    rng = random.Random(seed)
    day = 0
    for c in range(3):
        files = []
        for i in range(25):
            f = random_file(rng, f"home/c{c}/{i}.md", "v1", VOCAB, None, (3, 12))
            f.mtime = f"2001-{9 + day // 30:02}-{1 + day % 30:02}T00:00:00Z"
            day = (day + 1) % 90
            files.append(f)
        st.commit(Batch(files=files))
    st.commit(Batch(removed=[f"home/c{c}/{i}.md" for c in range(3) for i in range(0, 25, 7)]))
    return st


def _answers(st: Store) -> list:
    out = []
    for q in QUERIES:
        for after in DATED:
            pairs, _ = search.words(st, q, 10, after=after)
            out.append([(pid, round(score, 9)) for pid, score in pairs])
    return out


def test_two_memories_searched_in_turn_answer_as_each_alone(tmp_path):
    alone = []
    for seed in (1, 2):
        st = _memory(tmp_path / f"alone{seed}", seed)
        try:
            alone.append(_answers(st))
        finally:
            st.close()
    a, b = _memory(tmp_path / "a", 1), _memory(tmp_path / "b", 2)
    try:
        got_a, got_b = [], []
        for q in QUERIES:
            for after in DATED:
                for st, got in ((a, got_a), (b, got_b)):
                    pairs, _ = search.words(st, q, 10, after=after)
                    got.append([(pid, round(score, 9)) for pid, score in pairs])
        assert any(alone[0]) and any(alone[1]) and alone[0] != alone[1]
        assert got_a == alone[0]
        assert got_b == alone[1]
    finally:
        a.close()
        b.close()


def test_a_memory_s_facts_are_not_worked_out_again_after_another_searched(tmp_path):
    """What a search works out once for a snapshot (O(passages): every dead passage's
    segment; one file-table read per file for dates) stays with that snapshot: searching
    another memory in between does not make the next search of the first redo it."""
    a, b = _memory(tmp_path / "a", 1), _memory(tmp_path / "b", 2)
    try:
        search.words(a, "w1 w2", 10)
        search.words(a, "w1 w2", 10, after=DATED[1])
        snap_a = a.snapshot
        facts, times = snap_a.worked_out[terms.FACTS], snap_a.worked_out[checks.FILE_TIMES]
        assert facts[1] and times  # segments holding dead passages; files' times read
        search.words(b, "w1 w2", 10)
        search.words(b, "w1 w2", 10, after=DATED[1])
        assert b.snapshot.worked_out[terms.FACTS] is not facts
        search.words(a, "w4 w5", 10)
        search.words(a, "w4 w5", 10, after=DATED[1])
        assert a.snapshot is snap_a
        assert snap_a.worked_out[terms.FACTS] is facts  # the same: not worked out again
        assert snap_a.worked_out[checks.FILE_TIMES] is times
    finally:
        a.close()
        b.close()
