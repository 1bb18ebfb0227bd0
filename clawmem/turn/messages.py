"""What a conversation's messages may hold, checked before anything is stored (the roles, the
conversation id, the lengths of titles, user ids and tool names, phpClaw's WordPress user ids),
and what is measured of them once read: their sizes and pages."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from clawmem.errors import InvalidKey
from clawmem.paging import Page, page_of, time_cursor_key
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, check_size, encode_value
from clawmem.settings import PHPCLAW_SCHEMA
from clawmem.sql.conversations import Message, MessageSize, StoredMessage
from clawmem.text import utf8_len

ROLES = ("system", "user", "assistant", "tool", "summary", "recall")
# What phpClaw reads back (its Message roles); a conversation it continues must hold no other.
PHPCLAW_ROLES = ("system", "user", "assistant", "tool")
_WORDPRESS_USER = re.compile(r"[0-9]{1,20}")
DEFAULT_CONVERSATION_NAMESPACE = "default"
_CONVERSATION_ID = re.compile(r"[0-9A-Za-z_-]{1,26}")
_LIMITS = {"title": 255, "user_id": 180, "tool_name": 255}


def validate_conversation_id(conversation_id: object) -> str:
    """Return ``conversation_id`` if it can name a conversation (1-26 of A-Z a-z 0-9 _ -);
    else raise :class:`clawmem.errors.InvalidKey`."""
    if not isinstance(conversation_id, str) or not _CONVERSATION_ID.fullmatch(conversation_id):
        raise InvalidKey(f"conversation id {conversation_id!r} must be 1-26 characters from A-Z a-z 0-9 _ -")
    return conversation_id


def checked_text(conversation_id: str, field: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"conversation {conversation_id!r}: {field} must be a str or None, got {type(value).__name__}"
        )
    limit = _LIMITS[field.rpartition(" ")[2]]
    if len(value) > limit:
        raise ValueError(f"conversation {conversation_id!r}: {field} must not exceed {limit} characters")
    return value


def wordpress_user_id(conversation_id: str, user_id: str) -> int | None:
    """Return ``user_id`` as phpClaw's ``user_id`` column holds it: a WordPress user id (an
    unsigned number) or ``None`` for ``""`` (anonymous); else raise ``ValueError``."""
    if user_id == "":
        return None
    if not _WORDPRESS_USER.fullmatch(user_id) or int(user_id) >= 2**64:
        raise ValueError(
            f"conversation {conversation_id!r}: on the {PHPCLAW_SCHEMA} schema a user id is a WordPress "
            f"user id (a number, or '' for anonymous), got {user_id!r}"
        )
    return int(user_id)


def check_messages(
    conversation_id: str, messages: Iterable[Any], max_bytes: int = DEFAULT_MAX_VALUE_BYTES
) -> list[Message]:
    """Return ``messages`` as records after checking each one; raise ``TypeError`` or
    ``ValueError`` naming the conversation and the message, before anything is written.

    A message is a :class:`Message` or a dict with ``role``, ``content`` and optionally
    ``tool_name``, ``tool_input`` and ``metadata`` (a dict). Content (and tool input and
    metadata as JSON) may hold up to ``max_bytes`` UTF-8 bytes each.
    """
    records = []
    for index, message in enumerate(messages):
        where = f"message {index}"
        if isinstance(message, Message):
            fields = {
                "role": message.role,
                "content": message.content,
                "tool_name": message.tool_name,
                "tool_input": message.tool_input,
                "metadata": message.metadata,
            }
        elif isinstance(message, dict):
            extra = set(message) - {"role", "content", "tool_name", "tool_input", "metadata"}
            if extra:
                raise ValueError(
                    f"conversation {conversation_id!r}: {where} has unknown fields {sorted(extra)}"
                )
            fields = message
        else:
            raise TypeError(f"conversation {conversation_id!r}: {where} must be a Message or a dict")
        role = fields.get("role")
        if role not in ROLES:
            raise ValueError(
                f"conversation {conversation_id!r}: {where} role must be one of {ROLES}, got {role!r}"
            )
        content = fields.get("content")
        if content is not None:
            if not isinstance(content, str):
                raise TypeError(f"conversation {conversation_id!r}: {where} content must be a str or None")
            if "\x00" in content:
                raise ValueError(
                    f"conversation {conversation_id!r}: {where} content contains a NUL character"
                )
            check_size(f"conversation {conversation_id!r} {where} content", content, max_bytes)
        tool_input = fields.get("tool_input")
        if tool_input is not None:
            encode_value(conversation_id, tool_input, max_bytes)
        metadata = fields.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise TypeError(f"conversation {conversation_id!r}: {where} metadata must be a dict or None")
            try:
                encode_value(conversation_id, metadata, max_bytes)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"conversation {conversation_id!r}: {where} metadata: {exc}") from None
        tool_name = checked_text(conversation_id, f"{where} tool_name", fields.get("tool_name"))
        records.append(Message(role, content, tool_name, tool_input, metadata))
    return records


def message_page_of(
    rows: Sequence[StoredMessage], limit: int, descending: bool = False
) -> Page[StoredMessage]:
    """Return the first ``limit`` of ``rows`` (read in order, ``limit + 1`` of them when there are
    more) as a page of messages, with the cursor that continues after it in that direction."""
    return page_of(rows, limit, lambda m: time_cursor_key(m.created_at, m.raw_created_at, m.id, descending))


def sizes_of(messages: Iterable[StoredMessage]) -> list[MessageSize]:
    """Return the :class:`MessageSize` of each of ``messages`` (as read and opened), measured
    from its text: what :meth:`ConversationLog.message_sizes` gives when the messages are at hand."""
    return [MessageSize(row.id, row.role, utf8_len(row.content or ""), row.tool_input) for row in messages]
