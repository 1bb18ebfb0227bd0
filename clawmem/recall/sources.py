"""What recall reads of a memory, as protocols: recall stands below the drivers and wrappers,
which implement these without importing them.

- :class:`Readable`: ``all(namespace)``, the full read every memory gives (the scan).
- :class:`Wrapper`: a memory that holds no storage and names the one that serves a namespace.
- :class:`IndexSource`: a driver whose namespaces recall answers from a word index.
- :class:`InsertionOrdered`: a driver that lists entries in insertion order (phpClaw's ties).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from clawmem.records import MemoryRow

if TYPE_CHECKING:
    from clawmem.recall.index import WordIndex


@runtime_checkable
class Readable(Protocol):
    """A memory recall can scan: every live entry of a namespace, by key."""

    def all(self, namespace: str = "default") -> dict[str, Any]: ...


@runtime_checkable
class Wrapper(Protocol):
    """A memory that holds no storage of its own (a router, the privacy switch)."""

    def serving(self, namespace: str) -> tuple[Readable, bool]:
        """Return the memory that serves ``namespace`` and whether a write reaches it."""


@runtime_checkable
class IndexSource(Protocol):
    """A driver that keeps a word index of each namespace and reads rows back by key."""

    def word_index(self, namespace: str = "default") -> WordIndex: ...

    def fetch(self, namespace: str, keys: Sequence[str]) -> dict[str, MemoryRow]: ...


@runtime_checkable
class InsertionOrdered(Protocol):
    """A driver that lists a namespace's live entries in insertion order."""

    def entries_in_order(self, namespace: str = "default") -> list[tuple[str, Any]]: ...


def serving_driver(memory: Readable, namespace: str) -> tuple[Readable, bool]:
    """Return the storage driver behind any wrappers that serves ``namespace``, and whether a
    write reaches it (no privacy switch on the way holds it back)."""
    writes = True
    while isinstance(memory, Wrapper):
        memory, reaches = memory.serving(namespace)
        writes = writes and reaches
    return memory, writes


def driver_name(memory: Readable, namespace: str) -> str:
    """Return the name of the storage driver that serves ``namespace`` behind any wrappers."""
    driver, _ = serving_driver(memory, namespace)
    return str(getattr(driver, "name", type(driver).__name__))
