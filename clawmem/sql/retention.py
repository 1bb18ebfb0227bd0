"""Retention in SQL: delete conversations with their messages in batches, and count what a run
would delete.

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
from clawmem.sql.engine import connect, write_transaction
from clawmem.sql.schema import tables

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
    with connect(engine) as conn:
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
