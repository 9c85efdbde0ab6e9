"""The notes as the storage bridge's `notes.md` (a bound agent's, §6): a change written
through before `remember` answers, conditional on the version read."""

from __future__ import annotations

import os
from typing import Optional

from lnkmem.core.errors import ToolError
from lnkmem.memory.notesrules import Change, apply


class BridgeNotes:
    """The notes as `notes.md` of the storage bridge's memory collection.

    A change is written through to the bridge before `remember` answers, as
    a conditional write on the version just read; on 412 (someone else wrote
    meanwhile) it reads again and re-applies, so two engines adding notes at
    once lose neither.
    """

    local = False
    NAME = "notes.md"

    def __init__(self, collection, state: Optional[str] = None):
        self.coll = collection
        self.state = state  # where the text a change replaces is kept (§2.2 rev. 3): the cache's folder
        self._history = None

    def _keep(self, data: bytes) -> None:
        """Keep the text a change is about to replace (written and synced before the write)."""
        if self.state is None or not data:
            return
        from lnkmem.memory.config import open_folder
        from lnkmem.memory.noteshistory import History
        try:
            if self._history is None:
                fd = open_folder(self.state, None, create=True, mode=0o700)
                try:
                    self._history = History(fd, where=self.state)
                finally:
                    os.close(fd)
            self._history.keep(data, "replaced")
        except OSError as e:
            raise ToolError(f"the text the change would replace could not be kept in {self.state}/notes-history "
                            f"({e.strerror or e}); nothing was changed") from None

    def entry(self):
        return self.coll.stat(self.NAME)

    def read_bytes(self) -> tuple[bytes, str]:
        return self.coll.read(self.NAME)

    def read(self) -> str:
        from lnkmem.bridges.place import NotFound
        try:
            return self.read_bytes()[0].decode("utf-8", "replace")
        except NotFound:
            return ""

    def change(self, add: Optional[str], remove: Optional[str], limit: int) -> Change:
        from lnkmem.bridges.place import BridgeDown, Conflict, NotFound
        for _ in range(20):
            try:
                data, version = self.coll.read(self.NAME)
                current = data.decode("utf-8", "replace")
            except NotFound:
                current, version = "", None
            result = apply(current, add, remove, limit)
            if version is not None:
                self._keep(data)
            try:
                self.coll.write(self.NAME, result.text.encode("utf-8"), version)
            except Conflict:
                continue
            except BridgeDown as e:
                raise ToolError(f"the notes could not be written: {e}; nothing was changed") from None
            return result
        raise ToolError("the notes kept changing under us; nothing was changed, try again")
