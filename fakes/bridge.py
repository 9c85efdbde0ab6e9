"""What the files bridge and the storage bridge share (PROTOCOL.md §8.1).

Both are run as ``python -m fakes.<bridge> --unix PATH --root DIR --config FILE
[--log FILE] [fault flags]`` and read ``--config`` afresh on every request::

    {"bindings": {"<agent>": {"owner": "o1", "key": "<64 hex>"}},
     "teams": {"<team id>": {"folder": "<dir under root>",
                             "names": {"<agent>": "<name or account/name>"},
                             "grants": {"<agent>": "all" | "part"}}}}

A team's members are the agents in its ``names``; a member missing from
``grants`` is granted ``all``. A missing config file is ``{}`` (every request
401). Rewrite it atomically (write a temp file, rename it over) from tests.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fakes import auth
from fakes.http import HttpError, Request, Response, add_server_args, json_response, serve
from fakes.store import Tree, clean_path


@dataclass
class Team:
    id: str
    folder: str  # relative to the files bridge's root
    grant: str  # the asking agent's: "all" or "part"


class Bridge:
    """Authenticates each request for ``purpose``, then calls ``route``."""

    purpose = ""

    def __init__(self, root: str, config: str):
        self.root = Path(root).resolve()
        self.config_path = Path(config)
        self.tmp = self.root / ".fake-tmp"
        self.config: dict[str, Any] = {}

    def tree(self, *parts: str) -> Tree:
        return Tree(self.root.joinpath(*parts), self.tmp)

    def __call__(self, req: Request) -> Response:
        self.config = self._load_config()
        value = req.header("authorization")
        try:
            req.agent = auth.parse(value)[0]
            owner, agent = auth.verify(value, self.config.get("bindings"), self.purpose)
        except auth.Refused as e:
            raise HttpError(401, str(e)) from None
        if req.path == "/v1/bind":
            if req.method != "POST":
                raise HttpError(405, "use POST")
            return json_response({"owner": owner, "agent": agent})
        return self.route(req, agent)

    def route(self, req: Request, agent: str) -> Response:
        raise NotImplementedError

    def _load_config(self) -> dict[str, Any]:
        for attempt in range(3):
            try:
                config = json.loads(self.config_path.read_text())
            except FileNotFoundError:
                return {}
            except ValueError:  # caught mid-write by a careless test: try again
                if attempt == 2:
                    raise HttpError(500, f"{self.config_path} is not JSON") from None
                time.sleep(0.02)
                continue
            if not isinstance(config, dict):
                raise HttpError(500, f"{self.config_path} is not a JSON object")
            return config
        return {}

    # ---- teams

    def team_by_id(self, team_id: str, agent: str) -> Team:
        teams = self.config.get("teams") or {}
        team = teams.get(team_id) if auth.is_id(team_id) else None
        if not isinstance(team, dict) or agent not in (team.get("names") or {}):
            raise HttpError(403, "not a member of this team")
        return self._team(team_id, team, agent)

    def team_by_name(self, named: str, agent: str) -> Team:
        for team_id, team in (self.config.get("teams") or {}).items():
            if isinstance(team, dict) and (team.get("names") or {}).get(agent) == named:
                return self._team(team_id, team, agent)
        raise HttpError(403, "no team folder of that name for this agent")

    @staticmethod
    def _team(team_id: str, team: dict, agent: str) -> Team:
        grant = (team.get("grants") or {}).get(agent, "all")
        if grant not in ("all", "part"):
            raise HttpError(500, f"team {team_id}: grant must be all or part")
        folder = team.get("folder")
        if not isinstance(folder, str):
            raise HttpError(500, f"team {team_id}: no folder")
        return Team(team_id, clean_path(folder), grant)


def versioned(data: bytes, version: str, status: int = 200) -> Response:
    return Response(status, data, {"ETag": f'"{version}"', "Content-Type": "application/octet-stream"})


def written(version: str, size: int) -> Response:
    return json_response({"version": version, "size": size}, 200, {"ETag": f'"{version}"'})


def main(factory: Callable[[str, str], Bridge], prog: str, doc: str, argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--root", required=True, metavar="DIR", help="where the bridge keeps its files")
    parser.add_argument("--config", required=True, metavar="FILE", help="bindings and teams, JSON")
    args = parser.parse_args(argv)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    return serve(factory(args.root, args.config), args)
