"""A digest of the words ranking's answers: shows that a change of the code left what
searches answer the same, pair for pair and score for score (issue 36: "no behaviour
change, shown"; ``bench/index_digest.py`` does the same for the index a build makes).

``python bench/rank_digest.py [--root DIR] [--lines FILE]``: indexes BEIR SciFact
(``../shared/data/beir-scifact``, or ``$LNKMEM_SCIFACT``; each document ``home/<id>.md``,
as ``bench_quality``) in a temporary folder, in this process (``LNKMEM_WORKER=0``: the
passage ids do not depend on timing), then asks ``search.words`` every query of the train
and test splits in several forms -- as written; unpruned; with a phrase, a required
phrase, ``+word``, ``-word``, ``prefix*``; its last word alone (pruned and unpruned); with
dates, sources and ``under`` -- and ``search.scores_of`` for each answer's passages and a
spread of others. It prints a SHA-256 over every answer (each passage named by its ref
and lines, each score by its repr), then again with ``LONG_LIST`` lowered to 64 (so one
word's block-max runs on SciFact's short lists).

``--root DIR``: the code measured is the ``lnkmem`` below DIR (another commit's tree, as
``git archive <commit> | tar -x -C DIR`` makes it); by default this repository's.
``--lines FILE``: every answer, one a line, to compare two runs with ``diff``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import pkgutil
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def variants(q: str):
    """(tag, query, words() keywords) of each form of ``q`` asked."""
    ws = q.split()
    yield "plain", q, {}
    yield "unpruned", q, {"prune": False}
    if len(ws) >= 3:
        yield "phrase", f'"{ws[0]} {ws[1]}" {ws[2]}', {}
        yield "required-phrase", f'"{ws[0]} {ws[1]}"', {}
        yield "plus", f"+{ws[0]} {ws[1]} {ws[2]}", {}
        yield "minus", f"{ws[0]} {ws[1]} -{ws[2]}", {}
        yield "prefix", f"{ws[0][:4]}* {ws[1]}", {}
    if ws:
        yield "one", ws[-1], {}
        yield "one-unpruned", ws[-1], {"prune": False}
    yield "dated", q, {"after": 1.0, "before": 4e9}
    yield "sources", q, {"sources": ["home"]}
    yield "under", q, {"under": "home/1"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=ROOT, help="the tree whose lnkmem is measured (default: this one)")
    ap.add_argument("--lines", help="write every answer, one a line, to this file")
    a = ap.parse_args(argv)
    os.environ.setdefault("LNKMEM_WORKER", "0")
    sys.path.insert(0, HERE)  # eval_data
    sys.path.insert(0, os.path.abspath(a.root))
    import eval_data as ed
    import lnkmem
    import lnkmem.index.rank as rank
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.build import indexer
    from lnkmem.index.rank import search
    from lnkmem.index.store import Store

    print(f"lnkmem: {os.path.dirname(lnkmem.__file__)}", file=sys.stderr)
    beir = ed.load_beir()
    tmp = tempfile.mkdtemp(prefix="lnkmem-rank-digest-")
    try:
        home = os.path.join(tmp, "home")
        os.makedirs(home)
        for did, (title, text) in sorted(beir.corpus.items()):
            with open(os.path.join(home, f"{did}.md"), "w", encoding="utf-8") as f:
                f.write(f"{title}\n\n{text}\n")
        idx = os.path.join(tmp, "index")
        store = Store.open(idx)
        places = {"home": LocalPlace(home, ignore=True)}
        indexer.build(store, places, indexer.plan(store, places), idx)
        n = len(store.refresh().alive)
        names: dict[int, str] = {}

        def name(pid: int) -> str:
            if pid not in names:
                p = store.passages_of([pid])[0]
                names[pid] = f"{p.ref}:{p.first}-{p.last}" if p is not None else f"?{pid}"
            return names[pid]

        h = hashlib.sha256()
        lines = []

        def emit(tag: str, pairs) -> None:
            line = tag + " " + " ".join(f"{name(p)}={s!r}" for p, s in pairs)
            h.update(line.encode() + b"\n")
            lines.append(line)

        qids = sorted(set(beir.qrels["test"]) | set(beir.qrels["train"]))
        for round_ in ("as set", "LONG_LIST 64"):
            if round_ != "as set":
                for m in pkgutil.iter_modules(rank.__path__):
                    mod = importlib.import_module(f"lnkmem.index.rank.{m.name}")
                    if hasattr(mod, "LONG_LIST"):
                        mod.LONG_LIST = 64
            for qid in qids:
                for tag, q, kw in variants(beir.queries[qid]):
                    if round_ != "as set" and not tag.startswith(("one", "plain")):
                        continue
                    pairs, _ = search.words(store, q, 10, candidates=100, **kw)
                    emit(f"{round_} {qid} {tag}", pairs)
                    if tag in ("plain", "phrase", "prefix", "minus"):
                        pids = [p for p, _ in pairs] + list(range(int(qid) % 97, n, 211))
                        emit(f"{round_} {qid} {tag} scores_of", zip(pids, search.scores_of(store, q, pids).tolist()))
            print(f"{round_}: {h.hexdigest()} ({len(lines)} answers so far)")
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.lines:
        with open(a.lines, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print(f"all: {h.hexdigest()} ({len(lines)} answers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
