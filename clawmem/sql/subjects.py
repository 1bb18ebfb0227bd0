"""Subject access and erasure in SQL: find everything that concerns one data subject.

A subject is a user id (their conversations, exactly), one conversation id, or a piece of text
(conversations whose title, user id, metadata or any message contains it). Memory entries
concern the subject when their key or value contains the subject's text.

Matching is an exact, case-sensitive substring test, identical on every dialect: ``instr`` on
SQLite, ``strpos`` on PostgreSQL and a binary ``INSTR`` on MariaDB/MySQL. ``LIKE`` would need
wildcard escaping and, under MariaDB's default case- and accent-insensitive collations, would
select a different set of rows there than elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from clawmem.sql.conversations import StoredMessage, conversation_fields, load_messages
from clawmem.sql.kv import MemoryRow, memory_row
from clawmem.sql.paging import keyset_pages
from clawmem.sql.retention import batch_transaction, check_batch_size
from clawmem.sql.schema import tables

PAGE_SIZE = 200


class _Position(FunctionElement[int]):
    """1-based position of ``needle`` in ``haystack``, 0 when absent (NULL for a NULL haystack)."""

    type = sa.Integer()
    inherit_cache = True
    name = "clawmem_position"


@compiles(_Position)
def _position_instr(element: _Position, compiler: Any, **kw: Any) -> str:
    haystack, needle = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"instr({haystack}, {needle})"


@compiles(_Position, "postgresql")
def _position_strpos(element: _Position, compiler: Any, **kw: Any) -> str:
    haystack, needle = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"strpos({haystack}, {needle})"


class _Exact(FunctionElement[Any]):
    """A text expression compared byte for byte: MariaDB/MySQL collations otherwise ignore case,
    accents and trailing spaces. Elsewhere text already compares exactly."""

    inherit_cache = True
    name = "clawmem_exact"


@compiles(_Exact)
def _exact_default(element: _Exact, compiler: Any, **kw: Any) -> str:
    (text,) = element.clauses
    return str(compiler.process(text, **kw))


@compiles(_Exact, "mysql")
@compiles(_Exact, "mariadb")
def _exact_mysql(element: _Exact, compiler: Any, **kw: Any) -> str:
    # A substring match on UTF-8 bytes is a substring match on characters.
    (text,) = element.clauses
    return f"CAST({compiler.process(text, **kw)} AS BINARY)"


def contains(column: sa.ColumnElement[Any], text: str) -> sa.ColumnElement[bool]:
    """Return the condition "``column`` contains ``text``" (exact, case-sensitive, no wildcards)."""
    return _Position(_Exact(column), _Exact(sa.literal(text, sa.Text()))) > 0


def equals_exactly(column: sa.ColumnElement[Any], value: str) -> sa.ColumnElement[bool]:
    """Return the condition "``column`` equals ``value``" compared exactly on every dialect.

    The plain comparison lets an index find the candidates; the exact one decides.
    """
    return sa.and_(column == value, _Exact(column) == _Exact(sa.literal(value, sa.String())))


def json_needles(text: str) -> list[str]:
    """Return the forms ``text`` takes inside JSON strings: as written, and \\u-escaped if different.

    Stored JSON escapes quotes, backslashes and control characters, and some writers escape
    every non-ASCII character too.
    """
    needles = [json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]]
    return list(dict.fromkeys(needles))


def entry_matches(key: str, value: Any, text: str) -> bool:
    """Return whether a memory entry's key, or its value as JSON, contains ``text``.

    The same rule as :func:`memory_where`, for drivers that are scanned in Python.
    """
    encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text in key or any(needle in encoded for needle in json_needles(text))


@dataclass(frozen=True)
class Subject:
    """Who an export or erasure concerns: exactly one of ``user_id``, ``conversation_id``, ``match``.

    Raises ``ValueError`` unless exactly one is a non-empty str.
    """

    user_id: str | None = None
    conversation_id: str | None = None
    match: str | None = None

    def __post_init__(self) -> None:
        given = [value for value in (self.user_id, self.conversation_id, self.match) if value is not None]
        if len(given) != 1:
            raise ValueError("a subject is exactly one of a user id, a conversation id or a match text")
        if not isinstance(given[0], str) or not given[0]:
            raise ValueError("the subject must be a non-empty str")

    @property
    def text(self) -> str:
        """Return the text memory entries are matched against."""
        return self.user_id or self.conversation_id or self.match or ""

    def describe(self) -> dict[str, str]:
        """Return the subject as ``{"user_id": ...}``, ``{"conversation": ...}`` or ``{"match": ...}``."""
        if self.user_id is not None:
            return {"user_id": self.user_id}
        if self.conversation_id is not None:
            return {"conversation": self.conversation_id}
        return {"match": self.text}


def conversations_where(prefix: str, subject: Subject) -> sa.ColumnElement[bool]:
    """Return the condition selecting the subject's conversations in ``prefix``'s tables."""
    schema = tables(prefix)
    conversations, messages = schema.conversations, schema.messages
    if subject.user_id is not None:
        return equals_exactly(conversations.c.user_id, subject.user_id)
    if subject.conversation_id is not None:
        return conversations.c.id == subject.conversation_id
    text = subject.text
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


def memory_where(prefix: str, text: str) -> sa.ColumnElement[bool]:
    """Return the condition "memory row's key or JSON value contains ``text``"."""
    memory = tables(prefix).memory
    return sa.or_(
        contains(memory.c.lookup_key, text),
        *(contains(memory.c.value, needle) for needle in json_needles(text)),
    )


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConversationRecord:
    """One conversation of a subject with all its messages, oldest first."""

    id: str
    namespace: str
    user_id: str
    title: str | None
    metadata: Any
    created_at: datetime
    updated_at: datetime
    messages: list[StoredMessage]


def iter_conversations(
    engine: Engine, prefix: str, where: sa.ColumnElement[bool], page_size: int = PAGE_SIZE
) -> Iterator[ConversationRecord]:
    """Yield every conversation matching ``where``, oldest first, each with all its messages.

    Reads ``page_size`` conversations at a time (keyset on created_at, id), so memory use is
    bounded by one page, not by the subject's whole history.
    """
    conversations = tables(prefix).conversations

    def with_messages(conn: Connection, rows: list[Any]) -> list[ConversationRecord]:
        grouped: dict[str, list[StoredMessage]] = {row.id: [] for row in rows}
        for message in load_messages(conn, prefix, list(grouped)):
            grouped[message.conversation_id].append(message)
        return [ConversationRecord(**conversation_fields(row), messages=grouped[row.id]) for row in rows]

    columns = [conversations.c.created_at, conversations.c.id]
    select = sa.select(conversations).where(where)
    for page in keyset_pages(engine, select, columns, page_size, with_messages):
        yield from page


def iter_memory(engine: Engine, prefix: str, text: str, page_size: int = PAGE_SIZE) -> Iterator[MemoryRow]:
    """Yield every memory row (expired ones included) whose key or value contains ``text``, by
    namespace then key."""
    memory = tables(prefix).memory
    select = sa.select(memory).where(memory_where(prefix, text))
    for rows in keyset_pages(engine, select, [memory.c.namespace, memory.c.lookup_key], page_size):
        yield from (memory_row(row) for row in rows)


def count_memory(conn: Connection, prefix: str, text: str) -> int:
    """Return how many memory rows (expired ones included) contain ``text`` in key or value."""
    memory = tables(prefix).memory
    found = conn.execute(sa.select(sa.func.count()).select_from(memory).where(memory_where(prefix, text)))
    return int(found.scalar() or 0)


# -- erasing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBatch:
    """One committed batch of memory rows deleted: their (namespace, key) pairs."""

    entries: tuple[tuple[str, str], ...]


def delete_memory(engine: Engine, prefix: str, text: str, batch_size: int = 1000) -> Iterator[MemoryBatch]:
    """Delete every memory row whose key or value contains ``text``, ``batch_size`` rows per
    transaction; yield each committed batch. Raises ``ValueError`` for a bad ``batch_size``."""
    check_batch_size(batch_size)
    memory = tables(prefix).memory
    where = memory_where(prefix, text)
    while True:
        with batch_transaction(engine) as conn:
            candidates = (
                conn.execute(sa.select(memory.c.id).where(where).order_by(memory.c.id).limit(batch_size))
                .scalars()
                .all()
            )
            if not candidates:
                return
            # Locked by primary key and re-checked: a row a writer changed meanwhile so that it
            # no longer matches stays.
            rows = conn.execute(
                sa.select(memory.c.id, memory.c.namespace, memory.c.lookup_key)
                .where(memory.c.id.in_(candidates), where)
                .order_by(memory.c.id)
                .with_for_update()
            ).all()
            if rows:
                conn.execute(sa.delete(memory).where(memory.c.id.in_([row.id for row in rows])))
        if rows:
            yield MemoryBatch(tuple((row.namespace, row.lookup_key) for row in rows))
