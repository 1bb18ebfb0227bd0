"""ArrayMemory: an in-process, thread-safe dict. Nothing survives the process."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection
from typing import Any

from clawmem.clock import Clock
from clawmem.memory.base import FeedingMemory
from clawmem.records import Changes, MemoryRow
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, decode_value, is_expired

# namespace -> key -> (encoded JSON, expires_at)
_Store = dict[str, dict[str, tuple[str, int | None]]]
_LOG_SLACK = 1024  # changed keys a namespace's log holds beyond twice its size, before it restarts


class ArrayMemory(FeedingMemory):
    """Keeps entries as JSON text in a dict, so callers never share mutable state with it.

    Its change feed is a log per namespace of the keys written or deleted; a cursor is the
    log's generation and position. A flush, or a log grown past twice the namespace, starts a
    new generation, and a cursor of an older one gets the whole namespace again.
    """

    name = "array"
    at_rest = False  # nothing outlives the process, so nothing is sealed
    backend_errors = ()

    @property
    def async_ready(self) -> bool:
        """Whether an async caller runs this driver on its loop
        (:func:`clawmem.integrations.aio.driver_on_loop`): it does no I/O. A subclass may wait on
        something, so it keeps the worker thread."""
        return type(self) is ArrayMemory

    def __init__(self, clock: Clock = time.time, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        super().__init__(clock, max_value_bytes)
        self._store: _Store = {}
        self._lock = threading.Lock()
        self._log: dict[str, tuple[int, list[str]]] = {}  # namespace -> (generation, keys changed)
        self._generations = itertools.count(1)

    def _live(self, namespace: str, now: int) -> dict[str, str]:
        return {
            key: encoded
            for key, (encoded, expires_at) in self._store.get(namespace, {}).items()
            if not is_expired(expires_at, now)
        }

    def _changed(self, namespace: str, key: str) -> None:
        """Log a change of ``key`` (the lock is held)."""
        log = self._log.get(namespace)
        if log is None or len(log[1]) > 2 * len(self._store.get(namespace, ())) + _LOG_SLACK:
            log = self._log[namespace] = (next(self._generations), [])
        log[1].append(key)

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        with self._lock:
            encoded = self._live(namespace, now).get(key)
        return (False, None) if encoded is None else (True, decode_value(encoded))

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        with self._lock:
            self._store.setdefault(namespace, {})[key] = (encoded, expires_at)
            self._changed(namespace, key)

    def _forget(self, key: str, namespace: str, now: int) -> None:
        with self._lock:
            if self._store.get(namespace, {}).pop(key, None) is not None:
                self._changed(namespace, key)

    def _flush(self, namespace: str) -> int:
        with self._lock:
            self._log[namespace] = (next(self._generations), [])
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
                        self._changed(namespace, key)
        return counts

    def _records(self, namespace: str) -> list[MemoryRow]:
        with self._lock:
            stored = list(self._store.get(namespace, {}).items())
        return [
            MemoryRow(namespace, key, decode_value(encoded), expires_at, len(encoded.encode("utf-8")))
            for key, (encoded, expires_at) in stored
        ]

    def _changes(self, namespace: str, cursor: Any, held: Collection[str] | None = None) -> Changes:
        with self._lock:
            generation, keys = self._log.setdefault(namespace, (next(self._generations), []))
            stored = self._store.get(namespace, {})
            if cursor is None or cursor[0] != generation:
                entries = [(key, encoded, expires_at) for key, (encoded, expires_at) in stored.items()]
                gone: list[str] = []
                reset = True
            else:
                changed = dict.fromkeys(keys[cursor[1] :])
                entries = [(key, *stored[key]) for key in changed if key in stored]
                gone = [key for key in changed if key not in stored]
                reset = False
            position = (generation, len(keys))
        decoded = [(key, decode_value(encoded), expires_at) for key, encoded, expires_at in entries]
        return Changes(position, decoded, gone, reset=reset)

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        with self._lock:
            stored = self._store.get(namespace, {})
            found = [(key, stored[key]) for key in keys if key in stored]
        return [
            MemoryRow(namespace, key, decode_value(encoded), expires_at, len(encoded.encode("utf-8")))
            for key, (encoded, expires_at) in found
        ]
