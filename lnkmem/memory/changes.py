"""`changed` paths as Link names them (§5.6 rev. 2), and bursts of them coalesced.

Link names a change by a path in the agent's Home as the files bridge names
it (`docs/plan.md`), a conversation's name (`chats/<file>`) or
`memory/notes.md`; the engine's own refs (`home/docs/plan.md`) are understood
too. Such a path may mean more than one ref (a Home folder may be called
`chats`), so each path gives its candidates, all looked at; one naming
nothing known makes the engine list that path's folder again, and the
source's root when the folder is unknown too, so a change is never
acknowledged and then ignored. Many changes at once are looked at by folder:
a thousand files of a few folders cost a listing of those folders.
"""

from __future__ import annotations

from typing import Iterable

from lnkmem.bridges.place import Forbidden, check_relpath
from lnkmem.core.wire import SOURCES

NOTES_PATH = "memory/notes.md"
# this many changed refs in one folder: the folder is listed once instead. Behind a bridge a
# file is looked at by listing its folder anyway; a local folder is walked, so more are needed.
GROUP_AT, GROUP_AT_LOCAL = 2, 32


def clean(path: str) -> str:
    """The path as a clean relative path; ValueError saying why not. A leading
    `/` is read as Home's (or the agent's) root, as before revision 2."""
    try:
        p = check_relpath(path.lstrip("/") if isinstance(path, str) else path)
    except Forbidden as e:
        raise ValueError(str(e)) from None
    if not p:
        raise ValueError("path: names nothing (an empty path)")
    return p


def candidates(path: str, sources: Iterable[str]) -> list[str]:
    """The refs a clean Link path may mean, the likeliest first."""
    have = set(sources)
    out: list[str] = []
    first = path.split("/", 1)[0]
    if path == NOTES_PATH and "notes" in have:
        out.append("notes")
    if first in SOURCES and first in have and first != "home":  # chats/<file>, skills/..., notes
        out.append(path)
    if first == "home" and "home" in have:  # the engine's own ref
        out.append(path)
    if "home" in have:
        out.append(f"home/{path}")  # a path in Home as the files bridge names it
    seen: set[str] = set()
    return [r for r in out if not (r in seen or seen.add(r))]


def parent(ref: str) -> str:
    return ref.rsplit("/", 1)[0] if "/" in ref else ref


def coalesce(refs: Iterable[str], local: Iterable[str] = ()) -> list[str]:
    """Refs to look at: those of a folder with many changes become that folder;
    none inside another. ``local``: the sources read from local folders."""
    refs = set(refs)
    local = set(local)
    by_folder: dict[str, int] = {}
    for r in refs:
        if "/" in r:
            by_folder[parent(r)] = by_folder.get(parent(r), 0) + 1

    def many(folder: str) -> bool:
        return by_folder.get(folder, 0) >= (GROUP_AT_LOCAL if folder.split("/", 1)[0] in local else GROUP_AT)
    grouped = {parent(r) if "/" in r and many(parent(r)) else r for r in refs}
    out: list[str] = []
    for r in sorted(grouped, key=lambda r: (len(r), r)):  # outermost first; the same order every run
        if not any(r == o or r.startswith(o + "/") for o in out):
            out.append(r)
    return out


def known(store, ref: str) -> bool:
    """Whether the index holds ``ref`` or anything below it."""
    return any(r == ref or r.startswith(ref + "/") for r in store.file_versions(ref))
