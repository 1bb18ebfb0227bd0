"""SqlMemory: the key/value store on the ``{prefix}phpclaw_memory`` table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.errors import StorageError
from clawmem.memory.base import BaseMemory, MemoryRow, NamespaceCount, check_filter
from clawmem.memory.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    decode_value,
    validate_key,
    validate_namespace,
    validate_prefix,
)
from clawmem.sql import kv
from clawmem.sql import subjects as matching
from clawmem.sql.engine import describe_error, retry_deadlocks, write_transaction
from clawmem.sql.paging import Page, check_limit, decode_cursor, keyset_pages, page_of
from clawmem.sql.schema import tables


class SqlBackedMemory(BaseMemory):
    """A driver on the three tables of ``prefix`` in ``engine``'s database."""

    backend_errors = (sa.exc.SQLAlchemyError,)

    def __init__(
        self,
        engine: Engine,
        prefix: str = "",
        clock: Clock = time.time,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        super().__init__(clock, max_value_bytes)
        self.engine = engine
        self.prefix = validate_prefix(prefix)

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc)


class SqlMemory(SqlBackedMemory):
    """Entries as rows keyed by (namespace, lookup_key). Expiry is compared with the injected
    clock, never the database's ``NOW()``; upserts are single atomic statements."""

    name = "sql"

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        with self.engine.connect() as conn:
            encoded = kv.get_entry(conn, self.prefix, namespace, key, now)
        return (False, None) if encoded is None else (True, decode_value(encoded))

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        # InnoDB may pick a concurrent upsert of the same key as a deadlock victim.
        def upsert() -> None:
            with write_transaction(self.engine) as conn:
                kv.upsert_entry(conn, self.prefix, namespace, key, encoded, expires_at, self.clock)

        retry_deadlocks(upsert)

    def _forget(self, key: str, namespace: str, now: int) -> None:
        with write_transaction(self.engine) as conn:
            kv.delete_entry(conn, self.prefix, namespace, key)

    def _flush(self, namespace: str) -> int:
        with write_transaction(self.engine) as conn:
            return kv.delete_namespace(conn, self.prefix, namespace)

    def _all(self, namespace: str, now: int) -> dict[str, Any]:
        with self.engine.connect() as conn:
            return {
                key: decode_value(value) for key, value in kv.live_entries(conn, self.prefix, namespace, now)
            }

    def _namespaces(self) -> list[str]:
        with self.engine.connect() as conn:
            return kv.namespaces(conn, self.prefix)

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        with self.engine.connect() as conn:
            counts = kv.expired_counts(conn, self.prefix, now)
        if dry_run:
            return counts
        deleted = {}
        for namespace in counts:
            with write_transaction(self.engine) as conn:
                count = kv.delete_expired(conn, self.prefix, namespace, now)
            if count:
                deleted[namespace] = count
        return deleted

    # -- the operator's read API, answered by queries ------------------------------------------

    def _read(self, operation: str, function: Any, *args: Any, **options: Any) -> Any:
        def run() -> Any:
            with self.engine.connect() as conn:
                return function(conn, self.prefix, *args, **options)

        return self._call(operation, run)

    def _records(self, namespace: str) -> list[MemoryRow]:
        return self._read("records", kv.namespace_rows, namespace, self._now())

    def namespace_counts(self) -> list[NamespaceCount]:
        return self._read("namespace_counts", kv.namespace_counts, self._now())

    def count(self, namespace: str = "default") -> int:
        return self._read("count", kv.count_namespace, validate_namespace(namespace))

    def newest_write(self) -> datetime | None:
        """Return when any entry was last written, or ``None`` for an empty table."""
        return self._read("newest_write", kv.newest_write)

    def entries(
        self,
        namespace: str = "default",
        *,
        state: str | None = None,
        query: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[MemoryRow]:
        validate_namespace(namespace)
        check_filter(state)
        check_limit(limit)
        after = decode_cursor(cursor, 1)[0] if cursor else None
        rows = self._read(
            "entries",
            kv.namespace_rows,
            namespace,
            self._now(),
            state=state,
            query=query,
            after_key=after,
            limit=limit + 1,
        )
        return page_of(rows, limit, lambda row: [row.key])

    def entry(self, namespace: str, key: str) -> MemoryRow | None:
        return self._read("entry", kv.one_row, validate_namespace(namespace), validate_key(key))

    def find(self, text: str) -> Iterator[MemoryRow]:
        table = tables(self.prefix).memory
        select = sa.select(table).where(matching.memory_where(self.prefix, text))
        pages = keyset_pages(self.engine, select, [table.c.namespace, table.c.lookup_key], 500)
        try:
            for rows in pages:
                yield from (kv.memory_row(row) for row in rows)
        except self.backend_errors as exc:
            raise StorageError(self.name, "find", self._describe(exc)) from exc
