"""Every statement on the conversations and messages tables, and ``ConversationStore``, their read API."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.ids import new_id
from clawmem.memory.rules import validate_namespace, validate_prefix
from clawmem.sql.kv import like_pattern
from clawmem.sql.paging import Page, after, check_limit, decode_time_cursor, page_of
from clawmem.sql.schema import tables

ORDER_COLUMNS = ("created_at", "updated_at")


def check_order_column(column: str, name: str = "by") -> str:
    """Return ``column`` if conversations can be ordered or aged by it (``created_at`` or
    ``updated_at``); else raise ``ValueError`` naming the parameter ``name``."""
    if column not in ORDER_COLUMNS:
        raise ValueError(f"{name} must be one of {', '.join(ORDER_COLUMNS)}, got {column!r}")
    return column


@dataclass(frozen=True)
class MessageRecord:
    """A message to write: what a conversation payload's history holds."""

    role: str
    content: str | None
    tool_name: str | None = None
    tool_input: Any = None


@dataclass(frozen=True)
class StoredMessage:
    """A message row as read back."""

    id: str
    conversation_id: str
    role: str
    content: str | None
    tool_name: str | None
    tool_input: Any
    created_at: datetime


@dataclass(frozen=True)
class ConversationSummary:
    """A conversation row with its message count."""

    id: str
    namespace: str
    user_id: str
    title: str | None
    metadata: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    message_count: int


# -- statements used by SqlConversationMemory -------------------------------------------------


def lock_conversation(conn: Connection, prefix: str, conversation_id: str, namespace: str) -> Any:
    """Return the conversation row, locked for update where the dialect can, or ``None``."""
    table = tables(prefix).conversations
    return conn.execute(
        sa.select(table)
        .where(table.c.id == conversation_id, table.c.namespace == namespace)
        .with_for_update()
    ).first()


def load_conversation(conn: Connection, prefix: str, conversation_id: str, namespace: str) -> Any:
    """Return the conversation row of ``namespace``, or ``None``."""
    table = tables(prefix).conversations
    return conn.execute(
        sa.select(table).where(table.c.id == conversation_id, table.c.namespace == namespace)
    ).first()


def load_messages(conn: Connection, prefix: str, conversation_ids: Sequence[str]) -> list[StoredMessage]:
    """Return the messages of ``conversation_ids`` ordered by conversation, created_at, id."""
    table = tables(prefix).messages
    rows = conn.execute(
        sa.select(table)
        .where(table.c.conversation_id.in_(list(conversation_ids)))
        .order_by(table.c.conversation_id, table.c.created_at, table.c.id)
    )
    return [_message(row) for row in rows]


def insert_conversation(conn: Connection, prefix: str, row: dict[str, Any]) -> None:
    """Insert one conversation row."""
    conn.execute(sa.insert(tables(prefix).conversations).values(row))


def update_conversation(conn: Connection, prefix: str, conversation_id: str, changes: dict[str, Any]) -> None:
    """Update one conversation row."""
    table = tables(prefix).conversations
    conn.execute(sa.update(table).where(table.c.id == conversation_id).values(changes))


def insert_messages(
    conn: Connection,
    prefix: str,
    conversation_id: str,
    messages: Iterable[MessageRecord],
    created_at: datetime,
) -> int:
    """Insert ``messages`` in order (ids increase, so they sort as given); return how many."""
    rows = [
        {
            "id": new_id(),
            "conversation_id": conversation_id,
            "role": message.role,
            "content": message.content,
            "tool_name": message.tool_name,
            "tool_input": json_text(message.tool_input),
            "created_at": created_at,
        }
        for message in messages
    ]
    if rows:
        conn.execute(sa.insert(tables(prefix).messages), rows)
    return len(rows)


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


def delete_namespace(conn: Connection, prefix: str, namespace: str) -> tuple[int, int]:
    """Delete the messages and then the conversations of ``namespace``; return both counts."""
    schema = tables(prefix)
    ids = sa.select(schema.conversations.c.id).where(schema.conversations.c.namespace == namespace)
    messages = conn.execute(
        sa.delete(schema.messages).where(schema.messages.c.conversation_id.in_(ids))
    ).rowcount
    conversations = conn.execute(
        sa.delete(schema.conversations).where(schema.conversations.c.namespace == namespace)
    ).rowcount
    return (conversations, messages)


def namespace_messages(conn: Connection, prefix: str, namespace: str) -> list[StoredMessage]:
    """Return the messages of every conversation of ``namespace``, ordered per conversation."""
    schema = tables(prefix)
    messages = schema.messages
    rows = conn.execute(
        sa.select(messages)
        .join(schema.conversations, schema.conversations.c.id == messages.c.conversation_id)
        .where(schema.conversations.c.namespace == namespace)
        .order_by(messages.c.conversation_id, messages.c.created_at, messages.c.id)
    )
    return [_message(row) for row in rows]


def conversation_rows(conn: Connection, prefix: str, namespace: str) -> list[Any]:
    """Return every conversation row of ``namespace``."""
    table = tables(prefix).conversations
    return list(conn.execute(sa.select(table).where(table.c.namespace == namespace)))


def conversation_namespaces(conn: Connection, prefix: str) -> list[str]:
    """Return every namespace that holds a conversation."""
    table = tables(prefix).conversations
    return list(conn.execute(sa.select(table.c.namespace).distinct()).scalars())


def json_text(value: Any) -> str | None:
    """Return ``value`` as the JSON text a TEXT column holds (``None`` stays NULL)."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


def conversation_fields(row: Any) -> dict[str, Any]:
    """Return a conversation row's columns as fields (metadata parsed)."""
    return {
        "id": row.id,
        "namespace": row.namespace,
        "user_id": row.user_id,
        "title": row.title,
        "metadata": json.loads(row.metadata) if row.metadata else None,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def _message(row: Any) -> StoredMessage:
    return StoredMessage(
        id=row.id,
        conversation_id=row.conversation_id,
        role=row.role,
        content=row.content,
        tool_name=row.tool_name,
        tool_input=None if row.tool_input is None else json.loads(row.tool_input),
        created_at=row.created_at,
    )


# -- the read API ----------------------------------------------------------------------------


class ConversationStore:
    """Read API over conversations and messages for the dashboard and CLI. Every listing is paginated."""

    def __init__(self, engine: Engine, prefix: str = "") -> None:
        self.engine = engine
        self.prefix = validate_prefix(prefix)
        self.schema = tables(prefix)

    def _summaries(self, select: sa.Select[Any]) -> list[ConversationSummary]:
        with self.engine.connect() as conn:
            rows = conn.execute(select).all()
        return [
            ConversationSummary(**conversation_fields(row), message_count=row.message_count) for row in rows
        ]

    def _select(self) -> sa.Select[Any]:
        conversations, messages = self.schema.conversations, self.schema.messages
        count = (
            sa.select(sa.func.count())
            .where(messages.c.conversation_id == conversations.c.id)
            .scalar_subquery()
            .label("message_count")
        )
        return sa.select(conversations, count)

    def list(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        user_id: str | None = None,
        namespace: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        query: str | None = None,
    ) -> Page[ConversationSummary]:
        """Return a page of conversations, newest first (by created_at, then id).

        Filters: exact ``user_id`` and ``namespace``, ``since <= created_at < until``, and
        ``query`` contained in the title or any message's content (case-insensitive).
        Raises ``ValueError`` for a bad limit, namespace or cursor.
        """
        check_limit(limit)
        table, messages = self.schema.conversations, self.schema.messages
        select = self._select()
        if user_id is not None:
            select = select.where(table.c.user_id == user_id)
        if namespace is not None:
            select = select.where(table.c.namespace == validate_namespace(namespace))
        if since is not None:
            select = select.where(table.c.created_at >= since)
        if until is not None:
            select = select.where(table.c.created_at < until)
        if query:
            pattern = like_pattern(query)
            in_messages = sa.exists().where(
                messages.c.conversation_id == table.c.id, messages.c.content.ilike(pattern, escape="\\")
            )
            select = select.where(sa.or_(table.c.title.ilike(pattern, escape="\\"), in_messages))
        if cursor:
            select = select.where(
                after([table.c.created_at, table.c.id], decode_time_cursor(cursor), descending=True)
            )
        select = select.order_by(table.c.created_at.desc(), table.c.id.desc()).limit(limit + 1)
        return page_of(self._summaries(select), limit, lambda c: [c.created_at.isoformat(), c.id])

    def get(self, conversation_id: str) -> ConversationSummary | None:
        """Return one conversation with its message count, or ``None``."""
        table = self.schema.conversations
        found = self._summaries(self._select().where(table.c.id == conversation_id))
        return found[0] if found else None

    def messages(
        self, conversation_id: str, *, limit: int = 200, cursor: str | None = None
    ) -> Page[StoredMessage]:
        """Return a page of one conversation's messages, oldest first (by created_at, then id)."""
        check_limit(limit, 1000)
        table = self.schema.messages
        select = sa.select(table).where(table.c.conversation_id == conversation_id)
        if cursor:
            select = select.where(after([table.c.created_at, table.c.id], decode_time_cursor(cursor)))
        select = select.order_by(table.c.created_at, table.c.id).limit(limit + 1)
        with self.engine.connect() as conn:
            rows = [_message(row) for row in conn.execute(select)]
        return page_of(rows, limit, lambda m: [m.created_at.isoformat(), m.id])

    def recent_user_messages(self, limit: int = 50) -> list[StoredMessage]:
        """Return the newest ``limit`` messages with role ``user``, newest first."""
        check_limit(limit, 1000)
        table = self.schema.messages
        select = (
            sa.select(table)
            .where(table.c.role == "user")
            .order_by(table.c.created_at.desc(), table.c.id.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [_message(row) for row in conn.execute(select)]

    def counts(self) -> dict[str, int]:
        """Return ``{"conversations": n, "messages": n}``."""
        with self.engine.connect() as conn:
            conversations = conn.execute(
                sa.select(sa.func.count()).select_from(self.schema.conversations)
            ).scalar()
            messages = conn.execute(sa.select(sa.func.count()).select_from(self.schema.messages)).scalar()
        return {"conversations": int(conversations or 0), "messages": int(messages or 0)}

    def _edge(self, function: Any, by: str) -> datetime | None:
        column = self.schema.conversations.c[check_order_column(by)]
        with self.engine.connect() as conn:
            return conn.execute(sa.select(function(column))).scalar()

    def oldest(self, by: str = "created_at") -> datetime | None:
        """Return the earliest ``created_at`` (or ``updated_at``) of any conversation, or ``None``."""
        return self._edge(sa.func.min, by)

    def newest(self, by: str = "created_at") -> datetime | None:
        """Return the latest ``created_at`` (or ``updated_at``) of any conversation, or ``None``."""
        return self._edge(sa.func.max, by)

    def namespaces(self) -> list[str]:
        """Return every namespace that holds a conversation, sorted."""
        with self.engine.connect() as conn:
            return sorted(conversation_namespaces(conn, self.prefix))
