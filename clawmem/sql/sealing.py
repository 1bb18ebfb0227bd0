"""Sealing and opening the encrypted columns of the conversations and messages tables (SPEC 13).

Encrypted: a conversation's ``title`` and ``metadata``, a message's ``content``, ``tool_input``
and own ``metadata`` (a framework's item is kept there). Everything else (ids, namespaces, user
ids, roles, tool names, times, token counts) stays plain, so SQL can filter, order and count by it.
Each value is sealed for its site (table prefix), table, row id and column.

The row mappers of :mod:`clawmem.sql.conversations` read sealed columns as they are stored
(JSON columns as :class:`~clawmem.sql.lenient.Sealed`); the functions here open them. With
``raising`` a value that cannot be opened raises :class:`~clawmem.errors.Undecryptable` (one
conversation read for a turn); without it the row comes back marked unreadable, the column
read as ``None``, as a list or an export shows another program's unreadable row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clawmem.crypto import PREFIX, Cipher, Context, is_sealed, largest_plaintext
from clawmem.crypto.cipher import row_data
from clawmem.errors import Undecryptable, ValueTooLarge
from clawmem.sql.lenient import Sealed, read_json, reasons

CONVERSATIONS = "conversations"
MESSAGES = "messages"
TITLE_BYTES = 255  # VARCHAR(255): on MariaDB, 255 characters of which an envelope's are ASCII
TEXT_BYTES = 65_535  # TEXT on MariaDB/MySQL (tool_input and metadata); LONGTEXT holds far more


def clip_title(title: str, cipher: Cipher) -> str:
    """Return ``title`` cut (at a character) to the most UTF-8 bytes whose envelope fits the
    255-character title column under the longest key id the cipher may seal with."""
    room = largest_plaintext(TITLE_BYTES, 32)
    encoded = title.encode("utf-8")
    if len(encoded) <= room:
        return title
    return encoded[:room].decode("utf-8", errors="ignore")


def seal_column(
    cipher: Cipher,
    prefix: str,
    table: str,
    row_id: str,
    column: str,
    text: str | None,
    subject: str | None,
    dialect: str = "",
) -> str | None:
    """Return ``text`` sealed for its place (``None`` stays NULL). Raises :class:`ValueTooLarge`
    when the envelope would not fit MariaDB's ``TEXT`` column (``tool_input``, ``metadata``)."""
    if text is None or not cipher.enabled:
        return text
    sealed = cipher.seal(text, Context.row(prefix, table, row_id, column), subject or None)
    if dialect in ("mysql", "mariadb") and column in ("tool_input", "metadata") and len(sealed) > TEXT_BYTES:
        raise ValueTooLarge(
            f"{table} row {row_id!r}: the encrypted {column} is {len(sealed)} bytes, more than the "
            f"{TEXT_BYTES} MariaDB's TEXT column holds (about {largest_plaintext(TEXT_BYTES, 32)} bytes "
            "of JSON before encryption); nothing was written"
        )
    return sealed


def _open_text(cipher: Cipher, context: Context, text: str, raising: bool, problems: list[str]) -> str | None:
    # What cannot be opened reads as None (a page shows "unreadable", never the ciphertext as
    # if it were the text), with the reason; the stored row is left exactly as it is.
    try:
        return cipher.open(text, context)
    except Undecryptable as exc:
        if raising:
            raise
        problems.append(f"{context.column} cannot be decrypted ({exc.reason})")
        return None


def _open_json(cipher: Cipher, context: Context, value: Any, raising: bool, problems: list[str]) -> Any:
    # A JSON column: sealed text is opened then parsed; plaintext was parsed already, and is
    # refused in strict mode like any other plaintext.
    if value is None:
        return None
    if not isinstance(value, Sealed):
        if cipher.strict:
            _open_text(cipher, context, "", raising, problems)  # refuses plaintext: raises or says
            return None
        return value
    opened = _open_text(cipher, context, value, raising, problems)
    if opened is None:
        return None
    parsed, problem = read_json(opened, context.column)
    if problem:
        problems.append(problem)
    return parsed


def needs_opening(cipher: Cipher, *texts: Any) -> bool:
    """Return whether any of ``texts`` must go through the cipher: sealed, or strict mode."""
    return cipher.strict or any(isinstance(text, Sealed) or is_sealed(text) for text in texts)


def open_message(cipher: Cipher, prefix: str, message: Any, raising: bool = False) -> Any:
    """Return a :class:`~clawmem.sql.conversations.StoredMessage` with its content and tool input
    opened (or, without ``raising``, marked unreadable where they cannot be)."""
    content, tool_input, metadata = message.content, message.tool_input, message.metadata
    if not cipher.strict and not isinstance(tool_input, Sealed) and not isinstance(metadata, Sealed):
        # The common case of a turn's history, kept cheap: a sealed content and nothing else.
        if not is_sealed(content):
            return message
        try:
            opened = cipher.open_sealed(
                content,
                row_data(prefix, MESSAGES, message.id, "content"),
                lambda: Context.row(prefix, MESSAGES, message.id, "content").describe(),
            )
        except Undecryptable:
            if raising:
                raise
        else:
            return _with(message, content=opened)
    problems: list[str] = []
    if content is not None and (cipher.strict or is_sealed(content)):
        context = Context.row(prefix, MESSAGES, message.id, "content")
        content = _open_text(cipher, context, content, raising, problems)
    context = Context.row(prefix, MESSAGES, message.id, "tool_input")
    tool_input = _open_json(cipher, context, tool_input, raising, problems)
    if metadata is not None and (isinstance(metadata, Sealed) or cipher.strict):
        context = Context.row(prefix, MESSAGES, message.id, "metadata")
        metadata = _open_json(cipher, context, metadata, raising, problems)
    unreadable = reasons(message.unreadable, *problems)
    return _with(message, content=content, tool_input=tool_input, metadata=metadata, unreadable=unreadable)


def open_messages(cipher: Cipher, prefix: str, messages: list[Any], raising: bool = False) -> list[Any]:
    """Return :func:`open_message` of each of ``messages``, in order. A turn opens its whole
    history here, so the common row (sealed content, no tool input) takes a short path."""
    if (
        not cipher.enabled
        and not cipher.key_source
        and not any(
            is_sealed(m.content) or isinstance(m.tool_input, Sealed) or isinstance(m.metadata, Sealed)
            for m in messages
        )
    ):
        return messages
    with cipher.reading():  # the key source checks for an erasure once, not once a row
        return _open_messages(cipher, prefix, messages, raising)


def _open_messages(cipher: Cipher, prefix: str, messages: list[Any], raising: bool) -> list[Any]:
    if cipher.strict:
        return [open_message(cipher, prefix, message, raising) for message in messages]
    opened = []
    open_fast = cipher.fast_opener()
    head = f"row|{len(prefix)}:{prefix}|{len(MESSAGES)}:{MESSAGES}|"
    for message in messages:
        content = message.content
        if (
            message.tool_input is None
            and not isinstance(message.metadata, Sealed)
            and content is not None
            and content.startswith(PREFIX)
        ):
            row_id = message.id
            associated = f"{head}{len(row_id)}:{row_id}|7:content".encode("utf-8", "surrogatepass")
            text = open_fast(content, associated)
            if text is not None:
                opened.append(_with(message, content=text))
                continue
        opened.append(open_message(cipher, prefix, message, raising))  # names a failure, or marks it
    return opened


def _with(record: Any, **changes: Any) -> Any:
    # dataclasses.replace, without its per-field walk: a turn opens a whole history of rows.
    copy = object.__new__(type(record))
    copy.__dict__.update(record.__dict__, **changes)
    return copy


def open_fields(cipher: Cipher, prefix: str, fields: dict[str, Any], raising: bool = False) -> dict[str, Any]:
    """Return a conversation row's fields (see :func:`~clawmem.sql.conversations.conversation_fields`)
    with title and metadata opened (or marked unreadable)."""
    if not needs_opening(cipher, fields["title"], fields["metadata"]):
        return fields
    with cipher.reading():
        return _open_fields(cipher, prefix, fields, raising)


def _open_fields(cipher: Cipher, prefix: str, fields: dict[str, Any], raising: bool) -> dict[str, Any]:
    problems: list[str] = []
    title = fields["title"]
    if title is not None and (cipher.strict or is_sealed(title)):
        context = Context.row(prefix, CONVERSATIONS, fields["id"], "title")
        title = _open_text(cipher, context, title, raising, problems)
    context = Context.row(prefix, CONVERSATIONS, fields["id"], "metadata")
    metadata = _open_json(cipher, context, fields["metadata"], raising, problems)
    opened = {**fields, "title": title, "metadata": metadata}
    if "unreadable" in fields:
        opened["unreadable"] = reasons(fields["unreadable"], *problems)
    return opened


def open_summary(cipher: Cipher, prefix: str, summary: Any) -> Any:
    """Return a listed conversation with title and metadata opened, or marked unreadable."""
    if not needs_opening(cipher, summary.title, summary.metadata):
        return summary
    fields = {name: getattr(summary, name) for name in ("id", "title", "metadata", "unreadable")}
    opened = open_fields(cipher, prefix, fields)
    return dataclasses.replace(summary, **{name: opened[name] for name in OPENED})


OPENED = ("title", "metadata", "unreadable")
