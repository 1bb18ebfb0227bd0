"""Access to the app's clawmem objects from views and commands."""

from __future__ import annotations

import time
from typing import Any

from flask import current_app
from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.memory.base import MemoryInterface
from clawmem.memory.rules import encode_value
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.words import utf8_len

# The namespace open_memory routes to the conversation tables; every other one is key/value memory.
CONVERSATIONS_NAMESPACE = "conversations"


def settings() -> Settings:
    """Return the effective clawmem settings of the current app."""
    return current_app.extensions["clawmem.settings"]


def setting_sources() -> dict[str, str]:
    """Return where each setting came from: default, environment, instance config file, test config."""
    return current_app.extensions["clawmem.sources"]


def clock() -> Clock:
    """Return the app's clock (``time.time`` unless a test replaced ``app.extensions["clawmem.clock"]``)."""
    return current_app.extensions.get("clawmem.clock", time.time)


def engine() -> Engine:
    """Return the shared engine of the configured database."""
    return engine_for(settings().database_url)


def memory() -> MemoryInterface:
    """Return the app's memory (built once per app by :func:`clawmem.open_memory`)."""
    from clawmem.memory.registry import open_memory

    if "clawmem.memory" not in current_app.extensions:
        current_app.extensions["clawmem.memory"] = open_memory(settings(), clock())
    return current_app.extensions["clawmem.memory"]


def kv_namespaces() -> list[str]:
    """Return the key/value namespaces that hold entries, in name order (``conversations`` left out)."""
    return [name for name in memory().namespaces() if name != CONVERSATIONS_NAMESPACE]


def value_bytes(key: str, value: Any) -> int:
    """Return the UTF-8 size of ``value`` as stored (its compact JSON), within this site's value limit."""
    return utf8_len(encode_value(key, value, settings().max_value_bytes))
