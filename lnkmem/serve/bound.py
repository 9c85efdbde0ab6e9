"""Bound and team sessions (§5.4-§5.6): agents served through Link's bridges.

A :class:`Binding` is one agent of one owner bound with one key: its bridge
clients, its :class:`Memory` (places behind the bridges, the local cache of
the index copy, the write-back loop) and its open sessions. A
:class:`TeamBinding` is a team's memory as seen by one agent. The key lives in
the bridge clients only; it is never logged or repeated in a message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import threading
import time
from typing import Optional

from lnkmem.bridges.http import BIND, BridgeClient, BridgeDown, Refused, auth_header
from lnkmem.bridges.place import Forbidden, NotFound
from lnkmem.memory import changes
from lnkmem.serve.control import tell_changed
from lnkmem.memory.config import AgentConfig
from lnkmem.memory.spec import parse_size
from lnkmem.core.knobs import knobs
from lnkmem.core.wire import Bound, Changed, FirstLine, Spec

log = logging.getLogger("lnkmem")

BIND_PATIENCE_S = 5.0
BIND_GRACE_S = 1.0  # once one bridge took the key, how long the others may still answer
REBIND_FIRST_S, REBIND_MAX_S, REBIND_PATIENCE_S = 0.5, 10.0, 2.0  # a bridge down at Bound time, tried again
# A binding's end (`end`, a Bound line with a new key, SIGTERM, the linger's end: one path,
# Binding.close) waits close_s() (60 s) for its write-backs, all together, then stops its memories
# whatever they did: its bridges are closed first, so a write-back still trying fails at once
# (what it held stays dirty in the local cache, written back once bound again); stopping them
# takes stop_s() (15 s) more at most. serve-many ends its bindings at once, so its shutdown takes at
# most about their sum however many it holds (many.end_s(), with its connections'
# end): within a service manager's usual patience (systemd's: 90 s).
def close_s() -> float:
    """How long a binding's end waits for its write-backs (`LNKMEM_CLOSE_S`, 60 s)."""
    return knobs().close_s


def stop_s() -> float:
    """... then for its memories to stop (`LNKMEM_STOP_S`, 15 s)."""
    return knobs().stop_s
NOT_WHOLE_TEAM = "this agent is not granted the whole team folder, so the team's memory is not served to it"


class Refusal(Exception):
    """Why a Bound or team line is refused (a message without secrets)."""


class _Client(BridgeClient):
    """A bridge client that knows when its bridge was down at Bound time: then
    every call fails at once, saying so, until the background retry binds it."""

    down: Optional[str] = None  # why its bridge was down at Bound time, until it takes the key; None: bound

    def mark_down(self, why: str) -> None:
        self.down = why

    def request(self, method: str, url: str, *args, **kw):
        why = self.down
        if why is not None and url != BIND:
            raise BridgeDown(f"the {self.purpose} bridge is unreachable ({why}); it is retried in the background")
        return super().request(method, url, *args, **kw)


class BoundSession:
    """One connection's view of a binding (or of a team binding)."""

    def __init__(self, owner, memory, deny: Optional[str] = None):
        self.owner = owner
        self.memory = memory
        self.first_call_error = deny
        self.mcp = None  # (mcp.Session, writer, its loop), set by the service (serving)
        self.closed = False
        self._lock = threading.Lock()

    def detach(self) -> None:
        self.owner.detach(self)

    def serving(self, session, writer, loop) -> None:
        """Its MCP session began on ``writer``; closed at once when its binding ended first."""
        with self._lock:
            self.mcp = (session, writer, loop)
            closed = self.closed
        if closed:
            writer.close()

    def close(self) -> None:
        """Close its connection (from any thread: the connection's loop does it), or, when
        its MCP session has not begun yet, as it begins."""
        with self._lock:
            self.closed = True
            mcp = self.mcp
        if mcp is None:
            return
        _, writer, loop = mcp
        try:
            loop.call_soon_threadsafe(writer.close)
        except RuntimeError:  # the loop has ended: so has the connection
            pass


class Job:
    """``fn()`` on a thread of its own; ``answer``: what it returned (an error or None), or
    the text of what it raised, once done."""

    def __init__(self, fn):
        self.answer: Optional[str] = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name="lnkmem-end", daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self.answer = fn()
        except Exception as e:  # noqa: BLE001 - named in the answer, never skipping the others
            self.answer = f"{type(e).__name__}: {e}"

    def wait(self, deadline: Optional[float]) -> bool:
        """Wait until it is done or ``deadline`` (monotonic; None: no limit); whether it is done."""
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()


class _Held:
    """What bindings and team bindings share: sessions, a memory, clients."""

    memory = None
    clients: list[_Client]

    def __init__(self):
        self.sessions: set[BoundSession] = set()
        self.clients = []
        self.deny: Optional[str] = None
        self.ending = False  # its binding is ending: a session's end writes nothing back of its own

    def session(self) -> BoundSession:
        s = BoundSession(self, self.memory, self.deny)
        self.sessions.add(s)
        return s

    def detach(self, s: BoundSession) -> None:
        self.sessions.discard(s)
        wb = self.memory.writeback if self.memory is not None else None
        if not self.sessions and wb is not None and not self.ending:
            threading.Thread(target=wb.flush, daemon=True).start()  # end of input: write back now

    def flush(self) -> Optional[str]:
        if self.memory is None or self.memory.writeback is None:
            return None
        return self.memory.writeback.flush()

    def end_sessions(self) -> None:
        self.ending = True
        for s in list(self.sessions):
            s.close()

    def stop(self) -> None:
        """Its memory stopped: its index let go of (so it may be opened again)."""
        if self.memory is not None:
            self.memory.stop()


def places_of(b: Bound, sockets: dict[str, str]) -> tuple:
    """What a Bound line's plan is made of (§5.4 rev. 3): its files, storage
    (their sockets as checked: ``Bindings._check_sockets``), notes and index; two
    lines with the same places are served by one binding."""
    storage = None
    if b.storage is not None:
        storage = (sockets["storage"], tuple(sorted(b.storage.places.items())))
    return (sockets["files"] if b.files else None, storage,
            parse_size(b.notes) if b.notes else None, b.index)


class Binding(_Held):
    def __init__(self, owner: str, agent: str, key: str, places: tuple = ()):
        super().__init__()
        self.owner, self.agent, self._key = owner, agent, key
        self.places = places  # places_of() the line that made it
        self.teams: dict[str, TeamBinding] = {}
        self._closed = threading.Event()
        self._watch_lock = threading.Lock()
        self._watching = False

    def held(self) -> list[tuple[str, _Held]]:
        """Its memories, named: its own first, then its teams' (§5.5)."""
        return [(f"agent {self.agent}", self)] + [(f"team {t}", tb) for t, tb in list(self.teams.items())]

    def _flush_each(self, deadline: Optional[float], patience: float) -> tuple[list[str], list[_Held]]:
        """Write back its own memory, then its teams' (at once; §5.5: its own first), each
        whatever the others did, until ``deadline`` (None: each write-back's own patience).
        A stalled own write-back never takes the teams' time: they begin once it is done or
        half the patience is spent, whichever comes first. (Every failure named, the memories
        that failed.)"""
        errors: list[str] = []
        failed: list[_Held] = []
        held = self.held()
        jobs = [(what, h, Job(h.flush)) for what, h in held[:1]]
        if jobs and len(held) > 1:
            jobs[0][2].wait(None if deadline is None else time.monotonic() + max(deadline - time.monotonic(), 0) / 2)
        jobs += [(what, h, Job(h.flush)) for what, h in held[1:]]
        for what, h, job in jobs:
            if not job.wait(deadline):
                errors.append(f"{what}: the write-back did not finish within {patience:g} s")
            elif job.answer:
                errors.append(f"{what}: {job.answer}")
            else:
                continue
            failed.append(h)
        return errors, failed

    def flush_all(self) -> Optional[str]:
        """`flush`: its own memory written back, then its teams'; every failure named."""
        errors, _ = self._flush_each(None, 0)
        return "; ".join(errors) or None

    def close(self, patience: Optional[float] = None) -> Optional[str]:
        """The one way a binding ends (`end`, a new key, SIGTERM, the linger's end): its
        sessions closed; its own memory written back, then its teams' (a stalled own one
        given half the time at most before they begin), while its bridges are open (within
        ``patience`` together); those written back stopped; its bridges
        closed (a write-back still trying fails at once); the others stopped. Every memory
        is stopped, its index let go of, whatever happened; every failure is named."""
        with self._watch_lock:
            if self._closed.is_set():
                return None
            self._closed.set()  # (and the bridges down at Bound time are no longer tried)
        patience = close_s() if patience is None else patience
        deadline = time.monotonic() + patience
        held = self.held()
        for _, h in held:
            h.end_sessions()
        errors, failed = self._flush_each(deadline, patience)
        stops = [(what, Job(h.stop)) for what, h in held if h not in failed]
        for _, job in stops:  # (what changed since its write-back is written as it stops)
            job.wait(deadline)
        for c in self.clients:
            try:
                c.close()
            except Exception as e:  # noqa: BLE001 - the others are closed all the same
                log.warning("agent %s: the %s bridge's client did not close: %s", self.agent, c.purpose, type(e).__name__)
        stops += [(what, Job(h.stop)) for what, h in held if h in failed]
        end = time.monotonic() + stop_s()
        for what, job in stops:
            if not job.wait(end):
                errors.append(f"{what}: did not stop within {stop_s():g} s")
            elif job.answer:
                errors.append(f"{what}: {job.answer}")
        self.teams.clear()
        return "; ".join(errors) or None

    def client(self, purpose: str) -> Optional[BridgeClient]:
        return next((c for c in self.clients if c.purpose == purpose), None)

    def watch_down(self) -> None:
        """Bridges that were down at Bound time are bound again in the background;
        once one takes the key, what lives behind it is read again (§5.4 rev. 2)."""
        with self._watch_lock:
            if self._watching or not any(c.down for c in self.clients):
                return
            self._watching = True
        threading.Thread(target=self._retry_down, name="lnkmem-rebind", daemon=True).start()

    def _retry_down(self) -> None:
        """Bind again, now and then, every client whose bridge was down, until none is or the
        binding closes. Not tenacity's ``Retrying``: its waits end at once at the close (an
        event), and each client comes back on its own, its memories told when it does."""
        wait = REBIND_FIRST_S
        while not self._closed.wait(wait):
            wait = min(wait * 1.5, REBIND_MAX_S)
            for c in self.clients:
                if c.down is None:
                    continue
                try:
                    c.bind(REBIND_PATIENCE_S)
                except Refused as e:
                    c.down = str(e)
                    continue
                except Exception as e:  # noqa: BLE001 - still down
                    c.down = str(e) if isinstance(e, BridgeDown) else type(e).__name__
                    continue
                c.down = None
                log.info("agent %s: the %s bridge took the key; reading what lives behind it", self.agent, c.purpose)
                for memory in [self.memory] + [tb.memory for tb in list(self.teams.values())]:
                    if memory is None:
                        continue
                    if memory.layout.replica is not None:
                        memory.reattach()
                    for source in memory.places:
                        memory.changed(source, wait=False)
            with self._watch_lock:
                if not any(c.down for c in self.clients):
                    self._watching = False
                    return
        with self._watch_lock:
            self._watching = False

    def same_key(self, key: str) -> bool:
        """Whether ``key`` is this binding's key, compared in constant time (a key is
        64 hex characters, either case: both lower-cased, ASCII, before the compare)."""
        return hmac.compare_digest(self._key.lower().encode("ascii", "replace"), key.lower().encode("ascii", "replace"))


class TeamBinding(_Held):
    def __init__(self, team_id: str):
        super().__init__()
        self.team_id = team_id


class Bindings:
    """Every binding this process holds, keyed by (owner, agent)."""

    def __init__(self, service):
        self.service = service
        self.held: dict[tuple[str, str], Binding] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._pins: dict[str, int] = {}  # the cache folders opened (pinned), by their path
        self._pins_lock = threading.Lock()

    def pinned(self, path: str, top: Optional[str]) -> str:
        """The cache folder ``path`` opened once (made when missing), never through a link
        below ``top`` (Refusal when one stands in the way), as a path that reaches that
        folder whatever its name leads to later (atomic.pinned): a link swapped in while an
        agent is served changes nothing its memory touches. Held for the process's life;
        opened again only when the folder held is gone or its name names another."""
        from lnkmem.core import atomic
        from lnkmem.memory.config import FolderRefused, open_folder, same_folder
        with self._pins_lock:
            fd = self._pins.get(path)
            if fd is not None and os.fstat(fd).st_nlink > 0 and same_folder(fd, path):
                return atomic.pinned(fd, path)
            try:
                if top:
                    os.makedirs(top, mode=0o700, exist_ok=True)  # (--cache, made as before when missing)
                fd = open_folder(path, top)
            except FolderRefused as e:
                raise Refusal(f"its cache is not served: {e}") from None
            self._pins[path] = fd  # (one held before: left open, a memory may still use it)
            return atomic.pinned(fd, path)

    @property
    def opts(self):
        return self.service.opts

    def holds(self, owner: str, agent: str) -> bool:
        return (owner, agent) in self.held

    # --- opening ---------------------------------------------------------------

    async def open(self, first: FirstLine):
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.service.pool, self._open, first), None
        except Refusal as e:
            return None, str(e)

    def _own_bridges(self, agent: str) -> set[str]:
        own = set()
        for s in (self.opts.files_bridge, self.opts.storage_bridge):
            if s:
                own.add(os.path.realpath(s))
        if self.opts.bridges:
            own.add(os.path.realpath(os.path.join(self.opts.bridges, agent, "storage.sock")))
        return own

    def _check_sockets(self, agent: str, b: Bound) -> dict[str, str]:
        """§5.4: every socket named must be one of this machine's bridges, checked
        before any connection is made, so the key goes nowhere else. The answer:
        each bridge's path as checked (resolved, no link on the way), by purpose;
        its client connects there and never to the path named, which a link on
        the way could make name another socket after the check (issue 46)."""
        own = self._own_bridges(agent)
        named = [("files", b.files)] + ([("storage", b.storage.socket)] if b.storage else [])
        checked = {}
        for what, path in named:
            if path is None:
                continue
            real = os.path.realpath(path) if os.path.isabs(path) and "\0" not in path else None
            if real is None or real not in own:
                raise Refusal(f"the {what} bridge {path!r} is not one of this machine's bridges")
            checked[what] = real
        return checked

    def _config(self, agent: str, b: Bound) -> tuple[AgentConfig, str]:
        """The agent's config and the folder its local cache lives in."""
        why = self.service.refusal(agent) if agent in self.opts.agents.refused else None
        if why:  # named in <agents>, but its entry is refused: never served as someone else
            raise Refusal(why)
        cfg = self.opts.agents.get(agent)
        if cfg is not None:
            if not cfg.owner:
                cfg = dataclasses.replace(cfg, owner=b.owner)
            return cfg, os.path.join(cfg.state, "bound")
        if not self.opts.cache:
            raise Refusal(f"agent {agent} is not in <agents> and no --cache is given for its index")
        folder = os.path.join(self.opts.cache, b.owner, agent)
        spec = Spec(model=self.opts.embed) if self.opts.embed else Spec()
        # §2.3 rev. 2: no thread named is the owner's; a named one is judged with the Bound owner
        cfg = AgentConfig(folder="", state=folder, agent=None, spec=spec, notes_path=None,
                          notes_limit=parse_size(spec.notes), from_required=False, owner=b.owner,
                          model_url=self.opts.embed_url or "", env={}, judge_threads=True)
        return cfg, folder

    def _client(self, path: str, purpose: str, owner: str, agent: str, key: str) -> "_Client":
        return _Client(path, purpose, owner, agent, key)

    def _bind(self, clients: list["_Client"]) -> None:
        """Every bridge named is asked to take the key, at once (§5.4): one that
        refuses it refuses the line; all down (for BIND_PATIENCE_S) refuse it;
        some down while another took the key: served, those marked down."""
        outcome: dict[int, Optional[Exception]] = {}

        def one(i: int, c: BridgeClient) -> None:
            try:
                c.bind(BIND_PATIENCE_S)
                outcome[i] = None
            except (Refused, BridgeDown) as e:
                outcome[i] = e
            except Exception as e:  # noqa: BLE001 - an answer we cannot read is a bridge down
                outcome[i] = BridgeDown(f"{type(e).__name__}")
        threads = [threading.Thread(target=one, args=(i, c), daemon=True) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        took_at = None
        while any(t.is_alive() for t in threads):  # once one took the key, the others get a short grace
            if took_at is None and any(i in outcome and outcome[i] is None for i in range(len(clients))):
                took_at = time.monotonic()
            if took_at is not None and time.monotonic() - took_at >= BIND_GRACE_S:
                break
            time.sleep(0.01)
        for i, c in enumerate(clients):
            if isinstance(outcome.get(i), Refused):
                raise Refusal(str(outcome[i]))
        for i in range(len(clients)):
            outcome.setdefault(i, BridgeDown("no answer yet"))  # still trying: down for now, bound again later
        down = [(c, outcome.get(i)) for i, c in enumerate(clients) if outcome.get(i) is not None]
        if clients and len(down) == len(clients):
            c, e = down[0]
            raise Refusal(f"the {c.purpose} bridge is down: {e}")
        for c, e in down:
            c.mark_down(str(e))

    def _open(self, first: FirstLine):
        with self._lock(first.bound.owner, first.agent):  # one Bound line (or end) of an agent at a time
            return self._open_locked(first)

    def _open_locked(self, first: FirstLine):
        agent, b = first.agent, first.bound
        sockets = self._check_sockets(agent, b)
        has_memory_place = b.storage is not None and "memory" in b.storage.places
        if b.index == "home" and not b.files:
            raise Refusal('index "home" needs the files bridge (bound.files)')
        if not b.files and b.storage is None:  # §5.4: `ok` only once one of its bridges took the key
            raise Refusal("the Bound line names no bridge (files or storage) to take the key")
        cfg, cache = self._config(agent, b)
        top = self.opts.cache if cfg.agent is None else cfg.agent
        if first.team is None and not b.files and not cfg.folder:
            raise Refusal(f"agent {agent} names no files bridge and is not in <agents>: its Home is not known here")
        key = (b.owner, agent)
        binding = self.held.get(key)
        if binding is not None and not binding.same_key(b.key):
            fresh = self._new_binding(first, sockets)  # the bridges judge the new key first: a bad one ends nothing
            log.info("agent %s bound again with a new key", agent)
            err = binding.close()
            if err:
                log.warning("agent %s, its binding with the old key ended: %s", agent, err)
            self.held[key] = binding = fresh
        # (a team line's session has no notes and no index of the agent's: its bridges alone are compared)
        if binding is not None and (binding.places != places_of(b, sockets) if first.team is None
                                    else binding.places[:2] != places_of(b, sockets)[:2]):
            # §5.4 rev. 3: one start has one plan; never served with places other than its line names
            raise Refusal(f"agent {agent} is bound with other places (files, storage, notes or index) in this "
                          f"process; end that binding first")
        if binding is None:
            binding = self._new_binding(first, sockets)
            self.held[key] = binding
        if first.team is not None:
            session = self._team_session(binding, first, cfg, lambda: self.pinned(cache, top))
        else:
            if binding.memory is None:  # the agent's own memory starts with its first own session
                binding.memory = self._own_memory(binding, first, cfg, self.pinned(cache, top), has_memory_place)
            session = binding.session()
        binding.watch_down()
        return session

    def _new_binding(self, first: FirstLine, sockets: dict[str, str]) -> Binding:
        """Clients for the bridges the line names, each having taken the key; each
        connects to its socket as ``_check_sockets`` checked it (``sockets``)."""
        agent, b = first.agent, first.bound
        binding = Binding(b.owner, agent, b.key, places_of(b, sockets))
        if b.files:
            binding.clients.append(self._client(sockets["files"], "files", b.owner, agent, b.key))
        if b.storage:
            binding.clients.append(self._client(sockets["storage"], "storage", b.owner, agent, b.key))
        try:
            self._bind(binding.clients)
        except Refusal:
            for c in binding.clients:
                c.close()
            raise
        return binding

    def _own_memory(self, binding: Binding, first: FirstLine, cfg: AgentConfig, cache: str,
                    has_memory_place: bool):
        """The agent's memory, laid out as its Bound line says (``layout.bound_layout``)
        over this binding's bridges; an agent folder behind a link refuses the line."""
        from lnkmem.memory.layout import bound_layout
        from lnkmem.memory.memory import Memory
        from lnkmem.memory.config import FolderRefused
        try:
            layout = bound_layout(cfg, first.bound, first.agent, binding.client("files"), binding.client("storage"),
                                  has_memory_place, cache)
        except FolderRefused as e:
            raise Refusal(f"agent {first.agent} is not served: {e}") from None
        layout.embed = self._embedding(cfg, first)  # the endpoint, proving this binding (§6)
        watch = any(p.local for p in layout.places.values())  # (the notes' place among them)
        return Memory(cfg, layout).start(watch=watch)

    def _embedding(self, cfg: AgentConfig, first: FirstLine):
        """(url, model, headers) of the embedding endpoint, proving the binding (§6); None without one."""
        url = cfg.model_url or self.opts.embed_url
        if not url:
            return None
        key, owner, agent = first.bound.key, first.bound.owner, first.agent
        model = cfg.spec.model or self.opts.embed or "default"
        from lnkmem.bridges.embed import binding_headers
        return url, model, binding_headers(url, lambda: {"Authorization": auth_header(key, "embedding", owner, agent)},
                                           f"agent {agent}")

    def _team_session(self, binding: Binding, first: FirstLine, cfg: AgentConfig, cache_of) -> BoundSession:
        from lnkmem.memory.layout import team_copy, team_layout
        from lnkmem.memory.memory import Memory
        team, b = first.team, first.bound
        tb = binding.teams.get(team.id)
        if tb is not None:
            return tb.session()
        if not b.files or not b.storage:
            raise Refusal("a team's memory needs both the files and the storage bridge")
        files, storage = binding.client("files"), binding.client("storage")
        tb = TeamBinding(team.id)
        copy_place = team_copy(storage, team.id)
        try:  # a member granted part of the folder is refused the team copy
            copy_place.get("manifest.json")
        except Forbidden:
            tb.deny = NOT_WHOLE_TEAM
        except NotFound:
            pass
        except BridgeDown as e:
            raise Refusal(f"the storage bridge is down: {e}") from None
        if tb.deny is None:
            embed = self._embedding(cfg, first) if team.writes else None  # a reader embeds nothing
            cache = cache_of()  # (opened when a memory is made: a session of one running reuses it)
            tcache = self.pinned(os.path.join(cache, "teams", team.id), cache)
            layout = team_layout(files, copy_place, team.id, team.named, team.writes, embed, tcache)
            tcfg = dataclasses.replace(cfg, notes_path=None)
            tb.memory = Memory(tcfg, layout).start(watch=False)
        binding.teams[team.id] = tb
        return tb.session()

    # --- controls ----------------------------------------------------------------

    async def _in_pool(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.service.pool, fn, *args)

    def _lock(self, owner: str, agent: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault((owner, agent), threading.Lock())

    async def changed(self, c: Changed) -> Optional[str]:
        binding = self.held.get((c.owner, c.agent))
        if binding is None:
            return _not_held(c.owner, c.agent)
        if c.team is not None:
            tb = binding.teams.get(c.team)
            if tb is None or tb.memory is None:
                return f"no team {c.team} of agent {c.agent} is served here"
            return await self._in_pool(_relist_team, tb.memory)
        if binding.memory is None:
            return "the binding has no memory"
        try:
            path = changes.clean(c.path)
        except ValueError as e:
            return f"changed: {e}"
        done = await tell_changed(binding.memory, path)
        return None if done else "the change is still being indexed"

    async def flush(self, b) -> Optional[str]:
        binding = self.held.get((b.owner, b.agent))
        if binding is None:
            return _not_held(b.owner, b.agent)
        return await self._in_pool(binding.flush_all)  # its own first, then its teams

    def _end(self, owner: str, agent: str, gone_ok: bool = False) -> Optional[str]:
        """One binding ended (Binding.close), under the agent's lock: a Bound line for it
        waits until its memories are let go of, then makes it again."""
        with self._lock(owner, agent):
            binding = self.held.pop((owner, agent), None)
            if binding is None:  # (ended meanwhile)
                return None if gone_ok else _not_held(owner, agent)
            return binding.close()

    async def end(self, b) -> Optional[str]:
        return await self._in_pool(self._end, b.owner, b.agent)

    def end_all(self) -> list[tuple[str, Job]]:
        """SIGTERM or the linger's end: every binding ended as `end` ends one, all at once,
        each on a thread of its own (so within close_s() + stop_s() however many there are):
        (the agent, its Job) of each, begun."""
        return [(f"agent {agent}", Job(lambda o=owner, a=agent: self._end(o, a, gone_ok=True)))
                for owner, agent in list(self.held)]


def _not_held(owner: str, agent: str) -> str:
    return f"no binding of agent {agent} of {owner} is held here"


def _relist_team(memory) -> Optional[str]:
    """A team reader looks at the copy again, then the folder is listed again."""
    if memory.layout.replica is not None and not memory.layout.writes:
        memory.reattach()
    return None if memory.changed("home") else "the change is still being indexed"
