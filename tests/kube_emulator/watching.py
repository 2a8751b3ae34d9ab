"""Watch events and watchers: how one stored change becomes (at most) one event per watcher.

A watcher is registered under the store lock together with the replay of the history it asked
for, so that a change is delivered either by the replay or by the live feed, never by both (the
duplicate replay is what made kopf run a create handler twice on another emulator).
A MODIFIED object that starts or stops matching a watcher's selector is delivered as ADDED or
DELETED, as the real watch cache does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .selectors import Predicate


@dataclass(frozen=True)
class Change:
    rv: int
    storage_key: tuple[str, str]
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict
    old: dict | None = None


@dataclass
class Watcher:
    """One open watch stream; ``queue`` holds ``(type or None, object, rv)`` items."""

    storage_key: tuple[str, str]
    namespace: str | None
    predicate: Predicate
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    dropped: bool = False

    def _matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        ns = (obj.get("metadata") or {}).get("namespace")
        return (self.namespace is None or ns == self.namespace) and self.predicate(obj)

    def translate(self, change: Change) -> str | None:
        new_match = self._matches(change.obj)
        if change.type != "MODIFIED":
            return change.type if new_match else None
        old_match = self._matches(change.old)
        if old_match and new_match:
            return "MODIFIED"
        if new_match:
            return "ADDED"
        return "DELETED" if old_match else None

    def put(self, item: tuple) -> None:
        """Enqueue from the loop thread (replays) without a hop."""
        self.queue.put_nowait(item)

    def offer(self, change: Change) -> None:
        """Enqueue from any thread; items of skipped events still advance the bookmark RV."""
        item = (self.translate(change), change.obj, change.rv)
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def drop(self) -> None:
        self.dropped = True
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("DROP", None, 0))
