"""Evaluation data and retrieval metrics for the benchmarks (read in place, never copied).

- ``load_beir(dir)``: a BEIR-format data set (corpus.jsonl, queries.jsonl,
  qrels/<split>.tsv);
- ``load_locomo(path)``: LoCoMo's conversations as turns, and its QA items with
  turn-level evidence;
- ``ndcg_at``, ``recall_at``: binary-relevance metrics as pytrec_eval computes
  them (nDCG with log2 discounts, ideal ranking over all judged documents).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Iterable

def _shared(rel: str) -> str:
    """``shared/data/<rel>`` beside the project (its checkout's parent, or the parent's
    parent for a worktree under ``wt/``), found relative to this file, never at a fixed path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for up in (os.path.dirname(root), os.path.dirname(os.path.dirname(root))):
        p = os.path.join(up, "shared", "data", rel)
        if os.path.exists(p):
            return p
    return os.path.join(os.path.dirname(root), "shared", "data", rel)


SCIFACT = os.environ.get("LNKMEM_SCIFACT") or _shared("beir-scifact")
LOCOMO = os.environ.get("LNKMEM_LOCOMO") or _shared(os.path.join("locomo", "locomo10.json"))


# ---------------------------------------------------------------- BEIR


@dataclass
class Beir:
    corpus: dict[str, tuple[str, str]]  # doc id -> (title, text), in file order
    queries: dict[str, str]  # query id -> text
    qrels: dict[str, dict[str, dict[str, int]]]  # split -> query id -> doc id -> grade
    digest: str  # sha256 of corpus.jsonl (a cache key)


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_beir(root: str = SCIFACT, splits: Iterable[str] = ("train", "test")) -> Beir:
    if not os.path.isdir(root):
        raise SystemExit(f"no BEIR data at {root} (set LNKMEM_SCIFACT)")
    corpus: dict[str, tuple[str, str]] = {}
    with open(os.path.join(root, "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            corpus[str(d["_id"])] = (d.get("title") or "", d.get("text") or "")
    queries: dict[str, str] = {}
    with open(os.path.join(root, "queries.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            queries[str(d["_id"])] = d["text"]
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for split in splits:
        rel: dict[str, dict[str, int]] = {}
        with open(os.path.join(root, "qrels", f"{split}.tsv"), encoding="utf-8") as f:
            rows = csv.reader(f, delimiter="\t")
            next(rows)  # header
            for qid, did, score in rows:
                if int(score) > 0:
                    rel.setdefault(qid, {})[did] = int(score)
        qrels[split] = rel
    return Beir(corpus, queries, qrels, file_sha256(os.path.join(root, "corpus.jsonl")))


# ---------------------------------------------------------------- LoCoMo


@dataclass
class Turn:
    dia_id: str  # "D3:7"
    speaker: str
    text: str
    session: int
    at: str  # the session's date and time, as written


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    qa: list[dict] = field(default_factory=list)  # {"question", "evidence": [dia_id], "category"}


def load_locomo(path: str = LOCOMO) -> list[Conversation]:
    if not os.path.exists(path):
        raise SystemExit(f"no LoCoMo data at {path} (set LNKMEM_LOCOMO)")
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    out = []
    for item in raw:
        conv = item["conversation"]
        turns = []
        nums = sorted(int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
        for n in nums:
            at = conv.get(f"session_{n}_date_time", "")
            for t in conv[f"session_{n}"]:
                text = t.get("text", "")
                if t.get("blip_caption"):
                    text += f" [shares a photo: {t['blip_caption']}]"
                turns.append(Turn(t["dia_id"], t["speaker"], text, n, at))
        ids = {t.dia_id for t in turns}
        qa = []
        for q in item.get("qa", []):
            ev = [e.strip() for e in q.get("evidence", []) for e in re.split(r"[;,\s]+", e) if e.strip() in ids]
            if ev:
                qa.append({"question": q["question"], "evidence": sorted(set(ev)), "category": q.get("category")})
        out.append(Conversation(item.get("sample_id", str(len(out))), turns, qa))
    return out


# ---------------------------------------------------------------- metrics


def ndcg_at(ranked: list[str], rel: dict[str, int], k: int = 10) -> float:
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: list[str], rel: dict[str, int], k: int = 100) -> float:
    if not rel:
        return 0.0
    got = set(ranked[:k])
    return sum(1 for d in rel if d in got) / len(rel)


def mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def dedupe(keys: Iterable[str]) -> list[str]:
    """Keys in order, each kept at its first place (a document's best passage)."""
    seen: set[str] = set()
    out = []
    for k in keys:
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out
