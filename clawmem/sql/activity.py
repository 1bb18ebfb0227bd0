"""Rows per day, the aggregate counts behind the Overview's charts.

Every count is a range count on an indexed time column (``created_at``), asked for all days in
one statement of scalar subqueries: the same SQL on every dialect and both table shapes, and a
day costs only the index entries of that day, never a pass over the whole table.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from itertools import pairwise
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql.conversations import edge
from clawmem.sql.schema import tables

MAX_DAYS = 366


@dataclass(frozen=True)
class Activity:
    """Messages written and conversations begun on each UTC day, oldest day first, how many
    conversations are stored now, and the earliest ``created_at`` and latest ``updated_at`` of
    any conversation (``None``: none, or none readable)."""

    days: list[date]
    messages: list[int]
    conversations: list[int]
    conversations_now: int
    oldest: datetime | None = None
    newest: datetime | None = None


def day_edges(now: datetime, days: int) -> list[datetime]:
    """Return the ``days + 1`` UTC midnights that bound the last ``days`` days, today included
    (the last edge is tomorrow's midnight). Raises ``ValueError`` outside ``1..MAX_DAYS``."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be a whole number from 1 to {MAX_DAYS}, got {days!r}")
    tomorrow = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    return [tomorrow - timedelta(days=days - number) for number in range(days + 1)]


@functools.cache
def _interval_counts(column: sa.Column[datetime], intervals: int) -> sa.Select[Any]:
    # Built once per column and interval count: building 30 subqueries costs more than running them.
    def count(number: int) -> sa.Label[Any]:
        low = sa.bindparam(f"low{number}", type_=column.type)
        high = sa.bindparam(f"high{number}", type_=column.type)
        inside = sa.select(sa.func.count()).select_from(column.table).where(column >= low, column < high)
        return inside.scalar_subquery().label(f"d{number}")

    return sa.select(*(count(number) for number in range(intervals)))


def counts_between(conn: Connection, column: sa.Column[datetime], edges: Sequence[datetime]) -> list[int]:
    """Return, for each pair of neighbouring ``edges``, how many rows have ``column`` in
    ``[low, high)``: one count per interval, oldest first."""
    if len(edges) < 2:
        return []
    bounds: dict[str, datetime] = {}
    for number, (low, high) in enumerate(pairwise(edges)):
        bounds[f"low{number}"], bounds[f"high{number}"] = low, high
    found = conn.execute(_interval_counts(column, len(edges) - 1), bounds).one()
    return [int(count or 0) for count in found]


def messages_per_day(conn: Connection, prefix: str, edges: Sequence[datetime]) -> list[int]:
    """Return how many messages (every role) were written in each interval of ``edges``."""
    return counts_between(conn, tables(prefix).messages.c.created_at, edges)


def conversations_per_day(conn: Connection, prefix: str, edges: Sequence[datetime]) -> list[int]:
    """Return how many conversations began in each interval of ``edges``."""
    return counts_between(conn, tables(prefix).conversations.c.created_at, edges)


def memory_rows_per_day(
    conn: Connection, prefix: str, edges: Sequence[datetime], shape: str = CLAWMEM_SCHEMA
) -> list[int]:
    """Return how many memory rows were first written in each interval of ``edges``."""
    return counts_between(conn, tables(prefix, shape).memory.c.created_at, edges)


@functools.cache
def _activity_select(prefix: str, intervals: int) -> sa.Select[Any]:
    # One statement for the whole chart and the conversations' edges: the Overview pays one
    # round trip for them, not five.
    schema = tables(prefix)
    conversations = schema.conversations
    per_day = (*_interval_counts(schema.messages.c.created_at, intervals).selected_columns,
               *_interval_counts(conversations.c.created_at, intervals).selected_columns)
    whole = (sa.func.count(), sa.func.min(conversations.c.created_at),
             sa.func.max(conversations.c.updated_at))
    return sa.select(*per_day, *(
        sa.select(value).select_from(conversations).scalar_subquery().label(name)
        for name, value in zip(("stored", "oldest", "newest"), whole, strict=True)
    ))


def activity(conn: Connection, prefix: str, now: datetime, days: int) -> Activity:
    """Return the messages and conversations of each of the last ``days`` UTC days up to ``now``,
    with the conversations stored now and their earliest and latest times, in one statement."""
    edges = day_edges(now, days)
    bounds: dict[str, datetime] = {}
    for number, (low, high) in enumerate(pairwise(edges)):
        bounds[f"low{number}"], bounds[f"high{number}"] = low, high
    found = list(conn.execute(_activity_select(prefix, days), bounds).one())
    messages, conversations = found[:days], found[days:2 * days]
    total, oldest, newest = found[2 * days:]
    return Activity(
        [edge.date() for edge in edges[:-1]],
        [int(count or 0) for count in messages],
        [int(count or 0) for count in conversations],
        int(total or 0),
        _readable_edge(conn, prefix, sa.func.min, "created_at", oldest),
        _readable_edge(conn, prefix, sa.func.max, "updated_at", newest),
    )


def _readable_edge(conn: Connection, prefix: str, function: Any, by: str, found: Any) -> datetime | None:
    # Another program's unreadable time sorts first or last: only then is it asked for again.
    if found is None or isinstance(found, datetime):
        return found
    return edge(conn, prefix, function, by)
