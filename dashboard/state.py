"""The current app's clawmem site, and what views and commands read through it.

Views and commands call the core's stores and operations on this one :class:`~clawmem.site.Site`
and never ask which driver serves them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from flask import Flask, current_app
from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.conversations import ConversationLog
from clawmem.memory.base import BaseMemory
from clawmem.memory.rules import encode_value
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.settings import Settings
from clawmem.site import Site
from clawmem.sql.paging import Page
from clawmem.words import utf8_len

T = TypeVar("T")


def site_of(app: Flask) -> Site:
    """Return ``app``'s site, built once. Its clock reads ``app.extensions["clawmem.clock"]`` at
    every call, so a test that replaces the clock moves every store with it."""
    if "clawmem.site" not in app.extensions:
        app.extensions["clawmem.site"] = Site(
            app.extensions["clawmem.settings"], lambda: app.extensions.get("clawmem.clock", time.time)()
        )
    return app.extensions["clawmem.site"]


def site() -> Site:
    """Return the current app's site."""
    return site_of(current_app._get_current_object())  # type: ignore[attr-defined]


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
    return site().engine


def memory() -> PrivacyAwareMemory:
    """Return the site's key/value memory, behind the privacy switch."""
    return site().memory


def driver() -> BaseMemory:
    """Return the storage driver behind the switch: the operator's read API, expired entries included."""
    return site().driver


def conversations() -> ConversationLog:
    """Return the site's conversation log."""
    return site().conversations


def value_bytes(key: str, value: Any) -> int:
    """Return the UTF-8 size of ``value`` as stored (its compact JSON), within this site's value limit."""
    return utf8_len(encode_value(key, value, settings().max_value_bytes))


def every_item(fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
    """Yield the items of every page ``fetch(cursor)`` returns, from the first (``None``) to the last."""
    cursor = None
    while True:
        page = fetch(cursor)
        yield from page.items
        cursor = page.next_cursor
        if cursor is None:
            return
