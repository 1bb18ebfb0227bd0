"""Subject access and erasure in SQL: the conditions that find a subject's rows.

A subject's conversations are those of their user id (exactly), one conversation by id, or
those whose title, user id, metadata or any message contains a piece of text. Memory rows are
found by their key or JSON value containing a text (the driver then decides what counts).

Matching is exact and case-sensitive on every dialect (see :mod:`clawmem.sql.exact`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sql.conversations import Conversation, StoredMessage, conversation_fields, load_messages
from clawmem.sql.exact import contains, equals_exactly
from clawmem.sql.paging import keyset_pages
from clawmem.sql.schema import row_columns, tables

PAGE_SIZE = 200


def json_needles(text: str) -> list[str]:
    """Return the forms ``text`` takes inside JSON strings: as written, and \\u-escaped if different.

    Stored JSON escapes quotes, backslashes and control characters, and some writers escape
    every non-ASCII character too.
    """
    needles = [json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]]
    return list(dict.fromkeys(needles))


def conversations_where(
    prefix: str, *, user_id: str | None = None, conversation_id: str | None = None, match: str | None = None
) -> sa.ColumnElement[bool]:
    """Return the condition selecting, in ``prefix``'s tables, the conversations of ``user_id``,
    the one ``conversation_id``, or those that contain ``match`` (give exactly one)."""
    schema = tables(prefix)
    conversations, messages = schema.conversations, schema.messages
    if user_id is not None:
        return equals_exactly(conversations.c.user_id, user_id)
    if conversation_id is not None:
        return conversations.c.id == conversation_id
    if match is None:
        raise ValueError("give one of user_id, conversation_id or match")
    text = match
    needles = json_needles(text)
    in_messages = sa.exists().where(
        messages.c.conversation_id == conversations.c.id,
        sa.or_(
            contains(messages.c.content, text),
            contains(messages.c.tool_name, text),
            *(contains(messages.c.tool_input, needle) for needle in needles),
        ),
    )
    return sa.or_(
        contains(conversations.c.title, text),
        contains(conversations.c.user_id, text),
        *(contains(conversations.c.metadata, needle) for needle in needles),
        in_messages,
    )


def memory_where(prefix: str, text: str, shape: str = CLAWMEM_SCHEMA) -> sa.ColumnElement[bool]:
    """Return the condition "memory row's key or stored value contains ``text``" (JSON text, or
    in phpClaw's shape ``serialize()`` text, where strings stand as written)."""
    memory = tables(prefix, shape).memory
    needles = json_needles(text)
    if shape != CLAWMEM_SCHEMA:
        needles = list(dict.fromkeys([text, *needles]))
    return sa.or_(
        contains(memory.c.lookup_key, text),
        *(contains(memory.c.value, needle) for needle in needles),
    )


def memory_matches(
    conn: Connection, prefix: str, text: str, shape: str = CLAWMEM_SCHEMA
) -> list[tuple[str, str]]:
    """Return ``(namespace, key)`` of every memory row :func:`memory_where` selects, sorted.

    One pass over the table in its own order: no index holds a substring, and a pass in the
    order of the ``(namespace, key)`` index would fetch every row by a random read of its own.
    """
    memory = tables(prefix, shape).memory
    found = conn.execute(
        sa.select(memory.c.namespace, memory.c.lookup_key).where(memory_where(prefix, text, shape))
    )
    return sorted((namespace, key) for namespace, key in found)


def memory_rows_matching(
    conn: Connection,
    prefix: str,
    text: str,
    keys: Sequence[tuple[str, str]],
    shape: str = CLAWMEM_SCHEMA,
) -> list[Any]:
    """Return the rows of ``keys`` (``(namespace, key)`` pairs) that still match ``text`` as
    :func:`memory_where` says, in the order of ``keys``; a row since deleted or changed to no
    longer hold ``text`` is left out."""
    memory = tables(prefix, shape).memory
    wanted: dict[str, list[str]] = {}
    for namespace, key in keys:
        wanted.setdefault(namespace, []).append(key)
    chosen = sa.or_(
        *(
            sa.and_(memory.c.namespace == namespace, memory.c.lookup_key.in_(names))
            for namespace, names in wanted.items()
        )
    )
    found = {
        (row.namespace, row.lookup_key): row
        for row in conn.execute(sa.select(memory).where(chosen, memory_where(prefix, text, shape)))
    }
    return [found[pair] for pair in keys if pair in found]


# -- reading ----------------------------------------------------------------------------------


def iter_conversations(
    engine: Engine,
    prefix: str,
    where: sa.ColumnElement[bool],
    page_size: int = PAGE_SIZE,
    shape: str = CLAWMEM_SCHEMA,
) -> Iterator[Conversation]:
    """Yield every conversation matching ``where``, oldest first, each with all its messages.

    Reads ``page_size`` conversations at a time (keyset on created_at, id), so memory use is
    bounded by one page, not by the subject's whole history.
    """
    conversations = tables(prefix).conversations

    def with_messages(conn: Connection, rows: list[Any]) -> list[Conversation]:
        grouped: dict[str, list[StoredMessage]] = {row.id: [] for row in rows}
        for message in load_messages(conn, prefix, list(grouped), shape):
            grouped[message.conversation_id].append(message)
        return [Conversation(**conversation_fields(row), messages=tuple(grouped[row.id])) for row in rows]

    columns = [conversations.c.created_at, conversations.c.id]
    select = sa.select(*row_columns(conversations, shape)).where(where)
    for page in keyset_pages(engine, select, columns, page_size, with_messages):
        yield from page
