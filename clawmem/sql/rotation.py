"""Statements of a key rotation (SPEC 13): the rows of an encrypted column that are not yet under
the key that encrypts, read in keyset batches, and their new text written back only where the row
still holds what was read, so a value the agent wrote meanwhile is never overwritten.

Rows under a subject's data key (key ids ``s-…``) are never rotated: a new master key re-wraps
the data key instead, in the key store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.crypto.envelope import like_pattern
from clawmem.sql.engine import write_transaction
from clawmem.sql.keys import SEALED_COLUMNS, table_named

# The encrypted columns of each table (those of clawmem.sql.keys), in the order a row's texts are held.
ROTATED: dict[str, tuple[str, ...]] = {}
for _table_name, _column, _ in SEALED_COLUMNS:
    ROTATED[_table_name] = (*ROTATED.get(_table_name, ()), _column)
DATA_KEY_PATTERN = "cm1$s-%"  # sealed under a subject's data key (see clawmem.crypto.keystore)


@dataclass(frozen=True)
class StoredRow:
    """One row as stored: where it lives, whose it is (a user id, for the key store), and the
    text of each encrypted column (``None`` for NULL)."""

    table: str
    row_id: str
    texts: tuple[str | None, ...]
    user_id: str | None = None
    namespace: str | None = None
    key: str | None = None


def _behind(column: sa.Column[str], primary: str) -> sa.ColumnElement[bool]:
    # A value not yet under the key that encrypts: plaintext, or sealed under another master key.
    return sa.and_(
        column.is_not(None),
        sa.not_(column.like(like_pattern(primary), escape="\\")),
        sa.not_(column.like(DATA_KEY_PATTERN)),
    )


def _like_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _a_subjects(prefix: str, table: sa.Table, name: str, template: str) -> sa.ColumnElement[bool]:
    # Rows that belong to a subject, whose data key seals them once a key store is set: a
    # conversation with a user id, its messages, and entries of a subject namespace whose id
    # can be read back (not one held there only as its hash, ".:…").
    if name == "conversations":
        return table.c.user_id != ""
    if name == "messages":
        conversations = table_named(prefix, "conversations")
        owned = sa.select(conversations.c.id).where(conversations.c.user_id != "")
        return table.c.conversation_id.in_(owned)
    head, _, tail = template.partition("{user_id}")
    return sa.and_(
        table.c.namespace.like(_like_literal(head) + "%" + _like_literal(tail), escape="\\"),
        sa.not_(table.c.namespace.like(_like_literal(head + ".:") + "%", escape="\\")),
    )


def _needs_rotation(
    prefix: str, table: sa.Table, name: str, primary: str, subjects: str | None
) -> sa.ColumnElement[bool]:
    behind = sa.or_(*(_behind(table.c[column], primary) for column in ROTATED[name]))
    if subjects is None:
        return behind
    # With a key store, a subject's row still under a master key moves to the subject's data key.
    unkeyed = sa.or_(
        *(
            sa.and_(table.c[column].is_not(None), sa.not_(table.c[column].like(DATA_KEY_PATTERN)))
            for column in ROTATED[name]
        )
    )
    return sa.or_(behind, sa.and_(_a_subjects(prefix, table, name, subjects), unkeyed))


def count_behind(conn: Connection, prefix: str, name: str, primary: str, subjects: str | None = None) -> int:
    """Return how many rows of table ``name`` hold a value not under the key id ``primary`` (and,
    with ``subjects`` the subject namespace template of a site with a key store, a subject's
    value not under a data key)."""
    table = table_named(prefix, name)
    where = _needs_rotation(prefix, table, name, primary, subjects)
    return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(where)).scalar() or 0)


def rows_behind(
    conn: Connection,
    prefix: str,
    name: str,
    primary: str,
    after: str,
    limit: int,
    subjects: str | None = None,
) -> list[StoredRow]:
    """Return up to ``limit`` rows of table ``name`` with an id above ``after`` that
    :func:`count_behind` counts, by id (a message with its conversation's user id)."""
    table = table_named(prefix, name)
    texts = [table.c[column] for column in ROTATED[name]]
    where = sa.and_(table.c.id > after, _needs_rotation(prefix, table, name, primary, subjects))
    if name == "memory":
        query = sa.select(table.c.id, *texts, table.c.namespace, table.c.lookup_key)
    elif name == "messages":
        conversations = table_named(prefix, "conversations")
        query = sa.select(table.c.id, *texts, conversations.c.user_id).select_from(
            table.outerjoin(conversations, conversations.c.id == table.c.conversation_id)
        )
    else:
        query = sa.select(table.c.id, *texts, table.c.user_id)
    found = []
    for row in conn.execute(query.where(where).order_by(table.c.id).limit(limit)).all():
        values = tuple(row[1 : 1 + len(texts)])
        rest = row[1 + len(texts) :]
        if name == "memory":
            found.append(StoredRow(name, row[0], values, namespace=rest[0], key=rest[1]))
        else:
            found.append(StoredRow(name, row[0], values, user_id=rest[0] or None))
    return found


def write_rotated(
    engine: Engine, prefix: str, name: str, changes: Sequence[tuple[StoredRow, tuple[str | None, ...]]]
) -> int:
    """Write each row's new texts in one transaction, only where the row still holds the texts it
    was read with; return how many rows changed (the others were written meanwhile)."""
    if not changes:
        return 0
    table = table_named(prefix, name)
    columns = ROTATED[name]
    statement = (
        sa.update(table)
        .where(
            table.c.id == sa.bindparam("row_id"),
            *(table.c[column].is_not_distinct_from(sa.bindparam(f"old_{column}")) for column in columns),
        )
        .values({column: sa.bindparam(f"new_{column}") for column in columns})
    )
    parameters = []
    for row, new in changes:
        values: dict[str, str | None] = {"row_id": row.row_id}
        for column, old_text, new_text in zip(columns, row.texts, new, strict=True):
            values[f"old_{column}"] = old_text
            values[f"new_{column}"] = new_text
        parameters.append(values)
    with write_transaction(engine) as conn:
        # Compiled once and handed to the driver as is: a batch is thousands of plain strings,
        # and SQLAlchemy's per-row parameter processing would cost more than the encryption.
        compiled = statement.compile(dialect=conn.dialect)
        if compiled.positional:
            order = compiled.positiontup or []
            batch: list[Any] = [tuple(values[name] for name in order) for values in parameters]
        else:
            batch = parameters
        result = conn.exec_driver_sql(str(compiled), batch)
    return max(0, result.rowcount or 0)
