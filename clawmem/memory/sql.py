"""SqlMemory: the key/value store on the ``{prefix}phpclaw_memory`` table."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.codecs import StoredValues, UndecodableValue, codec_for
from clawmem.errors import StorageError
from clawmem.memory.base import FeedingMemory, check_filter, contains_text, passes_filter
from clawmem.memory.sql_feed import LocalDeletions, SqlCursor, SqlFeed
from clawmem.memory.sql_vectors import SqlVectorBacking
from clawmem.paging import Page, check_limit, check_sort, cursor_key, page_of, sort_start, sorted_page
from clawmem.records import Changes, MemoryRow, NamespaceCount
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, validate_key, validate_namespace, validate_prefix
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql import activity, kv, vectors
from clawmem.sql import subjects as matching
from clawmem.sql.engine import connect, describe_error, retry_deadlocks, write_transaction
from clawmem.sql.paging import keyset_pages
from clawmem.sql.schema import tables

# How many of a namespace's newest rows a search of sealed values decrypts and scans.
SCAN_LIMIT = 10_000
_WATCHES = itertools.count(1)
_INHERITED: list[Any] = []  # a parent's SQLite connections, held in a forked child so none closes


def _after_fork(memory: SqlMemory | None) -> None:
    if memory is not None:
        memory._forked()


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
        self._watch_lock = threading.Lock()
        self._watch: Any = None  # SQLite: a connection of its own, to read data_version
        self._vectors: bool | None = None  # whether the prefix's vectors table exists
        self._last_scan: Any = None
        # data_version is only comparable on one connection: a new one starts a new count.
        self._watch_number = next(_WATCHES)
        reference = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(reference()))

    def _forked(self) -> None:
        """In a forked child: watch on a connection of its own (the parent's stays the parent's,
        unclosed and unused). Its count is new, so no cursor the parent left matches it: the
        child's first read catches up from that cursor."""
        if self._watch is not None:
            _INHERITED.append(self._watch)
            self._watch = None
        self._watch_lock = threading.Lock()
        self._watch_number = next(_WATCHES)

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

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        # InnoDB may pick a concurrent upsert of the same key as a deadlock victim.
        def upsert() -> None:
            with write_transaction(self.engine) as conn:
                kv.upsert_entry(conn, self.prefix, namespace, key, stored, expires_at, self.clock, self.shape)

        stored = self.values.seal(namespace, key, encoded)

        retry_deadlocks(upsert)

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
        with write_transaction(self.engine) as conn:
            kv.delete_entry(conn, self.prefix, namespace, key, self.shape)
            if with_vectors:
                vectors.delete_keys(conn, self.prefix, namespace, [key])
        self._deleted.add(namespace, key)

    def _flush(self, namespace: str) -> int:
        with_vectors = self._has_vectors()
        with write_transaction(self.engine) as conn:
            count = kv.delete_namespace(conn, self.prefix, namespace, self.shape)
            if with_vectors:
                vectors.delete_namespace(conn, self.prefix, namespace)
        self._deleted.add(namespace, None)
        return count

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
            with write_transaction(self.engine) as conn:
                if with_vectors:
                    expired = kv.expired_keys(conn, self.prefix, namespace, now, self.shape)
                    vectors.delete_keys(conn, self.prefix, namespace, expired)
                count = kv.delete_expired(conn, self.prefix, namespace, now, self.shape)
            if count:
                deleted[namespace] = count
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
        if query and self.encrypted:
            start = sort_start(cursor, sort) if cursor else None
            found = sorted_page(self.scanned(namespace, state, query)[0], sort, start, limit + 1)
            return page_of(found, limit, lambda row: cursor_key(row, sort))
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
            values=self.values,
        )
        return page_of(rows, limit, lambda row: cursor_key(row, sort))

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

    def find(self, text: str) -> Iterator[MemoryRow]:
        table = tables(self.prefix, self.shape).memory
        select = sa.select(table)
        if not self.encrypted:
            select = select.where(matching.memory_where(self.prefix, text, self.shape))
        # Sealed values cannot be matched in SQL: every row is read, opened and matched here, so
        # export and erase stay complete.
        pages = keyset_pages(self.engine, select, [table.c.namespace, table.c.lookup_key], 500)
        try:
            for rows in pages:
                found = (kv.memory_row(row, self.shape, self.values) for row in rows)
                yield from (row for row in found if not self.encrypted or contains_text(row, text))
        except self.backend_errors as exc:
            raise StorageError(self.name, "find", self._describe(exc)) from exc
        except UndecodableValue as exc:
            raise StorageError(self.name, "find", str(exc)) from None

    # -- the recall index ---------------------------------------------------------------------

    def _data_version(self) -> tuple[int, int] | None:
        if self.engine.dialect.name != "sqlite":
            return None
        if self._watch is None:
            # Held for the driver's lifetime, so out of the pool: otherwise every driver on a
            # shared engine keeps one of its connections, and the pool runs dry.
            watch = self.engine.raw_connection()
            watch.detach()
            self._watch = watch
        cursor = self._watch.cursor()
        try:
            cursor.execute("PRAGMA data_version")
            return self._watch_number, int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def _changes(self, namespace: str, cursor: Any) -> Changes:
        with self._watch_lock:
            version = self._data_version()
        if isinstance(cursor, SqlCursor) and not cursor.broken:
            if version is not None and version == cursor.marker:
                return Changes(cursor)
        else:
            cursor = None
        local = self._deleted.position(namespace)
        # SQLite's version was read on a connection of its own, so the rows are read in a
        # transaction begun after it, never in an older one a caller holds (a dashboard
        # request's); elsewhere the marker is read in the same transaction as the rows.
        with self.engine.connect() if version is not None else connect(self.engine) as conn:
            # Read before the rows, so a commit after it is seen by the next call.
            marker = version if version is not None else kv.commit_marker(conn)
            if cursor is not None and marker is not None and marker == cursor.marker:
                return Changes(cursor)
            decode = partial(self.values.read, namespace)
            feed = SqlFeed(conn, self.prefix, self.shape, namespace, decode)
            if cursor is None:
                cursor = SqlCursor(local=local)
                entries = feed.load(cursor)
                cursor.marker = marker
                return Changes(cursor, entries, reset=True)
            try:
                deletions = self._deleted.since(namespace, cursor.local)
                feed.forget_local(cursor, deletions or [])
                cursor.local = local
                feed.catch_up(cursor)
            except BaseException:
                cursor.broken = True  # the copy may miss what was read: start again next time
                raise
        cursor.marker = marker
        entries = [entry for entry in feed.changed.values() if entry is not None]
        gone = [key for key, entry in feed.changed.items() if entry is None]
        return Changes(cursor, entries, gone)

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return self._read("fetch", kv.rows_of_keys, namespace, sorted(keys), values=self.values)

    def _fetch_across(self, wanted: dict[str, set[str]]) -> list[MemoryRow]:
        sorted_keys = {namespace: sorted(keys) for namespace, keys in wanted.items()}
        return self._read("fetch", kv.rows_across, sorted_keys, values=self.values)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
