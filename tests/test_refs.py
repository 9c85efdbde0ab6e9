"""The snapshot's table of refs (index/codec/refs.py): every ref back as it went in, each
ref's id found, a new table for new refs leaving the old one as it was."""

import os
import random

import numpy as np

from lnkmem.index.codec.refs import Refs

ODD = ["home/plain.md", "home/ünïcode/naïve.md", "home/with\nnewline.md", "home/tab\there.md",
       os.fsdecode(b"home/latin1-\xe9t\xe9.md"),  # not UTF-8 on disk: a surrogate-escaped str
       "chats/2026/emoji-\U0001f600.jsonl", "home/" + "long/" * 200 + "deep.md", "x", "home/a\ud800b.md"]


def test_every_ref_comes_back_and_is_found_by_its_id():
    rng = random.Random(3)
    names = ODD + [f"home/d{rng.randrange(50)}/f{i}.md" for i in range(2000)]
    t = Refs.of(names)
    assert len(t) == len(names)
    assert list(t) == names
    assert [t[i] for i in range(len(names))] == names
    assert t[np.int32(5)] == names[5] and t[-1] == names[-1]
    assert [t.find(r) for r in names] == list(range(len(names)))
    assert t.find_all(names).tolist() == list(range(len(names)))
    assert t.find("home/absent.md") == -1 and "home/absent.md" not in t and names[7] in t
    assert t.find_all(["home/absent.md", names[3], "home/d1"]).tolist() == [-1, 3, -1]
    for under in ("home/", "home/d1", "home/d1/", "home/ü", "chats/", "nothing/", ""):
        assert t.starting(under).tolist() == [r.startswith(under) for r in names], under


def test_an_extended_table_is_new_and_the_old_one_unchanged():
    t = Refs.of(["home/a.md", "home/b.md"])
    u = t.extended(["notes/c.md", "home/ä.md"])
    assert list(t) == ["home/a.md", "home/b.md"] and t.find("notes/c.md") == -1
    assert list(u) == ["home/a.md", "home/b.md", "notes/c.md", "home/ä.md"]
    assert [u.find(r) for r in u] == [0, 1, 2, 3]
    assert t.extended([]) is t
    kept = u.kept(np.array([False, True, False, True]))
    assert list(kept) == ["home/b.md", "home/ä.md"] and kept.find("home/ä.md") == 1


def test_a_hash_shared_by_two_refs_finds_the_right_one():
    """Refs are found by hash, then compared: a collision (two refs, one hash) is looked
    past. Made here by giving both refs the first one's hash."""
    a, b = "home/a.md", "home/b.md"
    blob = (b + a).encode()
    ends = np.array([len(b), len(b) + len(a)], np.int64)
    same = np.array([hash(a), hash(a)], np.int64)
    t = Refs(blob, ends, same, np.array([0, 1], np.int32))  # b (id 0) first under a's hash
    assert t.find(a) == 1
    assert t.find_all([a]).tolist() == [1]
    assert t.find(b) == -1  # b's own hash is not in the table
