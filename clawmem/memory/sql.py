"""SqlMemory: the key/value store on the ``{prefix}phpclaw_memory`` table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.clock import Clock
from clawmem.codecs import UndecodableValue, codec_for
from clawmem.crypto.stored import StoredValues
from clawmem.errors import StorageError
from clawmem.loop import on_async_path
from clawmem.memory.base import (
    DEFAULT_NAMESPACE,
    FeedingMemory,
    check_filter,
    contains_text,
    emit_write,
    passes_filter,
)
from clawmem.memory.sql_feed import LocalDeletions, SqlCursor, SqlFeed, written_log
from clawmem.memory.sql_vectors import SqlVectorBacking
from clawmem.paging import Page, check_limit, check_sort, cursor_key, page_of, sort_start, sorted_page
from clawmem.records import Changes, MemoryRow, NamespaceCount
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, Ttl, validate_key, validate_namespace, validate_prefix
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql import activity, changes, kv, vectors
from clawmem.sql import subjects as matching
from clawmem.sql.engine import (
    connect,
    current,
    describe_error,
    reading_line,
    retry_deadlocks,
    write_transaction,
)
from clawmem.sql.paging import keyset_pages
from clawmem.sql.schema import tables

# How many of a namespace's newest rows a search of sealed values decrypts and scans.
SCAN_LIMIT = 10_000
FIND_PAGE = 500  # rows read per query while find() yields its matches


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
        self.values = StoredValues(self.codec)
        self._deleted = LocalDeletions()
        self._vectors: bool | None = None  # whether the prefix's vectors table exists
        self._last_scan: Any = None
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
        with connect(self.engine) as conn:
            encoded = kv.get_entry(conn, self.prefix, namespace, key, now, self.shape)
        return (False, None) if encoded is None else (True, self.values.read(namespace, key, encoded))

    @property
    def keeps_metadata(self) -> bool:  # type: ignore[override]
        """Return whether entries keep metadata: clawmem's table has the column, phpClaw's not."""
        return self.shape == CLAWMEM_SCHEMA

    def _set(
        self,
        key: str,
        encoded: str,
        namespace: str,
        expires_at: int | None,
        now: int,
        metadata: str | None = None,
    ) -> None:
        stored = self.values.seal(namespace, key, encoded)
        described = None if metadata is None else self.values.seal(namespace, key, metadata, "metadata")

        def upsert(conn: Connection) -> None:
            kv.upsert_entry(
                conn, self.prefix, namespace, key, stored, expires_at, self.clock, self.shape, described
            )

        # InnoDB may pick a concurrent upsert of the same key as a deadlock victim.
        retry_deadlocks(lambda: self._write(upsert, namespace, key))

    def update(
        self,
        key: str,
        function: Callable[[Any], Any],
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
    ) -> Any:
        """Store ``function(current)`` and return it, read and written in one write transaction
        (see :meth:`clawmem.memory.base.BaseMemory.update`): one commit where a read and a
        :meth:`set` take two."""
        now, expires_at = self._prepare_write(key, namespace, ttl)

        def read_and_write(conn: Connection) -> tuple[Any, str]:
            found = kv.get_entry(conn, self.prefix, namespace, key, now, self.shape)
            value = function(None if found is None else self.values.read(namespace, key, found))
            encoded = self._encode(key, value)
            stored = self.values.seal(namespace, key, encoded)
            kv.upsert_entry(conn, self.prefix, namespace, key, stored, expires_at, self.clock, self.shape)
            return value, encoded

        def run() -> tuple[Any, str]:
            # InnoDB may pick a concurrent upsert of the same key as a deadlock victim.
            return retry_deadlocks(lambda: self._write(read_and_write, namespace, key))

        value, encoded = self._call("update", run)
        emit_write(self.name, namespace, key, encoded, ttl)
        self._written(namespace, key, value)
        return value

    def _has_vectors(self) -> bool:
        """Return whether the prefix's vectors table exists (looked up once, then remembered:
        a process started before ``init-db`` created it leaves its deletions to the feed)."""
        if self._vectors is None:
            self._vectors = vectors.has_vector_table(self.engine, self.prefix)
        return self._vectors

    def vector_backing(self) -> SqlVectorBacking | None:
        """Return the prefix's vectors table as recall's persisted vectors keep it, or ``None``
        when it does not exist (``init-db`` creates it)."""
        return SqlVectorBacking(self.engine, self.prefix, self.values) if self._has_vectors() else None

    def _forget(self, key: str, namespace: str, now: int) -> None:
        # The entry's vector goes with it: it would tell what the entry said.
        with_vectors = self._has_vectors()

        def delete(conn: Connection) -> None:
            kv.delete_entry(conn, self.prefix, namespace, key, self.shape)
            if with_vectors:
                vectors.delete_keys(conn, self.prefix, namespace, [key])

        self._write(delete, namespace, key)
        self._deleted.add(namespace, key)

    def _flush(self, namespace: str) -> int:
        with_vectors = self._has_vectors()

        def delete(conn: Connection) -> int:
            count = kv.delete_namespace(conn, self.prefix, namespace, self.shape)
            if with_vectors:
                vectors.delete_namespace(conn, self.prefix, namespace)
            return count

        count: int = self._write(delete, namespace, None)
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
        with connect(self.engine) as conn:
            found = kv.live_entries(conn, self.prefix, namespace, now, self.shape)
            if not self.encrypted:
                return {key: self.codec.read(namespace, key, value) for key, value in found}
            # A value that cannot be decrypted is skipped with a warning, never given as a value.
            return dict(self.values.readable(namespace, found))

    def entries_in_order(self, namespace: str = "default") -> list[tuple[str, Any]]:
        """Return every live ``(key, value)`` of ``namespace`` in insertion order (by row id), the
        order phpClaw's ``all()`` gives and its recall breaks ties in."""
        validate_namespace(namespace)

        def read() -> list[tuple[str, Any]]:
            with connect(self.engine) as conn:
                rows = kv.live_entries_in_order(conn, self.prefix, namespace, self._now(), self.shape)
            return list(self.values.readable(namespace, rows))

        return self._call("all", read)

    def _namespaces(self) -> list[str]:
        with connect(self.engine) as conn:
            return kv.namespaces(conn, self.prefix, self.shape)

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        with connect(self.engine) as conn:
            counts = kv.expired_counts(conn, self.prefix, now, self.shape)
        if dry_run:
            return counts
        deleted = {}
        with_vectors = self._has_vectors()
        for namespace in counts:

            def sweep(conn: Connection, namespace: str = namespace) -> int:
                if with_vectors:
                    expired = kv.expired_keys(conn, self.prefix, namespace, now, self.shape)
                    vectors.delete_keys(conn, self.prefix, namespace, expired)
                return kv.delete_expired(conn, self.prefix, namespace, now, self.shape)

            count = self._write(sweep, namespace, None, restart=True)
            if count:
                deleted[namespace] = count
        with current(self.engine).begin() as conn:  # the change log's older rows (see clawmem.sql.changes)
            if changes.has_table(conn, self.prefix):
                changes.trim(conn, self.prefix)
        return deleted

    # -- the operator's read API, answered by queries ------------------------------------------

    def _read(self, operation: str, function: Any, *args: Any, **options: Any) -> Any:
        def run() -> Any:
            with connect(self.engine) as conn:
                return function(conn, self.prefix, *args, **options, shape=self.shape)

        return self._call(operation, run)

    def _records(self, namespace: str) -> list[MemoryRow]:
        return self._read("records", kv.namespace_rows, namespace, self._now(), values=self.values)

    def namespace_counts(self) -> list[NamespaceCount]:
        return self._read("namespace_counts", kv.namespace_counts, self._now())

    def count(self, namespace: str = "default") -> int:
        return self._read("count", kv.count_namespace, validate_namespace(namespace))

    def rows_per_day(self, edges: Sequence[datetime]) -> list[int]:
        return self._read("rows_per_day", activity.memory_rows_per_day, edges)

    def counts_and_rows_per_day(self, edges: Sequence[datetime]) -> tuple[list[NamespaceCount], list[int]]:
        found = self._read("namespace_counts", activity.memory_counts_and_rows_per_day, self._now(), edges)
        return found if found is not None else super().counts_and_rows_per_day(edges)

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
        descending: bool | None = None,
    ) -> Page[MemoryRow]:
        validate_namespace(namespace)
        check_filter(state)
        check_sort(sort)
        check_limit(limit)
        if query and self.encrypted:
            start = sort_start(cursor, sort, descending=descending) if cursor else None
            found = sorted_page(self.scanned(namespace, state, query)[0], sort, start, limit + 1, descending)
            return page_of(found, limit, lambda row: cursor_key(row, sort, descending))
        start = sort_start(cursor, sort, self.engine.dialect.name, descending) if cursor else None
        rows = self._read(
            "entries",
            kv.namespace_rows,
            namespace,
            self._now(),
            state=state,
            query=query,
            sort=sort,
            descending=descending,
            start=start,
            limit=limit + 1,
            values=self.values,
        )
        return page_of(rows, limit, lambda row: cursor_key(row, sort, descending))

    def scanned(self, namespace: str, state: str | None, query: str) -> tuple[list[MemoryRow], int, bool]:
        """Return the rows among the newest :data:`SCAN_LIMIT` of ``namespace`` (passing
        ``state``) whose key or decrypted value holds ``query`` (case-insensitive), how many rows
        were read, and whether that was all of them: sealed values cannot be matched in SQL."""
        # Kept for a moment only (one page's list, count and scope), so a later search sees
        # what was written since.
        memo = (namespace, state, query, int(time.monotonic()))
        if self._last_scan is not None and self._last_scan[0] == memo:
            return self._last_scan[1]
        rows = self._read(
            "entries", kv.newest_rows, namespace, self._now(), SCAN_LIMIT + 1, state=state, values=self.values
        )
        complete = len(rows) <= SCAN_LIMIT
        rows = rows[:SCAN_LIMIT]
        needle = query.casefold()
        found = [
            row
            for row in rows
            if not row.unreadable
            and passes_filter(state, row.expires_at, self._now())
            and (needle in row.key.casefold() or needle in _json(row.value).casefold())
        ]
        self._last_scan = (memo, (found, len(rows), complete))
        return found, len(rows), complete

    def count_entries(
        self, namespace: str = "default", *, state: str | None = None, query: str | None = None
    ) -> int:
        validate_namespace(namespace)
        check_filter(state)
        if query and self.encrypted:
            return len(self.scanned(namespace, state, query)[0])
        return self._read("count_entries", kv.count_rows, namespace, self._now(), state=state, query=query)

    def entry(self, namespace: str, key: str) -> MemoryRow | None:
        return self._read(
            "entry", kv.one_row, validate_namespace(namespace), validate_key(key), values=self.values
        )

    def find(self, text: str, *, whole: bool = False) -> Iterator[MemoryRow]:
        if self.encrypted or not whole:
            yield from self._find_in_order(text)
            return
        # The matching keys in one pass over the table in its own order, then their rows a page
        # at a time: the pages of _find_in_order read every row through the (namespace, key)
        # index, one random read each, which costs ten times as much when few rows match. A
        # caller that stops early (a search's first page) keeps those pages, quick when many do.
        keys = self._read("find", matching.memory_matches, text)
        for start in range(0, len(keys), FIND_PAGE):
            rows = self._read("find", matching.memory_rows_matching, text, keys[start : start + FIND_PAGE])
            try:
                found = [kv.memory_row(row, self.shape, self.values) for row in rows]
            except UndecodableValue as exc:
                raise StorageError(self.name, "find", str(exc)) from None
            yield from found

    def _find_in_order(self, text: str) -> Iterator[MemoryRow]:
        table = tables(self.prefix, self.shape).memory
        select = sa.select(table)
        if not self.encrypted:
            select = select.where(matching.memory_where(self.prefix, text, self.shape))
        # Sealed values cannot be matched in SQL: every row is read, opened and matched here, so
        # export and erase stay complete.
        order = [table.c.namespace, table.c.lookup_key]
        pages = keyset_pages(self.engine, select, order, FIND_PAGE)
        try:
            for rows in pages:
                found = (kv.memory_row(row, self.shape, self.values) for row in rows)
                yield from (row for row in found if not self.encrypted or contains_text(row, text))
        except self.backend_errors as exc:
            raise StorageError(self.name, "find", self._describe(exc)) from exc
        except UndecodableValue as exc:
            raise StorageError(self.name, "find", str(exc)) from None

    # -- the recall index ---------------------------------------------------------------------

    def _changes(self, namespace: str, cursor: Any, held: Collection[str] | None = None) -> Changes:
        if not isinstance(cursor, SqlCursor) or cursor.broken or (cursor.known is None and held is None):
            cursor = None  # (a cursor that asked its copy which keys it holds needs it asked again)
        if self._line is None or on_async_path():  # in-memory SQLite (one process, no marker); a loop's task
            with current(self.engine, reading=True).connect() as conn:
                return self._follow(namespace, cursor, held, conn)
        return self._line.run(partial(self._follow, namespace, cursor, held))

    def _reading(self, work: Any) -> Any:
        """Run ``work(connection)`` on the reading line (on a pooled connection without one)."""
        if self._line is not None and not on_async_path():
            return self._line.run(work)
        with current(self.engine, reading=True).connect() as conn:
            return work(conn)

    def _follow(
        self, namespace: str, cursor: SqlCursor | None, held: Collection[str] | None, conn: Connection
    ) -> Changes:
        own = self._line is not None and self._line.sqlite  # SQLite: this process's writes are logged
        # Read before the rows, so a commit after it is seen by the next call.
        marker = self._line.data_version() if own else kv.commit_marker(conn)  # type: ignore[union-attr]
        written = written_log(self._line).position(namespace) if own else (0, 0)
        local = self._deleted.position(namespace)
        feed = SqlFeed(conn, self.prefix, self.shape, namespace, self.values, held)
        if cursor is None:
            cursor = SqlCursor(known=None if held is not None else set(), local=local, written=written)
            if own:
                entries = feed.load(cursor)
            else:  # streamed, which PostgreSQL does only inside a transaction
                with current(self.engine).connect() as pooled:
                    streamed = SqlFeed(pooled, self.prefix, self.shape, namespace, self.values, held)
                    entries = streamed.load(cursor)
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
        ordered, values = sorted(keys), self.values
        return self._reading(
            lambda conn: kv.rows_of_keys(conn, self.prefix, namespace, ordered, self.shape, values=values)
        )

    def _fetch_across(self, wanted: dict[str, set[str]]) -> list[MemoryRow]:
        sorted_keys = {namespace: sorted(keys) for namespace, keys in wanted.items()}
        return self._reading(
            lambda conn: kv.rows_across(conn, self.prefix, sorted_keys, self.shape, values=self.values)
        )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
