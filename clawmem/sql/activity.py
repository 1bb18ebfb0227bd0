"""Rows per day, the aggregate counts behind the Overview's charts.

Every count reads only the index entries of the days asked (``created_at`` is indexed), never a
pass over the whole table. On SQLite each day is a range count, all days asked in one statement
of scalar subqueries. On PostgreSQL and MariaDB/MySQL, where planning and binding sixty
subqueries costs more than counting a few thousand rows, the Overview's chart counts the window's
rows per day in one ``GROUP BY`` on the day of ``created_at`` (times are stored as naive UTC, so
that day is the UTC day the edges bound).
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from itertools import pairwise
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from clawmem.crypto import PLAIN, Cipher, Context, is_sealed
from clawmem.errors import Undecryptable
from clawmem.records import NamespaceCount
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql import kv
from clawmem.sql.conversation_list import edge
from clawmem.sql.schema import tables
from clawmem.sql.sealing import MESSAGES as SEALED_MESSAGES

MAX_DAYS = 366
GROUPED_DIALECTS = ("postgresql", "mysql", "mariadb")  # where the charts count by GROUP BY
WHOLE, MESSAGES, CONVERSATIONS, REPORTED = 0, 1, 2, 3  # the kinds of row of _grouped_activity_select
MEMORY = 1  # _memory_counts_select's rows per day (its namespaces' counts are WHOLE)


@dataclass(frozen=True)
class Activity:
    """Messages written and conversations begun on each UTC day, oldest day first, how many
    conversations are stored now, the earliest ``created_at`` and latest ``updated_at`` of any
    conversation (``None``: none, or none readable), and the tokens the conversations were billed
    (``None``: no turn reported any, or phpClaw's tables, which hold none) in all and on each day
    (``tokens``, when asked)."""

    days: list[date]
    messages: list[int]
    conversations: list[int]
    conversations_now: int
    oldest: datetime | None = None
    newest: datetime | None = None
    total_tokens: int | None = None
    tokens: list[int | None] | None = None
    # Of the days' tokens, those of the turns' extraction calls ("memory writing"): None when
    # no row of the days reported one.
    writing_tokens: int | None = None


def day_edges(now: datetime, days: int) -> list[datetime]:
    """Return the ``days + 1`` UTC midnights that bound the last ``days`` days, today included
    (the last edge is tomorrow's midnight). Raises ``ValueError`` outside ``1..MAX_DAYS``."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be a whole number from 1 to {MAX_DAYS}, got {days!r}")
    tomorrow = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    return [tomorrow - timedelta(days=days - number) for number in range(days + 1)]


def _day_of(column: sa.Column[datetime], dialect: str) -> sa.ColumnElement[Any]:
    # The calendar day of a stored (naive UTC) time, as the server computes it.
    return sa.cast(column, sa.Date) if dialect == "postgresql" else sa.func.date(column)


def _in_window(column: sa.Column[datetime]) -> sa.ColumnElement[bool]:
    # The rows of the window [low, high) the statements of this module bind at execution.
    low, high = sa.bindparam("low", type_=column.type), sa.bindparam("high", type_=column.type)
    return sa.and_(column >= low, column < high)


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
    column = tables(prefix, shape).memory.c.created_at
    if conn.dialect.name in GROUPED_DIALECTS and _midnights(edges):
        return _counts_by_day(conn, column, edges)
    return counts_between(conn, column, edges)


def memory_counts_and_rows_per_day(
    conn: Connection, prefix: str, now: int, edges: Sequence[datetime], shape: str = CLAWMEM_SCHEMA
) -> tuple[list[NamespaceCount], list[int]] | None:
    """Return, on PostgreSQL and MariaDB/MySQL, :func:`clawmem.sql.kv.namespace_counts` and
    :func:`memory_rows_per_day` of ``edges`` (midnights) from one statement; ``None`` elsewhere,
    or for other edges."""
    if conn.dialect.name not in GROUPED_DIALECTS or not _midnights(edges):
        return None
    table = tables(prefix, shape).memory
    bound = {"now": kv.stored_moment(table, now), "low": edges[0], "high": edges[-1]}
    day_number = {edge.date(): number for number, edge in enumerate(edges[:-1])}
    counts, per_day = [], [0] * len(day_number)
    for kind, namespace, day, total, gone, timed in conn.execute(
        _memory_counts_select(prefix, shape, conn.dialect.name), bound
    ):
        if kind == WHOLE:
            counts.append(kv.namespace_count(namespace, total, gone, timed))
        elif day in day_number:
            per_day[day_number[day]] = int(total or 0)
    return counts, per_day


@functools.cache
def _memory_counts_select(prefix: str, shape: str, dialect: str) -> sa.CompoundSelect:
    # The namespaces' counts (in name order, as namespace_counts gives them) then the rows
    # first written on each day of the window.
    table = tables(prefix, shape).memory
    by_namespace = sa.select(
        sa.literal(WHOLE).label("kind"), table.c.namespace, sa.null(), *kv.namespace_count_columns(table)
    ).group_by(table.c.namespace)
    day = _day_of(table.c.created_at, dialect)
    by_day = (
        sa.select(sa.literal(MEMORY), sa.null(), day, sa.func.count(), sa.null(), sa.null())
        .where(_in_window(table.c.created_at))
        .group_by(day)
    )
    union = sa.union_all(by_namespace, by_day)
    return union.order_by(union.selected_columns.kind, union.selected_columns.namespace)


def _midnights(edges: Sequence[datetime]) -> bool:
    # Edges a day apart, each at midnight: the intervals are whole days, which a count by the
    # day of the column answers.
    return len(edges) >= 2 and all(
        later - earlier == timedelta(days=1) and earlier.time() == time()
        for earlier, later in pairwise(edges)
    )


@functools.cache
def _by_day_select(column: sa.Column[datetime], dialect: str) -> sa.Select[Any]:
    day = _day_of(column, dialect)
    return sa.select(day, sa.func.count()).where(_in_window(column)).group_by(day)


def _counts_by_day(conn: Connection, column: sa.Column[datetime], edges: Sequence[datetime]) -> list[int]:
    """Return how many rows have ``column`` on each day ``edges`` (midnights) bound, by one
    ``GROUP BY`` on the day of ``column`` over the whole range."""
    day_number = {edge.date(): number for number, edge in enumerate(edges[:-1])}
    counts = [0] * len(day_number)
    statement = _by_day_select(column, conn.dialect.name)
    for day, count in conn.execute(statement, {"low": edges[0], "high": edges[-1]}):
        if day in day_number:
            counts[day_number[day]] = int(count or 0)
    return counts


def tokens_per_day(
    conn: Connection,
    prefix: str,
    edges: Sequence[datetime],
    billed: Callable[[Mapping[str, Any] | None], int | None],
    cipher: Cipher = PLAIN,
) -> tuple[list[int | None], int | None]:
    """Return the tokens billed in each interval of ``edges``: the sum of ``billed(usage)`` over
    the assistant rows written then whose metadata holds a usage, with a turn's extraction call
    (its ``memory_writing_tokens``), ``None`` for an interval where no row reported one ("not
    reported", never 0), and those extraction calls' tokens over all the intervals (``None``:
    none reported). Sealed metadata is opened with ``cipher``; what it cannot open reports
    nothing. One range read on the messages' time index."""
    if len(edges) < 2:
        return [], None
    rows = conn.execute(_reported_select(prefix), {"low": edges[0], "high": edges[-1]})
    return _billed_per_day(rows, edges, billed, _metadata_opener(cipher, prefix))


def _billed_per_day(
    rows: Iterable[Any],
    edges: Sequence[datetime],
    billed: Callable[[Mapping[str, Any] | None], int | None],
    opened: Callable[[Any, Any], Any],
) -> tuple[list[int | None], int | None]:
    """Return :func:`tokens_per_day` of ``rows`` (``id``, ``created_at``, ``metadata``) already
    read, each metadata through ``opened(id, metadata)`` (:func:`_metadata_opener`)."""
    found: list[int | None] = [None] * (len(edges) - 1)
    writing_total: int | None = None
    for row_id, created_at, metadata in rows:
        decoded = _decoded(opened(row_id, metadata))
        reply, writing = billed(_usage(decoded)), _writing(decoded)
        if (reply is None and writing is None) or not isinstance(created_at, datetime):
            continue
        tokens = (reply or 0) + (writing or 0)
        day = bisect.bisect_right(edges, created_at) - 1
        if 0 <= day < len(found):
            found[day] = (found[day] or 0) + tokens
            if writing is not None:
                writing_total = (writing_total or 0) + writing
    return found, writing_total


def _reported_rows(prefix: str) -> sa.ColumnElement[bool]:
    # The assistant rows of the window that may hold a usage.
    messages = tables(prefix).messages
    return sa.and_(
        _in_window(messages.c.created_at), messages.c.role == "assistant", messages.c.metadata.is_not(None)
    )


@functools.cache
def _reported_select(prefix: str) -> sa.Select[Any]:
    # Built once: asked on every Overview.
    messages = tables(prefix).messages
    return sa.select(messages.c.id, messages.c.created_at, messages.c.metadata).where(_reported_rows(prefix))


def _metadata_opener(cipher: Cipher, prefix: str) -> Callable[[Any, Any], Any]:
    # Sealed metadata (encryption at rest) opened in its row's context; plaintext as it is.
    def opened(row_id: Any, metadata: Any) -> Any:
        if not is_sealed(metadata):
            return metadata
        try:
            return cipher.open(metadata, Context.row(prefix, SEALED_MESSAGES, str(row_id), "metadata"))
        except Undecryptable:
            return None

    return opened


def _decoded(metadata: Any) -> dict[str, Any] | None:
    # Another program may have written anything into the column: what is no JSON object reports
    # nothing.
    try:
        decoded = json.loads(metadata) if isinstance(metadata, str) else None
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def _usage(decoded: dict[str, Any] | None) -> Mapping[str, Any] | None:
    usage = decoded.get("usage") if decoded is not None else None
    return usage if isinstance(usage, dict) else None


def _writing(decoded: dict[str, Any] | None) -> int | None:
    # The tokens of the turn's extraction call (clawmem.turn.extraction), billed apart from its reply.
    tokens = decoded.get("memory_writing_tokens") if decoded is not None else None
    return tokens if type(tokens) is int and tokens >= 0 else None


@functools.cache
def _activity_select(prefix: str, intervals: int, ours: bool) -> sa.Select[Any]:
    # One statement for the whole chart and the conversations' edges: the Overview pays one
    # round trip for them, not five.
    schema = tables(prefix)
    conversations = schema.conversations
    per_day = (
        *_interval_counts(schema.messages.c.created_at, intervals).selected_columns,
        *_interval_counts(conversations.c.created_at, intervals).selected_columns,
    )
    whole = (
        sa.func.count(),
        sa.func.min(conversations.c.created_at),
        sa.func.max(conversations.c.updated_at),
        sa.func.sum(conversations.c.total_tokens) if ours else sa.null(),
    )
    return sa.select(
        *per_day,
        *(
            sa.select(value).select_from(conversations).scalar_subquery().label(name)
            for name, value in zip(("stored", "oldest", "newest", "total_tokens"), whole, strict=True)
        ),
    )


@functools.cache
def _grouped_activity_select(prefix: str, ours: bool, dialect: str, reported: bool) -> sa.CompoundSelect:
    # One statement: the conversations' totals and edges first (each its own subquery, so each
    # keeps its index), then the window's messages and conversations per day, and with
    # ``reported`` the rows the tokens per day are read from (see tokens_per_day).
    schema = tables(prefix)
    conversations = schema.conversations
    values = [
        sa.func.count(),
        sa.func.min(conversations.c.created_at),
        sa.func.max(conversations.c.updated_at),
    ]
    if ours:  # phpClaw's conversations keep no tokens
        values.append(sa.func.sum(conversations.c.total_tokens))
    whole = sa.select(
        sa.literal(WHOLE),
        sa.null(),
        *(sa.select(value).select_from(conversations).scalar_subquery() for value in values),
        *([] if ours else [sa.null()]),
        sa.null(),
        sa.null(),
    )

    def per_day(kind: int, column: sa.Column[datetime]) -> sa.Select[Any]:
        day = _day_of(column, dialect)
        return (
            sa.select(sa.literal(kind), day, sa.func.count(), *[sa.null()] * 5)
            .where(_in_window(column))
            .group_by(day)
        )

    parts = [
        whole,
        per_day(MESSAGES, schema.messages.c.created_at),
        per_day(CONVERSATIONS, conversations.c.created_at),
    ]
    if reported:
        messages = schema.messages
        parts.append(
            sa.select(
                sa.literal(REPORTED),
                sa.null(),
                sa.null(),
                messages.c.created_at,
                sa.null(),
                sa.null(),
                messages.c.metadata,
                messages.c.id,
            ).where(_reported_rows(prefix))
        )
    return sa.union_all(*parts)


def _grouped_counts(
    conn: Connection,
    prefix: str,
    edges: Sequence[datetime],
    ours: bool,
    billed: Callable[[Mapping[str, Any] | None], int | None] | None,
    cipher: Cipher,
) -> tuple[list[int], list[int], tuple[Any, Any, Any, Any], tuple[list[int | None] | None, int | None]]:
    """Return the messages and conversations per day of ``edges`` (UTC midnights), the
    conversations' count, earliest ``created_at``, latest ``updated_at`` and tokens, and given
    ``billed`` the tokens per day (:func:`tokens_per_day`), from one statement."""
    statement = _grouped_activity_select(prefix, ours, conn.dialect.name, billed is not None)
    day_number = {edge.date(): number for number, edge in enumerate(edges[:-1])}
    per_day = {MESSAGES: [0] * len(day_number), CONVERSATIONS: [0] * len(day_number)}
    whole: tuple[Any, Any, Any, Any] = (0, None, None, None)
    reported: list[tuple[Any, Any, Any]] = []
    for kind, day, count, moment, newest, total_tokens, metadata, row_id in conn.execute(
        statement, {"low": edges[0], "high": edges[-1]}
    ):
        if kind == WHOLE:
            whole = (count, moment, newest, total_tokens)
        elif kind == REPORTED:
            reported.append((row_id, moment, metadata))
        elif day in day_number:
            per_day[kind][day_number[day]] = int(count or 0)
    if billed is None:
        return per_day[MESSAGES], per_day[CONVERSATIONS], whole, (None, None)
    tokens = _billed_per_day(reported, edges, billed, _metadata_opener(cipher, prefix))
    return per_day[MESSAGES], per_day[CONVERSATIONS], whole, tokens


def activity(
    conn: Connection,
    prefix: str,
    now: datetime,
    days: int,
    shape: str = CLAWMEM_SCHEMA,
    billed: Callable[[Mapping[str, Any] | None], int | None] | None = None,
    cipher: Cipher = PLAIN,
) -> Activity:
    """Return the messages and conversations of each of the last ``days`` UTC days up to ``now``,
    with the conversations stored now, their earliest and latest times and their tokens, in one
    statement, and, given ``billed``, the tokens of each day (see :func:`tokens_per_day`; none
    on phpClaw's tables, whose messages keep no usage), in the same statement on a server and
    in a second on SQLite. Metadata sealed at rest is opened with ``cipher``."""
    ours = shape == CLAWMEM_SCHEMA
    edges = day_edges(now, days)
    billed = billed if ours else None  # phpClaw's messages keep no usage
    if conn.dialect.name in GROUPED_DIALECTS:
        messages, conversations, whole, tokens = _grouped_counts(conn, prefix, edges, ours, billed, cipher)
        total, oldest, newest, total_tokens = whole
    else:
        bounds: dict[str, datetime] = {}
        for number, (low, high) in enumerate(pairwise(edges)):
            bounds[f"low{number}"], bounds[f"high{number}"] = low, high
        found = list(conn.execute(_activity_select(prefix, days, ours), bounds).one())
        messages, conversations = found[:days], found[days : 2 * days]
        total, oldest, newest, total_tokens = found[2 * days :]
        tokens = (None, None) if billed is None else tokens_per_day(conn, prefix, edges, billed, cipher)
    return Activity(
        [edge.date() for edge in edges[:-1]],
        [int(count or 0) for count in messages],
        [int(count or 0) for count in conversations],
        int(total or 0),
        _readable_edge(conn, prefix, sa.func.min, "created_at", oldest),
        _readable_edge(conn, prefix, sa.func.max, "updated_at", newest),
        None if total_tokens is None else int(total_tokens),
        tokens[0],
        tokens[1],
    )


def _readable_edge(conn: Connection, prefix: str, function: Any, by: str, found: Any) -> datetime | None:
    # Another program's unreadable time sorts first or last: only then is it asked for again.
    if found is None or isinstance(found, datetime):
        return found
    return edge(conn, prefix, function, by)
