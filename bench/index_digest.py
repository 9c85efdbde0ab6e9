"""A digest of every table of an index: shows that a change of the code left the index it
builds byte for byte the same (issue 36: "no behaviour change, shown").

``python bench/index_digest.py HOME [AGENT]``: builds a fresh index of HOME (and the agent's
``chats/`` and ``skills/``) in a temporary folder with ``indexer.plan`` and ``indexer.build``
(the merge the build asks for included), closes it, and prints one line per table and one for
the whole index. ``python bench/index_digest.py --index FOLDER`` reads an existing index
folder instead (opened read-only; nothing is changed).

Each table's digest is a SHA-256 over its items in key order, each as the lengths and bytes of
its key and value; the whole index's is over the tables' names and digests in the order below.
The build runs in this process, its files in plan order (``LNKMEM_WORKER=0`` is set unless
the caller set it: with the worker process, which files each side counts depends on timing,
and so do the passage ids). Files' modification times are part of the files table: digests
compare builds of one tree left untouched in between.

``--corpus SCALE``: first generates (or reuses) ``<out>/digest-SCALE/`` (``--out``, default
``bench/out/``) with ``bench/corpus.py`` (seed 7) and builds that tree.

``--changes``: a second round after the first build, on a second tree made once and kept
below ``<out>/digest-changed/`` (hard links to the first round's files): every 7th file
removed, every 5th rewritten (a line added, a fixed modification time), the plan applied
again (its commit's deletions, dead passages and the merge it asks
for), then a merge of every segment, then seeded vectors for every live passage
(``put_vectors``, the quantized rows). The digests are printed after each round.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
TABLES = ("meta", "files", "passages", "postings", "segments", "dead", "vectors", "vec_pending")
_LEN = struct.Struct("<II")


def table_digests(folder: str) -> dict[str, tuple[int, str]]:
    """Per table: (its item count, the SHA-256 of its items in key order)."""
    import lmdb

    env = lmdb.open(folder, readonly=True, lock=False, max_dbs=16, subdir=True)
    out = {}
    try:
        with env.begin() as txn:
            for name in TABLES:
                db = env.open_db(name.encode(), txn=txn, create=False)
                h = hashlib.sha256()
                n = 0
                for k, v in txn.cursor(db=db):
                    h.update(_LEN.pack(len(k), len(v)))
                    h.update(k)
                    h.update(v)
                    n += 1
                out[name] = (n, h.hexdigest())
    finally:
        env.close()
    return out


def whole_digest(tables: dict[str, tuple[int, str]]) -> str:
    h = hashlib.sha256()
    for name in TABLES:
        h.update(f"{name}\0{tables[name][1]}\n".encode())
    return h.hexdigest()


def _places(home: str, agent: str | None) -> dict:
    from lnkmem.bridges.local import LocalPlace

    places = {"home": LocalPlace(home)}
    if agent:
        for source in ("chats", "skills"):
            if os.path.isdir(os.path.join(agent, source)):
                places[source] = LocalPlace(os.path.join(agent, source))
    return places


def build_index(home: str, agent: str | None, folder: str, tmpdir: str) -> int:
    """Apply the plan of ``home`` (and ``agent``) to the index at ``folder`` (made if need
    be), closed as the people's `index` closes it; returns the number of files indexed."""
    try:
        from lnkmem.index.build import indexer
    except ImportError:  # (the layout before issue 36: the same digests, shown)
        from lnkmem.index.build import indexer
    from lnkmem.index.store import Store

    places = _places(home, agent)
    st = Store.open(folder)
    try:
        return indexer.build(st, places, indexer.plan(st, places), tmpdir)
    finally:
        st.close()


CHANGED_AT = 1_700_000_000  # the modification time of the files the second round rewrites


def changed_tree(home: str, agent: str | None) -> tuple[str, str | None, int, int]:
    """The second round's tree: ``home`` (and ``agent``) again below
    ``<out>/digest-changed/``, each file a hard link to the first round's (the same inode
    and modification time: the same version, not indexed again), then changed by
    :func:`change_tree`; made once and kept (a local file's version holds its inode: a
    fresh copy's files would differ each run)."""
    import json

    key = hashlib.sha256(f"{os.path.abspath(home)}\0{agent and os.path.abspath(agent)}".encode()).hexdigest()[:16]
    out = os.path.join(OUT, "digest-changed", key)
    done = os.path.join(out, "done.json")
    try:
        with open(done) as f:
            removed, rewritten = json.load(f)
    except (OSError, ValueError):
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        removed = rewritten = 0
        for name, tree in (("home", home), ("agent", agent)):
            if tree:
                r, w = change_tree(shutil.copytree(tree, os.path.join(out, name), copy_function=os.link))
                removed, rewritten = removed + r, rewritten + w
        with open(done, "w") as f:
            json.dump([removed, rewritten], f)
    return (os.path.join(out, "home"), os.path.join(out, "agent") if agent else None, removed, rewritten)


def change_tree(root: str) -> tuple[int, int]:
    """Every 7th file below ``root`` (sorted paths) removed, every 5th other one rewritten
    (a new file in its place: the first round's, linked here, is left as it was)."""
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    removed = rewritten = 0
    for i, path in enumerate(paths):
        if i % 7 == 3:
            os.unlink(path)
            removed += 1
        elif i % 5 == 1:
            with open(path, "rb") as f:
                data = f.read()
            os.unlink(path)
            if path.endswith(".jsonl"):
                data += b'{"role": "user", "text": "digest round two quokka", "at": "2026-01-01T00:00:00Z"}\n'
            else:
                data += b"\ndigest round two quokka\n"
            with open(path, "wb") as f:
                f.write(data)
            os.utime(path, (CHANGED_AT, CHANGED_AT))
            rewritten += 1
    return removed, rewritten


def merge_and_embed(folder: str) -> int:
    """Every segment merged into one, then seeded unit vectors (16 wide) for every live
    passage; returns the number of vectors stored."""
    import numpy as np

    from lnkmem.index.store import Store

    st = Store.open(folder)
    try:
        st.merge(sorted(st.segment_sizes()))
        pids = [int(p) for p in np.flatnonzero(st.snapshot.alive)]
        rng = np.random.default_rng(7)
        vecs = rng.standard_normal((len(pids), 16)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        st.use_vector_model("digest-16")
        return len(st.put_vectors(pids, vecs))
    finally:
        st.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("home", nargs="?")
    ap.add_argument("agent", nargs="?")
    ap.add_argument("--index", help="digest this existing index folder instead of building one")
    ap.add_argument("--corpus", type=float, metavar="SCALE",
                    help="build bench/corpus.py's tree at this scale (seed 7)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"),
                    help="where the generated and the second round's trees are kept (bench/out)")
    ap.add_argument("--changes", action="store_true",
                    help="then a second round: files removed and rewritten, merged, vectors")
    a = ap.parse_args(argv)
    global OUT
    OUT = a.out
    os.environ.setdefault("LNKMEM_WORKER", "0")
    sys.path.insert(0, ROOT)
    if a.index:
        tables = table_digests(a.index)
        what = f"index {a.index}"
    else:
        if a.corpus is not None:
            sys.path.insert(0, HERE)
            import corpus

            out = os.path.join(OUT, f"digest-{a.corpus:g}")
            corpus.generate(out, scale=a.corpus, seed=7, log=lambda *x: print(*x, file=sys.stderr))
            a.home, a.agent = os.path.join(out, "home"), os.path.join(out, "agent")
        if not a.home:
            ap.error("give HOME (and AGENT), --corpus SCALE or --index FOLDER")
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "index")
            n = build_index(a.home, a.agent, folder, tmp)
            show(f"built from {a.home}" + (f" + {a.agent}" if a.agent else "") + f": {n} files",
                 table_digests(folder))
            if a.changes:
                home, agent, removed, rewritten = changed_tree(a.home, a.agent)
                n = build_index(home, agent, folder, tmp)
                show(f"round two ({home}): {removed} files removed, {rewritten} rewritten: "
                     f"{n} files indexed", table_digests(folder))
                v = merge_and_embed(folder)
                show(f"merged whole, {v} vectors", table_digests(folder))
        return 0
    show(what, tables)
    return 0


def show(what: str, tables: dict[str, tuple[int, str]]) -> None:
    print(what)
    for name in TABLES:
        count, digest = tables[name]
        print(f"{name:<12} {count:>9} {digest}")
    print(f"{'index':<12} {'':>9} {whole_digest(tables)}")


if __name__ == "__main__":
    sys.exit(main())
