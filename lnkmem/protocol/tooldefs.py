"""The four tools' definitions (§4): names, schemas, annotations, argument types.

Kept apart from what the tools do so that a session can answer `tools/list`
without importing the index (numpy, LMDB): start fast.

A call's arguments are held to the published inputSchema by the small validator
below, then converted into ``wire.*Args`` by msgspec. msgspec's convert alone (the
Structs' ``Meta`` bounds, ``forbid_unknown_fields``) is not the published schema
(issue 48): it lets through what the schema refuses (``sources`` given twice, a
``null`` for an optional string, an empty ``add``), refuses what it allows (``limit``
2.0, an integer in JSON Schema), and answers in its own types (``expected `str |
null`, got `int```, ``expected `str` of length >= 1``, ``invalid enum value 'web'``
without the allowed ones, ``object missing required field `query```) where this one
says ``under: expected a string, got an integer``, ``ref: must not be empty``,
``sources[0]: "web" is not one of "home", ...``, ``query: required``. Its cost: 10,000
valid calls of the four tools take 156 ms here with the validator and 7 ms with
convert alone (15 us a call, against a search's milliseconds).
"""

from __future__ import annotations

import re

from lnkmem.core.wire import SOURCES, ListArgs, ReadArgs, RememberArgs, SearchArgs

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
                                         'PIO-1384 or a/b/c.md (the passage holding one exactly ranks above '
                                         'any holding only its parts), or pasted text. Syntax is read only in a '
                                         'short keyword query (at most 6 words, no sentence punctuation): '
                                         '"an exact phrase" (required when the query is only phrases; beside '
                                         'other words it ranks passages holding it higher), +word or +"phrase" '
                                         '(required), -word (exclude), word* (prefix). Longer text or a '
                                         'sentence is read as prose: quotes, dashes and stars are punctuation '
                                         'and never lose a document (+"phrase" is still required). Quotes pair '
                                         'left to right; an unpaired one is punctuation.'},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10,
                          "description": "The most hits to return (1-100; the token budget still cuts their text)."},
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
                "conversations": {"type": "string"},
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


# --- the published inputSchema, enforced as published ------------------------------
#
# One small JSON Schema validator, driven by the dicts above, so that whatever a
# tool's inputSchema says (a field added, a bound changed) is what a call is held
# to. It knows the keywords below; `known_keywords` lets a test check that every
# keyword a schema uses is one it enforces. Why not msgspec's decode into wire.*Args
# alone: see the module's docstring.

ENFORCED = {"type", "enum", "const", "minLength", "maxLength", "pattern", "minimum", "maximum",
            "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "items", "prefixItems", "minItems",
            "maxItems", "uniqueItems", "properties", "required", "additionalProperties",
            "anyOf", "oneOf", "allOf", "not"}
ANNOTATIONS = {"description", "default", "title", "examples", "format", "$schema", "$comment",
               "deprecated", "readOnly", "writeOnly"}


class InvalidArguments(ValueError):
    """Arguments breaking a tool's inputSchema; the message names the argument."""


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


_WORDS = {"null": "null", "boolean": "true or false", "integer": "an integer", "number": "a number",
          "string": "a string", "array": "an array", "object": "an object"}


def _is(v, t: str) -> bool:
    k = _kind(v)
    if t == "number":
        return k in ("integer", "number")
    if t == "integer":  # JSON Schema: a number with no fraction (2.0 is an integer)
        return k == "integer" or (k == "number" and v == v and v not in (float("inf"), float("-inf"))
                                  and float(v).is_integer())
    return k == t


def _show(v) -> str:
    text = repr(v) if not isinstance(v, str) else '"' + v[:40] + ('…' if len(v) > 40 else '') + '"'
    return text if len(text) <= 60 else text[:59] + "…"


def _canon(v):
    """A hashable form equal for equal JSON values (1 == 1.0, key order ignored)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", float(v)) if v == v else ("nan",)
    if isinstance(v, list):
        return ("a", tuple(_canon(x) for x in v))
    if isinstance(v, dict):
        return ("o", tuple(sorted((k, _canon(x)) for k, x in v.items())))
    return ("s", v) if isinstance(v, str) else ("z", repr(v))


def check(schema, value, where: str = "arguments") -> None:
    """Raise InvalidArguments naming ``where`` when ``value`` breaks ``schema``."""
    if schema is True or schema == {}:
        return
    if schema is False:
        raise InvalidArguments(f"{where}: not allowed")
    t = schema.get("type")
    if t is not None:
        types = [t] if isinstance(t, str) else list(t)
        if not any(_is(value, x) for x in types):
            want = " or ".join(_WORDS.get(x, x) for x in types)
            raise InvalidArguments(f"{where}: expected {want}, got {_WORDS.get(_kind(value), _kind(value))}")
    if "enum" in schema and _canon(value) not in {_canon(x) for x in schema["enum"]}:
        allowed = ", ".join(_show(x) for x in schema["enum"])
        raise InvalidArguments(f"{where}: {_show(value)} is not one of {allowed}")
    if "const" in schema and _canon(value) != _canon(schema["const"]):
        raise InvalidArguments(f"{where}: must be {_show(schema['const'])}")
    k = _kind(value)
    if k == "string":
        n = len(value)  # JSON Schema counts characters (code points)
        if "minLength" in schema and n < schema["minLength"]:
            lo = schema["minLength"]
            raise InvalidArguments(f"{where}: " + ("must not be empty" if lo == 1 else f"at least {lo} characters, got {n}"))
        if "maxLength" in schema and n > schema["maxLength"]:
            raise InvalidArguments(f"{where}: at most {schema['maxLength']} characters, got {n}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise InvalidArguments(f"{where}: does not match {schema['pattern']}")
    if k in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise InvalidArguments(f"{where}: at least {schema['minimum']}, got {_show(value)}")
        if "maximum" in schema and value > schema["maximum"]:
            raise InvalidArguments(f"{where}: at most {schema['maximum']}, got {_show(value)}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            raise InvalidArguments(f"{where}: more than {schema['exclusiveMinimum']}, got {_show(value)}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            raise InvalidArguments(f"{where}: less than {schema['exclusiveMaximum']}, got {_show(value)}")
        m = schema.get("multipleOf")
        if m and (value / m) != int(value / m):
            raise InvalidArguments(f"{where}: must be a multiple of {m}")
    if k == "array":
        n = len(value)
        if "minItems" in schema and n < schema["minItems"]:
            raise InvalidArguments(f"{where}: at least {schema['minItems']} items, got {n}")
        if "maxItems" in schema and n > schema["maxItems"]:
            raise InvalidArguments(f"{where}: at most {schema['maxItems']} items, got {n}")
        if schema.get("uniqueItems"):
            seen = set()
            for x in value:
                c = _canon(x)
                if c in seen:
                    raise InvalidArguments(f"{where}: items must be unique ({_show(x)} is given twice)")
                seen.add(c)
        prefix = schema.get("prefixItems", [])
        for i, (sub, x) in enumerate(zip(prefix, value)):
            check(sub, x, f"{where}[{i}]")
        if "items" in schema:
            for i, x in enumerate(value[len(prefix):], start=len(prefix)):
                check(schema["items"], x, f"{where}[{i}]")
    if k == "object":
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise InvalidArguments(f"{_join(where, name)}: required")
        extra = schema.get("additionalProperties", True)
        for name, x in value.items():
            if name in props:
                check(props[name], x, _join(where, name))
            elif extra is False:
                known = ", ".join(props) or "none"
                raise InvalidArguments(f"{_join(where, name)}: unknown argument (expected one of: {known})")
            else:
                check(extra, x, _join(where, name))
    for sub in schema.get("allOf", []):
        check(sub, value, where)
    if "anyOf" in schema and not any(_fits(sub, value) for sub in schema["anyOf"]):
        raise InvalidArguments(f"{where}: fits none of the forms allowed")
    if "oneOf" in schema and sum(_fits(sub, value) for sub in schema["oneOf"]) != 1:
        raise InvalidArguments(f"{where}: must fit exactly one of the forms allowed")
    if "not" in schema and _fits(schema["not"], value):
        raise InvalidArguments(f"{where}: a form that is not allowed")


def _join(where: str, name: str) -> str:
    return name if where == "arguments" else f"{where}.{name}"


def _fits(schema, value) -> bool:
    try:
        check(schema, value)
        return True
    except InvalidArguments:
        return False


def _integral(schema, value):
    """``value`` with integral floats made ints where the schema says integer (2.0 -> 2)."""
    if not isinstance(schema, dict):
        return value
    t = schema.get("type")
    if isinstance(value, float) and (t == "integer" or (isinstance(t, list) and "integer" in t)) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", {})
        return [_integral(prefix[i] if i < len(prefix) else items, x) for i, x in enumerate(value)]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _integral(props.get(k, {}), x) for k, x in value.items()}
    return value


def validate_arguments(name: str, args: dict) -> dict:
    """``args`` checked against tool ``name``'s published inputSchema (InvalidArguments
    naming the argument), with integral numbers given as ints."""
    schema = TOOLS[name]["inputSchema"]
    check(schema, args)
    return _integral(schema, args)


def known_keywords(schema) -> set:
    """Every keyword ``schema`` uses that the validator neither enforces nor ignores."""
    out: set = set()
    if not isinstance(schema, dict):
        return out
    for k, v in schema.items():
        if k not in ENFORCED and k not in ANNOTATIONS:
            out.add(k)
        if k == "properties":
            for sub in v.values():
                out |= known_keywords(sub)
        elif k in ("items", "additionalProperties", "not"):
            out |= known_keywords(v)
        elif k in ("prefixItems", "anyOf", "oneOf", "allOf"):
            for sub in v:
                out |= known_keywords(sub)
    return out


def tool_names(memory) -> list[str]:
    """The tools a memory serves: `remember` only where it keeps notes."""
    return served_names(memory is not None and memory.notes is not None)


def served_names(notes: bool) -> list[str]:
    return ["search", "read", "list"] + (["remember"] if notes else [])
