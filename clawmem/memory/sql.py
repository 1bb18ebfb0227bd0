"""SqlMemory: the key/value store on the ``{prefix}phpclaw_memory`` table."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.clock import Clock
from clawmem.codecs import UndecodableValue, codec_for, readable_entries
from clawmem.errors import StorageError
from clawmem.memory.base import FeedingMemory, check_filter
from clawmem.memory.sql_feed import LocalDeletions, SqlCursor, SqlFeed, written_log
from clawmem.paging import Page, check_limit, check_sort, cursor_key, page_of, sort_start
from clawmem.records import Changes, MemoryRow, NamespaceCount
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, validate_key, validate_namespace, validate_prefix
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql import activity, kv
from clawmem.sql import subjects as matching
from clawmem.sql.engine import describe_error, reading_line, retry_deadlocks, write_transaction
from clawmem.sql.paging import keyset_pages
from clawmem.sql.schema import tables


class SqlMemory(FeedingMemory):
    """Entries as rows keyed by (namespace, lookup_key). Expiry is compared with the injected
    clock, never the database's ``NOW()``; upserts are single atomic statements.

    Its change feed follows the table, whoever writes it (see :mod:`clawmem.memory.sql_feed`).
    When nothing has been committed since the cursor (SQLite's ``PRAGMA data_version``,
    PostgreSQL's current snapshot), it reads nothing more.
    """

    name = "sql"
    backend_errors = (sa.exc.SQLAlchemyError,)

    def __init__(
        self,
        engine: Engine,
        prefix: str = "",
        clock: Clock = time.time,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        shape: str = CLAWMEM_SCHEMA,
    ) -> None:
        super().__init__(clock, max_value_bytes)
        self.engine = engine
        self.prefix = validate_prefix(prefix)
        self.shape = shape  # of the tables: clawmem, or phpclaw-wordpress (SPEC 4.8)
        self.codec = codec_for(shape)
        self._deleted = LocalDeletions()
        # The connection a turn's reads take (the feed and the read-back), and on a SQLite
        # file this driver's writes (see clawmem.sql.engine.ReadingLine).
        self._line = reading_line(engine)

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc)

    def _call(self, operation: str, function: Any, *args: Any) -> Any:
        try:
            return super()._call(operation, function, *args)
        except UndecodableValue as exc:  # names the key, never the value
            raise StorageError(self.name, operation, str(exc)) from None

    def _encode(self, key: str, value: Any) -> str:
        return self.codec.encode(key, value, self.max_value_bytes)

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        with self.engine.connect() as conn:
            encoded = kv.get_entry(conn, self.prefix, namespace, key, now, self.shape)
        return (False, None) if encoded is None else (True, self.codec.read(namespace, key, encoded))

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        def upsert(conn: Connection) -> None:
            kv.upsert_entry(conn, self.prefix, namespace, key, encoded, expires_at, self.clock, self.shape)

        # InnoDB may pick a concurrent upsert of the same key as a deadlock victim.
        retry_deadlocks(lambda: self._write(upsert, namespace, key))

    def _forget(self, key: str, namespace: str, now: int) -> None:
        delete = partial(kv.delete_entry, prefix=self.prefix, namespace=namespace, key=key, shape=self.shape)
        self._write(delete, namespace, key)
        self._deleted.add(namespace, key)

    def _flush(self, namespace: str) -> int:
        count: int = self._write(
            lambda conn: kv.delete_namespace(conn, self.prefix, namespace, self.shape), namespace, None
        )
        self._deleted.add(namespace, None)
        return count

    def _write(self, work: Any, namespace: str, key: str | None, restart: bool = False) -> Any:
        """Run ``work(connection)`` in one write transaction. On a SQLite file it runs on the
        reading line, and the feed's log of this process's writes learns of it as it commits:
        ``key`` written or deleted, ``None`` for the whole namespace, or with ``restart`` a
        change the log cannot list (a sweep)."""
        if self._line is None or not self._line.sqlite:
            with write_transaction(self.engine) as conn:
                return work(conn)

        def logged(_done: Any) -> None:
            log = written_log(self._line)
            if restart:
                log.restart(namespace)
            else:
                log.add(namespace, key)

        return self._line.write(work, logged)

    def _all(self, namespace: str, now: int) -> dict[str, Any]:
        with self.engine.connect() as conn:
            found = kv.live_entries(conn, self.prefix, namespace, now, self.shape)
            return {key: self.codec.read(namespace, key, value) for key, value in found}

    def entries_in_order(self, namespace: str = "default") -> list[tuple[str, Any]]:
        """Return every live ``(key, value)`` of ``namespace`` in insertion order (by row id), the
        order phpClaw's ``all()`` gives and its recall breaks ties in."""
        validate_namespace(namespace)

        def read() -> list[tuple[str, Any]]:
            with self.engine.connect() as conn:
                rows = kv.live_entries_in_order(conn, self.prefix, namespace, self._now(), self.shape)
            return list(readable_entries(self.codec, namespace, rows))

        return self._call("all", read)

    def _namespaces(self) -> list[str]:
        with self.engine.connect() as conn:
            return kv.namespaces(conn, self.prefix, self.shape)

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        with self.engine.connect() as conn:
            counts = kv.expired_counts(conn, self.prefix, now, self.shape)
        if dry_run:
            return counts
        deleted = {}
        for namespace in counts:
            sweep = partial(kv.delete_expired, prefix=self.prefix, namespace=namespace, now=now)
            count = self._write(partial(sweep, shape=self.shape), namespace, None, restart=True)
            if count:
                deleted[namespace] = count
        return deleted

    # -- the operator's read API, answered by queries ------------------------------------------

    def _read(self, operation: str, function: Any, *args: Any, **options: Any) -> Any:
        def run() -> Any:
            with self.engine.connect() as conn:
                return function(conn, self.prefix, *args, **options, shape=self.shape)

        return self._call(operation, run)

    def _records(self, namespace: str) -> list[MemoryRow]:
        return self._read("records", kv.namespace_rows, namespace, self._now())

    def namespace_counts(self) -> list[NamespaceCount]:
        return self._read("namespace_counts", kv.namespace_counts, self._now())

    def count(self, namespace: str = "default") -> int:
        return self._read("count", kv.count_namespace, validate_namespace(namespace))

    def rows_per_day(self, edges: Sequence[datetime]) -> list[int]:
        return self._read("rows_per_day", activity.memory_rows_per_day, edges)

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
        sort: str = "key",
    ) -> Page[MemoryRow]:
        validate_namespace(namespace)
        check_filter(state)
        check_sort(sort)
        check_limit(limit)
        start = sort_start(cursor, sort, self.engine.dialect.name) if cursor else None
        rows = self._read(
            "entries",
            kv.namespace_rows,
            namespace,
            self._now(),
            state=state,
            query=query,
            sort=sort,
            start=start,
            limit=limit + 1,
        )
        return page_of(rows, limit, lambda row: cursor_key(row, sort))

    def count_entries(
        self, namespace: str = "default", *, state: str | None = None, query: str | None = None
    ) -> int:
        validate_namespace(namespace)
        check_filter(state)
        return self._read("count_entries", kv.count_rows, namespace, self._now(), state=state, query=query)

    def entry(self, namespace: str, key: str) -> MemoryRow | None:
        return self._read("entry", kv.one_row, validate_namespace(namespace), validate_key(key))

    def find(self, text: str) -> Iterator[MemoryRow]:
        table = tables(self.prefix, self.shape).memory
        select = sa.select(table).where(matching.memory_where(self.prefix, text, self.shape))
        pages = keyset_pages(self.engine, select, [table.c.namespace, table.c.lookup_key], 500)
        try:
            for rows in pages:
                yield from (kv.memory_row(row, self.shape) for row in rows)
        except self.backend_errors as exc:
            raise StorageError(self.name, "find", self._describe(exc)) from exc
        except UndecodableValue as exc:
            raise StorageError(self.name, "find", str(exc)) from None

    # -- the recall index ---------------------------------------------------------------------

    def _changes(self, namespace: str, cursor: Any) -> Changes:
        if not isinstance(cursor, SqlCursor) or cursor.broken:
            cursor = None
        if self._line is None:  # an in-memory SQLite database: one process, no marker
            with self.engine.connect() as conn:
                return self._follow(namespace, cursor, conn)
        return self._line.run(partial(self._follow, namespace, cursor))

    def _reading(self, work: Any) -> Any:
        """Run ``work(connection)`` on the reading line (on a pooled connection without one)."""
        if self._line is not None:
            return self._line.run(work)
        with self.engine.connect() as conn:
            return work(conn)

    def _follow(self, namespace: str, cursor: SqlCursor | None, conn: Connection) -> Changes:
        own = self._line is not None and self._line.sqlite  # SQLite: this process's writes are logged
        # Read before the rows, so a commit after it is seen by the next call.
        marker = self._line.data_version() if own else kv.commit_marker(conn)  # type: ignore[union-attr]
        written = written_log(self._line).position(namespace) if own else (0, 0)
        local = self._deleted.position(namespace)
        feed = SqlFeed(conn, self.prefix, self.shape, namespace, partial(self.codec.read, namespace))
        if cursor is None:
            cursor = SqlCursor(local=local, written=written)
            if own:
                entries = feed.load(cursor)
            else:  # streamed, which PostgreSQL does only inside a transaction
                with self.engine.connect() as pooled:
                    entries = SqlFeed(pooled, self.prefix, self.shape, namespace, feed.decode).load(cursor)
            cursor.marker = marker
            return Changes(cursor, entries, reset=True)
        try:
            if marker is not None and marker == cursor.marker:
                if not own:
                    return Changes(cursor)  # nothing committed since
                logged = written_log(self._line).since(namespace, cursor.written)
                if logged is not None:  # only this process wrote since, and the log says what
                    if not logged:
                        return Changes(cursor)
                    feed.apply_own(cursor, logged)
                    cursor.written, cursor.local = written, local
                    return feed.batch(cursor)
            deletions = self._deleted.since(namespace, cursor.local)
            feed.forget_local(cursor, deletions or [])
            cursor.local, cursor.written = local, written
            feed.catch_up(cursor, marker)
        except BaseException:
            cursor.broken = True  # the copy may miss what was read: start again next time
            raise
        cursor.marker = marker
        return feed.batch(cursor)

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return self._reading(
            lambda conn: kv.rows_of_keys(conn, self.prefix, namespace, sorted(keys), self.shape)
        )
