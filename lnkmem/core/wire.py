"""The whole wire contract, typed once (PROTOCOL.md).

Every message that crosses a boundary is one of these Structs, decoded and
validated at the edge with :func:`decode` so that the rest of the engine works
with checked values only. Field constraints live here, next to the types.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal, Optional

import msgspec
from msgspec import Meta, Struct

# \Z, not $: an ID matches the whole string ("a1\n" is not an ID; `$` would let it pass)
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z"
ID_RE = re.compile(ID_PATTERN)
SIZE_PATTERN = r"(?i)^\s*[0-9]+(\.[0-9]+)?\s*(b|kb|kib|mb|mib)?\s*$"

Id = Annotated[str, Meta(pattern=ID_PATTERN)]
HEX_KEY_PATTERN = r"^[0-9a-fA-F]{64}\Z"
HexKey = Annotated[str, Meta(pattern=HEX_KEY_PATTERN)]
Size = Annotated[str, Meta(pattern=SIZE_PATTERN)]
ModelName = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
Source = Literal["home", "chats", "skills", "notes"]
SOURCES: tuple[str, ...] = ("home", "chats", "skills", "notes")


class _Strict(Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


# --- §1.2 what `command` prints ------------------------------------------

class Serve(Struct, omit_defaults=True):
    argv: list[str]
    allow: list[str]
    models: Optional[bool] = None
    model: Optional[str] = None
    shared: Optional[bool] = None
    programs: Optional[list[str]] = None


# --- §2.1 the spec ---------------------------------------------------------

class Spec(_Strict):
    model: Optional[ModelName] = None
    tokens: Annotated[int, Meta(ge=1, le=1_000_000)] = 2000
    notes: Size = "4 KB"
    engine: Optional[str] = None


# --- §5.2 agents -----------------------------------------------------------

# Agents (§5.2) are read entry by entry in config.from_serve_argv / many.parse_agents:
# one bad entry is refused for its agent alone.


# --- §5.3-§5.6 a session's first line ------------------------------------

class _Open(Struct, omit_defaults=True):
    """A part of Link's first line whose shape Link owns and may extend (§5.4
    rev. 2): unknown fields are ignored, a known field of the wrong type refused."""


class StorageAt(_Open):
    socket: str
    places: dict[str, str] = msgspec.field(default_factory=dict)


class Bound(_Open):
    owner: Id
    key: HexKey
    files: Optional[str] = None
    storage: Optional[StorageAt] = None
    notes: Optional[Size] = None
    index: Literal["memory", "home"] = "memory"

    def __repr__(self) -> str:  # never print the key
        return f"Bound(owner={self.owner!r}, files={self.files!r}, index={self.index!r})"


class Team(_Open):
    id: Id
    named: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127})?\Z")]
    writes: bool = False


class Changed(_Strict):
    owner: Id
    agent: Id
    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    team: Optional[Id] = None


class Binding(_Strict):
    owner: Id
    agent: Id


class FirstLine(_Strict):
    """Any first line; :func:`classify_first_line` tells which kind it is."""
    agent: Optional[Id] = None
    bound: Optional[Bound] = None
    team: Optional[Team] = None
    changed: Optional[Changed] = None
    flush: Optional[Binding] = None
    end: Optional[Binding] = None


class Ok(Struct):
    ok: bool = True


class Refusal(Struct):
    error: str


# --- §4 tool inputs --------------------------------------------------------

class SearchArgs(_Strict):
    query: Annotated[str, Meta(min_length=1, max_length=10_000)]
    limit: Annotated[int, Meta(ge=1, le=100)] = 10
    sources: Optional[list[Source]] = None
    under: Optional[Annotated[str, Meta(max_length=4096)]] = None
    after: Optional[Annotated[str, Meta(min_length=1, max_length=64)]] = None
    before: Optional[Annotated[str, Meta(min_length=1, max_length=64)]] = None


class ReadArgs(_Strict):
    ref: Annotated[str, Meta(min_length=1, max_length=4096)]
    lines: Optional[tuple[Annotated[int, Meta(ge=1)], Annotated[int, Meta(ge=1)]]] = None


class ListArgs(_Strict):
    ref: Optional[Annotated[str, Meta(max_length=4096)]] = None


class RememberArgs(_Strict):
    add: Optional[Annotated[str, Meta(max_length=100_000)]] = None
    remove: Optional[Annotated[str, Meta(max_length=100_000)]] = None


# --- §4 tool outputs -------------------------------------------------------

class Hit(Struct, omit_defaults=True):
    ref: str
    source: str
    lines: tuple[int, int]
    score: float
    text: str
    thread: Optional[str] = None
    role: Optional[str] = None
    at: Optional[str] = None


class Progress(Struct):
    done: int
    total: int


class SearchResult(Struct, omit_defaults=True):
    hits: list[Hit]
    ranked: Literal["words", "meaning+words"]
    truncated: bool
    indexing: Optional[Progress] = None
    embedding: Optional[Progress] = None  # only while passages wait for vectors
    conversations: Optional[str] = None  # §3.5 rev. 3: "refreshing" or "unavailable: <why>" (a store driver)


class ReadResult(Struct):
    ref: str
    lines: tuple[int, int]
    total_lines: int
    text: str
    truncated: bool


class ListEntry(Struct, omit_defaults=True):
    ref: str
    kind: Literal["file", "folder"]
    size: Optional[int] = None


class ListResult(Struct):
    ref: str
    entries: list[ListEntry]
    truncated: bool = False


class RememberResult(Struct):
    bytes: int
    limit: int
    entries: int


# --- decoding at the edge --------------------------------------------------

_PATTERN_WORDS = {
    SIZE_PATTERN: 'a size such as "4 KB" (a number and B, KB, KiB, MB or MiB)',
    ID_PATTERN: "an ID (a letter or digit, then letters, digits, '.', '_' or '-'; at most 128)",
    HEX_KEY_PATTERN: "64 hexadecimal characters",
    r"^[^\x00-\x1f\x7f]+$": "text without control characters",
}


def explain(err: msgspec.ValidationError | msgspec.DecodeError, type_=None) -> str:
    """msgspec's message made plain, led by the key it names."""
    msg = str(err)
    m = re.search(r" - at `\$(.*)`$", msg)
    where, what = "", msg
    if m:
        where, what = m.group(1).lstrip("."), msg[: m.start()]
    rx = re.match(r"Expected `str` matching regex '(.*)'$", what)
    if rx:
        pattern = rx.group(1).encode().decode("unicode_escape")
        what = "expected " + _PATTERN_WORDS.get(pattern, "text matching " + pattern)
    unknown = re.match(r"Object contains unknown field `(.*)`$", what)
    if unknown:
        if not where and isinstance(type_, type) and issubclass(type_, msgspec.Struct):
            # quoted, since a key may hold any character; and the keys that are known
            known = ", ".join(f.name for f in msgspec.structs.fields(type_))
            return f"unknown key {json.dumps(unknown.group(1))} (expected one of: {known})"
        key = f"{where}.{unknown.group(1)}" if where else unknown.group(1)
        return f"{key}: unknown key"
    if what.startswith("JSON is malformed") or what.startswith("Input data was truncated"):
        return f"not valid JSON ({what})"
    what = what[:1].lower() + what[1:]
    return f"{where}: {what}" if where else what


def decode(data: bytes | str, type_):
    """Decode JSON into ``type_``; raises ValueError with a message naming the key."""
    try:
        return msgspec.json.decode(data, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ValueError(explain(e, type_)) from None
    except RecursionError:  # msgspec's answer to JSON nested about 1000 deep
        raise ValueError("not valid JSON here (nested too deeply)") from None


def convert(obj, type_):
    """Validate an already-decoded JSON value as ``type_`` (ValueError naming the key)."""
    try:
        return msgspec.convert(obj, type=type_, strict=True)
    except msgspec.ValidationError as e:
        raise ValueError(explain(e, type_)) from None


_encoder = msgspec.json.Encoder()


def encode(obj) -> bytes:
    return _encoder.encode(obj)


def to_builtins(obj):
    return msgspec.to_builtins(obj)

