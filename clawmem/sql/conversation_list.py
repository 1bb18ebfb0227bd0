"""The conversation list's statements: its sorts, filters and keyset cursors, each page with its
message counts (and, asked, its total), the search's candidates, and the counts the overview
and a subject's page show. :mod:`clawmem.sql.conversations` holds one conversation's statements."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from clawmem.errors import InvalidCursor
from clawmem.paging import decode_moment, decode_sorted_cursor, directed_name, moment_key
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql.conversations import ConversationSummary, check_order_column, fields_of
from clawmem.sql.exact import equals_exactly
from clawmem.sql.kv import like_pattern
from clawmem.sql.lenient import as_text, raw_moment
from clawmem.sql.paging import sorted_rows
from clawmem.sql.schema import row_columns, tables


def table_counts(conn: Connection, prefix: str) -> dict[str, int]:
    """Return ``{"conversations": n, "messages": n}``."""
    schema = tables(prefix)
    return {
        name: int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)
        for name, table in (("conversations", schema.conversations), ("messages", schema.messages))
    }


def role_counts(conn: Connection, prefix: str) -> dict[str, int]:
    """Return how many messages each role has, by role name."""
    table = tables(prefix).messages
    rows = conn.execute(
        sa.select(table.c.role, sa.func.count()).group_by(table.c.role).order_by(table.c.role)
    )
    return {str(role): int(count) for role, count in rows}


def edge(conn: Connection, prefix: str, function: Any, by: str) -> datetime | None:
    """Return ``function`` (``sa.func.min`` or ``max``) of the conversations' ``by`` column."""
    column = tables(prefix).conversations.c[check_order_column(by)]
    found = conn.execute(sa.select(function(column))).scalar()
    if found is None or isinstance(found, datetime):
        return found
    # Another program's unreadable time (a zero date, 'soon') sorts first or last: take the
    # edge of the readable ones instead.
    found = conn.execute(
        sa.select(function(column)).where(column.between(datetime.min, datetime.max))
    ).scalar()
    return found if isinstance(found, datetime) else None


def subjects(conn: Connection, prefix: str, limit: int) -> list[str]:
    """Return up to ``limit`` user ids that have a conversation (none for the anonymous ''), in
    order, from the conversations' user index."""
    table = tables(prefix).conversations
    select = sa.select(table.c.user_id).where(table.c.user_id != "").distinct().order_by(table.c.user_id)
    return [as_text(user_id) for user_id in conn.execute(select.limit(limit)).scalars()]


def conversation_namespaces(conn: Connection, prefix: str) -> list[str]:
    """Return every namespace that holds a conversation, in order, on every list page (the
    namespace filter's choices), skipping from one namespace to the next in the namespace
    index: a DISTINCT on MariaDB/MySQL, which do that skip themselves; elsewhere, where a
    DISTINCT reads every conversation's entry, one seek each for the next larger one."""
    return list(conn.execute(_namespaces_select(prefix, conn.dialect.name)).scalars())


@functools.cache
def _namespaces_select(prefix: str, dialect: str) -> sa.Select[Any]:
    # Built once per prefix: every list page asks, and building the recursive statement cost
    # about as much as running it. MariaDB runs each recursive step as a scan of the index
    # from its start (a comparison with the step's namespace gives it no range): 50,000
    # conversations in one namespace, 11 ms against 0.3 for its DISTINCT; PostgreSQL's
    # DISTINCT 9 ms against 0.2 for the steps.
    table = tables(prefix).conversations
    if dialect in ("mysql", "mariadb"):
        return sa.select(table.c.namespace).distinct().order_by(table.c.namespace)
    found = sa.select(sa.func.min(table.c.namespace).label("namespace")).cte("found", recursive=True)
    following = sa.select(sa.func.min(table.c.namespace)).where(table.c.namespace > found.c.namespace)
    found = found.union_all(sa.select(following.scalar_subquery()).where(found.c.namespace.is_not(None)))
    return sa.select(found.c.namespace).where(found.c.namespace.is_not(None))


# How the conversation list can be ordered: the column, and whether newest (or Z) comes first.
# Each is served by an index on (column, id); titles may be NULL, and untitled ones come last.
# ``tokens`` is the conversation's total_tokens (not reported, NULL, last); ``messages`` its count
# of messages said, counted per row (no index serves it: it reads every conversation's count).
SORTS = {
    "updated": ("updated_at", True),
    "created": ("created_at", True),
    "title": ("title", False),
    "tokens": ("total_tokens", True),
    "messages": ("message_count", True),
}
NUMERIC_SORTS = ("tokens", "messages")


def check_sort(sort: str) -> str:
    """Return ``sort`` if the conversation list can be ordered by it, else raise ``ValueError``."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    return sort


def sort_name(sort: str, descending: bool | None) -> str:
    """Return the name a cursor of the conversation list's ``sort`` in that direction is made
    for (``tokens``, or ``tokens:asc`` for the other way than its own)."""
    return directed_name(sort, descending, SORTS[sort][1])


def cursor_key(conversation: ConversationSummary, sort: str, descending: bool | None = None) -> list[Any]:
    """Return the key of the cursor after ``conversation`` in the list ordered by ``sort``:
    ``[sort, the sort column as text (None for no title or no tokens), id]``."""
    name = sort_name(sort, descending)
    if sort == "title":
        return [name, conversation.title, conversation.id]
    if sort == "tokens":
        tokens = conversation.total_tokens
        return [name, None if tokens is None else str(tokens), conversation.id]
    if sort == "messages":
        return [name, str(conversation.message_count), conversation.id]
    if sort == "updated":
        return [name, moment_key(conversation.updated_at, conversation.raw_updated_at), conversation.id]
    return [name, moment_key(conversation.created_at, conversation.raw_created_at), conversation.id]


def _start(cursor: str, sort: str, dialect: str, descending: bool | None = None) -> tuple[Any, str]:
    value, conversation_id = decode_sorted_cursor(cursor, sort_name(sort, descending))
    if sort == "title":
        return value, conversation_id
    if sort in NUMERIC_SORTS:
        if value is None:
            return None, conversation_id
        if not value.isdigit():
            raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
        return int(value), conversation_id
    if value is None:  # both time columns are NOT NULL: no cursor of ours holds a NULL there
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    return decode_moment(value, cursor, dialect), conversation_id


def _filtered(
    select: sa.Select[Any],
    prefix: str,
    *,
    conversation_id: str | None = None,
    user_id: str | None = None,
    namespace: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    query: str | None = None,
    conversation_ids: Sequence[str] | None = None,
) -> sa.Select[Any]:
    schema = tables(prefix)
    table, messages = schema.conversations, schema.messages
    if conversation_id is not None:
        select = select.where(table.c.id == conversation_id)
    if conversation_ids is not None:
        select = select.where(table.c.id.in_(list(conversation_ids)))
    if user_id is not None:
        select = select.where(equals_exactly(table.c.user_id, user_id))
    if namespace is not None:
        select = select.where(table.c.namespace == namespace)
    if since is not None:
        select = select.where(table.c.created_at >= since)
    if until is not None:
        select = select.where(table.c.created_at < until)
    if query:
        pattern = like_pattern(query)
        in_messages = sa.exists().where(
            messages.c.conversation_id == table.c.id,
            messages.c.role != "recall",  # a recall record's JSON is not something anyone said
            messages.c.content.ilike(pattern, escape="\\"),
        )
        select = select.where(sa.or_(table.c.title.ilike(pattern, escape="\\"), in_messages))
    return select


def summaries(
    conn: Connection,
    prefix: str,
    *,
    limit: int,
    sort: str = "created",
    cursor: str | None = None,
    shape: str = CLAWMEM_SCHEMA,
    descending: bool | None = None,
    counted: bool = False,
    at_most: int | None = None,
    **filters: Any,
) -> tuple[list[ConversationSummary], int | None]:
    """Return up to ``limit`` conversations with their message counts in ``sort`` order (see
    :data:`SORTS`; ties by id), filtered as :meth:`clawmem.ConversationLog.list` describes
    (``conversation_id`` picks one), and, when ``counted``, how many conversations match the
    filters in all (as :func:`count_summaries` counts them, up to ``at_most``; ``None`` when not
    counted): the count is a column of the page's own statement, so a list page with its total
    costs one statement instead of two. Raises ``InvalidCursor`` for a cursor of another sort."""
    table = tables(prefix).conversations
    name, own_direction = SORTS[check_sort(sort)]
    if sort == "tokens" and shape != CLAWMEM_SCHEMA:
        raise ValueError("phpClaw's tables hold no tokens to sort by")
    start = _start(cursor, sort, conn.dialect.name, descending) if cursor else None
    direction = own_direction if descending is None else descending
    given = _given(filters)
    total = [_total_column(prefix, at_most, filters)] if counted else []
    if list(given) == ["conversation_id"] and start is None and not counted:
        # One conversation (its page asks on every request): a statement built once, the id bound.
        one = {"conversation_id": given["conversation_id"]}
        rows, counts = list(conn.execute(_one_summary_select(prefix, shape), one)), None
    elif sort == "messages" or filters.get("conversation_id") is not None:
        # The order is the count itself: every matching conversation is counted (one
        # conversation asked for by id is counted in the same statement).
        of_row = role_counts_of(prefix)
        select = _filtered(sa.select(*row_columns(table, shape), *of_row, *total), prefix, **filters)
        counts = None
        rows = sorted_rows(conn, select, [of_row[0].element, table.c.id], limit, start, descending=direction)
    elif not given and start is None and name not in NULLABLE_SORTS and not counted:
        # The list's first page unfiltered, the page most asked for: a statement built once.
        rows = list(conn.execute(_first_page_select(prefix, shape, name, direction, limit)))
        counts = None
    else:
        # Page first, then count the page's messages only: a database that computes a row's
        # columns before it sorts would otherwise count every matching conversation.
        select = _filtered(sa.select(*row_columns(table, shape), *total), prefix, **filters)
        rows = sorted_rows(
            conn,
            select,
            [table.c[name], table.c.id],
            limit,
            start,
            descending=direction,
            nullable=name in NULLABLE_SORTS,
        )
        counts = page_role_counts(conn, prefix, [row.id for row in rows])
    # Each row read once into a dict by its result's column names (looked up once): a row's
    # attributes cost more to read than the rest of a summary.
    names = rows[0]._fields if rows else ()
    found = []
    for row in rows:
        columns = dict(zip(names, row, strict=True))
        if counts is None:  # counted in the row's own statement
            said, recall = columns["message_count"], columns["recall_count"]
            checkpoints = columns["checkpoint_count"]
        else:
            said, recall, checkpoints = counts.get(columns["id"], (0, 0, 0))
        found.append(
            ConversationSummary(
                **fields_of(columns),
                message_count=int(said or 0),
                recall_count=int(recall or 0),
                checkpoint_count=int(checkpoints or 0),
                raw_created_at=raw_moment(columns["created_at"]),
                raw_updated_at=raw_moment(columns["updated_at"]),
            )
        )
    if not counted:
        return found, None
    if rows:
        return found, int(rows[0].total or 0)
    # No row to carry the count: none match, unless the page starts after the last one.
    return found, 0 if start is None else count_summaries(conn, prefix, at_most, **filters)


def _given(filters: dict[str, Any]) -> dict[str, Any]:
    """Return the filters of :func:`_filtered` that narrow the list (an empty search does not;
    an empty ``user_id`` does: it is the anonymous subject)."""
    return {
        name: value for name, value in filters.items() if value is not None and (name != "query" or value)
    }


NULLABLE_SORTS = ("title", "total_tokens")  # columns that may be NULL: listed last, in a query apart


@functools.cache
def _one_summary_select(prefix: str, shape: str) -> sa.Select[Any]:
    table = tables(prefix).conversations
    return sa.select(*row_columns(table, shape), *role_counts_of(prefix)).where(
        table.c.id == sa.bindparam("conversation_id")
    )


@functools.cache
def _first_page_select(prefix: str, shape: str, column: str, descending: bool, limit: int) -> sa.Select[Any]:
    # The rows come in the order of the column's index and the limit stops the walk, so the
    # correlated counts run for the page's rows only, each an index range count: the page most
    # asked for is one statement.
    table = tables(prefix).conversations
    order = [table.c[column], table.c.id]
    return (
        sa.select(*row_columns(table, shape), *role_counts_of(prefix))
        .order_by(*([part.desc() for part in order] if descending else order))
        .limit(limit)
    )


def page_role_counts(
    conn: Connection, prefix: str, conversation_ids: Sequence[str]
) -> dict[str, tuple[int, int, int]]:
    """Return, for each of ``conversation_ids`` that has messages, its messages said, recall
    records and checkpoints, in one grouped statement over the messages' conversation index."""
    if not conversation_ids:
        return {}
    found = conn.execute(_page_role_counts_select(prefix), {"ids": list(conversation_ids)})
    return {conversation_id: (int(a or 0), int(b or 0), int(c or 0)) for conversation_id, a, b, c in found}


@functools.cache
def _page_role_counts_select(prefix: str) -> sa.Select[Any]:
    # Built once per prefix, the page's ids bound at execution: a list page runs it on every
    # request, and building it (fifty literals coerced one by one) cost more than running it.
    messages = tables(prefix).messages
    said = sa.func.sum(sa.case((messages.c.role.not_in(NOT_SAID), 1), else_=0))
    recall = sa.func.sum(sa.case((messages.c.role == "recall", 1), else_=0))
    summary = sa.func.sum(sa.case((messages.c.role == "summary", 1), else_=0))
    return (
        sa.select(messages.c.conversation_id, said, recall, summary)
        .where(messages.c.conversation_id.in_(sa.bindparam("ids", expanding=True)))
        .group_by(messages.c.conversation_id)
    )


NOT_SAID = ("recall", "summary")  # the rows a turn stores that nobody said: counted apart


@functools.cache
def role_counts_of(prefix: str) -> tuple[sa.Label[Any], ...]:
    """Return the three correlated counts of a conversation row's messages: ``message_count``
    (what was said), ``recall_count`` and ``checkpoint_count``, each an index range count
    (built once per prefix: a conversation's page asks for them on every request)."""
    schema = tables(prefix)
    table, messages = schema.conversations, schema.messages
    of_row = messages.c.conversation_id == table.c.id

    def count(label: str, *where: Any) -> sa.Label[Any]:
        return sa.select(sa.func.count()).where(of_row, *where).scalar_subquery().label(label)

    return (
        count("message_count", messages.c.role.not_in(NOT_SAID)),
        count("recall_count", messages.c.role == "recall"),
        count("checkpoint_count", messages.c.role == "summary"),
    )


@dataclass(frozen=True)
class SubjectTotals:
    """What one subject's conversations hold: how many conversations, messages said, recall
    records and checkpoints, and the tokens billed (``None``: no turn of theirs reported any)."""

    conversations: int
    messages: int
    recall_records: int
    checkpoints: int
    total_tokens: int | None = None
    memory_writing_tokens: int | None = None  # of total_tokens, the extraction calls'


def subject_totals(conn: Connection, prefix: str, user_id: str, shape: str = CLAWMEM_SCHEMA) -> SubjectTotals:
    """Return the :class:`SubjectTotals` of the conversations whose ``user_id`` is ``user_id``
    (exactly): the messages counted in one statement over the messages' conversation index, the
    conversations and their tokens in another (phpClaw's shape reports no tokens)."""
    schema = tables(prefix)
    table, messages = schema.conversations, schema.messages
    theirs = sa.select(table.c.id).where(equals_exactly(table.c.user_id, user_id))

    def count(*where: Any) -> Any:
        # Each a range count on (conversation_id, role): no message row is read.
        found = sa.select(sa.func.count()).where(messages.c.conversation_id.in_(theirs), *where)
        return found.scalar_subquery()

    every, recalls, summaries = conn.execute(
        sa.select(count(), count(messages.c.role == "recall"), count(messages.c.role == "summary"))
    ).one()
    counted = (int(every or 0) - int(recalls or 0) - int(summaries or 0), recalls, summaries)
    tokens = sa.func.sum(table.c.total_tokens) if shape == CLAWMEM_SCHEMA else sa.null()
    conversations, total_tokens = conn.execute(
        sa.select(sa.func.count(), tokens).where(equals_exactly(table.c.user_id, user_id))
    ).one()
    return SubjectTotals(
        int(conversations or 0),
        *(int(value or 0) for value in counted),
        total_tokens=None if total_tokens is None else int(total_tokens),
    )


def count_summaries(conn: Connection, prefix: str, at_most: int | None = None, **filters: Any) -> int:
    """Return how many conversations :func:`summaries` lists under ``filters``, in one query;
    with ``at_most``, counting stops there (a search through every message can stop early)."""
    return int(conn.execute(_count_statement(prefix, at_most, filters)).scalar() or 0)


def _count_statement(prefix: str, at_most: int | None, filters: dict[str, Any]) -> sa.Select[Any]:
    table = tables(prefix).conversations
    if at_most is None and not _given(filters):
        return _count_select(prefix)
    if at_most is None:
        return _filtered(sa.select(sa.func.count()).select_from(table), prefix, **filters)
    found = _filtered(sa.select(table.c.id), prefix, **filters).limit(at_most).subquery()
    return sa.select(sa.func.count()).select_from(found)


@functools.cache
def _count_select(prefix: str) -> sa.Select[Any]:
    # Every conversation, as the unfiltered list counts them on each request: built once.
    return sa.select(sa.func.count()).select_from(tables(prefix).conversations)


def _total_column(prefix: str, at_most: int | None, filters: dict[str, Any]) -> sa.Label[Any]:
    """Return :func:`count_summaries` as a column of the list's own statement (it refers to no
    row of it, so the database counts once)."""
    # Never correlated: inside a statement on the conversations it still counts them all.
    return _count_statement(prefix, at_most, filters).correlate(None).scalar_subquery().label("total")


def scan_candidates(
    conn: Connection, prefix: str, limit: int, **filters: Any
) -> tuple[list[tuple[str, Any]], list[tuple[str, str, Any]]]:
    """Return what a search of sealed text decrypts: ``(id, title)`` of the newest ``limit``
    conversations passing ``filters`` (by last activity) and ``(conversation id, message id,
    content)`` of the newest ``limit`` of their messages (recall records left out), newest first."""
    schema = tables(prefix)
    table, messages = schema.conversations, schema.messages
    titles = conn.execute(
        _filtered(sa.select(table.c.id, table.c.title), prefix, **filters)
        .order_by(table.c.updated_at.desc(), table.c.id.desc())
        .limit(limit)
    ).all()
    chosen = _filtered(sa.select(table.c.id), prefix, **filters)
    contents = conn.execute(
        sa.select(messages.c.conversation_id, messages.c.id, messages.c.content)
        .where(messages.c.conversation_id.in_(chosen), messages.c.role != "recall")
        .order_by(messages.c.created_at.desc(), messages.c.id.desc())
        .limit(limit)
    ).all()
    return (
        [(as_text(row_id), title) for row_id, title in titles],
        [(as_text(conversation), as_text(message), content) for conversation, message, content in contents],
    )


def first_matches(
    conn: Connection, prefix: str, conversation_ids: Sequence[str], query: str, max_chars: int
) -> dict[str, str]:
    """Return, for each of ``conversation_ids`` with a message whose content holds ``query``
    (as the list's search matches it), the first ``max_chars`` characters of its first such
    message."""
    if not conversation_ids or not query:
        return {}
    table = tables(prefix).messages
    first = (
        sa.select(sa.func.min(table.c.id))
        .where(
            table.c.conversation_id.in_(list(conversation_ids)),
            table.c.role != "recall",
            table.c.content.ilike(like_pattern(query), escape="\\"),
        )
        .group_by(table.c.conversation_id)
    )
    select = sa.select(table.c.conversation_id, sa.func.substr(table.c.content, 1, max_chars)).where(
        table.c.id.in_(first)
    )
    return {as_text(conversation_id): as_text(text) or "" for conversation_id, text in conn.execute(select)}
