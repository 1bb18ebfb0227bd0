"""Every statement on the ``{prefix}phpclaw_memory`` table, and ``MemoryStore``, its read API."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from clawmem.clock import Clock, now_seconds, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.rules import decode_value, validate_namespace
from clawmem.sql.paging import Page, check_limit, decode_cursor, page_of
from clawmem.sql.schema import tables


def _live(table: sa.Table, now: int) -> sa.ColumnElement[bool]:
    return sa.or_(table.c.expires_at.is_(None), table.c.expires_at > now)


def _expired(table: sa.Table, now: int) -> sa.ColumnElement[bool]:
    return table.c.expires_at <= now


def get_entry(conn: Connection, prefix: str, namespace: str, key: str, now: int) -> str | None:
    """Return the JSON text of a live entry, or ``None``."""
    table = tables(prefix).memory
    return conn.execute(
        sa.select(table.c.value).where(
            table.c.namespace == namespace, table.c.lookup_key == key, _live(table, now)
        )
    ).scalar_one_or_none()


def upsert_entry(
    conn: Connection,
    prefix: str,
    namespace: str,
    key: str,
    encoded: str,
    expires_at: int | None,
    clock: Clock,
) -> None:
    """Create or replace an entry in one atomic statement on every dialect."""
    table = tables(prefix).memory
    stamp = utc_datetime(clock)
    row = {
        "id": new_id(),
        "namespace": namespace,
        "lookup_key": key,
        "value": encoded,
        "expires_at": expires_at,
        "created_at": stamp,
        "updated_at": stamp,
    }
    changes = ("value", "expires_at", "updated_at")
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        insert = mysql.insert(table).values(row)
        statement = insert.on_duplicate_key_update({name: insert.inserted[name] for name in changes})
    else:
        module = postgresql if dialect == "postgresql" else sqlite
        insert = module.insert(table).values(row)
        statement = insert.on_conflict_do_update(
            index_elements=["namespace", "lookup_key"],
            set_={name: insert.excluded[name] for name in changes},
        )
    conn.execute(statement)


def delete_entry(conn: Connection, prefix: str, namespace: str, key: str) -> int:
    """Delete one entry; return the number of rows removed (0 or 1)."""
    table = tables(prefix).memory
    return conn.execute(
        sa.delete(table).where(table.c.namespace == namespace, table.c.lookup_key == key)
    ).rowcount


def delete_namespace(conn: Connection, prefix: str, namespace: str) -> int:
    """Delete every entry of ``namespace``; return how many went."""
    table = tables(prefix).memory
    return conn.execute(sa.delete(table).where(table.c.namespace == namespace)).rowcount


def live_entries(conn: Connection, prefix: str, namespace: str, now: int) -> Iterator[tuple[str, str]]:
    """Yield ``(key, JSON text)`` of every live entry of ``namespace``."""
    table = tables(prefix).memory
    result = conn.execute(
        sa.select(table.c.lookup_key, table.c.value).where(table.c.namespace == namespace, _live(table, now))
    )
    yield from result


def expired_counts(conn: Connection, prefix: str, now: int) -> dict[str, int]:
    """Return the number of expired rows per namespace."""
    table = tables(prefix).memory
    rows = conn.execute(
        sa.select(table.c.namespace, sa.func.count()).where(_expired(table, now)).group_by(table.c.namespace)
    )
    return {namespace: count for namespace, count in rows}


def delete_expired(conn: Connection, prefix: str, namespace: str, now: int) -> int:
    """Delete the expired rows of ``namespace``; return how many went.

    The condition is re-checked row by row, so an entry a concurrent writer just renewed stays.
    """
    table = tables(prefix).memory
    return conn.execute(sa.delete(table).where(table.c.namespace == namespace, _expired(table, now))).rowcount


def namespaces(conn: Connection, prefix: str) -> list[str]:
    """Return every namespace with at least one row."""
    table = tables(prefix).memory
    return list(conn.execute(sa.select(table.c.namespace).distinct()).scalars())


# -- the read API ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NamespaceCount:
    """Entries of one namespace: all rows, live ones and expired-but-unswept ones."""

    namespace: str
    total: int
    live: int
    expired: int


@dataclass(frozen=True)
class MemoryRow:
    """One row of the memory table as an operator sees it, expired or not."""

    namespace: str
    key: str
    value: Any
    metadata: dict[str, Any] | None
    expires_at: int | None
    created_at: datetime
    updated_at: datetime
    bytes: int


def memory_row(row: Any) -> MemoryRow:
    """Return a row of the memory table as a :class:`MemoryRow` (value and metadata decoded)."""
    return MemoryRow(
        namespace=row.namespace,
        key=row.lookup_key,
        value=decode_value(row.value),
        metadata=json.loads(row.metadata) if row.metadata else None,
        expires_at=row.expires_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        bytes=len(row.value.encode("utf-8")),
    )


STATES = ("live", "expiring", "expired")


def like_pattern(text: str) -> str:
    """Return a LIKE pattern matching ``text`` anywhere, with ``\\`` escaping % and _."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class MemoryStore:
    """Read API over the key/value table for the dashboard and CLI, expired rows included."""

    def __init__(self, engine: Engine, prefix: str = "", clock: Clock = time.time) -> None:
        self.engine = engine
        self.prefix = prefix
        self.table = tables(prefix).memory
        self.clock = clock

    def namespaces(self) -> list[NamespaceCount]:
        """Return every namespace with its total, live and expired counts, sorted by name."""
        table, now = self.table, now_seconds(self.clock)
        expired = sa.func.sum(sa.case((_expired(table, now), 1), else_=0))
        query = (
            sa.select(table.c.namespace, sa.func.count(), expired)
            .group_by(table.c.namespace)
            .order_by(table.c.namespace)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [NamespaceCount(ns, total, total - int(gone or 0), int(gone or 0)) for ns, total, gone in rows]

    def count(self, namespace: str) -> int:
        """Return how many rows ``namespace`` holds, expired-but-unswept ones included."""
        validate_namespace(namespace)
        table = self.table
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(sa.func.count()).select_from(table).where(table.c.namespace == namespace)
            ).scalar()
        return int(found or 0)

    def counts(self) -> dict[str, int]:
        """Return ``{"total", "live", "expired"}`` row counts over every namespace."""
        found = self.namespaces()
        return {
            "total": sum(n.total for n in found),
            "live": sum(n.live for n in found),
            "expired": sum(n.expired for n in found),
        }

    def newest(self) -> datetime | None:
        """Return the latest ``updated_at`` of any row (the newest write), or ``None``."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.max(self.table.c.updated_at))).scalar()

    def entries(
        self,
        namespace: str,
        *,
        state: str | None = None,
        query: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[MemoryRow]:
        """Return a page of a namespace's rows ordered by key; ``state`` filters by TTL state and
        ``query`` matches key or value text. Raises ``ValueError`` for a bad state or cursor."""
        validate_namespace(namespace)
        check_limit(limit)
        table, now = self.table, now_seconds(self.clock)
        select = sa.select(table).where(table.c.namespace == namespace)
        if state == "live":
            select = select.where(_live(table, now))
        elif state == "expiring":
            select = select.where(table.c.expires_at > now)
        elif state == "expired":
            select = select.where(_expired(table, now))
        elif state is not None:
            raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        if query:
            pattern = like_pattern(query)
            select = select.where(
                sa.or_(
                    table.c.lookup_key.ilike(pattern, escape="\\"), table.c.value.ilike(pattern, escape="\\")
                )
            )
        if cursor:
            (after,) = decode_cursor(cursor, 1)
            select = select.where(table.c.lookup_key > after)
        select = select.order_by(table.c.lookup_key).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = [memory_row(row) for row in conn.execute(select)]
        return page_of(rows, limit, lambda row: [row.key])

    def entry(self, namespace: str, key: str) -> MemoryRow | None:
        """Return one row, expired or not, or ``None``."""
        validate_namespace(namespace)
        table = self.table
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(table).where(table.c.namespace == namespace, table.c.lookup_key == key)
            ).first()
        return None if row is None else memory_row(row)
