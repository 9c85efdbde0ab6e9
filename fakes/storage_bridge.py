"""A fake storage bridge: conversations, notes and index copies (PROTOCOL.md §8.1, §8.3).

    python -m fakes.storage_bridge --unix PATH --root DIR --config FILE [--log FILE] [fault flags]

Config: see ``fakes.bridge``. Authentication: ``Link-Binding``, purpose ``storage``.

- An agent's collection is ``<root>/stores/<agent>/<collection>/``; a team's
  copy is ``<root>/teams/<team id>/memory/``. Use a root of its own, not the
  files bridge's.
- ``POST /v1/bind`` -> ``{"owner", "agent"}``.
- ``GET /v1/c/<collection>?prefix=<p>`` -> ``{"entries": [{"name", "size",
  "version"}]}``, sorted, names starting with ``<p>`` (a plain string prefix);
  ``version`` is the ETag without its quotes.
- ``GET|HEAD /v1/c/<collection>/<name>`` -> the bytes with ``ETag``; 304 for a
  matching ``If-None-Match``. Names may hold ``/``.
- ``PUT /v1/c/<collection>/<name>`` -> 200 ``{"version", "size"}`` with
  ``ETag``; ``DELETE`` -> 204; conditional as in ``fakes.files_bridge``.
- Collections: ``conversations`` (read-only: writes 403) and ``memory``
  (writes only to ``lnkmem/...`` and ``notes.md``: else 403). Others: 404.
- ``/v1/teams/<team id>/c/memory[/<name>]``: the same verbs on the team's
  copy, writes only to ``lnkmem/...``; 403 for an agent that is not a member
  or is granted only ``part`` of the team folder.
"""

from __future__ import annotations

import sys

from fakes import bridge
from fakes.http import HttpError, Request, Response, json_response
from fakes.store import Tree, clean_path, not_modified

COLLECTIONS = ("conversations", "memory")


class StorageBridge(bridge.Bridge):
    purpose = "storage"

    def route(self, req: Request, agent: str) -> Response:
        parts = req.path.split("/")
        if parts[:3] == ["", "v1", "c"] and len(parts) >= 4:
            collection, rest = parts[3], parts[4:]
            team = None
        elif parts[:3] == ["", "v1", "teams"] and len(parts) >= 6 and parts[4] == "c":
            team, collection, rest = parts[3], parts[5], parts[6:]
        else:
            raise HttpError(404, "not found")
        if collection not in COLLECTIONS or (team is not None and collection != "memory"):
            raise HttpError(404, f"no collection {collection!r}")
        if team is not None:
            if self.team_by_id(team, agent).grant != "all":
                raise HttpError(403, "the agent is not granted all of the team folder")
            tree = self.tree("teams", team, collection)
        else:
            tree = self.tree("stores", agent, collection)
        name = "/".join(rest)
        if not name:
            return self._list(req, tree)
        return self._object(req, tree, collection, clean_path(name), team is not None)

    @staticmethod
    def _list(req: Request, tree: Tree) -> Response:
        if req.method not in ("GET", "HEAD"):
            raise HttpError(405, "use GET to list")
        prefix = req.query.get("prefix", "")
        entries = [e for e in tree.entries(name_key="name", modified=False) if e["name"].startswith(prefix)]
        return json_response({"entries": entries})

    @staticmethod
    def _object(req: Request, tree: Tree, collection: str, name: str, team: bool) -> Response:
        if req.method in ("GET", "HEAD"):
            data, version = tree.read(name)
            if not_modified(version, req.header("if-none-match")):
                return bridge.versioned(b"", version, 304)
            return bridge.versioned(data, version)
        if req.method not in ("PUT", "DELETE"):
            raise HttpError(405, "use GET, PUT or DELETE")
        if collection == "conversations":
            raise HttpError(403, "conversations are read-only")
        if not (name.startswith("lnkmem/") or (name == "notes.md" and not team)):
            raise HttpError(403, "only lnkmem/* and notes.md of memory are written")
        if req.method == "DELETE":
            tree.delete(name, req.header("if-match"), req.header("if-none-match"))
            return Response(204)
        version, _ = tree.write(name, req.body, req.header("if-match"), req.header("if-none-match"))
        return bridge.written(version, len(req.body))


def main(argv: list[str] | None = None) -> int:
    return bridge.main(StorageBridge, "python -m fakes.storage_bridge", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
