"""Bound and team sessions (§5.4, §5.5): agents served through bridges.

(Under construction: the engine refuses Bound lines until the bridges land.)
"""

from __future__ import annotations

from typing import Optional


class Bindings:
    def __init__(self, service):
        self.service = service

    def holds(self, owner: str, agent: str) -> bool:
        return False

    async def open(self, first):
        return None, "bound sessions are not served by this engine yet"

    async def changed(self, c) -> Optional[str]:
        return "no such binding"

    async def flush(self, b) -> Optional[str]:
        return "no such binding"

    async def end(self, b) -> Optional[str]:
        return "no such binding"

    async def close_all(self) -> None:
        return None
