"""`lnk-lnkmem status`: what the index holds, how fresh it is, who is building it. Changes nothing."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

from lnkmem.cli.common import agent_of, building_pid, emit, is_terminal, open_config, plural, visible

DEFAULT_SKIPS = ["node_modules/", "__pycache__/", ".git/", "virtual environments (a folder holding pyvenv.cfg)",
                 "hidden files and folders"]


def _walk(folder: str):
    """os.walk's (folder, its folders, its files), top down, in a loop: os.walk recurses
    (Python 3.11), and a Home 1,500 folders deep was a RecursionError. The caller may
    prune the folders list, as os.walk's."""
    todo = [folder]
    while todo:
        here = todo.pop()
        try:
            with os.scandir(here) as it:
                entries = list(it)
        except OSError:
            continue
        dirs, files, links = [], [], set()
        for e in entries:
            try:
                is_dir = e.is_dir()
                if is_dir and e.is_symlink():
                    links.add(e.name)  # listed as a folder, never walked into (os.walk's default)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e.name)
        yield here, dirs, files
        todo.extend(os.path.join(here, d) for d in reversed(dirs) if d not in links)


def ignore_files(folder: str, limit: int = 200) -> list[str]:
    """The .gitignore and .lnkmemignore files in Home (paths relative to it)."""
    found: list[str] = []
    for root, dirs, files in _walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__")
                         and not os.path.exists(os.path.join(root, d, "pyvenv.cfg")))
        for name in (".gitignore", ".lnkmemignore"):
            if name in files:
                found.append(os.path.relpath(os.path.join(root, name), folder))
                if len(found) >= limit:
                    return found
    return found


def disk_bytes(path: str) -> int:
    """Bytes a file or folder takes on disk (allocated blocks: a sparse LMDB map
    counts as what it uses, not its map size)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for root, _, files in _walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _rfc3339(t: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def gather_status(cfg) -> dict:
    from lnkmem.memory.layout import local_layout
    from lnkmem.core.errors import DamagedIndex
    from lnkmem.index.build import indexer
    from lnkmem.index.format import SOURCES
    from lnkmem.index.store import Store
    index_path = os.path.join(cfg.state, "index")
    data = os.path.join(index_path, "data.mdb")
    pid = building_pid(cfg.state) if os.path.isdir(cfg.state) else None
    out: dict = {"folder": cfg.folder, "state": cfg.state, "agent": cfg.agent, "indexed": False,
                 "building": {"pid": pid} if pid else None}
    layout = local_layout(cfg, create=False)
    from lnkmem.cli.notes_history import listing
    out["notes_history"] = listing(cfg.state)  # §2.2 rev. 3: the notes' kept versions
    out["sources"] = {s: {"files": 0, "passages": 0, "bytes": 0} for s in SOURCES if s in layout.places}
    out.update(files=0, passages=0, by_kind={}, index_bytes=0, last_change=None, pending=None, damaged=None)
    model = {"name": cfg.spec.model, "served": bool(cfg.model_url), "vectors_of": None, "embedded": 0}
    out["model"] = model
    if os.path.exists(data):
        try:
            store = Store(index_path)
        except DamagedIndex as e:
            out["damaged"] = f"{e}; the next index or serve rebuilds it"
            store = None
        except Exception as e:  # lmdb's own errors: the same, said plainly
            out["damaged"] = f"{type(e).__name__}: {e}; the next index or serve rebuilds it"
            store = None
        if store is not None:
            try:
                out["indexed"] = True
                recs = store.all_files()
                by = out["sources"]
                kinds: dict[str, int] = {}
                for ref, rec in recs.items():
                    s = by.setdefault(ref.split("/", 1)[0], {"files": 0, "passages": 0, "bytes": 0})
                    s["files"] += 1
                    s["passages"] += len(rec.pids)
                    s["bytes"] += rec.size
                    if rec.kind != "text":
                        kinds[rec.kind] = kinds.get(rec.kind, 0) + 1
                out["files"] = len(recs)
                out["passages"] = store.snapshot.live
                out["by_kind"] = kinds  # files indexed by name only, binary files
                model["embedded"] = store.vector_count()
                model["vectors_of"] = store.vector_model()
                out["last_change"] = _rfc3339(os.stat(data).st_mtime)
                plan = indexer.plan(store, layout.places)
                out["pending"] = {"changed": len(plan.todo), "removed": len(plan.removed)}
            finally:
                store.close()
        out["index_bytes"] = disk_bytes(index_path)
    out["copy"] = _writeback(cfg.state)
    out["watch"], out["moved_aside"] = _watch_and_moved(layout.state_fd)
    out["ignore_files"] = ignore_files(cfg.folder)
    out["skipped_by_default"] = DEFAULT_SKIPS
    return out


def _watch_and_moved(state_fd: Optional[int]) -> tuple[Optional[dict], list[str]]:
    """The watch's state as a serve left it (each folder: watched, polling or re-arming;
    the serve's pid), and what was found in <state> in a wrong shape and moved aside."""
    from lnkmem.core import atomic
    from lnkmem.memory.watch import WATCH_FILE
    if state_fd is None:
        return None, []
    watch = None
    try:
        watch = json.loads(atomic.read_at(state_fd, WATCH_FILE, 1 << 20) or b"null")
    except ValueError:
        pass
    if not (isinstance(watch, dict) and isinstance(watch.get("folders"), dict)):
        watch = None
    return watch, atomic.moved_names(state_fd)


def _writeback(state: str) -> Optional[dict]:
    """The write-back's state of this agent's bound cache (`serve-many` writes it), or None."""
    from lnkmem.replica.sync import StateFile
    return StateFile(os.path.join(state, "bound")).read()


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def render_status(st: dict) -> str:
    lines = [f"Home    {st['folder']}", f"agent   {st['agent'] or '(none)'}", f"state   {st['state']}"]
    if st.get("damaged"):
        lines.append(f"index   damaged: {st['damaged']}")
    elif not st["indexed"]:
        lines.append("index   not built yet (run: lnk-lnkmem index ...)")
    else:
        lines.append(f"index   {plural(st['files'], 'file')}, {plural(st['passages'], 'passage')}, "
                     f"{_human(st['index_bytes'])} on disk, last changed {st['last_change']}")
        for s, v in st["sources"].items():
            lines.append(f"  {s:<7} {plural(v['files'], 'file')}, {plural(v['passages'], 'passage')}, {_human(v['bytes'])} of text")
        kinds = st.get("by_kind") or {}
        if kinds:
            lines.append("  " + ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items())) + " (indexed by name or not at all)")
        p = st["pending"]
        if p and (p["changed"] or p["removed"]):
            lines.append(f"pending {p['changed']:,} new or changed, {p['removed']:,} removed since the last index "
                         "(run index, or a running serve catches up)")
        else:
            lines.append("pending nothing: the index matches the files")
    m = st["model"]
    if m["name"] or m["vectors_of"]:
        served = "served" if m["served"] else "not served now ($LNK_MEMORY_MODEL is empty)"
        lines.append(f"model   {m['name'] or m['vectors_of']} ({served}); {m['embedded']:,} of "
                     f"{plural(st['passages'], 'passage')} embedded")
    else:
        lines.append("model   none: ranked by words only")
    kept = st.get("notes_history") or []
    if kept:
        lines.append(f"notes   {plural(len(kept), 'earlier version')} kept (newest {kept[0]['at']}, {kept[0]['why']}); "
                     f"list, print or restore: lnk-lnkmem notes-history {st['state']}")
    else:
        lines.append("notes   no earlier versions kept")
    b = st["building"]
    if b:
        lines.append(f"build   process {b['pid']} is building this index now" if b["pid"] > 0
                     else "build   another process is building this index now")
    else:
        lines.append("build   no other process is building it")
    wb = st.get("copy")
    if wb:
        alive = _alive(wb.get("pid"))
        lines.append(f"copy    write-back {wb.get('state')} since {wb.get('since')}, {wb.get('writes', 0):,} written"
                     + (f"; {wb['error']}" if wb.get("error") else "")
                     + ("" if alive else f" (as process {wb.get('pid')} left it; it has ended)"))
    w = st.get("watch")
    if w:
        gone = "" if _alive(w.get("pid")) else f" (as process {w.get('pid')} left it; it has ended)"
        for folder, state in w["folders"].items():
            lines.append(f"watch   {folder}: {state}{gone}")
    else:
        lines.append("watch   no serve has watched these folders yet")
    moved = st.get("moved_aside") or []
    if moved:
        lines.append(f"aside   {plural(len(moved), 'thing')} found in a wrong shape in {st['state']} and moved aside "
                     f"(never followed; the newest two of a name kept): " + ", ".join(moved))
    ig = st["ignore_files"]
    lines.append("ignore  " + (", ".join(ig) if ig else "no .gitignore or .lnkmemignore in Home"))
    lines.append("        always skipped: " + ", ".join(st["skipped_by_default"]))
    return "\n".join(lines) + "\n"


def cmd_status(args) -> int:
    cfg = open_config(args.folder, args.state, agent_of(args), create_state=False)
    st = gather_status(cfg)
    if args.json:
        emit(json.dumps(st, ensure_ascii=False) + "\n")
    else:  # names from Home shown, never obeyed, on a terminal
        text = render_status(st)
        emit(visible(text) if is_terminal(sys.stdout) else text)
    return 0
