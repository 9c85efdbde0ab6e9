"""The four tools' definitions (§4): names, schemas, annotations, argument types.

Kept apart from what the tools do so that a session can answer `tools/list`
without importing the index (numpy, LMDB): start fast.
"""

from __future__ import annotations

from lnkmem.wire import SOURCES, ListArgs, ReadArgs, RememberArgs, SearchArgs

_HINTS_READ = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
_REF = {"type": "string", "minLength": 1, "maxLength": 4096}

TOOLS: dict[str, dict] = {
    "search": {
        "name": "search",
        "title": "Search memory",
        "description": (
            "Search the agent's Home files, conversations, skills and notes. Words are matched "
            "stemmed and case-insensitively (and by meaning when a model is served). Returns the "
            "best passages with their ref and line range; pass a ref and lines to `read` for more."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 10000,
                          "description": 'What to look for: words (ranked, none required), identifiers such as '
                                         'PIO-1384 or a/b/c.md (exact ones rank first), "an exact phrase", '
                                         '-word (exclude), word* (prefix).'},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10,
                          "description": "The most hits to return."},
                "sources": {"type": "array", "items": {"enum": list(SOURCES)}, "uniqueItems": True,
                            "description": "Only these sources (default: all)."},
                "under": {"type": "string", "maxLength": 4096,
                          "description": "Only refs starting with this prefix, e.g. home/projects/."},
                "after": {"type": "string", "minLength": 1, "maxLength": 64,
                          "description": "Only hits from this time on: an RFC 3339 date (2024-03-01) or "
                                         "date-time (2024-03-01T09:30:00Z); a conversation's by its message's "
                                         "time, a file's by its modification time."},
                "before": {"type": "string", "minLength": 1, "maxLength": 64,
                           "description": "Only hits from before this time (a date or date-time, as for after)."},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "hits": {"type": "array", "items": {
                    "type": "object",
                    "properties": {
                        "ref": {"type": "string"}, "source": {"enum": list(SOURCES)},
                        "lines": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                        "score": {"type": "number"}, "text": {"type": "string"},
                        "thread": {"type": "string"}, "role": {"type": "string"}, "at": {"type": "string"},
                    },
                    "required": ["ref", "source", "lines", "score", "text"],
                }},
                "ranked": {"enum": ["words", "meaning+words"]},
                "truncated": {"type": "boolean"},
                "indexing": {"type": "object", "properties": {"done": {"type": "integer"}, "total": {"type": "integer"}},
                             "required": ["done", "total"]},
                "embedding": {"type": "object", "properties": {"done": {"type": "integer"}, "total": {"type": "integer"}},
                              "required": ["done", "total"]},
            },
            "required": ["hits", "ranked", "truncated"],
        },
        "annotations": {"title": "Search memory", **_HINTS_READ},
    },
    "read": {
        "name": "read",
        "title": "Read a file of memory",
        "description": "Read a file by its ref (as search and list give them), optionally only lines [from, to]. "
                       "A conversation reads as `role: text` lines.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "ref": {**_REF, "description": "e.g. home/docs/plan.md, chats/<thread>.jsonl, notes"},
                "lines": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2,
                          "description": "[from, to], 1-based, inclusive."},
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "ref": {"type": "string"},
                "lines": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                "total_lines": {"type": "integer"}, "text": {"type": "string"}, "truncated": {"type": "boolean"},
            },
            "required": ["ref", "lines", "total_lines", "text", "truncated"],
        },
        "annotations": {"title": "Read a file of memory", **_HINTS_READ},
    },
    "list": {
        "name": "list",
        "title": "List memory",
        "description": "List the entries directly under a ref (default: the roots home, chats, skills, notes).",
        "inputSchema": {
            "type": "object",
            "properties": {"ref": {"type": "string", "maxLength": 4096, "description": "e.g. home/projects"}},
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "ref": {"type": "string"},
                "entries": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"ref": {"type": "string"}, "kind": {"enum": ["file", "folder"]},
                                   "size": {"type": "integer"}},
                    "required": ["ref", "kind"],
                }},
                "truncated": {"type": "boolean"},
            },
            "required": ["ref", "entries"],
        },
        "annotations": {"title": "List memory", **_HINTS_READ},
    },
    "remember": {
        "name": "remember",
        "title": "Remember in the notes",
        "description": (
            "Keep the agent's notes, a short file it reads at every start: `add` appends a line "
            "(`- text`), `remove` deletes the one line equal to it. Both at once replace a line. "
            "Only in the owner's conversations; the notes have a size limit."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "add": {"type": "string", "minLength": 1, "maxLength": 100000, "description": "A line to add."},
                "remove": {"type": "string", "minLength": 1, "maxLength": 100000,
                           "description": "The exact line to remove (without its leading '- ')."},
            },
            "additionalProperties": False,
        },
        "outputSchema": {
            "type": "object",
            "properties": {"bytes": {"type": "integer"}, "limit": {"type": "integer"}, "entries": {"type": "integer"}},
            "required": ["bytes", "limit", "entries"],
        },
        "annotations": {"title": "Remember in the notes", "readOnlyHint": False, "destructiveHint": False,
                        "idempotentHint": False, "openWorldHint": False},
    },
}

ARGS = {"search": SearchArgs, "read": ReadArgs, "list": ListArgs, "remember": RememberArgs}


def tool_names(memory) -> list[str]:
    """The tools a memory serves: `remember` only where it keeps notes."""
    names = ["search", "read", "list"]
    if memory is not None and memory.notes is not None:
        names.append("remember")
    return names
