"""Places behind Link's bridges: a folder through the files bridge (§8.2) and
a collection of the storage bridge (§8.3). Both implement the place interface
(list, stat, read, listdir) and, where the engine may write, conditional
``write``/``delete``."""

from __future__ import annotations

import hashlib
import threading
from typing import Optional

import msgspec

from lnkmem.bridges.http import (Body, BridgeClient, BridgeDown, Chunks, Unanswered, bridge_url, check, etag, quote,
                                 unquote)
from lnkmem.bridges.place import MAX_FILE, Conflict, Entry, Forbidden, NotFound, PlaceBase, check_relpath
from lnkmem.bridges.ignore import MAX_BYTES as IGNORE_MAX_BYTES
from lnkmem.bridges.ignore import NAMES as IGNORE_NAMES
from lnkmem.bridges.ignore import Listed, parse as parse_ignore


class _FileEntry(msgspec.Struct):
    path: str
    size: int
    version: str
    modified: Optional[str] = None


class _FileList(msgspec.Struct):
    entries: list[_FileEntry]


class _CollEntry(msgspec.Struct):
    name: str
    size: int
    version: str


class _CollList(msgspec.Struct):
    entries: list[_CollEntry]


# the bridges' list answers, decoded into their Structs (what `listing_entries` reads)
files_listing = msgspec.json.Decoder(_FileList)
collection_listing = msgspec.json.Decoder(_CollList)


def _hidden(path: str) -> bool:
    return any(p.startswith(".") for p in path.split("/"))


def _unclean(path: str) -> bool:
    """A name from a bridge that is no clean relative path ('..', '/x', 'a//b', NUL)."""
    try:
        return not path or check_relpath(path) != path
    except Forbidden:
        return True


def listing_entries(decoder, r, what: str):
    """A list answer's entries; BridgeDown when the bridge answered something else."""
    try:
        return decoder.decode(r.content).entries
    except msgspec.DecodeError as e:  # a ValidationError is one too
        raise BridgeDown(f"{what}: the bridge's answer is not understood ({e})") from None


def _children(entries: list[Entry], base: str) -> list[tuple[str, str, int]]:
    """Direct children of ``base`` among recursive entries (for `list`)."""
    pre = base + "/" if base else ""
    seen: dict[str, tuple[str, int]] = {}
    for e in entries:
        if not e.path.startswith(pre):
            continue
        rest = e.path[len(pre):]
        name, sep, _ = rest.partition("/")
        if sep:
            seen.setdefault(name, ("folder", 0))
        else:
            seen[name] = ("file", e.size)
    return [(n, k, s) for n, (k, s) in sorted(seen.items())]


class _BridgePlace(PlaceBase):
    """What both remote places share: paths below ``root``, `stat`/`listdir`
    from the recursive listing, and reads and conditional writes of one file
    through ``_send(method, full path, headers, body)``."""

    client: BridgeClient
    root: str = ""

    @property
    def moved(self) -> int:
        """Bytes moved through this place's bridge client so far (progress, for waiters)."""
        return self.client.moved

    def _full(self, path: str) -> str:
        path = check_relpath(path)
        return f"{self.root}/{path}" if self.root and path else (self.root or path)

    def _send(self, method: str, full: str, headers: dict, content: Optional[Body] = None):
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[Entry]:
        raise NotImplementedError

    def stat(self, path: str) -> Optional[Entry]:
        for e in self.list(path):
            if e.path == check_relpath(path):
                return e
        return None

    def listdir(self, path: str) -> list[tuple[str, str, int]]:
        rel = check_relpath(path)
        kids = _children(self.list(rel) if rel else self.list(), rel)
        if rel and not kids:
            raise NotFound(path)
        return kids

    def get(self, path: str, if_none_match: Optional[str] = None) -> tuple[Optional[bytes], str]:
        """(bytes, version), or (None, version) when unchanged since ``if_none_match``."""
        full = self._full(path)
        h = {"If-None-Match": quote(if_none_match)} if if_none_match else {}
        r = check(self._send("GET", full, h), f"read {full}")
        if r.status_code == 304:
            return None, if_none_match or ""
        return r.content, unquote(etag(r))

    def read(self, path: str) -> tuple[bytes, str]:
        data, version = self.get(path)
        return data, version

    def write(self, path: str, data: Chunks, expect: Optional[str], length: Optional[int] = None) -> str:
        """Write if the file is still at ``expect`` (None: only if it does not exist); the new
        version. ``data``: bytes, or chunks of ``length`` bytes in all, sent in pieces (http.Body).

        A write whose answer was lost (Unanswered: it may have been done) is checked
        before anything else is concluded (§7.3 rev. 3): the file still at ``expect`` was
        not written and is written again; the file holding exactly these bytes was written
        (by this request): its version is the answer; anything else is a Conflict."""
        full = self._full(path)
        h = {"If-Match": quote(expect)} if expect else {"If-None-Match": "*"}
        body = Body(data, length)
        try:
            for _ in range(5):
                try:
                    return unquote(etag(check(self._send("PUT", full, h, body), f"write {full}")))
                except Unanswered:
                    if not body.replayable:
                        raise
                    version = self._written(path, body, expect)
                    if version is not None:
                        return version
            raise BridgeDown(f"write {full}: the bridge kept losing its answers")
        finally:
            body.release()  # (http.Body.release: what outlives the request no longer holds the data)

    def _written(self, path: str, body: Body, expect: Optional[str]) -> Optional[str]:
        """After a lost answer: the version when the file holds ``body`` now; None when it is
        as before the write (not done: send it again); Conflict when another version is there."""
        try:
            there, version = self.get(path, expect)
        except NotFound:
            if expect is None:
                return None  # create-only, and nothing there: not done
            raise Conflict(f"write {self._full(path)}: the file is gone") from None
        if there is None:  # 304: still the version expected
            return None
        if hashlib.sha256(there).digest() == body.digest():
            return version
        raise Conflict(f"write {self._full(path)}")

    def delete(self, path: str, expect: Optional[str] = None) -> None:
        """Delete (if still at ``expect``). A delete whose answer was lost is sent once more:
        its answer says what is there (gone: done; another version: Conflict)."""
        full = self._full(path)
        h = {"If-Match": quote(expect)} if expect else {}
        for last in (False, True):
            try:
                check(self._send("DELETE", full, h), f"delete {full}")
                return
            except NotFound:
                return
            except Unanswered:
                if last:
                    raise


class FilesPlace(_BridgePlace):
    """A folder through the files bridge: the agent's Home, or a team folder
    (``folder=<named>``), optionally only below ``root`` (e.g. ``memory``)."""

    def __init__(self, client: BridgeClient, folder: Optional[str] = None, root: str = "",
                 exclude: tuple[str, ...] = (), ignore: bool = False):
        self.client = client
        self.folder = folder
        self.root = root.strip("/")
        self.exclude = tuple(e.strip("/") for e in exclude)
        self.skipped = 0
        # ignore files (§3.2 rev. 2; Home only), read through the bridge as a listing
        # shows them: their rules by path (with the version read), the folders holding
        # pyvenv.cfg; ``ignore`` decides with what the last listings showed
        self._ignoring = ignore
        self._ignore_rules: dict[str, tuple[str, tuple]] = {}
        self._venvs: set[str] = set()
        self._ignore_lock = threading.Lock()
        self.ignore: Optional[Listed] = Listed({}) if ignore else None

    def _url(self, route: str, path: str, folder: Optional[str] = None) -> str:
        """``/v1/<route>?path=<path>[&folder=<folder>]`` (§8.2), percent-encoded (http.bridge_url)."""
        return bridge_url("v1", route, query={"path": path, "folder": folder or None})

    def _excluded(self, rel: str) -> bool:
        return any(rel == e or rel.startswith(e + "/") for e in self.exclude)

    def list(self, prefix: str = "") -> list[Entry]:
        prefix = check_relpath(prefix)
        out = self._list(prefix)
        if prefix and not out and "/" in prefix:  # a file's path: look in its folder
            out = [e for e in self._list(prefix.rsplit("/", 1)[0]) if e.path == prefix]
        elif prefix and not out:
            out = [e for e in self._list("") if e.path == prefix]
        return out

    def _list(self, prefix: str) -> list[Entry]:
        full = self._full(prefix)
        r = check(self.client.request("GET", self._url("list", full, self.folder)), f"list {full}")
        cut = len(self.root) + 1 if self.root else 0
        listed = []
        for e in listing_entries(files_listing, r, f"list {full}"):
            if self.root and not e.path.startswith(self.root + "/"):
                continue
            listed.append((e.path[cut:] if cut else e.path, e))
        ignorer = self._learn_ignores(prefix, listed) if self._ignoring else None
        memo: dict = {}
        out = []
        self.skipped = 0
        for rel, e in listed:
            if _hidden(rel) or self._excluded(rel) or _unclean(rel):
                continue
            if e.size > MAX_FILE:
                self.skipped += 1
                continue
            if full and prefix and not (e.path == full or e.path.startswith(full + "/")):
                continue
            if ignorer is not None and ignorer.ignored(rel, False, memo):
                self.skipped += 1
                continue
            out.append(Entry(rel, e.size, e.version, e.modified or ""))
        return out

    def _learn_ignores(self, prefix: str, listed: list) -> Listed:
        """The ignore rules in force after a listing of ``prefix``: the ignore files
        it shows (read through the bridge when their version changed), those of the
        folders above it (asked for by name, conditionally: not in this listing),
        and the virtual environments it shows; what the listing no longer shows
        below ``prefix`` is forgotten."""
        found: dict[str, tuple[str, int]] = {}
        venvs: set[str] = set()
        for rel, e in listed:
            if _unclean(rel) or self._excluded(rel):
                continue
            folder, _, name = rel.rpartition("/")
            if folder and (_hidden(folder) or self._excluded(folder)):
                continue
            if name in IGNORE_NAMES:
                found[rel] = (e.version, e.size)
            elif name == "pyvenv.cfg" and folder:
                venvs.add(folder)
        parts = prefix.split("/") if prefix else []
        above = ["/".join(parts[:i]) for i in range(len(parts))]  # "" and each folder above prefix
        with self._ignore_lock:
            rules = self._ignore_rules
            for path in [p for p in rules if not prefix or p.startswith(prefix + "/")]:
                if path not in found:
                    del rules[path]
            for path, (version, size) in found.items():
                got = rules.get(path)
                if got is not None and got[0] == version:
                    continue
                rules.pop(path, None)
                if size > MAX_FILE:  # never read whole; as though absent
                    continue
                try:
                    data, version = self.get(path)
                except NotFound:
                    continue
                rules[path] = (version, parse_ignore((data or b"")[:IGNORE_MAX_BYTES].decode("utf-8", "replace")))
            for folder in above:
                for name in IGNORE_NAMES:
                    path = f"{folder}/{name}" if folder else name
                    got = rules.get(path)
                    try:
                        data, version = self.get(path, got[0] if got else None)
                    except (NotFound, Forbidden):
                        rules.pop(path, None)
                        continue
                    if data is not None:
                        rules[path] = (version, parse_ignore(data[:IGNORE_MAX_BYTES].decode("utf-8", "replace")))
            self._venvs = {v for v in self._venvs if prefix and not v.startswith(prefix + "/") and v != prefix} | venvs
            self.ignore = Listed({p: r for p, (_, r) in rules.items()}, frozenset(self._venvs))
            return self.ignore

    def read(self, path: str) -> tuple[bytes, str]:
        if _hidden(path) or self._excluded(check_relpath(path)):
            raise NotFound(path)
        return super().read(path)

    def _send(self, method: str, full: str, headers: dict, content: Optional[Body] = None):
        if method == "GET":
            return self.client.request("GET", self._url("read", full, self.folder), headers=headers)
        # writes: Home only, for the copy under memory/lnkmem/
        return self.client.request(method, self._url("write", full), content=content, headers=headers)


class Collection(_BridgePlace):
    """A collection of the storage bridge (``conversations``, ``memory``), or a
    team's (``/v1/teams/<id>/c/...``), optionally only below ``root``."""

    def __init__(self, client: BridgeClient, name: str, team: Optional[str] = None, root: str = ""):
        self.client = client
        self.base = ("v1", "teams", team, "c", name) if team else ("v1", "c", name)  # segments (http.bridge_url)
        self.where = f"/v1/teams/{team}/c/{name}" if team else f"/v1/c/{name}"  # for messages
        self.root = root.strip("/")
        self.skipped = 0

    def list(self, prefix: str = "") -> list[Entry]:
        prefix = check_relpath(prefix)
        full = self._full(prefix)
        r = check(self.client.request("GET", bridge_url(*self.base, query={"prefix": full})), f"list {self.where}")
        cut = len(self.root) + 1 if self.root else 0
        out = []
        for e in listing_entries(collection_listing, r, f"list {self.where}"):
            if self.root and not e.name.startswith(self.root + "/"):
                continue
            rel = e.name[cut:]
            if _hidden(rel) or e.size > MAX_FILE or _unclean(rel):
                continue
            if prefix and not (rel == prefix or rel.startswith(prefix.rstrip("/") + "/")):
                continue
            out.append(Entry(rel, e.size, e.version))
        return out

    def _send(self, method: str, full: str, headers: dict, content: Optional[Body] = None):
        return self.client.request(method, bridge_url(*self.base, name=full), content=content, headers=headers)
