"""Every statement on the conversations and messages tables; :class:`clawmem.ConversationLog` runs them."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

from clawmem.crypto.envelope import like_pattern as sealed_pattern
from clawmem.ids import new_id
from clawmem.paging import decode_time_cursor
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql.exact import equals_exactly
from clawmem.sql.kv import like_pattern
from clawmem.sql.lenient import as_text, raw_moment, read_json, read_moment, reasons
from clawmem.sql.paging import after
from clawmem.sql.schema import row_columns, tables
from clawmem.text import utf8_len

ORDER_COLUMNS = ("created_at", "updated_at")
IDS_PER_STATEMENT = 500  # ids bound in one IN list, well under every backend's limit


def check_order_column(column: str, name: str = "by") -> str:
    """Return ``column`` if conversations can be ordered or aged by it (``created_at`` or
    ``updated_at``); else raise ``ValueError`` naming the parameter ``name``."""
    if column not in ORDER_COLUMNS:
        raise ValueError(f"{name} must be one of {', '.join(ORDER_COLUMNS)}, got {column!r}")
    return column


@dataclass(frozen=True)
class Message:
    """A message to append: its role, content, for tool rows the call, and what belongs to
    this message alone (``metadata``: a turn's provider usage, a framework's item, a job id)."""

    role: str
    content: str | None
    tool_name: str | None = None
    tool_input: Any = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class StoredMessage:
    """A message row as read back.

    ``metadata`` is the message's own JSON object (``None`` when it has none, and always on
    phpClaw's shape). ``unreadable`` says why a column could not be read (another program's
    row): then ``tool_input`` (or ``metadata``) holds the column's raw text, or ``created_at`` is ``None`` and
    ``raw_created_at`` holds what was read, so a listing can continue after the row.
    """

    id: str
    conversation_id: str
    role: str
    content: str | None
    tool_name: str | None
    tool_input: Any
    created_at: datetime | None
    unreadable: str | None = None
    raw_created_at: Any = field(default=None, repr=False, compare=False)
    metadata: Any = None


@dataclass(frozen=True)
class MessageSize:
    """What the compaction analysis reads of a message instead of the whole row: its id and
    role, the UTF-8 size of its content in bytes, and its ``tool_input`` read as in
    :class:`StoredMessage` (a turn sends it as JSON, so its size is measured from the value)."""

    id: str
    role: str
    content_bytes: int
    tool_input: Any


@dataclass(frozen=True)
class ConversationRow:
    """The columns of a conversation row, as read (see :func:`conversation_fields`);
    ``total_tokens`` is ``None`` until a turn's provider reports its usage ("not reported")."""

    id: str
    namespace: str
    user_id: str
    title: str | None
    metadata: Any
    created_at: datetime | None
    updated_at: datetime | None
    total_tokens: int | None


@dataclass(frozen=True)
class ConversationSummary(ConversationRow):
    """A conversation row with its counts: ``message_count`` is what was said (every role but
    the ``recall`` records and ``summary`` checkpoints, which are counted apart in
    ``recall_count`` and ``checkpoint_count``; ``row_count`` is all three). ``unreadable`` and
    ``raw_created_at`` (and ``raw_updated_at``) as in :class:`StoredMessage` (unreadable metadata
    is kept as its raw text)."""

    message_count: int
    unreadable: str | None = None
    raw_created_at: Any = field(default=None, repr=False, compare=False)
    raw_updated_at: Any = field(default=None, repr=False, compare=False)
    recall_count: int = 0
    checkpoint_count: int = 0

    @property
    def row_count(self) -> int:
        """Return how many message rows the conversation has, of every role."""
        return self.message_count + self.recall_count + self.checkpoint_count


@dataclass(frozen=True)
class Conversation(ConversationRow):
    """A conversation row with its messages in (created_at, id) order: all of them for an export,
    from the newest ``summary`` checkpoint on for a turn (:meth:`clawmem.ConversationLog.load`).

    ``unreadable`` says which columns of the row could not be read (another program's row).
    """

    messages: tuple[StoredMessage, ...]
    unreadable: str | None = None


# -- writing --------------------------------------------------------------------------------


def touch_conversation(
    conn: Connection, prefix: str, conversation_id: str, stamp: datetime, tokens: int | None = None
) -> bool:
    """Set the conversation's ``updated_at`` (locking its row) and add ``tokens`` to its
    ``total_tokens`` (our shape only); return whether it exists."""
    table = tables(prefix).conversations
    values: dict[str, Any] = {"updated_at": stamp}
    if tokens is not None:
        values["total_tokens"] = sa.func.coalesce(table.c.total_tokens, 0) + tokens
    changed = conn.execute(sa.update(table).where(table.c.id == conversation_id).values(values))
    return changed.rowcount > 0


def newest_checkpoint_id(conn: Connection, prefix: str, conversation_id: str) -> str | None:
    """Return the id of the conversation's newest ``summary`` checkpoint, or ``None``."""
    table = tables(prefix).messages
    return conn.execute(
        sa.select(table.c.id)
        .where(table.c.conversation_id == conversation_id, table.c.role == "summary")
        .order_by(table.c.created_at.desc(), table.c.id.desc())
        .limit(1)
    ).scalar()


def insert_conversation(
    conn: Connection, prefix: str, row: dict[str, Any], shape: str = CLAWMEM_SCHEMA
) -> None:
    """Insert one conversation row."""
    conn.execute(sa.insert(tables(prefix).conversations).values(row))


def insert_messages(
    conn: Connection,
    prefix: str,
    conversation_id: str,
    messages: Iterable[Message],
    created_at: datetime,
    shape: str = CLAWMEM_SCHEMA,
    seal: Callable[[str, str, str | None], str | None] | None = None,
) -> list[str]:
    """Insert ``messages`` in one statement, in order (ids increase, so they sort as given);
    return their ids. phpClaw's shape has no column for a message's metadata. ``seal(row id,
    column, text)`` encrypts ``content`` and ``tool_input`` (see :mod:`clawmem.sql.sealing`)."""
    own_metadata = shape == CLAWMEM_SCHEMA
    rows = []
    for message in messages:
        row_id = new_id()
        content, tool_input = message.content, json_text(message.tool_input)
        metadata = json_text(message.metadata)
        if seal is not None:  # bound to the row id, which is why ids are made here first
            content, tool_input = seal(row_id, "content", content), seal(row_id, "tool_input", tool_input)
            metadata = seal(row_id, "metadata", metadata)
        rows.append(
            {
                "id": row_id,
                "conversation_id": conversation_id,
                "role": message.role,
                "content": content,
                "tool_name": message.tool_name,
                "tool_input": tool_input,
                "created_at": created_at,
                **({"metadata": metadata} if own_metadata else {}),
            }
        )
    if rows:
        conn.execute(sa.insert(tables(prefix).messages), rows)
    return [row["id"] for row in rows]


def delete_messages(conn: Connection, prefix: str, conversation_ids: Sequence[str]) -> int:
    """Delete every message of ``conversation_ids``; return how many went."""
    table = tables(prefix).messages
    return conn.execute(sa.delete(table).where(table.c.conversation_id.in_(list(conversation_ids)))).rowcount


def delete_conversations(conn: Connection, prefix: str, conversation_ids: Sequence[str]) -> tuple[int, int]:
    """Delete the messages and then the conversations of ``conversation_ids``; return both counts."""
    if not conversation_ids:
        return (0, 0)
    table = tables(prefix).conversations
    messages = delete_messages(conn, prefix, conversation_ids)
    conversations = conn.execute(sa.delete(table).where(table.c.id.in_(list(conversation_ids)))).rowcount
    return (conversations, messages)


# -- reading ---------------------------------------------------------------------------------


def load_conversation(
    conn: Connection, prefix: str, conversation_id: str, shape: str = CLAWMEM_SCHEMA
) -> Any:
    """Return the conversation row, or ``None``."""
    table = tables(prefix).conversations
    return conn.execute(sa.select(*row_columns(table, shape)).where(table.c.id == conversation_id)).first()


def load_messages(
    conn: Connection, prefix: str, conversation_ids: Sequence[str], shape: str = CLAWMEM_SCHEMA
) -> list[StoredMessage]:
    """Return the messages of ``conversation_ids`` ordered by conversation, created_at, id."""
    table = tables(prefix).messages
    rows = conn.execute(
        sa.select(*row_columns(table, shape))
        .where(table.c.conversation_id.in_(list(conversation_ids)))
        .order_by(table.c.conversation_id, table.c.created_at, table.c.id)
    )
    return _messages(rows)


def messages_since_checkpoint(
    conn: Connection, prefix: str, conversation_id: str, shape: str = CLAWMEM_SCHEMA
) -> list[StoredMessage]:
    """Return what a turn loads of one conversation, in (created_at, id) order: with no
    ``summary`` checkpoint, every message; else a leading ``system`` message, the newest
    checkpoint, and the messages after the last one it covers (older checkpoints left out)."""
    table = tables(prefix).messages
    of_conversation = table.c.conversation_id == conversation_id
    in_order = (table.c.created_at, table.c.id)
    checkpoint = conn.execute(
        sa.select(*row_columns(table, shape))
        .where(of_conversation, table.c.role == "summary")
        .order_by(table.c.created_at.desc(), table.c.id.desc())
        .limit(1)
    ).first()
    select = sa.select(*row_columns(table, shape)).where(of_conversation).order_by(*in_order)
    if checkpoint is None:
        return _messages(conn.execute(select))
    summary = _message(checkpoint)
    boundary = conn.execute(
        sa.select(*in_order).where(of_conversation, table.c.id == covered_until(summary))
    ).first() or (summary.created_at, summary.id)
    later = conn.execute(select.where(table.c.role != "summary", after(in_order, boundary)))
    first = conn.execute(select.limit(1)).first()
    leading = [_message(first)] if first is not None and first.role == "system" else []
    return [*leading, summary, *(_message(row) for row in later)]


def covered_until(summary: StoredMessage) -> str | None:
    """Return the id of the last message a ``summary`` checkpoint covers (from its
    ``tool_input``), or ``None`` when the row does not say."""
    covers = summary.tool_input.get("covers") if isinstance(summary.tool_input, dict) else None
    last = covers.get("to") if isinstance(covers, dict) else None
    return last if isinstance(last, str) else None


def _message_before(conn: Connection, prefix: str, row: Any, shape: str) -> Any:
    """Return the row of the message just before ``row`` in its conversation, or ``None``."""
    table = tables(prefix).messages
    return conn.execute(
        sa.select(*row_columns(table, shape))
        .where(
            table.c.conversation_id == row.conversation_id,
            after([table.c.created_at, table.c.id], [row.created_at, row.id], descending=True),
        )
        .order_by(table.c.created_at.desc(), table.c.id.desc())
        .limit(1)
    ).first()


def turn(
    conn: Connection, prefix: str, conversation_id: str, message_id: str, shape: str = CLAWMEM_SCHEMA
) -> list[StoredMessage]:
    """Return one ``user`` message of a conversation, preceded by its ``recall`` record when
    the message just before it is one; ``[]`` when there is no such user message."""
    table = tables(prefix).messages
    of_conversation = table.c.conversation_id == conversation_id
    row = conn.execute(
        sa.select(*row_columns(table, shape)).where(
            of_conversation, table.c.id == message_id, table.c.role == "user"
        )
    ).first()
    if row is None:
        return []
    before = _message_before(conn, prefix, row, shape)
    found = [_message(row)]
    return [_message(before), *found] if before is not None and before.role == "recall" else found


def messages_of_job(
    conn: Connection, prefix: str, conversation_id: str, job_id: str, opened: Any = None
) -> list[StoredMessage]:
    """Return the messages of one conversation whose metadata names ``job_id`` as its
    ``job_id``, in (created_at, id) order (the text match narrows, the parsed metadata decides).
    With ``opened`` (a function opening a list of messages), sealed metadata is a candidate too,
    decided once opened: SQL cannot match text inside an envelope."""
    table = tables(prefix).messages
    matched = table.c.metadata.like(like_pattern(job_id), escape="\\")
    if opened is not None:
        matched = sa.or_(matched, table.c.metadata.like(sealed_pattern(), escape="\\"))
    rows = conn.execute(
        sa.select(table)
        .where(table.c.conversation_id == conversation_id, matched)
        .order_by(table.c.created_at, table.c.id)
    )
    found = _messages(rows)
    if opened is not None:
        found = opened(found)
    return [m for m in found if isinstance(m.metadata, dict) and m.metadata.get("job_id") == job_id]


def message_page(
    conn: Connection,
    prefix: str,
    conversation_id: str,
    limit: int,
    cursor: str | None,
    shape: str = CLAWMEM_SCHEMA,
    descending: bool = False,
) -> list[StoredMessage]:
    """Return up to ``limit`` of one conversation's messages after ``cursor``, oldest first
    (newest first when ``descending``)."""
    if not cursor:
        found = conn.execute(
            _first_messages_select(prefix, shape, descending, limit), {"conversation_id": conversation_id}
        )
        return _messages(found)
    table = tables(prefix).messages
    select = sa.select(*row_columns(table, shape)).where(table.c.conversation_id == conversation_id)
    columns = [table.c.created_at, table.c.id]
    moment = decode_time_cursor(cursor, conn.dialect.name, descending)
    select = select.where(after(columns, moment, descending))
    order = [column.desc() for column in columns] if descending else columns
    select = select.order_by(*order).limit(limit)
    return _messages(conn.execute(select))


@functools.cache
def _first_messages_select(prefix: str, shape: str, descending: bool, limit: int) -> sa.Select[Any]:
    # The first page of a conversation's messages, its id bound at execution: built once, as
    # every conversation page asks for it.
    table = tables(prefix).messages
    columns = [table.c.created_at, table.c.id]
    return (
        sa.select(*row_columns(table, shape))
        .where(table.c.conversation_id == sa.bindparam("conversation_id"))
        .order_by(*([column.desc() for column in columns] if descending else columns))
        .limit(limit)
    )


def _content_size(content: Any, dialect: str) -> tuple[Any, Any | None]:
    """Return two expressions over the ``content`` column: its UTF-8 size in bytes as the
    database measures it, and the content itself where the database cannot measure it as Python
    reads it (a SQLite BLOB another program wrote is read with U+FFFD for bad bytes; a dialect
    without a rule here), so that row's size is measured from what is read; ``None`` when the
    database measures every row."""
    if dialect == "sqlite":
        kind = sa.func.typeof(content)
        size = sa.case((kind == "text", sa.func.length(sa.cast(content, sa.LargeBinary))), else_=0)
        return size, sa.case((kind.in_(("text", "null")), sa.null()), else_=content)
    if dialect in ("mysql", "mariadb"):
        return sa.func.octet_length(sa.cast(content, mysql.CHAR(charset="utf8mb4"))), None
    if dialect == "postgresql":
        return sa.func.octet_length(sa.func.convert_to(content, "UTF8")), None
    return sa.literal(0), content


def message_sizes(conn: Connection, prefix: str, conversation_id: str, limit: int) -> list[MessageSize]:
    """Return the :class:`MessageSize` of up to ``limit`` of one conversation's messages, oldest
    first, without reading their content."""
    select, measures_all = _message_sizes_select(prefix, conn.dialect.name, limit)
    found = []
    for row in conn.execute(select, {"conversation_id": conversation_id}):
        tool_input, _ = read_json(row.tool_input, "tool_input")
        raw = None if measures_all else row.raw
        measured = int(row.size or 0) if raw is None else utf8_len(as_text(raw) or "")
        found.append(MessageSize(as_text(row.id), as_text(row.role), measured, tool_input))
    return found


@functools.cache
def _message_sizes_select(prefix: str, dialect: str, limit: int) -> tuple[sa.Select[Any], bool]:
    # Built once per prefix and dialect, the conversation's id bound at execution (every
    # conversation page runs it); with whether the database measures every row's size itself.
    table = tables(prefix).messages
    size, unmeasured = _content_size(table.c.content, dialect)
    columns = [table.c.id, table.c.role, table.c.tool_input, size.label("size")]
    select = (
        sa.select(*columns, *([] if unmeasured is None else [unmeasured.label("raw")]))
        .where(table.c.conversation_id == sa.bindparam("conversation_id"))
        .order_by(table.c.created_at, table.c.id)
        .limit(limit)
    )
    return select, unmeasured is None


def messages_with_ids(
    conn: Connection,
    prefix: str,
    conversation_id: str,
    message_ids: Sequence[str],
    shape: str = CLAWMEM_SCHEMA,
) -> dict[str, StoredMessage]:
    """Return the messages of one conversation among ``message_ids``, by id (a deleted one is
    left out)."""
    table = tables(prefix).messages
    found: dict[str, StoredMessage] = {}
    for start in range(0, len(message_ids), IDS_PER_STATEMENT):
        chunk = list(message_ids[start : start + IDS_PER_STATEMENT])
        rows = conn.execute(
            sa.select(*row_columns(table, shape)).where(
                table.c.conversation_id == conversation_id, table.c.id.in_(chunk)
            )
        )
        found.update((message.id, message) for message in map(_message, rows))
    return found


def recent_messages(
    conn: Connection, prefix: str, role: str, limit: int, shape: str = CLAWMEM_SCHEMA
) -> list[StoredMessage]:
    """Return the newest ``limit`` messages with ``role``, newest first."""
    table = tables(prefix).messages
    select = (
        sa.select(*row_columns(table, shape))
        .where(table.c.role == role)
        .order_by(table.c.created_at.desc(), table.c.id.desc())
        .limit(limit)
    )
    return _messages(conn.execute(select))


def json_text(value: Any) -> str | None:
    """Return ``value`` as the JSON text a TEXT column holds (``None`` stays NULL)."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


def php_metadata(metadata: Any) -> Any:
    """Return conversation metadata as our API holds it: phpClaw writes an empty PHP array as
    ``[]``, which is no metadata (``None``), and a PHP list as a JSON list, which becomes a dict
    keyed ``"0"``, ``"1"``... as PHP keys it. Anything else is returned as it is."""
    if isinstance(metadata, list):
        return {str(index): item for index, item in enumerate(metadata)} or None
    return metadata


def conversation_fields(row: Any) -> dict[str, Any]:
    """Return a conversation row's columns as fields (metadata parsed), with ``unreadable``
    saying which could not be read (see :mod:`clawmem.sql.lenient`)."""
    return fields_of(dict(zip(row._fields, row, strict=True)))


def fields_of(columns: dict[str, Any]) -> dict[str, Any]:
    """Return :func:`conversation_fields` of a row given as a dict of its columns by name."""
    metadata, bad_metadata = read_json(columns["metadata"], "metadata")
    created_at, bad_created = read_moment(columns["created_at"], "created_at")
    updated_at, bad_updated = read_moment(columns["updated_at"], "updated_at")
    return {
        "id": as_text(columns["id"]),
        "namespace": as_text(columns["namespace"]),
        "user_id": as_text(columns["user_id"]),
        "title": as_text(columns["title"]),
        "metadata": php_metadata(metadata),
        "created_at": created_at,
        "updated_at": updated_at,
        "total_tokens": _whole(columns.get("total_tokens")),
        "unreadable": reasons(bad_metadata, bad_created, bad_updated),
    }


def _whole(value: Any) -> int | None:
    # Another program may have written anything into total_tokens: what is not a whole number
    # of tokens reads as not reported.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _message(row: Any) -> StoredMessage:
    return _message_of(dict(zip(row._fields, row, strict=True)))


def _messages(rows: Iterable[Any]) -> list[StoredMessage]:
    # Each row read once into a dict by its result's column names, looked up once: a row's
    # attributes cost more to read than the rest of a message (a page reads a hundred).
    found, names = [], None
    for row in rows:
        names = names or row._fields
        found.append(_message_of(dict(zip(names, row, strict=True))))
    return found


def _message_of(columns: dict[str, Any]) -> StoredMessage:
    tool_input, bad_input = read_json(columns["tool_input"], "tool_input")
    metadata, bad_metadata = read_json(columns.get("metadata"), "metadata")
    created_at, bad_created = read_moment(columns["created_at"], "created_at")
    return StoredMessage(
        id=as_text(columns["id"]),
        conversation_id=as_text(columns["conversation_id"]),
        role=as_text(columns["role"]),
        content=as_text(columns["content"]),
        tool_name=as_text(columns["tool_name"]),
        tool_input=tool_input,
        created_at=created_at,
        unreadable=reasons(bad_input, bad_metadata, bad_created),
        raw_created_at=raw_moment(columns["created_at"]),
        metadata=metadata,
    )


def subject_reported_messages(conn: Connection, prefix: str, user_id: str, shape: str) -> list[StoredMessage]:
    """Return the assistant messages with metadata (where a turn's usage and its extraction's
    tokens are kept) of the conversations whose ``user_id`` is ``user_id`` (exactly)."""
    schema = tables(prefix)
    conversations, messages = schema.conversations, schema.messages
    theirs = sa.select(conversations.c.id).where(equals_exactly(conversations.c.user_id, user_id))
    select = sa.select(*row_columns(messages, shape)).where(
        messages.c.conversation_id.in_(theirs),
        messages.c.role == "assistant",
        messages.c.metadata.is_not(None),
    )
    return _messages(conn.execute(select))


# -- one conversation's newest messages (what a framework session reads and pops) -------------


def newest_messages(
    conn: Connection,
    prefix: str,
    conversation_id: str,
    roles: Sequence[str],
    limit: int | None,
    shape: str = CLAWMEM_SCHEMA,
) -> list[StoredMessage]:
    """Return the newest ``limit`` messages of one conversation whose role is among ``roles``
    (every one with ``None``), oldest first; only those rows are read, newest first by the
    (conversation_id, created_at) index."""
    select = _newest_messages_statement(prefix, shape, tuple(roles), limit is not None)
    parameters: dict[str, Any] = {"conversation_id": conversation_id}
    if limit is None:
        return _messages(conn.execute(select, parameters))
    return _messages(reversed(conn.execute(select, {**parameters, "limit": limit}).all()))


@functools.lru_cache(maxsize=64)
def _newest_messages_statement(prefix: str, shape: str, roles: tuple[str, ...], limited: bool) -> sa.Select:
    # Built once per table and roles: a session reads its history every turn, and building the
    # statement cost about as much as SQLAlchemy's cached compile of it.
    table = tables(prefix).messages
    select = sa.select(*row_columns(table, shape)).where(
        table.c.conversation_id == sa.bindparam("conversation_id"), table.c.role.in_(list(roles))
    )
    if not limited:
        return select.order_by(table.c.created_at, table.c.id)
    newest_first = select.order_by(table.c.created_at.desc(), table.c.id.desc())
    return newest_first.limit(sa.bindparam("limit", type_=sa.Integer))


def pop_newest_message(
    conn: Connection,
    prefix: str,
    conversation_id: str,
    roles: Sequence[str],
    attached_role: str,
    shape: str = CLAWMEM_SCHEMA,
) -> list[StoredMessage]:
    """Delete the newest message of one conversation whose role is among ``roles`` (locking it),
    with the message just before it when that one has ``attached_role`` (a turn's ``recall``
    record goes with its user message); return what was deleted, oldest first (``[]`` when none)."""
    table = tables(prefix).messages
    of_conversation = table.c.conversation_id == conversation_id
    newest = sa.select(*row_columns(table, shape)).where(of_conversation, table.c.role.in_(list(roles)))
    newest = newest.order_by(table.c.created_at.desc(), table.c.id.desc()).limit(1)
    row = conn.execute(newest.with_for_update()).first()
    if row is None:
        return []
    deleted = [_message(row)]
    before = _message_before(conn, prefix, row, shape)
    if before is not None and before.role == attached_role:
        deleted.insert(0, _message(before))
    ids = [message.id for message in deleted]
    conn.execute(sa.delete(table).where(of_conversation, table.c.id.in_(ids)))
    return deleted
