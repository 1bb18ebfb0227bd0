"""ArrayMemory: an in-process, thread-safe dict. Nothing survives the process."""

from __future__ import annotations

import threading
import time
from typing import Any

from clawmem.clock import Clock
from clawmem.memory.base import BaseMemory
from clawmem.recall.index import WordIndex
from clawmem.records import MemoryRow
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, decode_value, is_expired

# namespace -> key -> (encoded JSON, expires_at)
_Store = dict[str, dict[str, tuple[str, int | None]]]


class ArrayMemory(BaseMemory):
    """Keeps entries as JSON text in a dict, so callers never share mutable state with it."""

    name = "array"
    backend_errors = ()

    def __init__(self, clock: Clock = time.time, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        super().__init__(clock, max_value_bytes)
        self._store: _Store = {}
        self._lock = threading.Lock()
        # The recall index of each namespace asked for, kept in step by every write.
        self._indexes: dict[str, WordIndex] = {}

    def _live(self, namespace: str, now: int) -> dict[str, str]:
        return {
            key: encoded
            for key, (encoded, expires_at) in self._store.get(namespace, {}).items()
            if not is_expired(expires_at, now)
        }

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        with self._lock:
            encoded = self._live(namespace, now).get(key)
        return (False, None) if encoded is None else (True, decode_value(encoded))

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        with self._lock:
            self._store.setdefault(namespace, {})[key] = (encoded, expires_at)
            if namespace in self._indexes:
                self._indexes[namespace].put(key, decode_value(encoded), expires_at)

    def _forget(self, key: str, namespace: str, now: int) -> None:
        with self._lock:
            self._store.get(namespace, {}).pop(key, None)
            if namespace in self._indexes:
                self._indexes[namespace].remove(key)

    def _flush(self, namespace: str) -> int:
        with self._lock:
            if namespace in self._indexes:
                self._indexes[namespace].clear()
            return len(self._store.pop(namespace, {}))

    def _all(self, namespace: str, now: int) -> dict[str, Any]:
        with self._lock:
            live = self._live(namespace, now)
        return {key: decode_value(encoded) for key, encoded in live.items()}

    def _namespaces(self) -> list[str]:
        with self._lock:
            return [namespace for namespace, entries in self._store.items() if entries]

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for namespace, entries in self._store.items():
                expired = [k for k, (_, exp) in entries.items() if is_expired(exp, now)]
                if expired:
                    counts[namespace] = len(expired)
                if not dry_run:
                    for key in expired:
                        del entries[key]
                        if namespace in self._indexes:
                            self._indexes[namespace].remove(key)
        return counts

    def _records(self, namespace: str) -> list[MemoryRow]:
        with self._lock:
            stored = list(self._store.get(namespace, {}).items())
        return [
            MemoryRow(namespace, key, decode_value(encoded), expires_at, len(encoded.encode("utf-8")))
            for key, (encoded, expires_at) in stored
        ]

    def _fresh_index(self, namespace: str) -> WordIndex:
        with self._lock:
            index = self._indexes.get(namespace)
            if index is None:
                index = self._indexes[namespace] = WordIndex(namespace)
                stored = self._store.get(namespace, {}).items()
                index.load((key, decode_value(encoded), expires_at) for key, (encoded, expires_at) in stored)
            return index

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        with self._lock:
            stored = self._store.get(namespace, {})
            found = [(key, stored[key]) for key in keys if key in stored]
        return [
            MemoryRow(namespace, key, decode_value(encoded), expires_at, len(encoded.encode("utf-8")))
            for key, (encoded, expires_at) in found
        ]
