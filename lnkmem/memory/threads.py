"""Whose conversation a call comes from (§2.3): notes only in the owner's."""

from __future__ import annotations

from typing import Optional

REFUSED_PREFIXES = {
    "agent-": "a teammate's conversation",
    "team-": "a team's conversation",
    "task-": "a subagent's conversation",
}


def notes_refusal(thread: Optional[str], owner: str, from_required: bool,
                  judge_named: bool = False) -> Optional[str]:
    """Why notes may not be written from ``thread``, or None when they may.

    ``judge_named`` (a bound agent that <agents> does not name, §2.3 rev. 2):
    a call naming no thread is the owner's, one naming a thread is judged.
    """
    if not from_required and not (judge_named and thread):
        return None
    if not thread:
        return "the conversation is not named"
    for prefix, what in REFUSED_PREFIXES.items():
        if thread.startswith(prefix):
            return f"notes are written only in the owner's conversations, and {thread!r} is {what}"
    if not owner:
        return "notes are written only in the owner's conversations, and no owner is known to prove this one is"
    if thread == owner or thread.startswith(owner + "/"):
        return None
    return f"notes are written only in the owner's conversations, and {thread!r} is not the owner's"
