"""A reference engine's restart, as lean as ours is measured: a new process that opens the
index and answers one query, importing nothing but the engine and what the query needs
(run by bench_scale as ``python bench/restart_ref.py fts5|tantivy WHERE QUERY``; its
restart worker had imported bench_scale's own modules first, ~50 ms of CPU that was no
part of the engine's restart). The query builders are bench_scale's too (one definition)."""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
from typing import Optional  # noqa: E402

_WORD = re.compile(r"\w+")
FTS_SQL = "SELECT rowid FROM p WHERE p MATCH ? ORDER BY bm25(p) LIMIT 10"


def fts_match(q: str) -> Optional[str]:
    ws = _WORD.findall(q)
    return " OR ".join(f'"{w}"' for w in ws) if ws else None


def tantivy_query(index, q: str):
    ws = [w.lower() for w in _WORD.findall(q)]
    return index.parse_query(" ".join(ws), ["body"]) if ws else None


def main(name: str, where: str, query: str) -> None:
    if name == "fts5":
        import sqlite3
        db = sqlite3.connect(where)
        hits = len(db.execute(FTS_SQL, (fts_match(query),)).fetchall())
    else:
        import tantivy
        index = tantivy.Index.open(where)
        hits = len(index.searcher().search(tantivy_query(index, query), 10).hits)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime, "hits": hits}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
