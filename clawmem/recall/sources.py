"""What recall reads of a memory, as protocols: recall stands below the drivers and wrappers,
which implement these without importing them.

- :class:`Readable`: ``all(namespace)``, the full read every memory gives (the scan);
  :class:`Listing` also lists the namespaces (what warming the index reads).
- :class:`Wrapper`: a memory that holds no storage and names the one that serves a namespace.
- :class:`clawmem.recall.feeds.ChangeFeed`: a driver whose changes recall follows in an index.
- :class:`InsertionOrdered`: a driver that lists entries in insertion order (phpClaw's ties).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Readable(Protocol):
    """A memory recall can scan: every live entry of a namespace, by key."""

    def all(self, namespace: str = "default") -> dict[str, Any]: ...


@runtime_checkable
class Listing(Readable, Protocol):
    """A memory recall can scan that also lists its namespaces (what warming the index reads)."""

    def namespaces(self) -> list[str]: ...


@runtime_checkable
class Wrapper(Protocol):
    """A memory that holds no storage of its own (a router, the privacy switch)."""

    def serving(self, namespace: str) -> tuple[Readable, bool]:
        """Return the memory that serves ``namespace`` and whether a write reaches it."""


@runtime_checkable
class InsertionOrdered(Protocol):
    """A driver that lists a namespace's live entries in insertion order."""

    def entries_in_order(self, namespace: str = "default") -> list[tuple[str, Any]]: ...


_CONFORMS: dict[tuple[type, type], bool] = {}


def conforms(memory: object, protocol: type) -> bool:
    """Return ``isinstance(memory, protocol)`` for a runtime-checkable protocol, remembered per
    class: the check looks up every method of the protocol, about 20 microseconds a call, and a
    turn asks it of the same drivers several times. (Drivers define their methods on the class.)"""
    cached = _CONFORMS.get((type(memory), protocol))
    if cached is None:
        cached = _CONFORMS[type(memory), protocol] = isinstance(memory, protocol)
    return cached


def serving_driver(memory: Readable, namespace: str) -> tuple[Readable, bool]:
    """Return the storage driver behind any wrappers that serves ``namespace``, and whether a
    write reaches it (no privacy switch on the way holds it back)."""
    writes = True
    while conforms(memory, Wrapper):
        memory, reaches = memory.serving(namespace)
        writes = writes and reaches
    return memory, writes


def driver_name(memory: Readable, namespace: str) -> str:
    """Return the name of the storage driver that serves ``namespace`` behind any wrappers."""
    driver, _ = serving_driver(memory, namespace)
    return str(getattr(driver, "name", type(driver).__name__))
