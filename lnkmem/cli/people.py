"""`index` and `search` for people (PROTOCOL.md §1.5), and what the people commands share.

They use the same engine as `serve`: `search` calls the MCP search tool's own
function with an arguments dict, so every filter the tool takes is a flag here.
Output fits where it goes: a bar and colours on a terminal only (stderr for the
bar, ``NO_COLOR`` respected), plain text in a pipe, one JSON document with
``--json``. Every bad path or value is one line on stderr and exit 2.
The engine, numpy and tqdm are imported inside the commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Optional

from lnkmem.cli.common import (PROG, BuildLock, agent_of, emit, is_terminal,
                               open_config, plural, use_colour, visible)
from lnkmem.core.errors import UsageError
from lnkmem.core.knobs import knobs

NO_CUT_TOKENS = 1_000_000  # the spec's largest budget: a person's search is not cut
MERGE_SAY_S = 0.3


@contextlib.contextmanager
def _when_slow(say, name: str):
    """Call ``say(name)`` if the block is still running after MERGE_SAY_S (a
    phase named only when it takes a while)."""
    timer = threading.Timer(MERGE_SAY_S, say, (name,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# --- index ---------------------------------------------------------------------------

class Run:
    """One pass bringing the index in step with its sources, phase by phase, for a person."""

    def __init__(self, memory, bar, listing=None):
        self.memory = memory
        self.bar = bar
        self.listing = listing  # called as the listing of the places begins
        self.stop = False
        self.stoppable = False  # Ctrl-C: stop between files (True) or at once (False)
        self.plan = None
        self.done = 0
        self.skipped: dict[str, int] = {}
        self.indexed = self.removed = self.unchanged = 0
        self.embedded: Optional[tuple[int, int]] = None
        self.embed_note = ""

    def on_sigint(self, signum, frame) -> None:
        if self.stop or not self.stoppable:
            raise KeyboardInterrupt
        self.stop = True

    def files(self) -> None:
        from lnkmem.index.build import indexer
        memory, store = self.memory, self.memory.store
        self.bar.phase("listing")
        if self.listing is not None:
            self.listing()
        self.plan = plan = indexer.plan(store, memory.places)
        for place in memory.places.values():
            for why, n in place.skipped_by.items():
                self.skipped[why] = self.skipped.get(why, 0) + n
        self.unchanged = plan.listed - len(plan.todo)
        if plan.total:
            self.bar.phase("reading", total=plan.total)
        else:  # nothing to read: the bar ends on what was looked at
            self.bar.phase("listed", total=plan.listed)
            self.bar.update(plan.listed)
        merge = store.maybe_merge

        def merging(*a, **kw):  # build merges once at its end: say so, and skip it when stopped
            if self.stop:
                return False
            self.stoppable = False
            # named only when it takes a while: most passes find nothing to merge
            with _when_slow(self.bar.phase, "merging"):
                return merge(*a, **kw)

        commit = store.commit

        def writing(*a, **kw):  # a batch written (and the snapshot reloaded): named when slow
            try:
                with _when_slow(self.bar.rename, "writing"):
                    return commit(*a, **kw)
            finally:
                if self.bar.name == "writing":
                    self.bar.rename("reading")

        store.maybe_merge, store.commit = merging, writing
        self.stoppable = True
        try:
            self.done = indexer.build(store, memory.places, plan, memory.tmpdir,
                                      self._reading, lambda: self.stop, merge=False)
        finally:
            del store.maybe_merge, store.commit  # the class's own again
            self.stoppable = False
        self._count_read(plan)
        self.removed = len(plan.removed)
        if plan.total and not self.stop:  # every file read: its entries let go of before the merge
            plan.todo = []  # (tens of MiB at 120k files; a stop now finds them all indexed)
            merging()

    def _count_read(self, plan) -> None:
        """What became of the files read: indexed, binary, or unreadable."""
        from lnkmem.index.build import indexer
        processed = [indexer.ref_of(src, e.path) for src, e in plan.todo[: self.done - len(plan.removed)]]
        kinds = self.memory.store.kinds_of(processed)  # those read only: a restart reads no other record
        for ref in processed:
            kind = kinds.get(ref)
            if kind is None:
                self.skipped["unreadable"] = self.skipped.get("unreadable", 0) + 1
            elif kind == "binary":
                self.skipped["binary"] = self.skipped.get("binary", 0) + 1
            else:
                self.indexed += 1

    def _reading(self, done: int, total: int) -> None:
        if self.bar.name in ("reading", "writing"):  # (build reports once more at its end)
            self.bar.update(done, total)

    def embed(self) -> None:
        """Vectors for every passage that has none (when a model is served), with the bar."""
        memory, store = self.memory, self.memory.store
        if memory.embedder is None or self.stop:
            return
        from lnkmem.bridges.embed import EmbeddingUnavailable
        store.use_vector_model(memory.embedder.model)
        memory.vindex.load(store)
        live = store.snapshot.live
        have = memory.vindex.count()
        self.bar.phase("embedding", total=max(live - have, 0), unit="passages")
        self.stoppable = True
        done = 0
        try:
            while not self.stop:
                todo = memory.vindex.missing(store.snapshot.alive, 256)
                passages = store.passages_of(todo)
                pids = [p for p, x in zip(todo, passages) if x is not None]
                if not pids:
                    break
                live_passages = [x for x in passages if x is not None]
                try:
                    vecs = memory.embedder.embed([x.text[:2000] for x in live_passages])
                except EmbeddingUnavailable as e:
                    self.embed_note = f"the model is not answering ({e}); serve or index again to finish embedding"
                    break
                stored = set(store.put_vectors(pids, vecs, live_passages))
                keep = [i for i, p in enumerate(pids) if p in stored]
                memory.vindex.add([pids[i] for i in keep], vecs[keep])
                done += len(keep)
                self.bar.update(done)
        finally:
            self.stoppable = False
            self.embedded = (memory.vindex.count(), store.snapshot.live)


def _skipped_text(skipped: dict[str, int]) -> str:
    total = sum(skipped.values())
    if not total:
        return "skipped 0"
    why = ", ".join(f"{n:,} {k}" for k, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"skipped {total:,} ({why})"


def _open_memory(cfg):
    from lnkmem.memory.memory import Memory
    memory = Memory(cfg)
    try:
        memory.store = memory.open_store()
    except OSError as e:
        raise UsageError(f"state: the index cannot be opened in {cfg.state} ({e.strerror or e})") from None
    except Exception as e:  # lmdb.Error and friends: a state folder LMDB cannot use
        raise UsageError(f"state: the index cannot be opened in {cfg.state} ({type(e).__name__}: {e})") from None
    return memory


def cmd_index(args) -> int:
    import signal
    from lnkmem.cli.progress import Bar
    cfg = open_config(args.folder, args.state, agent_of(args), create_state=True)
    lock = BuildLock(cfg.state)
    holder = lock.acquire()
    if holder is not None:
        who = f"process {holder}" if holder > 0 else "another process"
        raise UsageError(f"index: {who} is building this index now; run again when it has finished")
    from lnkmem.cli import warm
    from lnkmem.core.errors import DamagedIndex
    t0 = time.monotonic()
    # the tree's inodes read on the other core while the index is imported and opened (the
    # listing itself takes both cores past indexer.SHARED_LISTING files: the walk stops then)
    walk = warm.start([cfg.folder] + ([os.path.join(cfg.agent, "chats"), os.path.join(cfg.agent, "skills")]
                                      if cfg.agent else []))
    bar = Bar(sys.stderr)
    memory = None
    run = None
    failed: Optional[BaseException] = None  # the state folder failed under the run
    old = signal.getsignal(signal.SIGINT)
    try:
        memory = _open_memory(cfg)
        memory.store.leave_merged = True  # its close compacts: merged segments' postings dropped there
        run = Run(memory, bar, listing=lambda: warm.stop(walk))
        signal.signal(signal.SIGINT, run.on_sigint)
        try:
            run.files()
            run.embed()
        except KeyboardInterrupt:  # a second Ctrl-C, or one while listing or merging: at once
            run.stop = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the index is consistent; now only say so
        lines = _index_report(run, memory, time.monotonic() - t0)
    except KeyboardInterrupt:  # while opening the index
        lines = [f"{PROG}: stopped; the index is as it was, run again to finish"]
        run = None
    except (OSError, DamagedIndex) as e:  # removed, full or changed under it: said below, in one line
        failed = e
    finally:
        warm.stop(walk)
        signal.signal(signal.SIGINT, old)
        bar.close()
        try:
            if memory is not None and memory.store is not None:
                if memory.embedder is not None:
                    memory.embedder.close()
                # a build's merges leave free pages: compacted, unless it failed
                memory.store.close(compact=failed is None and run is not None and not run.stop)
            lock.release()
        except (OSError, DamagedIndex):
            if failed is None:
                raise
    if failed is not None:
        if not isinstance(failed, OSError):
            why = "its files changed or went away"
        elif failed.strerror and failed.filename:
            why = f"{failed.strerror}: {failed.filename}"
        else:
            why = str(failed)
        raise UsageError(f"state: indexing stopped, the index in {cfg.state} failed under it ({why}); "
                         "run again to finish") from None
    for line in lines:
        print(line, file=sys.stderr)
    return 130 if run is None or run.stop else 0


def _index_report(run: "Run", memory, took: float) -> list[str]:
    """What a person is told at the end, counted from the index itself when stopped."""
    store, plan = memory.store, run.plan
    n_files = store.file_count()
    if plan is None:
        return [f"{PROG}: stopped while listing; the index is as it was, run again to finish"]
    if run.stop and run.embedded is None:
        versions = store.file_versions()
        done = plan.listed - len(plan.todo) + sum(
            1 for src, e in plan.todo if versions.get(indexer_ref(src, e.path)) == (e.version, e.size))
        return [f"{PROG}: stopped; {done:,} of {plan.listed:,} files indexed, run again to finish"]
    lines = [f"indexed {plural(run.indexed, 'file')}, {run.unchanged:,} unchanged, {run.removed:,} removed, "
             f"{_skipped_text(run.skipped)}; the index holds {plural(n_files, 'file')} and "
             f"{plural(store.live_count(), 'passage')} ({took:.1f}s)"]
    if run.embedded is not None:
        done, total = run.embedded
        lines.append(f"embedded {done:,} of {plural(total, 'passage')} with {memory.embedder.model}"
                     + (f"; {run.embed_note}" if run.embed_note else ""))
        if run.stop:
            lines.append(f"{PROG}: stopped while embedding; every file is indexed, run again to embed the rest")
    return lines


def indexer_ref(source: str, path: str) -> str:
    from lnkmem.index.build.count import ref_of
    return ref_of(source, path)


# --- search --------------------------------------------------------------------------

def _search_arguments(args, query: str) -> dict:
    out: dict = {"query": query, "limit": args.limit}
    if args.sources:
        out["sources"] = [s.strip() for v in args.sources for s in v.split(",") if s.strip()]
    for key in ("under", "after", "before"):
        v = getattr(args, key)
        if v is not None:
            out[key] = v
    return out


def _split_query(args) -> tuple[Optional[str], str]:
    """(agent, query): the old form `search <folder> <state> <agent> QUERY` is still understood,
    but only for an existing folder; a mistyped one is refused, never searched for."""
    words = list(args.query)
    agent = args.agent
    if agent is None and len(words) > 1 and ("/" in words[0] or words[0] in (".", "..")):
        if os.path.isdir(words[0]):
            agent = words.pop(0)
        else:
            raise UsageError(f"agent folder does not exist: {words[0]} (give the agent folder with --agent; "
                             f"to search for a path, quote the whole query)")
    return agent, " ".join(words)


def cmd_search(args) -> int:
    import signal
    agent, query = _split_query(args)
    if args.budget is not None and not 1 <= args.budget <= NO_CUT_TOKENS:
        raise UsageError(f"--budget: {args.budget} is not a number of tokens from 1 to {NO_CUT_TOKENS:,}")
    from lnkmem.protocol import tooldefs
    from lnkmem.core.wire import SOURCES, convert
    arguments = _search_arguments(args, query)
    for s in arguments.get("sources", []):
        if s not in SOURCES:
            raise UsageError(f"search: --sources: {s!r} is not a source (choose from {', '.join(SOURCES)})")
    try:
        typed = convert(arguments, tooldefs.ARGS["search"])
    except ValueError as e:  # named as the tool names it; the flag is that name with --
        msg = str(e)
        key = msg.split(":", 1)[0].split("[", 1)[0]
        raise UsageError(f"search: {'--' if key in arguments and key != 'query' else ''}{msg}") from None
    cfg = open_config(args.folder, args.state, agent, create_state=True, tokens=args.budget or NO_CUT_TOKENS)
    from lnkmem.cli.progress import Bar
    from lnkmem.protocol import tools
    from lnkmem.core.errors import ToolError
    lock = BuildLock(cfg.state)
    holder = lock.acquire()
    memory = _open_memory(cfg)
    bar = Bar(sys.stderr, delay=knobs().bar_delay_s)  # a bar only for a slow refresh
    try:
        if holder is None:  # refresh quietly first: a bar only when that takes a while
            run = Run(memory, bar)
            old = signal.signal(signal.SIGINT, run.on_sigint)
            try:
                run.files()
            except KeyboardInterrupt:
                run.stop = True
            finally:
                signal.signal(signal.SIGINT, old)
                bar.close()
            if run.stop:
                print(f"{PROG}: stopped before searching; the index keeps what was read, run again to finish",
                      file=sys.stderr)
                return 130
        else:
            print(f"{PROG}: the index is being built by process {holder}; answering from what it holds so far",
                  file=sys.stderr)
            memory.store.refresh()
        lock.release()
        if memory.embedder is not None and memory.store.vector_model() == memory.embedder.model:
            memory.vindex.load(memory.store)  # rank by meaning too, with the vectors `index` made
        memory.opened.set()
        memory.ready.set()
        try:
            text, structured = tools.call(memory, "search", typed, None)
        except ToolError as e:
            raise UsageError(f"search: {e}") from None
    finally:
        bar.close()
        lock.release()
        if memory.embedder is not None:
            memory.embedder.close()
        memory.store.close()
    if args.json:
        emit(json.dumps(structured, ensure_ascii=False) + "\n")
    else:
        emit(render_hits(structured, query, colour=use_colour(sys.stdout), terminal=is_terminal(sys.stdout)))
    return 0


BOLD, MARK, DIM, RESET = "\x1b[1m", "\x1b[1;33m", "\x1b[2m", "\x1b[0m"

def _highlighter(query: str):
    """A function marking the words of a text that the query matches (stems and prefixes)."""
    import re
    from lnkmem.index.text import analyze
    terms: set[str] = set()
    prefixes: list[str] = []
    for tok in re.findall(r'"[^"]*"|\S+', query):
        if tok.startswith("-") and len(tok) > 1:
            continue  # excluded: never in a hit
        if tok.endswith("*") and not tok.startswith('"'):
            p = tok.rstrip("*").casefold()
            if p:
                prefixes.append(p)
            continue
        terms.update(analyze.query_terms(tok.strip('"')))
    word = re.compile(r"[^\W_]+", re.UNICODE)

    def matches(w: str) -> bool:
        low = w.casefold()
        if any(low.startswith(p) for p in prefixes):
            return True
        return any(t in terms for t in analyze.query_terms(w))

    def mark(text: str) -> str:
        return word.sub(lambda m: f"{MARK}{m.group(0)}{RESET}" if matches(m.group(0)) else m.group(0), text)

    return mark


def render_hits(result: dict, query: str, colour: bool, terminal: bool = False) -> str:
    """The hits as text; ``terminal``: control characters made visible, ``colour``: marked up."""
    hits = result.get("hits", [])
    how = result.get("ranked", "words").replace("+", " and ")
    extra = ""
    if result.get("indexing"):
        extra += f"; indexing {result['indexing']['done']}/{result['indexing']['total']}"
    if result.get("embedding"):
        extra += f"; embedded {result['embedding']['done']}/{result['embedding']['total']}"
    out = [f"{plural(len(hits), 'hit')} for {query!r} (ranked by {how}{extra})\n"]
    mark = _highlighter(query) if colour else (lambda t: t)
    safe = visible if terminal or colour else (lambda t: t)
    for i, h in enumerate(hits, 1):
        where = f"{h['ref']} lines {h['lines'][0]}-{h['lines'][1]}"
        if h.get("thread") is not None:
            bits = [f"thread {h['thread']}"] + [b for b in (h.get("role"), h.get("at")) if b]
            where += " (" + ", ".join(bits) + ")"
        score = f"score {h['score']:.3g}"
        where = safe(where)
        head = f"[{i}] {BOLD}{where}{RESET} {DIM}{score}{RESET}" if colour else f"[{i}] {where} {score}"
        body = mark(safe(h["text"].rstrip("\n")))
        out.append(f"\n{head}\n{body}\n")
    if result.get("truncated"):
        out.append("\n(cut to the budget; more with a larger --budget)\n")
    return "".join(out)
