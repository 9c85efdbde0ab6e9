"""Prose is not syntax (§4.1 rev. 3, issue 35): pasted text with quotes, dashes,
stars and hyphenated words, ranked by words.

Run: ``.venv/bin/python bench/bench_prose.py [--make-set] [--record] [--phrase-weight W ...]``

In-process with the engine's own parts (``indexer.build`` into a real LMDB
``Store``, ``search.words`` as ``Memory.rank`` calls it; no model):

- **The prose set** (``bench/prose_set.json``, written by ``--make-set`` from
  the public text in ``../shared/data``, never typed by hand): SciFact claims
  (train and test) and LoCoMo questions, each made into the text an agent
  pastes by a seeded random choice of what people write: a span of 2-5 words
  in quotes (``"…"``, ``“…”`` or ``«…»``), a dash (``-``, ``--`` or ``—``
  between words, or one glued to a word: ``-glaciers``), a footnote star
  (``word*``), an opening quote never closed, two words joined by a hyphen.
  Each query keeps its known answers (SciFact's qrels; LoCoMo's evidence
  turns). Every query is ranked twice: as written, and with every operator
  character removed (quotes, stars, a ``+`` or ``-`` before a word); the
  syntax must not rank worse than its removal. SciFact by nDCG@10 (train:
  tuning, test: report), LoCoMo by turn R@10 within the question's
  conversation (conversations 1-5: tuning, 6-10: report).
- **The plain queries** of both, as in ``bench_quality.py`` and
  ``bench_meaning.py --locomo`` (words): unchanged or better.

``--phrase-weight`` measures other lifts of a scored phrase
(``search.PHRASE_WEIGHT``), on the tuning parts. Prints a table;
``--record`` writes it to the "prose" section of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import random
import re
import shutil
import tempfile
import time

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE  # noqa: E402
import eval_data as ed  # noqa: E402

from lnkmem.bridges.local import LocalPlace  # noqa: E402
from lnkmem.index.build import indexer  # noqa: E402
from lnkmem.index.rank import search as S  # noqa: E402
from lnkmem.index.store import Store  # noqa: E402

SECTION = "prose"
SET = os.path.join(HERE, "prose_set.json")
SEED = 35
CANDIDATES = 100


def log(msg: str) -> None:
    print(f"[bench_prose] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the set

_OPERATOR = re.compile(r'["\u201c\u201d\u201e\u201f\u00ab\u00bb*]|(?<!\S)[+-]+(?=\S)')


def strip_operators(q: str) -> str:
    """The query with every operator character removed: quotes, stars, and a ``+`` or
    ``-`` that starts a word (a hyphen inside a word is no operator)."""
    return _OPERATOR.sub("", q)


_QUOTE_PAIRS = (('"', '"'), ('"', '"'), ("\u201c", "\u201d"), ("\u00ab", "\u00bb"))


def prose_of(text: str, rng: random.Random) -> str:
    """``text`` as an agent pastes it: a quoted span, and one or two of a dash, a
    star, an unclosed quote, a hyphenated pair (seeded)."""
    words = text.split()
    if len(words) < 4:
        return ""
    content = [i for i, w in enumerate(words) if len(re.sub(r"\W", "", w)) >= 4]
    # a quoted span of 2-5 words
    n = rng.randint(2, min(5, len(words) - 1))
    a = rng.randrange(0, len(words) - n + 1)
    op, cl = rng.choice(_QUOTE_PAIRS)
    words[a] = op + words[a]
    words[a + n - 1] = words[a + n - 1] + cl
    kinds = rng.sample(["dash", "glued", "star", "unclosed", "hyphen"], rng.randint(1, 2))
    kinds.sort(key=lambda k: k == "hyphen")  # (last: it joins two words into one)
    for kind in kinds:
        free = [i for i in content if not (a <= i < a + n)]
        if not free:
            break
        i = rng.choice(free)
        if kind == "dash":
            words[i] = rng.choice(["-", "--", "\u2014"]) + " " + words[i]
        elif kind == "glued":
            words[i] = "-" + words[i]
        elif kind == "star":
            words[i] = words[i] + "*"
        elif kind == "unclosed":
            words[i] = '"' + words[i]
        elif kind == "hyphen" and i + 1 < len(words) and words[i][-1:].isalnum() and words[i + 1][:1].isalnum():
            words[i] = words[i] + "-" + words.pop(i + 1)
    return " ".join(words)


def make_set() -> list[dict]:
    rng = random.Random(SEED)
    out: list[dict] = []
    beir = ed.load_beir()
    for split in ("train", "test"):
        for qid in sorted(beir.qrels[split]):
            q = prose_of(beir.queries[qid], rng)
            if q:
                out.append({"kind": "scifact", "split": split, "id": qid, "query": q,
                            "rel": beir.qrels[split][qid]})
    convs = ed.load_locomo(ed.LOCOMO)
    for ci, c in enumerate(convs):
        for j, qa in enumerate(c.qa):
            q = prose_of(qa["question"], rng)
            if q:
                out.append({"kind": "locomo", "split": "tune" if ci < 5 else "report", "id": f"{ci}:{j}",
                            "conv": ci, "query": q, "evidence": qa["evidence"]})
    return out


# ---------------------------------------------------------------- the indexes

def build(folder: str, idx: str, source: str = "home") -> Store:
    store = Store.open(idx)
    places = {source: LocalPlace(folder, ignore=source == "home")}
    indexer.build(store, places, indexer.plan(store, places), idx)
    return store


class SciFact:
    def __init__(self, tmp: str):
        self.beir = ed.load_beir()
        home = os.path.join(tmp, "scifact")
        os.makedirs(home)
        for did, (title, text) in self.beir.corpus.items():
            with open(os.path.join(home, f"{did}.md"), "w", encoding="utf-8") as f:
                f.write(f"{title}\n\n{text}\n")
        t = time.perf_counter()
        self.store = build(home, os.path.join(tmp, "scifact-idx"))
        log(f"scifact: {len(self.beir.corpus)} documents indexed in {time.perf_counter() - t:.1f}s")

    def ndcg(self, query: str, rel: dict) -> float:
        pairs, _ = S.words(self.store, query, 10, candidates=CANDIDATES)
        refs = [p.ref for p in self.store.passages_of(pid for pid, _ in pairs)]
        return ed.ndcg_at(ed.dedupe(r[len("home/"):-len(".md")] for r in refs), rel, 10)


class LoCoMo:
    def __init__(self, tmp: str):
        from bench_meaning import locomo_time
        self.convs = ed.load_locomo(ed.LOCOMO)
        home = os.path.join(tmp, "chats")
        os.makedirs(home)
        self.turn_of_line = {}
        for ci, c in enumerate(self.convs):
            with open(os.path.join(home, f"c{ci}.jsonl"), "w", encoding="utf-8") as f:
                for n, t in enumerate(c.turns, 1):
                    f.write(json.dumps({"role": t.speaker, "text": t.text, "at": locomo_time(t.at)}) + "\n")
                    self.turn_of_line[(f"chats/c{ci}.jsonl", n)] = t.dia_id
        self.store = build(home, os.path.join(tmp, "locomo-idx"), "chats")

    def recall(self, query: str, ci: int, evidence: list, k: int = 10) -> float:
        pairs, _ = S.words(self.store, query, k, under=f"chats/c{ci}.jsonl", candidates=CANDIDATES)
        got = {self.turn_of_line[(p.ref, p.last)] for p in self.store.passages_of(pid for pid, _ in pairs[:k])}
        return sum(1 for e in evidence if e in got) / len(evidence)


# ---------------------------------------------------------------- measuring

def measure(sf: SciFact, lc: LoCoMo, prose: list[dict]) -> dict:
    r: dict = {}
    for split in ("train", "test"):
        r[f"scifact plain {split}"] = ed.mean(sf.ndcg(sf.beir.queries[q], rel) for q, rel in sf.beir.qrels[split].items())
    for part, lo, hi in (("tune", 0, 5), ("report", 5, 10)):
        r[f"locomo plain {part}"] = ed.mean(lc.recall(qa["question"], ci, qa["evidence"])
                                            for ci, c in enumerate(lc.convs) if lo <= ci < hi for qa in c.qa)
    for kind, splits in (("scifact", ("train", "test")), ("locomo", ("tune", "report"))):
        for split in splits:
            qs = [x for x in prose if x["kind"] == kind and x["split"] == split]
            for how, f in (("syntax", lambda s: s), ("stripped", strip_operators)):
                if kind == "scifact":
                    vals = [sf.ndcg(f(x["query"]), x["rel"]) for x in qs]
                else:
                    vals = [lc.recall(f(x["query"]), x["conv"], x["evidence"]) for x in qs]
                r[f"{kind} prose {split} {how}"] = ed.mean(vals)
            r[f"{kind} prose {split} n"] = len(qs)
    return r


def table(r: dict) -> str:
    lines = ["| Queries | Split | n | As written (syntax) | Operators removed | Result |", "|---|---|---|---|---|---|"]
    for kind, metric, splits in (("scifact", "nDCG@10", ("train", "test")), ("locomo", "R@10", ("tune", "report"))):
        for split in splits:
            a, b, n = r[f"{kind} prose {split} syntax"], r[f"{kind} prose {split} stripped"], r[f"{kind} prose {split} n"]
            ok = "pass" if a >= b - 1e-9 else "**FAIL**"
            lines.append(f"| {kind} prose ({metric}) | {split} | {n} | {a:.4f} | {b:.4f} | {ok} |")
    lines += ["", "| Plain queries (words) | Split | Figure |", "|---|---|---|"]
    for key in ("scifact plain train", "scifact plain test", "locomo plain tune", "locomo plain report"):
        lines.append(f"| {key.split()[0]} ({'nDCG@10' if 'scifact' in key else 'R@10'}) | {key.split()[-1]} | {r[key]:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-set", action="store_true")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--phrase-weight", type=float, nargs="*", default=None)
    a = ap.parse_args(argv)
    if a.make_set or not os.path.exists(SET):
        prose = make_set()
        with open(SET, "w", encoding="utf-8") as f:
            json.dump(prose, f, indent=0, ensure_ascii=False)
        log(f"{len(prose)} prose queries written to {SET}")
    with open(SET, encoding="utf-8") as f:
        prose = json.load(f)
    tmp = tempfile.mkdtemp(prefix="lnkmem-prose-")
    try:
        sf, lc = SciFact(tmp), LoCoMo(tmp)
        if a.phrase_weight:
            for w in a.phrase_weight:
                S.PHRASE_WEIGHT = w
                sc = ed.mean(sf.ndcg(x["query"], x["rel"]) for x in prose if x["kind"] == "scifact" and x["split"] == "train")
                lo = ed.mean(lc.recall(x["query"], x["conv"], x["evidence"]) for x in prose
                             if x["kind"] == "locomo" and x["split"] == "tune")
                print(f"phrase weight {w:g}: scifact train prose {sc:.4f}, locomo 1-5 prose {lo:.4f}")
            return 0
        t = time.perf_counter()
        r = measure(sf, lc, prose)
        log(f"measured in {time.perf_counter() - t:.1f}s")
        out = table(r)
        print(out)
        print(json.dumps(r, indent=1))
        if a.record:
            from datetime import datetime, timezone
            when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            note = (f"{when}; {common.machine()}{common.load_note()}. `bench/bench_prose.py`, in-process "
                    f"(`indexer.build` into LMDB, `search.words` as `Memory.rank` calls it, no model); "
                    f"`search.PHRASE_WEIGHT` {S.PHRASE_WEIGHT:g}; the set `bench/prose_set.json` (seed {SEED}).")
            common.write_section(SECTION, ["## Prose queries (issue 35)", "", note, "", out])
        sf.store.close()
        lc.store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
