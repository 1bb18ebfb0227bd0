"""Wrappers that hold no storage: routing by namespace, and the privacy switch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clawmem.memory.base import DEFAULT_NAMESPACE, MemoryInterface, SearchableMemory, emit_write
from clawmem.recall.rankings import rank
from clawmem.records import MemoryHit
from clawmem.rules import Ttl, encode_value, validate_key, validate_namespace, validate_ttl


def search_any(memory: MemoryInterface, query: str, limit: int, namespace: str) -> list[MemoryHit]:
    """Search ``memory`` natively when it can, else rank a scan of its ``all()``."""
    if isinstance(memory, SearchableMemory):
        return memory.search(query, limit, namespace)
    return [
        MemoryHit(key, value, namespace, points)
        for key, value, points in rank(query, memory.all(namespace), limit)
    ]


def set_any(
    memory: MemoryInterface,
    key: str,
    value: Any,
    namespace: str,
    ttl: Ttl,
    metadata: Mapping[str, Any] | None,
) -> None:
    """Write to ``memory``, passing ``metadata`` on only when there is some: a memory of the
    six-method contract alone takes none."""
    if metadata is None:
        memory.set(key, value, namespace, ttl)
    else:
        memory.set(key, value, namespace, ttl, metadata=metadata)  # type: ignore[call-arg]


def sweep_any(memory: MemoryInterface, dry_run: bool = False) -> dict[str, int]:
    """Sweep ``memory`` if it keeps its own expiry; a driver without ``sweep`` reports nothing."""
    sweep = getattr(memory, "sweep", None)
    return sweep(dry_run=dry_run) if sweep else {}


def namespaces_any(memory: MemoryInterface) -> list[str]:
    """Return the namespaces ``memory`` holds; raise ``NotImplementedError`` if it cannot list them."""
    namespaces = getattr(memory, "namespaces", None)
    if namespaces is None:
        raise NotImplementedError(f"{type(memory).__name__} cannot list its namespaces")
    return namespaces()


class RouterMemory(SearchableMemory):
    """Sends each call to the driver routed for its exact namespace, else to ``default``."""

    def __init__(self, default: MemoryInterface, routes: Mapping[str, MemoryInterface] | None = None) -> None:
        self.default = default
        self.routes = {validate_namespace(ns): driver for ns, driver in (routes or {}).items()}

    def serving(self, namespace: str) -> tuple[MemoryInterface, bool]:
        """Return the driver routed for ``namespace``; every write reaches it."""
        return self.driver_for(namespace), True

    def driver_for(self, namespace: str) -> MemoryInterface:
        """Return the driver that serves ``namespace``."""
        return self.routes.get(namespace, self.default)

    def drivers(self) -> list[MemoryInterface]:
        """Return every distinct driver behind this router, the default first."""
        distinct: list[MemoryInterface] = []
        for driver in [self.default, *self.routes.values()]:
            if all(driver is not seen for seen in distinct):
                distinct.append(driver)
        return distinct

    def get(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> Any:
        return self.driver_for(namespace).get(key, namespace)

    def set(
        self,
        key: str,
        value: Any,
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        set_any(self.driver_for(namespace), key, value, namespace, ttl, metadata)

    def forget(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.driver_for(namespace).forget(key, namespace)

    def flush(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.driver_for(namespace).flush(namespace)

    def all(self, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        return self.driver_for(namespace).all(namespace)

    def has(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        return self.driver_for(namespace).has(key, namespace)

    def search(self, query: str, limit: int = 5, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryHit]:
        return search_any(self.driver_for(namespace), query, limit, namespace)

    def namespaces(self) -> list[str]:
        """Return every namespace that holds entries, each taken from the driver that serves it."""
        found = {ns for ns in namespaces_any(self.default) if ns not in self.routes}
        for namespace, driver in self.routes.items():
            if namespace in namespaces_any(driver):
                found.add(namespace)
        return sorted(found)

    def sweep(self, dry_run: bool = False) -> dict[str, int]:
        """Sweep every driver behind the router; return expired counts per namespace."""
        counts: dict[str, int] = {}
        for driver in self.drivers():
            for namespace, count in sweep_any(driver, dry_run).items():
                counts[namespace] = counts.get(namespace, 0) + count
        return counts


class PrivacyAwareMemory(SearchableMemory):
    """The privacy switch: with ``store_messages=False``, ``set`` writes nothing.

    Only ``set`` is gated. Reads, ``forget``, ``flush``, ``all`` and ``search`` pass through,
    so entries written before the switch stay readable and eligible for recall. Every gated
    ``set`` still validates its input and emits ``memory.write`` with ``gated=True``.
    """

    def __init__(self, inner: MemoryInterface, store_messages: bool = True) -> None:
        self.inner = inner
        self.store_messages = store_messages

    def serving(self, namespace: str) -> tuple[MemoryInterface, bool]:
        """Return the wrapped memory, and whether a write reaches it (the switch is on)."""
        return self.inner, self.store_messages

    def get(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> Any:
        return self.inner.get(key, namespace)

    def set(
        self,
        key: str,
        value: Any,
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if self.store_messages:
            set_any(self.inner, key, value, namespace, ttl, metadata)
            return
        validate_key(key)
        validate_namespace(namespace)
        validate_ttl(ttl)
        encoded = encode_value(key, value)
        emit_write("privacy", namespace, key, encoded, ttl, gated=True)

    def forget(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.inner.forget(key, namespace)

    def flush(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.inner.flush(namespace)

    def all(self, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        return self.inner.all(namespace)

    def has(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        return self.inner.has(key, namespace)

    def search(self, query: str, limit: int = 5, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryHit]:
        return search_any(self.inner, query, limit, namespace)

    def namespaces(self) -> list[str]:
        """Return the wrapped memory's namespaces."""
        return namespaces_any(self.inner)

    def sweep(self, dry_run: bool = False) -> dict[str, int]:
        """Sweep the wrapped memory (deleting expired rows is not a write the switch gates)."""
        return sweep_any(self.inner, dry_run)
