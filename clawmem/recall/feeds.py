"""Indexes fed by the drivers' change feeds: the one place recall keeps state about a backend.

A driver with a feed implements ``changes(namespace, cursor) -> Changes`` (see
:class:`clawmem.records.Changes`): given the cursor of its last answer it returns what changed
since, in step with everything any process has committed. :func:`fresh_index` keeps one
:class:`~clawmem.recall.index.WordIndex` per driver, namespace and stemming
(``CLAW_RECALL_STEMMING``), and applies the batch on each call: an index built under one stemming
is never asked under another, so a process started with another setting builds its index anew,
once, from the backend. A driver without a feed is not indexed: recall scans it
(:class:`ChangeFeed` says which).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, runtime_checkable

from clawmem.loop import holding
from clawmem.recall.index import WordIndex
from clawmem.recall.sources import Listing, conforms, serving_driver
from clawmem.recall.words import NO_STEMMING
from clawmem.records import Changes, MemoryRow


@runtime_checkable
class ChangeFeed(Protocol):
    """A driver that publishes each namespace's changes and reads rows back by key."""

    def changes(self, namespace: str, cursor: Any = None, held: Collection[str] | None = None) -> Changes:
        """Return what changed in ``namespace`` since ``cursor`` (everything, for ``None``);
        ``held`` is the keys of the copy the changes are applied to."""

    def fetch(self, namespace: str, keys: Sequence[str]) -> dict[str, MemoryRow]:
        """Return the stored rows of ``keys`` that exist (expired ones included), by key."""


class _Followed:
    """A namespace's index under one stemming and the cursor of the last batch applied to it."""

    def __init__(self, namespace: str, stemming: str) -> None:
        self.index = WordIndex(namespace, stemming)
        self.cursor: Any = None
        self.lock = threading.Lock()


# Per driver (gone with it), namespace and stemming.
_FOLLOWED: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], _Followed]] = weakref.WeakKeyDictionary()
_FOLLOWED_LOCK = threading.Lock()


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        library = ctypes.CDLL(name) if name else None
    except OSError:  # a C library that cannot be loaded by name: nothing to trim with
        return None
    return getattr(library, "malloc_trim", None)  # glibc's; others return freed memory, or never


_TRIM = _libc_trim()


def release_scratch() -> None:
    """Hand the memory a full load used and freed back to the system. glibc keeps freed heap
    for reuse, and a load of a million entries frees a few hundred megabytes of scratch (the
    decoded batch, the word numbers, the sort): without this the process keeps them resident."""
    if _TRIM is not None:
        _TRIM(0)


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
    driver: ChangeFeed,
    namespace: str,
    changes: Callable[[str, Any, Collection[str]], Changes] | None = None,
    stemming: str = NO_STEMMING,
) -> WordIndex:
    """Return the index of ``namespace`` on ``driver`` whose words are stemmed by ``stemming``,
    in step with everything any process has committed to the backend so far (built from the
    whole namespace on the first call). Raises what the driver's ``changes`` raises; a driver
    answering its own search passes its unwrapped feed as ``changes``."""
    with _FOLLOWED_LOCK:
        of_driver = _FOLLOWED.get(driver)
        if of_driver is None:
            of_driver = _FOLLOWED[driver] = {}
        followed = of_driver.get((namespace, stemming))
        if followed is None:
            followed = of_driver[namespace, stemming] = _Followed(namespace, stemming)
    with holding(followed.lock):
        # The index says which keys it holds: a driver need not keep a set of them per cursor.
        batch = (changes or driver.changes)(namespace, followed.cursor, followed.index)
        if not batch.empty:
            apply(followed.index, batch)
        followed.cursor, reset = batch.cursor, batch.reset
        del batch
        if reset:
            release_scratch()
        return followed.index


def warm(memory: Listing, namespaces: Sequence[str] | None = None, stemming: str = NO_STEMMING) -> int:
    """Bring the index under ``stemming`` of each of ``namespaces`` (every namespace ``memory``
    lists, by default) up to date, and return how many entries they hold. Called before
    gunicorn forks its workers (``--preload``), it builds one index that every worker shares:
    a worker starts with it and its cursor, and catches up from there on its first turn.
    Namespaces served by a driver without a feed are skipped (recall scans them). Raises what
    the drivers raise."""
    held = 0
    for namespace in memory.namespaces() if namespaces is None else namespaces:
        driver = serving_driver(memory, namespace)[0]
        if conforms(driver, ChangeFeed):
            held += len(fresh_index(driver, namespace, stemming=stemming))
    return held
