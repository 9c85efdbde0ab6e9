"""A fake files bridge: Home in a bucket, and team folders (PROTOCOL.md §8.1, §8.2).

    python -m fakes.files_bridge --unix PATH --root DIR --config FILE [--log FILE] [fault flags]

Config: see ``fakes.bridge``. Authentication: ``Link-Binding``, purpose ``files``.

- An agent's Home is ``<root>/homes/<agent>/``; a team folder is
  ``<root>/<folder>`` of the team whose ``names`` give the agent that name.
- ``POST /v1/bind`` -> ``{"owner", "agent"}``.
- ``GET /v1/list?path=<dir>[&folder=<named>]`` -> ``{"entries": [{"path",
  "size", "version", "modified"}]}``: every file below ``<dir>`` (``""`` or
  absent: all), recursive, paths relative to the folder's root, sorted;
  ``version`` is the ETag without its quotes, ``modified`` RFC 3339 UTC.
- ``GET|HEAD /v1/read?path=<p>[&folder=<named>]`` -> the bytes with ``ETag``;
  304 for a matching ``If-None-Match``.
- ``PUT /v1/write?path=<p>`` (body: the bytes) -> 200 ``{"version", "size"}``
  with ``ETag``; ``DELETE /v1/write?path=<p>`` -> 204. Home only, and only
  ``memory/lnkmem/...`` and ``memory/notes.md``: anything else 403. ``If-Match: "<version>"`` must
  name the current version, ``If-None-Match: *`` creates only; else 412.
- Team folders: members (granted ``all`` or ``part``) may list and read;
  anyone else 403. Writes to a team folder: 403.
- A path with ``..``, ``.``, an empty segment or a leading ``/``: 400.
  Missing: 404. Errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import sys

from fakes import bridge
from fakes.http import HttpError, Request, Response, json_response
from fakes.store import Tree, clean_path, not_modified

WRITABLE = "memory/lnkmem/"
NOTES = "memory/notes.md"  # the notes through the files bridge (§5.4 rev. 2)


class FilesBridge(bridge.Bridge):
    purpose = "files"

    def route(self, req: Request, agent: str) -> Response:
        if req.path == "/v1/list":
            self._method(req, "GET")
            tree = self._folder(req, agent)
            return json_response({"entries": tree.entries(clean_path(req.query.get("path", ""), allow_empty=True))})
        if req.path == "/v1/read":
            self._method(req, "GET", "HEAD")
            data, version = self._folder(req, agent).read(self._path(req))
            if not_modified(version, req.header("if-none-match")):
                return bridge.versioned(b"", version, 304)
            return bridge.versioned(data, version)
        if req.path == "/v1/write":
            self._method(req, "PUT", "DELETE")
            path = self._path(req)
            if "folder" in req.query:
                raise HttpError(403, "only Home is written")
            if not path.startswith(WRITABLE) and path != NOTES:
                raise HttpError(403, f"only {WRITABLE}* and {NOTES} are written")
            home = self._home(agent)
            if req.method == "DELETE":
                home.delete(path, req.header("if-match"), req.header("if-none-match"))
                return Response(204)
            version, _ = home.write(path, req.body, req.header("if-match"), req.header("if-none-match"))
            return bridge.written(version, len(req.body))
        raise HttpError(404, "not found")

    @staticmethod
    def _method(req: Request, *allowed: str) -> None:
        if req.method not in allowed:
            raise HttpError(405, f"use {' or '.join(allowed)}")

    @staticmethod
    def _path(req: Request) -> str:
        if "path" not in req.query:
            raise HttpError(400, "path is required")
        return clean_path(req.query["path"])

    def _home(self, agent: str) -> Tree:
        return self.tree("homes", agent)

    def _folder(self, req: Request, agent: str) -> Tree:
        named = req.query.get("folder")
        if named is None:
            return self._home(agent)
        return self.tree(self.team_by_name(named, agent).folder)


def main(argv: list[str] | None = None) -> int:
    return bridge.main(FilesBridge, "python -m fakes.files_bridge", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
