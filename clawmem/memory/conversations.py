"""SqlConversationMemory: conversation payloads stored across the conversations and messages tables.

A payload is ``{"title", "user_id", "metadata", "created_at", "history"}`` where ``history`` is a
list of ``{"role", "content", "tool_name"?, "tool_input"?}``. When a new history extends the
stored one, only the new messages are inserted and existing rows are never rewritten;
otherwise the history is replaced in one transaction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from clawmem import events
from clawmem.clock import utc_datetime
from clawmem.errors import InvalidKey
from clawmem.memory.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    check_size,
    encode_value,
)
from clawmem.memory.sql import SqlBackedMemory
from clawmem.sql import conversations as sql
from clawmem.sql.engine import retry_deadlocks, write_transaction

ROLES = ("system", "user", "assistant", "tool")
PAYLOAD_FIELDS = ("title", "user_id", "metadata", "created_at", "history")
_CONVERSATION_ID = re.compile(r"[0-9A-Za-z_-]{1,26}")


@dataclass(frozen=True)
class Conversation:
    """A validated conversation payload."""

    title: str | None
    user_id: str
    metadata: dict[str, Any] | None
    created_at: datetime | None
    history: list[sql.MessageRecord]


def _text(key: str, field: str, value: Any, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"conversation {key!r}: {field} must be a str or None, got {type(value).__name__}")
    if len(value) > limit:
        raise ValueError(f"conversation {key!r}: {field} must not exceed {limit} characters")
    return value


def _created_at(key: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"conversation {key!r}: created_at {value!r} is not an ISO 8601 time") from None
    else:
        raise TypeError(
            f"conversation {key!r}: created_at must be an ISO 8601 str, got {type(value).__name__}"
        )
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def validate_conversation_id(key: object) -> str:
    """Return ``key`` if it can name a conversation (1-26 of A-Z a-z 0-9 _ -); else raise ``InvalidKey``."""
    if not isinstance(key, str) or not _CONVERSATION_ID.fullmatch(key):
        raise InvalidKey(f"conversation id {key!r} must be 1-26 characters from A-Z a-z 0-9 _ -")
    return key


def parse_conversation(key: str, payload: Any, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> Conversation:
    """Return the validated payload; raise ``TypeError``/``ValueError`` naming the conversation.

    Each message's content (and tool input) may hold up to ``max_bytes`` UTF-8 bytes.
    """
    validate_conversation_id(key)
    if not isinstance(payload, dict):
        raise TypeError(f"conversation {key!r}: the payload must be a dict, got {type(payload).__name__}")
    unknown = set(payload) - set(PAYLOAD_FIELDS)
    if unknown:
        raise ValueError(
            f"conversation {key!r}: unknown payload fields {sorted(unknown)}; allowed: {PAYLOAD_FIELDS}"
        )
    metadata = payload.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(f"conversation {key!r}: metadata must be a dict or None")
        encode_value(key, metadata, max_bytes)
    history = payload.get("history", [])
    if not isinstance(history, (list, tuple)):
        raise TypeError(f"conversation {key!r}: history must be a list of messages")
    records = []
    for index, message in enumerate(history):
        where = f"history[{index}]"
        if not isinstance(message, dict):
            raise TypeError(f"conversation {key!r}: {where} must be a dict")
        extra = set(message) - {"role", "content", "tool_name", "tool_input"}
        if extra:
            raise ValueError(f"conversation {key!r}: {where} has unknown fields {sorted(extra)}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"conversation {key!r}: {where} role must be one of {ROLES}, got {role!r}")
        content = message.get("content")
        if content is not None:
            if not isinstance(content, str):
                raise TypeError(f"conversation {key!r}: {where} content must be a str or None")
            if "\x00" in content:
                raise ValueError(f"conversation {key!r}: {where} content contains a NUL character")
            check_size(f"conversation {key!r} {where} content", content, max_bytes)
        tool_input = message.get("tool_input")
        if tool_input is not None:
            encode_value(key, tool_input, max_bytes)
        records.append(
            sql.MessageRecord(
                role, content, _text(key, f"{where} tool_name", message.get("tool_name"), 255), tool_input
            )
        )
    return Conversation(
        title=_text(key, "title", payload.get("title"), 255),
        user_id=_text(key, "user_id", payload.get("user_id"), 180) or "",
        metadata=metadata,
        created_at=_created_at(key, payload.get("created_at")),
        history=records,
    )


def _payload(row: Any, messages: list[sql.StoredMessage]) -> dict[str, Any]:
    history = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_name is not None:
            item["tool_name"] = message.tool_name
        if message.tool_input is not None:
            item["tool_input"] = message.tool_input
        history.append(item)
    fields = sql.conversation_fields(row)
    return {
        "title": fields["title"],
        "user_id": fields["user_id"],
        "metadata": fields["metadata"],
        "created_at": fields["created_at"].replace(tzinfo=UTC).isoformat(),
        "history": history,
    }


def _same(stored: sql.StoredMessage, record: sql.MessageRecord) -> bool:
    return (stored.role, stored.content, stored.tool_name, stored.tool_input) == (
        record.role,
        record.content,
        record.tool_name,
        record.tool_input,
    )


class SqlConversationMemory(SqlBackedMemory):
    """A ``MemoryInterface`` for conversation payloads (normally the ``conversations`` namespace).

    Conversations do not expire: a ``ttl`` raises ``ValueError``; retention is ``flask claw prune``.
    """

    name = "sql_conversations"
    announces_saves = True  # emits conversation.saved itself, with inserted/replaced counts

    def _encode(self, key: str, value: Any) -> str:
        parse_conversation(key, value, self.max_value_bytes)
        return json.dumps(value, ensure_ascii=False, default=str)

    def set(self, key: str, value: Any, namespace: str = "conversations", ttl: int | None = None) -> None:
        """Save the conversation payload ``value`` under id ``key``; see the module docstring."""
        if ttl is not None:
            raise ValueError(
                "conversations do not expire: ttl must be None (use flask claw prune for retention)"
            )
        super().set(key, value, namespace)

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        if not _CONVERSATION_ID.fullmatch(key):
            return (False, None)
        with self.engine.connect() as conn:
            row = sql.load_conversation(conn, self.prefix, key, namespace)
            if row is None:
                return (False, None)
            return (True, _payload(row, sql.load_messages(conn, self.prefix, [key])))

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        conversation = parse_conversation(key, json.loads(encoded), self.max_value_bytes)
        try:
            retry_deadlocks(lambda: self._save(key, conversation, namespace))
        except sa.exc.IntegrityError:
            # Two first saves of one new id raced; the loser now finds the row and extends it.
            retry_deadlocks(lambda: self._save(key, conversation, namespace))

    def _save(self, key: str, conversation: Conversation, namespace: str) -> None:
        stamp = utc_datetime(self.clock)
        with write_transaction(self.engine) as conn:
            row = sql.lock_conversation(conn, self.prefix, key, namespace)
            fields = {
                "title": conversation.title,
                "user_id": conversation.user_id,
                "metadata": sql.json_text(conversation.metadata),
                "updated_at": stamp,
            }
            if row is None:
                created = conversation.created_at or stamp
                sql.insert_conversation(
                    conn, self.prefix, {"id": key, "namespace": namespace, "created_at": created, **fields}
                )
                inserted = sql.insert_messages(conn, self.prefix, key, conversation.history, stamp)
                replaced = False
            else:
                if conversation.created_at is not None:
                    fields["created_at"] = conversation.created_at
                sql.update_conversation(conn, self.prefix, key, fields)
                inserted, replaced = self._save_history(conn, key, conversation.history, stamp)
        events.emit(
            "conversation.saved",
            driver=self.name,
            namespace=namespace,
            key=key,
            messages=len(conversation.history),
            inserted=inserted,
            replaced=replaced,
        )

    def _save_history(
        self, conn: Connection, key: str, history: list[sql.MessageRecord], stamp: datetime
    ) -> tuple[int, bool]:
        stored = sql.load_messages(conn, self.prefix, [key])
        extends = len(history) >= len(stored) and all(
            _same(old, new) for old, new in zip(stored, history, strict=False)
        )
        if extends:
            # New rows never sort before the stored ones, even if this clock lags another writer's.
            created = max([stamp, *(message.created_at for message in stored[-1:])])
            return (sql.insert_messages(conn, self.prefix, key, history[len(stored) :], created), False)
        sql.delete_messages(conn, self.prefix, [key])
        return (sql.insert_messages(conn, self.prefix, key, history, stamp), True)

    def _forget(self, key: str, namespace: str, now: int) -> None:
        if not _CONVERSATION_ID.fullmatch(key):
            return
        with write_transaction(self.engine) as conn:
            if sql.load_conversation(conn, self.prefix, key, namespace) is not None:
                sql.delete_conversations(conn, self.prefix, [key])

    def _flush(self, namespace: str) -> int:
        with write_transaction(self.engine) as conn:
            conversations, _ = sql.delete_namespace(conn, self.prefix, namespace)
        return conversations

    def _all(self, namespace: str, now: int) -> dict[str, Any]:
        with self.engine.connect() as conn:
            rows = {row.id: row for row in sql.conversation_rows(conn, self.prefix, namespace)}
            grouped: dict[str, list[sql.StoredMessage]] = {key: [] for key in rows}
            for message in sql.namespace_messages(conn, self.prefix, namespace):
                grouped[message.conversation_id].append(message)
        return {key: _payload(row, grouped[key]) for key, row in rows.items()}

    def _namespaces(self) -> list[str]:
        with self.engine.connect() as conn:
            return sql.conversation_namespaces(conn, self.prefix)

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        return {}
