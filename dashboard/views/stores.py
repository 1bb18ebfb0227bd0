"""The read APIs views use, built for the current app's settings, prefix and clock."""

from __future__ import annotations

from clawmem.sql.conversations import ConversationStore
from clawmem.sql.kv import MemoryStore
from dashboard import state


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
