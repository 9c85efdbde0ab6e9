"""What one agent is served with: folders, spec and environment (§1-§2)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from lnkmem.errors import UsageError
from lnkmem.spec import notes_limit, parse_spec
from lnkmem.wire import Spec


@dataclass(frozen=True)
class AgentConfig:
    folder: str
    state: str
    agent: Optional[str]
    spec: Spec
    notes_path: Optional[str]
    notes_limit: int
    from_required: bool
    owner: str
    model_url: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        """The most bytes of text one result may hold (§2.1)."""
        return 4 * self.spec.tokens


def from_args(folder: str, state: str, agent: Optional[str], env: Mapping[str, str],
              need_folder: bool = True) -> AgentConfig:
    """Check the command line's folders and the environment; UsageError if bad."""
    spec = parse_spec(env.get("LNK_MEMORY_SPEC"))
    folder_abs = os.path.abspath(folder)
    if need_folder and not os.path.isdir(folder_abs):
        raise UsageError(f"folder does not exist: {folder}")
    if not state:
        raise UsageError("state: an empty path")
    agent_abs = os.path.abspath(agent) if agent else None
    if agent_abs is not None and need_folder and not os.path.isdir(agent_abs):
        raise UsageError(f"agent folder does not exist: {agent}")
    notes = env.get("LNK_MEMORY_NOTES") or None
    if notes is not None and not os.path.isabs(notes):
        raise UsageError(f"LNK_MEMORY_NOTES: not an absolute path: {notes}")
    return AgentConfig(
        folder=folder_abs,
        state=os.path.abspath(state),
        agent=agent_abs,
        spec=spec,
        notes_path=notes,
        notes_limit=notes_limit(spec),
        from_required=env.get("LNK_MEMORY_FROM") == "1",
        owner=env.get("LNK_OWNER", ""),
        model_url=env.get("LNK_MEMORY_MODEL", ""),
        env=dict(env),
    )
