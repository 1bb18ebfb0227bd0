"""The memory contract: six methods every driver implements, plus search.

Rules (every driver, identically): keys are non-empty str of at most 191 characters with no
control characters; namespaces follow :func:`~clawmem.memory.rules.validate_namespace`; values
are JSON-representable and round-trip exactly; ``ttl=None`` never expires, a positive int
expires at ``floor(now) + ttl``; an entry is expired when ``now >= expires_at``. Backend
failures raise :class:`clawmem.StorageError`.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import Any

from clawmem import events
from clawmem.clock import Clock, now_seconds
from clawmem.errors import StorageError
from clawmem.memory.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    encode_value,
    validate_count,
    validate_key,
    validate_namespace,
    validate_ttl,
)
from clawmem.words import rank

DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class MemoryHit:
    """One search result: the entry and its overlap score."""

    key: str
    value: Any
    namespace: str
    score: int


def emit_write(
    driver: str, namespace: str, key: str, encoded: str, ttl: int | None, gated: bool = False
) -> None:
    """Emit ``memory.write`` for a write of ``encoded`` (its size only; never the value)."""
    events.emit(
        "memory.write",
        driver=driver,
        namespace=namespace,
        key=key,
        bytes=len(encoded.encode("utf-8")),
        ttl=ttl,
        gated=gated,
    )


class MemoryInterface(abc.ABC):
    """The six-method key/value contract."""

    @abc.abstractmethod
    def get(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> Any:
        """Return the value, or ``None`` when the key is missing or expired."""

    @abc.abstractmethod
    def set(self, key: str, value: Any, namespace: str = DEFAULT_NAMESPACE, ttl: int | None = None) -> None:
        """Create or replace the entry; ``ttl=None`` clears any earlier TTL."""

    @abc.abstractmethod
    def forget(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Delete one key; a missing key is not an error."""

    @abc.abstractmethod
    def flush(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Delete every key of the namespace."""

    @abc.abstractmethod
    def all(self, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        """Return every live entry of the namespace, sorted by key in code-point order."""

    @abc.abstractmethod
    def has(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Return whether a live entry exists, even one whose value is ``None``."""


class SearchableMemory(MemoryInterface):
    """A memory that can rank its entries against a query (see :mod:`clawmem.recall`)."""

    @abc.abstractmethod
    def search(self, query: str, limit: int = 5, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryHit]:
        """Return up to ``limit`` hits with score > 0, by score descending then key ascending."""


class BaseMemory(SearchableMemory):
    """Shared front of every storage driver: validation, events and error wrapping.

    Subclasses set ``name`` and ``backend_errors`` and implement the ``_get``, ``_set``,
    ``_forget``, ``_flush``, ``_all`` and ``_sweep`` primitives, which receive validated input.
    ``_get`` returns a ``(found, value)`` pair so that a stored ``None`` is not a miss.
    """

    name = "base"
    backend_errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, clock: Clock = time.time, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        self.clock = clock
        self.max_value_bytes = max_value_bytes

    # -- primitives -----------------------------------------------------------------------

    @abc.abstractmethod
    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]: ...

    @abc.abstractmethod
    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None: ...

    @abc.abstractmethod
    def _forget(self, key: str, namespace: str, now: int) -> None: ...

    @abc.abstractmethod
    def _flush(self, namespace: str) -> int: ...

    @abc.abstractmethod
    def _all(self, namespace: str, now: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]: ...

    def _encode(self, key: str, value: Any) -> str:
        return encode_value(key, value, self.max_value_bytes)

    def _search(self, query: str, limit: int, namespace: str, now: int) -> list[MemoryHit]:
        return [
            MemoryHit(key, value, namespace, points)
            for key, value, points in rank(query, self._all(namespace, now), limit)
        ]

    # -- the contract -----------------------------------------------------------------------

    def _call(self, operation: str, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except StorageError:
            raise
        except self.backend_errors as exc:
            raise StorageError(self.name, operation, self._describe(exc)) from exc

    def _describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def _now(self) -> int:
        return now_seconds(self.clock)

    def get(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> Any:
        validate_key(key)
        validate_namespace(namespace)
        found, value = self._call("get", self._get, key, namespace, self._now())
        events.emit("memory.read", driver=self.name, namespace=namespace, key=key, hit=found)
        return value if found else None

    def has(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        validate_key(key)
        validate_namespace(namespace)
        found, _ = self._call("has", self._get, key, namespace, self._now())
        events.emit("memory.read", driver=self.name, namespace=namespace, key=key, hit=found)
        return found

    def _prepare_write(self, key: str, namespace: str, ttl: int | None) -> tuple[int, int | None]:
        """Validate a write's key, namespace and TTL; return ``(now, expires_at)`` for it."""
        validate_key(key)
        validate_namespace(namespace)
        validate_ttl(ttl)
        now = self._now()
        return now, None if ttl is None else now + ttl

    def set(self, key: str, value: Any, namespace: str = DEFAULT_NAMESPACE, ttl: int | None = None) -> None:
        now, expires_at = self._prepare_write(key, namespace, ttl)
        encoded = self._encode(key, value)
        self._call("set", self._set, key, encoded, namespace, expires_at, now)
        emit_write(self.name, namespace, key, encoded, ttl)

    def forget(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        validate_key(key)
        validate_namespace(namespace)
        self._call("forget", self._forget, key, namespace, self._now())
        events.emit("memory.forget", driver=self.name, namespace=namespace, key=key)

    def flush(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.purge(namespace)

    def purge(self, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Flush ``namespace`` and return how many entries (expired ones included) went."""
        validate_namespace(namespace)
        count = self._call("flush", self._flush, namespace)
        events.emit("memory.flush", driver=self.name, namespace=namespace, count=count)
        return count

    def all(self, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        validate_namespace(namespace)
        entries = self._call("all", self._all, namespace, self._now())
        events.emit("memory.read", driver=self.name, namespace=namespace, key=None, count=len(entries))
        return dict(sorted(entries.items()))

    def search(self, query: str, limit: int = 5, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryHit]:
        validate_namespace(namespace)
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        validate_count("limit", limit)
        hits = self._call("search", self._search, query, limit, namespace, self._now())
        events.emit("memory.search", driver=self.name, namespace=namespace, hits=len(hits), limit=limit)
        return hits

    def namespaces(self) -> list[str]:
        """Return every namespace that holds at least one entry (live or expired), sorted."""
        return sorted(self._call("namespaces", self._namespaces))

    def _namespaces(self) -> list[str]:
        raise NotImplementedError(f"the {self.name} driver cannot list its namespaces")

    def sweep(self, dry_run: bool = False) -> dict[str, int]:
        """Delete expired entries in every namespace; return the count per namespace.

        With ``dry_run`` nothing is deleted and the counts say what would go.
        """
        return self._call("sweep", self._sweep, self._now(), dry_run)


__all__ = [
    "DEFAULT_NAMESPACE",
    "BaseMemory",
    "MemoryHit",
    "MemoryInterface",
    "SearchableMemory",
]
