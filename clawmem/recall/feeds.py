"""Indexes fed by the drivers' change feeds: the one place recall keeps state about a backend.

A driver with a feed implements ``changes(namespace, cursor) -> Changes`` (see
:class:`clawmem.records.Changes`): given the cursor of its last answer it returns what changed
since, in step with everything any process has committed. :func:`fresh_index` keeps one
:class:`~clawmem.recall.index.WordIndex` per driver and namespace, and applies the batch on each
call. A driver without a feed is not indexed: recall scans it (:class:`ChangeFeed` says which).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from clawmem.recall.index import WordIndex
from clawmem.records import Changes, MemoryRow


@runtime_checkable
class ChangeFeed(Protocol):
    """A driver that publishes each namespace's changes and reads rows back by key."""

    def changes(self, namespace: str, cursor: Any = None) -> Changes:
        """Return what changed in ``namespace`` since ``cursor`` (everything, for ``None``)."""

    def fetch(self, namespace: str, keys: Sequence[str]) -> dict[str, MemoryRow]:
        """Return the stored rows of ``keys`` that exist (expired ones included), by key."""


class _Followed:
    """A namespace's index and the cursor of the last batch applied to it."""

    def __init__(self, namespace: str) -> None:
        self.index = WordIndex(namespace)
        self.cursor: Any = None
        self.lock = threading.Lock()


# Per driver (gone with it) and namespace.
_FOLLOWED: weakref.WeakKeyDictionary[Any, dict[str, _Followed]] = weakref.WeakKeyDictionary()
_FOLLOWED_LOCK = threading.Lock()


def apply(index: WordIndex, batch: Changes) -> None:
    """Apply one batch of a change feed to ``index``."""
    if batch.reset:  # a sweep of an emptied copy drops nothing
        index.load(batch.entries)
    else:
        if batch.swept_at is not None:
            index.drop_expired(batch.swept_at)
        for key, value, expires_at in batch.entries:
            index.put(key, value, expires_at)
    for key in batch.gone:
        index.remove(key)


def fresh_index(
    driver: ChangeFeed, namespace: str, changes: Callable[[str, Any], Changes] | None = None
) -> WordIndex:
    """Return the index of ``namespace`` on ``driver``, in step with everything any process has
    committed to the backend so far. Raises what the driver's ``changes`` raises; a driver
    answering its own search passes its unwrapped feed as ``changes``."""
    with _FOLLOWED_LOCK:
        followed = _FOLLOWED.setdefault(driver, {}).get(namespace)
        if followed is None:
            followed = _FOLLOWED[driver][namespace] = _Followed(namespace)
    with followed.lock:
        batch = (changes or driver.changes)(namespace, followed.cursor)
        if not batch.empty:
            apply(followed.index, batch)
        followed.cursor = batch.cursor
        return followed.index
