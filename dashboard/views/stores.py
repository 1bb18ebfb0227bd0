"""The read APIs views use, built for the current app's settings, prefix and clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from clawmem.sql.conversations import ConversationStore
from clawmem.sql.kv import MemoryStore
from clawmem.sql.paging import Page
from dashboard import state

T = TypeVar("T")


def conversation_store() -> ConversationStore:
    """Return the conversation read API over the configured database and prefix."""
    return ConversationStore(state.engine(), state.settings().table_prefix)


def memory_store() -> MemoryStore | None:
    """Return the key/value read API when the memory driver is ``sql``, else ``None``
    (other drivers are read through their contract, live entries only)."""
    settings = state.settings()
    if settings.memory_driver != "sql":
        return None
    return MemoryStore(state.engine(), settings.table_prefix, clock=state.clock())


def every_item(fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
    """Yield the items of every page ``fetch(cursor)`` returns, from the first (``None``) to the last."""
    cursor = None
    while True:
        page = fetch(cursor)
        yield from page.items
        cursor = page.next_cursor
        if cursor is None:
            return
