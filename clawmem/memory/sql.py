"""SqlMemory: the key/value store on the ``{prefix}phpclaw_memory`` table."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.codecs import UndecodableValue, codec_for, readable_entries, warn_unreadable
from clawmem.errors import StorageError
from clawmem.memory.base import BaseMemory, check_filter
from clawmem.paging import Page, check_limit, check_sort, cursor_key, page_of, sort_start
from clawmem.recall.index import WordIndex
from clawmem.records import MemoryRow, NamespaceCount
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, validate_key, validate_namespace, validate_prefix
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql import activity, kv
from clawmem.sql import subjects as matching
from clawmem.sql.engine import describe_error, retry_deadlocks, write_transaction
from clawmem.sql.lenient import as_text, read_expiry, read_value
from clawmem.sql.paging import keyset_pages
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

    def _call(self, operation: str, function: Any, *args: Any) -> Any:
        try:
            return super()._call(operation, function, *args)
        except UndecodableValue as exc:  # names the key, never the value
            raise StorageError(self.name, operation, str(exc)) from None


# Rows whose updated_at is this much older than the newest one the index has seen are still
# read again on each refresh: a writer's clock may lag, and a long transaction may commit a
# stamp from before others that committed first. A change stamped further back than this is
# only found when the namespace's row count says something is missing.
REINDEX_OVERLAP = timedelta(minutes=5)


@dataclass
class _IndexState:
    """A namespace's index and what it had seen of the table when it was last brought up to date."""

    index: WordIndex
    newest: datetime | None = None
    unreadable: set[str] = field(default_factory=set)
    # SQLite's data_version or PostgreSQL's snapshot when last brought up to date: while it is
    # the same, nothing has been committed since, and nothing needs reading.
    marker: Any = None
    # What was seen of each row stamped within REINDEX_OVERLAP of the newest: a changed row
    # there shows a different mark, and only those are read again.
    window: dict[str, int] = field(default_factory=dict)
    # MariaDB: the window's bounds and digest (see clawmem.sql.kv.window_digest) when last probed.
    digest: tuple[Any, Any] = (None, None)


def _marks(probe: list[tuple[Any, Any, Any, Any]]) -> dict[str, int]:
    """Return, per key of :func:`clawmem.sql.kv.index_probe`'s rows, what tells two states of
    the row apart: a hash of its stamp, expiry and version."""
    return {as_text(key): hash((str(stamp), str(expires), version)) for key, stamp, expires, version in probe}


class SqlMemory(SqlBackedMemory):
    """Entries as rows keyed by (namespace, lookup_key). Expiry is compared with the injected
    clock, never the database's ``NOW()``; upserts are single atomic statements.

    The recall index of a namespace follows the table, whoever writes it (another worker, the
    CLI, another program with plain SQL): each call reads the key, stamp and version (see
    :func:`clawmem.sql.kv.row_version`) of the rows stamped since the newest ``updated_at`` it
    saw (less :data:`REINDEX_OVERLAP`), reads the values of only those that changed, and
    compares the namespace's row count, reading every key again only when rows went missing.
    When nothing has been committed since (SQLite's ``PRAGMA data_version``, PostgreSQL's
    current snapshot), it reads nothing more.
    """

    name = "sql"

    def __init__(
        self,
        engine: Engine,
        prefix: str = "",
        clock: Clock = time.time,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        shape: str = CLAWMEM_SCHEMA,
    ) -> None:
        super().__init__(engine, prefix, clock, max_value_bytes)
        self.shape = shape  # of the tables: clawmem, or phpclaw-wordpress (SPEC 4.8)
        self.codec = codec_for(shape)
        self._indexes: dict[str, _IndexState] = {}
        self._index_lock = threading.Lock()
        self._watch: Any = None  # SQLite: a connection of its own, to read data_version

    def _encode(self, key: str, value: Any) -> str:
        return self.codec.encode(key, value, self.max_value_bytes)

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        with self.engine.connect() as conn:
            encoded = kv.get_entry(conn, self.prefix, namespace, key, now, self.shape)
        return (False, None) if encoded is None else (True, self.codec.read(namespace, key, encoded))

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        # InnoDB may pick a concurrent upsert of the same key as a deadlock victim.
        def upsert() -> None:
            with write_transaction(self.engine) as conn:
                kv.upsert_entry(
                    conn, self.prefix, namespace, key, encoded, expires_at, self.clock, self.shape
                )

        retry_deadlocks(upsert)

    def _forget(self, key: str, namespace: str, now: int) -> None:
        with write_transaction(self.engine) as conn:
            kv.delete_entry(conn, self.prefix, namespace, key, self.shape)
        self._indexed(namespace, lambda index: index.remove(key))

    def _flush(self, namespace: str) -> int:
        with write_transaction(self.engine) as conn:
            count = kv.delete_namespace(conn, self.prefix, namespace, self.shape)
        self._indexed(namespace, WordIndex.clear)
        return count

    def _indexed(self, namespace: str, change: Any) -> None:
        """Apply a deletion this process made to the namespace's index, if it has one, so the
        next refresh finds the row count as expected instead of reading every key again."""
        with self._index_lock:
            state = self._indexes.get(namespace)
            if state is not None:
                change(state.index)

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
            with write_transaction(self.engine) as conn:
                count = kv.delete_expired(conn, self.prefix, namespace, now, self.shape)
            if count:
                deleted[namespace] = count
                self._indexed(namespace, lambda index: index.drop_expired(now))
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

    def _data_version(self) -> int | None:
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
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def _fresh_index(self, namespace: str) -> WordIndex:
        with self._index_lock:
            state = self._indexes.get(namespace)
            version = self._data_version()
            if state is not None and version is not None and version == state.marker:
                return state.index
            with self.engine.connect() as conn:
                # Read before the rows, so a commit after it is seen by the next call.
                marker = version if version is not None else kv.commit_marker(conn)
                if state is not None and marker is not None and marker == state.marker:
                    return state.index
                if state is None:
                    state = self._indexes[namespace] = _IndexState(WordIndex(namespace))
                    self._load(state, conn)
                else:
                    self._catch_up(state, conn)
            state.marker = marker
            return state.index

    def _decoded(self, state: _IndexState, rows: Any) -> Iterator[tuple[str, Any, int | None]]:
        for key, text, expires_at, updated_at in rows:
            if isinstance(updated_at, datetime) and (state.newest is None or updated_at > state.newest):
                state.newest = updated_at  # an unreadable stamp (another program's row) says nothing
            key = as_text(key)
            value, problem = read_value(partial(self.codec.read, state.index.namespace, key), text)
            if problem is not None:
                if key not in state.unreadable:
                    warn_unreadable(state.index.namespace, key)
                state.unreadable.add(key)  # another program's row; recall cannot use it
                continue
            state.unreadable.discard(key)
            # An expiry that is not a number (SQLite keeps 'soon') never compares as expired in SQL.
            yield key, value, read_expiry(expires_at)[0]

    def _load(self, state: _IndexState, conn: Any) -> None:
        namespace = state.index.namespace
        # The window's marks are read before the values: a row changed in between shows a
        # different mark on the next call and is read again, never the other way round.
        newest = kv.newest_stamp(conn, self.prefix, namespace, self.shape)
        since = newest - REINDEX_OVERLAP if isinstance(newest, datetime) else None
        probe = kv.index_probe(conn, self.prefix, namespace, since, self.shape)
        state.window = _marks(probe)
        state.index.load(self._decoded(state, kv.index_rows(conn, self.prefix, namespace, None, self.shape)))

    def _catch_up(self, state: _IndexState, conn: Any) -> None:
        """Bring the index up to date: read the key, stamp and version of the rows stamped within
        the overlap of the newest seen, index again only those that differ from what was seen
        there, and compare the row count to find rows deleted (or stamped far back) elsewhere."""
        index, namespace = state.index, state.index.namespace
        since = None if state.newest is None else state.newest - REINDEX_OVERLAP
        # Read before the marks: a row changed after it makes the next digest differ.
        digest = (since, kv.window_digest(conn, self.prefix, namespace, since, self.shape))
        if digest[1] is None or digest != state.digest:
            self._probe_window(state, conn, since)
            state.digest = digest
        count = kv.count_namespace(conn, self.prefix, namespace, self.shape)
        if count == len(index) + len(state.unreadable):
            return
        # Rows went missing (deleted elsewhere) or came with an old stamp: compare every key.
        present = kv.namespace_keys(conn, self.prefix, namespace, self.shape)
        for key in (set(index.slot_of) | state.unreadable) - present:
            index.remove(key)
            state.unreadable.discard(key)
        self._index_keys(state, conn, sorted(present - set(index.slot_of) - state.unreadable))

    def _probe_window(self, state: _IndexState, conn: Any, since: datetime | None) -> None:
        """Read the marks of the rows stamped since ``since``; index again those that changed."""
        probe = kv.index_probe(conn, self.prefix, state.index.namespace, since, self.shape)
        window = _marks(probe)
        changed = [key for key, mark in window.items() if state.window.get(key) != mark]
        if changed:
            self._index_keys(state, conn, changed)
        # Only once indexed: marks of rows that fell out of the window go with it.
        state.window = window
        stamps = [stamp for _, stamp, _, _ in probe if isinstance(stamp, datetime)]
        if stamps and (state.newest is None or max(stamps) > state.newest):
            state.newest = max(stamps)

    def _index_keys(self, state: _IndexState, conn: Any, keys: list[str]) -> None:
        """Index the stored rows of ``keys`` as they are now; drop those no longer stored."""
        index, unknown = state.index, sorted(keys)
        while unknown:
            try:
                rows = kv.rows_of_keys(conn, self.prefix, index.namespace, unknown, self.shape)
            except UndecodableValue as exc:  # another program's row; recall cannot use it
                if exc.key not in state.unreadable:
                    warn_unreadable(index.namespace, exc.key)
                state.unreadable.add(exc.key)
                index.remove(exc.key)
                unknown.remove(exc.key)
                continue
            found = {row.key for row in rows}
            for row in rows:
                if row.raw_value:  # another program's row; recall cannot use it
                    if row.key not in state.unreadable:
                        warn_unreadable(index.namespace, row.key)
                    state.unreadable.add(row.key)
                    index.remove(row.key)
                else:
                    state.unreadable.discard(row.key)
                    index.put(row.key, row.value, row.expires_at)
            for key in set(unknown) - found:
                index.remove(key)
                state.unreadable.discard(key)
            break

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return self._read("fetch", kv.rows_of_keys, namespace, sorted(keys))
