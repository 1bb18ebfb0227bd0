"""Retention in SQL: delete conversations with their messages in batches, count what a run would
delete, measure the three tables per dialect, and drop a prefix's tables.

Conversations have no TTL; this module is how a retention window or an erasure is enforced.
Messages go first and then their conversations, and every batch is one transaction, so a run
killed at any moment leaves no orphan messages and the next run finishes the job.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.sql.conversations import check_order_column, delete_conversations
from clawmem.sql.engine import write_transaction
from clawmem.sql.schema import drop_tables, tables

_WINDOW = re.compile(r"([0-9]+)([dh])")
_UNITS = {"d": "days", "h": "hours"}
MAX_WINDOW = timedelta(days=36_500)  # a century; beyond it the cutoff would leave the calendar


def parse_window(text: str) -> timedelta:
    """Return a retention window written ``<N>d`` (days) or ``<N>h`` (hours), 1 <= N, at most a
    century. Raises ``ValueError`` with the accepted form for anything else (``90x``, ``-5d``, ``0d``)."""
    found = _WINDOW.fullmatch(text.strip()) if isinstance(text, str) else None
    rule = "use <N>d or <N>h with N >= 1, for example 90d"
    if found is None or int(found[1]) == 0:
        raise ValueError(f"{text!r} is not a retention window: {rule}")
    if int(found[1]) > MAX_WINDOW.days * (24 if found[2] == "h" else 1):
        raise ValueError(f"{text!r} is longer than the longest retention window, {MAX_WINDOW.days}d")
    return timedelta(**{_UNITS[found[2]]: int(found[1])})


def older_than(prefix: str, by: str, cutoff: datetime) -> sa.ColumnElement[bool]:
    """Return the condition "conversation's ``by`` column is before ``cutoff``" (naive UTC).

    Raises ``ValueError`` unless ``by`` is ``created_at`` or ``updated_at``.
    """
    return tables(prefix).conversations.c[check_order_column(by)] < cutoff


def check_batch_size(batch_size: object) -> int:
    """Return ``batch_size`` if it is a positive int, else raise ``ValueError``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return batch_size


@dataclass(frozen=True)
class Counts:
    """How many conversations, and messages of those conversations, a condition selects."""

    conversations: int
    messages: int


def count_conversations(conn: Connection, prefix: str, where: sa.ColumnElement[bool]) -> Counts:
    """Return how many conversations match ``where`` and how many messages they hold."""
    schema = tables(prefix)
    conversations, messages = schema.conversations, schema.messages
    selected = sa.select(conversations.c.id).where(where)
    found = conn.execute(sa.select(sa.func.count()).select_from(conversations).where(where)).scalar()
    held = conn.execute(
        sa.select(sa.func.count()).select_from(messages).where(messages.c.conversation_id.in_(selected))
    ).scalar()
    return Counts(int(found or 0), int(held or 0))


def iter_conversation_ids(
    conn: Connection, prefix: str, where: sa.ColumnElement[bool], order_by: str = "created_at"
) -> Iterator[tuple[str, datetime]]:
    """Yield ``(id, order_by value)`` of every matching conversation, oldest first, streamed."""
    conversations = tables(prefix).conversations
    column = conversations.c[order_by]
    result = conn.execution_options(yield_per=1000).execute(
        sa.select(conversations.c.id, column).where(where).order_by(column, conversations.c.id)
    )
    yield from result  # each row unpacks as (id, moment)


@contextlib.contextmanager
def batch_transaction(engine: Engine) -> Iterator[Connection]:
    """Yield a connection inside one write transaction for a deletion batch.

    On MariaDB/MySQL it runs at READ COMMITTED, as PostgreSQL does by default: InnoDB then
    locks only the rows deleted, not the gaps after them, so a batch never blocks an agent
    inserting new messages elsewhere, and cannot deadlock with one. Writers lock a
    conversation row before adding to it, and the batch has locked its rows first.
    """
    if engine.dialect.name not in ("mysql", "mariadb"):
        with write_transaction(engine) as conn:
            yield conn
        return
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            yield conn


@dataclass(frozen=True)
class Batch:
    """One committed batch: the conversations deleted, their message count and how long it took."""

    conversation_ids: tuple[str, ...]
    messages: int
    seconds: float

    @property
    def conversations(self) -> int:
        """Return how many conversations this batch deleted."""
        return len(self.conversation_ids)


def _namespaces(engine: Engine, prefix: str, where: sa.ColumnElement[bool]) -> list[str]:
    conversations = tables(prefix).conversations
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(conversations.c.namespace).where(where).distinct()).scalars())


def _delete_batch(
    conn: Connection, prefix: str, where: sa.ColumnElement[bool], namespace: str, order_by: str, size: int
) -> tuple[list[str], int] | None:
    """Delete one batch; return its ids and message count, or ``None`` when nothing matches."""
    conversations = tables(prefix).conversations
    column = conversations.c[order_by]
    # Candidates come from a plain read (no locks on the rows scanned to find them); then only
    # the chosen rows are locked by primary key, re-checking the condition in case a writer
    # changed one in between. A writer saving one of them waits for this commit and then
    # finds the conversation gone, so it can never add messages to a deleted conversation.
    candidates = (
        conn.execute(
            sa.select(conversations.c.id)
            .where(conversations.c.namespace == namespace, where)
            .order_by(column, conversations.c.id)
            .limit(size)
        )
        .scalars()
        .all()
    )
    if not candidates:
        return None
    locked = (
        conn.execute(
            sa.select(conversations.c.id)
            .where(conversations.c.id.in_(candidates), where)
            .order_by(conversations.c.id)
            .with_for_update()
        )
        .scalars()
        .all()
    )
    if not locked:
        return [], 0  # every candidate changed meanwhile; the next batch selects afresh
    _, deleted_messages = delete_conversations(conn, prefix, locked)
    return list(locked), deleted_messages


def delete_in_batches(
    engine: Engine,
    prefix: str,
    where: sa.ColumnElement[bool],
    *,
    order_by: str = "created_at",
    batch_size: int = 1000,
) -> Iterator[Batch]:
    """Delete every conversation matching ``where`` with its messages; yield each committed batch.

    Works namespace by namespace, oldest ``order_by`` first, ``batch_size`` conversations per
    transaction (messages first, then the conversations). Only ids of the current batch are
    held in memory. Raises ``ValueError`` for a bad ``order_by`` or ``batch_size``.
    """
    check_order_column(order_by, "order_by")
    check_batch_size(batch_size)
    for namespace in _namespaces(engine, prefix, where):
        while True:
            started = time.perf_counter()
            with batch_transaction(engine) as conn:
                outcome = _delete_batch(conn, prefix, where, namespace, order_by, batch_size)
            if outcome is None:
                break
            deleted, messages = outcome
            if deleted:
                yield Batch(tuple(deleted), messages, time.perf_counter() - started)


# -- sizes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableStats:
    """One table of the prefix: whether it exists, its exact row count and its size on disk.

    ``bytes`` is ``None`` when the database cannot tell (SQLite without the dbstat table).
    """

    name: str
    exists: bool
    rows: int | None
    bytes: int | None


def _three(prefix: str) -> list[sa.Table]:
    schema = tables(prefix)
    return [schema.conversations, schema.messages, schema.memory]


def table_names(prefix: str) -> list[str]:
    """Return the names of the prefix's three tables: conversations, messages, memory."""
    return [table.name for table in _three(prefix)]


def _mysql_sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    # The inspection query of the phpClaw article, limited to this prefix's tables.
    rows = conn.execute(
        sa.text(
            "SELECT table_name, data_length + index_length FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name IN :names"
        ).bindparams(sa.bindparam("names", expanding=True)),
        {"names": names},
    )
    return {name: int(size or 0) for name, size in rows}


def _postgres_sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    # Looked up by relname rather than a regclass cast, so a prefix with capitals needs no quoting.
    rows = conn.execute(
        sa.text(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname IN :names"
        ).bindparams(sa.bindparam("names", expanding=True)),
        {"names": names},
    )
    return {name: int(size) for name, size in rows}


def _sqlite_sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    # dbstat lists b-trees by their own name, so a table's size is its b-tree plus its indexes'.
    owners = dict(
        conn.execute(
            sa.text("SELECT name, tbl_name FROM sqlite_master WHERE tbl_name IN :names").bindparams(
                sa.bindparam("names", expanding=True)
            ),
            {"names": names},
        ).all()
    )
    sizes = dict.fromkeys(names, 0)
    try:
        rows = conn.execute(
            sa.text("SELECT name, SUM(pgsize) FROM dbstat WHERE name IN :btrees GROUP BY name").bindparams(
                sa.bindparam("btrees", expanding=True)
            ),
            {"btrees": list(owners)},
        ).all()
    except sa.exc.OperationalError:
        return {}  # this SQLite was built without the dbstat virtual table
    for btree, size in rows:
        if btree in owners:
            sizes[owners[btree]] += int(size or 0)
    return sizes


_SIZE_QUERIES = {
    "mysql": _mysql_sizes,
    "mariadb": _mysql_sizes,
    "postgresql": _postgres_sizes,
    "sqlite": _sqlite_sizes,
}


def table_stats(engine: Engine, prefix: str) -> list[TableStats]:
    """Return rows and bytes of the prefix's three tables on MariaDB/MySQL, PostgreSQL or SQLite.

    Rows are exact counts; a missing table is reported with ``exists=False``.
    """
    found = {stats.name: stats for stats in existing_tables(engine, prefix)}
    sizes: dict[str, int] = {}
    if found:
        measure = _SIZE_QUERIES.get(engine.dialect.name)
        if measure is not None:
            with engine.connect() as conn:
                sizes = measure(conn, list(found))
    return [
        TableStats(name, name in found, found[name].rows if name in found else None, sizes.get(name))
        for name in table_names(prefix)
    ]


def sqlite_file_bytes(engine: Engine) -> int | None:
    """Return page_count * page_size of a SQLite database (the whole file), else ``None``."""
    if engine.dialect.name != "sqlite":
        return None
    with engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar()
    return int(pages or 0) * int(size or 0)


# -- uninstall --------------------------------------------------------------------------------


def present_tables(engine: Engine, prefix: str) -> list[str]:
    """Return the names of the prefix's three tables that exist, in :func:`table_names` order."""
    existing = set(sa.inspect(engine).get_table_names())
    return [name for name in table_names(prefix) if name in existing]


def existing_tables(engine: Engine, prefix: str) -> list[TableStats]:
    """Return the prefix's tables that exist, with exact row counts (sizes left out)."""
    present = set(present_tables(engine, prefix))
    found = []
    with engine.connect() as conn:
        for table in _three(prefix):
            if table.name in present:
                rows = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
                found.append(TableStats(table.name, True, int(rows or 0), None))
    return found


def drop_prefix_tables(engine: Engine, prefix: str) -> list[str]:
    """Drop the prefix's three tables (those that exist); return the names dropped."""
    present = present_tables(engine, prefix)
    drop_tables(engine, prefix)
    return present
