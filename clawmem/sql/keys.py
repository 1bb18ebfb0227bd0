"""Statements on the encrypted columns as stored (SPEC 13): rows per key id, plaintext rows left,
and the newest row under a key id. None of them decrypts; the envelope's key id stands in plain
at its start (see :mod:`clawmem.crypto.envelope`), so ``LIKE`` and a substring find it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from clawmem.crypto.envelope import PREFIX, like_pattern
from clawmem.sql.schema import tables

# Every encrypted column: (table, column, the time column that orders its rows newest first).
SEALED_COLUMNS = (
    ("conversations", "title", "updated_at"),
    ("conversations", "metadata", "updated_at"),
    ("messages", "content", "created_at"),
    ("messages", "tool_input", "created_at"),
    ("messages", "metadata", "created_at"),
    ("memory", "value", "updated_at"),
    ("memory", "metadata", "updated_at"),
)


@dataclass(frozen=True)
class ColumnKeys:
    """One encrypted column's rows: how many are sealed under each key id, and how many hold
    plaintext (written before encryption was on, or by another program)."""

    table: str
    column: str
    per_key: dict[str, int]
    plaintext: int


@dataclass(frozen=True)
class SealedRow:
    """The newest row of a column under a key id: where it lives and its stored text."""

    table: str
    column: str
    row_id: str
    namespace: str | None
    key: str | None
    text: str


def table_named(prefix: str, name: str) -> sa.Table:
    return getattr(tables(prefix), name)


def key_id_expression(column: Any, dialect: str) -> Any:
    """Return SQL for the key id of an envelope in ``column`` (the text between the first two
    ``$``), on SQLite, MariaDB/MySQL and PostgreSQL."""
    start = len(PREFIX) + 1
    if dialect == "postgresql":
        return sa.func.split_part(column, "$", 2)
    if dialect in ("mysql", "mariadb"):
        return sa.func.substring_index(sa.func.substring(column, start), "$", 1)
    rest = sa.func.substr(column, start)
    return sa.func.substr(rest, 1, sa.func.instr(rest, "$") - 1)


def _sealed(column: Any, key_id: str | None = None) -> Any:
    return column.like(like_pattern(key_id), escape="\\")


def column_keys(conn: Connection, prefix: str) -> list[ColumnKeys]:
    """Return, for every encrypted column of the prefix's tables, rows per key id and plaintext
    rows left (``NULL`` and empty columns counted as neither). Two grouped scans per column."""
    found = []
    for table_name, column_name, _ in SEALED_COLUMNS:
        table = table_named(prefix, table_name)
        column = table.c[column_name]
        key_id = key_id_expression(column, conn.dialect.name).label("key_id")
        rows = conn.execute(sa.select(key_id, sa.func.count()).where(_sealed(column)).group_by(key_id))
        per_key = {str(name): int(count) for name, count in rows}
        plaintext = conn.execute(
            sa.select(sa.func.count())
            .select_from(table)
            .where(column.is_not(None), column != "", sa.not_(_sealed(column)))
        ).scalar()
        found.append(ColumnKeys(table_name, column_name, per_key, int(plaintext or 0)))
    return found


def newest_sealed(conn: Connection, prefix: str, key_id: str | None = None) -> list[SealedRow]:
    """Return, per encrypted column, its newest row sealed under ``key_id`` (under any key id
    with ``None``); columns with no such row are left out. One indexed read per column."""
    found = []
    for table_name, column_name, moment in SEALED_COLUMNS:
        table = table_named(prefix, table_name)
        column = table.c[column_name]
        where = [table.c.namespace, table.c.lookup_key] if table_name == "memory" else [table.c.id]
        select = (
            sa.select(*where, column).where(_sealed(column, key_id)).order_by(table.c[moment].desc()).limit(1)
        )
        row = conn.execute(select).first()
        if row is None:
            continue
        if table_name == "memory":
            found.append(SealedRow(table_name, column_name, "", str(row[0]), str(row[1]), str(row[2])))
        else:
            found.append(SealedRow(table_name, column_name, str(row[0]).rstrip(), None, None, str(row[1])))
    return found
