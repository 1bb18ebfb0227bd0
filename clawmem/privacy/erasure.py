"""Subject access and erasure on one site: the plan of what a subject's export and erasure
cover, the export document, and the erasure itself (SPEC 4.7).

A plan has three parts: the subject's conversations, the entries of their subject namespace,
and mentions of them in other namespaces. Export and erasure always cover the first two.
Mentions are listed, with the matched text, and deleted only when asked for
(``erase --mentions``). An id of only digits or shorter than
:data:`~clawmem.privacy.subjects.MIN_MENTION_LENGTH` characters is never matched as a mention.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import sqlalchemy as sa

from clawmem.encryption.ciphers import cipher_for, keystore_of, subject_of_user
from clawmem.memory.base import contains_text
from clawmem.privacy.subjects import (
    Subject,
    matched_text,
    mention_pattern,
    mention_search_refusal,
    mentions,
    text_pattern,
)
from clawmem.records import MemoryRow
from clawmem.rules import is_expired, subject_namespace
from clawmem.sites.deletion import Deleted, OnBatch, delete_conversations
from clawmem.sites.site import Site
from clawmem.sql.conversations import Conversation
from clawmem.sql.engine import after_erasure, connect
from clawmem.sql.lenient import unix_to_datetime
from clawmem.sql.retention import count_conversations, iter_conversation_ids
from clawmem.sql.schema import tables
from clawmem.sql.subjects import conversations_where, iter_conversations

EXPORT_FORMAT = "clawmem-export/1"


@dataclass(frozen=True)
class Mention:
    """An entry outside the subject's namespace that mentions them: where it is, whether the
    key or the value matched, and the matched text with some context around it."""

    namespace: str
    key: str
    where: str
    matched: str


@dataclass(frozen=True)
class SubjectPlan:
    """What an export holds and an erasure deletes for one subject, counted before any deletion.

    ``namespace`` is the subject namespace (a user id only) and ``entries`` its keys;
    ``mentions`` are entries elsewhere, deleted only with ``mentions=True``. When
    ``mentions_searched`` is false, ``not_searched`` says why (an id too plain to search for).
    """

    subject: Subject
    conversations: int
    messages: int
    namespace: str | None
    entries: tuple[tuple[str, str], ...]
    mentions: tuple[Mention, ...]
    mentions_searched: bool
    not_searched: str | None = None

    def counts(self) -> dict[str, int]:
        """Return the plan's counts: conversations, messages, memory (subject namespace), mentions."""
        return {
            "conversations": self.conversations,
            "messages": self.messages,
            "memory": len(self.entries),
            "mentions": len(self.mentions),
        }

    @property
    def nothing(self) -> bool:
        """Return whether the plan holds nothing at all (mentions included)."""
        return not (self.conversations or self.messages or self.entries or self.mentions)


def _subject_where(site: Site, subject: Subject) -> Any:
    if subject.match is not None and site.conversations.encrypted:
        return _matched_by_scan(site, subject.match)
    return conversations_where(
        site.prefix, user_id=subject.user_id, conversation_id=subject.conversation_id, match=subject.match
    )


def _matched_by_scan(site: Site, text: str) -> Any:
    # Sealed columns cannot be matched in SQL: every conversation is opened and searched here,
    # so an export or erasure by text stays complete (never bounded, unlike a dashboard search).
    every = iter_conversations(site.engine, site.prefix, sa.true(), shape=site.conversations.shape)
    log = site.conversations
    found = [conversation.id for conversation in every if _holds(log.opened(conversation), text)]
    return tables(site.prefix).conversations.c.id.in_(found)


def _holds(conversation: Conversation, text: str) -> bool:
    """Return whether a conversation's title, user id, metadata or any message holds ``text``."""
    parts: list[Any] = [conversation.title, conversation.user_id, conversation.metadata]
    for message in conversation.messages:
        parts += [message.content, message.tool_name, message.tool_input]
    for part in parts:
        if part is None:
            continue
        shown = part if isinstance(part, str) else json.dumps(part, ensure_ascii=False)
        if text in shown or (not isinstance(part, str) and text in json.dumps(part)):
            return True
    return False


def own_namespace(site: Site, subject: Subject) -> str | None:
    """Return the subject namespace of a user id on this site, ``None`` for other subjects."""
    if subject.user_id is None:
        return None
    return subject_namespace(subject.user_id, site.settings.subject_namespace)


def subject_conversations(site: Site, subject: Subject) -> Iterator[Conversation]:
    """Yield the subject's conversations, oldest first, each with all its messages (summaries
    and recall records included), one page at a time."""
    where = _subject_where(site, subject)
    found = iter_conversations(site.engine, site.prefix, where, shape=site.conversations.shape)
    return (site.conversations.opened(conversation) for conversation in found)


def subject_entries(site: Site, subject: Subject) -> list[MemoryRow]:
    """Return every entry of the subject's own namespace, expired ones included (none for a
    conversation or a match text, which have no namespace)."""
    namespace = own_namespace(site, subject)
    return [] if namespace is None else site.driver.records(namespace)


def mentions_not_searched(subject: Subject) -> str | None:
    """Return why the subject's mentions are not searched (see
    :func:`clawmem.privacy.subjects.mention_search_refusal`), or ``None`` when they are."""
    return None if subject.user_id is None else mention_search_refusal(subject.user_id)


def subject_mentions(site: Site, subject: Subject) -> Iterator[tuple[MemoryRow, Mention]]:
    """Yield each entry outside the subject's namespace that mentions them, with where it matched.

    A user id matches as a whole token (``cust-42`` never matches ``cust-420``), and never when
    :func:`mentions_not_searched` gives a reason; a conversation id or a match text matches
    anywhere in a key or a value. Expired entries are included.
    """
    if mentions_not_searched(subject) is not None:
        return
    own = own_namespace(site, subject)
    whole_token = subject.user_id is not None
    pattern = mention_pattern(subject.text) if whole_token else text_pattern(subject.text)
    for row in site.driver.find(subject.text, whole=True):
        if row.namespace == own:
            continue
        if whole_token and not mentions(pattern, row.key, row.value):
            continue
        if not whole_token and not contains_text(row, subject.text):
            continue
        where, matched = matched_text(pattern, row.key, row.value) or ("value", subject.text)
        yield row, Mention(row.namespace, row.key, where, matched)


def subject_plan(site: Site, subject: Subject) -> SubjectPlan:
    """Return what an export holds and an erasure deletes for ``subject``, deleting nothing.

    This is the plan a dry run shows, the plan a run records in its "started" audit line, and
    what the dashboard's subject page can list.
    """
    with connect(site.engine) as conn:
        counted = count_conversations(conn, site.prefix, _subject_where(site, subject))
    reason = mentions_not_searched(subject)
    return SubjectPlan(
        subject=subject,
        conversations=counted.conversations,
        messages=counted.messages,
        namespace=own_namespace(site, subject),
        entries=tuple((row.namespace, row.key) for row in subject_entries(site, subject)),
        mentions=tuple(mention for _, mention in subject_mentions(site, subject)),
        mentions_searched=reason is None,
        not_searched=reason,
    )


def subject_conversation_ids(site: Site, subject: Subject) -> Iterator[str]:
    """Yield the ids of the subject's conversations, oldest first (for a dry run's listing)."""
    with connect(site.engine) as conn:
        for conversation_id, _ in iter_conversation_ids(conn, site.prefix, _subject_where(site, subject)):
            yield conversation_id


# -- export --------------------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.replace(tzinfo=UTC).isoformat()


def _unreadable(document: dict[str, Any], reason: str | None) -> dict[str, Any]:
    # A row another program wrote is exported as stored, with what could not be read.
    if reason:
        document["unreadable"] = reason
    return document


def conversation_document(conversation: Conversation) -> dict[str, Any]:
    """Return one conversation with its messages as the export writes it. A column that could
    not be read is given as stored (a time as ``null``) and named under ``unreadable``."""
    return _unreadable(
        {
            "id": conversation.id,
            "namespace": conversation.namespace,
            "user_id": conversation.user_id,
            "title": conversation.title,
            "metadata": conversation.metadata,
            "total_tokens": conversation.total_tokens,
            "created_at": _iso(conversation.created_at),
            "updated_at": _iso(conversation.updated_at),
            "messages": [
                _unreadable(
                    {
                        "id": message.id,
                        "role": message.role,
                        "content": message.content,
                        "tool_name": message.tool_name,
                        "tool_input": message.tool_input,
                        "metadata": message.metadata,
                        "created_at": _iso(message.created_at),
                    },
                    message.unreadable,
                )
                for message in conversation.messages
            ],
        },
        conversation.unreadable,
    )


def entry_document(row: MemoryRow, now: int) -> dict[str, Any]:
    """Return one key/value entry as the export writes it (an unreadable value as its stored
    text, named under ``unreadable``)."""
    expires = unix_to_datetime(row.expires_at)
    return _unreadable(
        {
            "namespace": row.namespace,
            "key": row.key,
            "value": row.value,
            "metadata": row.metadata,
            "expires_at": None if expires is None else expires.replace(tzinfo=UTC).isoformat(),
            "expired": is_expired(row.expires_at, now),
            "created_at": _iso(row.created_at),
            "updated_at": _iso(row.updated_at),
        },
        row.unreadable,
    )


def unreadable_rows(conversation: Conversation) -> list[dict[str, str]]:
    """Return the conversation's row and message rows that could not be read whole, by id."""
    found = []
    if conversation.unreadable:
        found.append({"table": "conversations", "id": conversation.id, "reason": conversation.unreadable})
    found += [
        {"table": "messages", "id": message.id, "reason": message.unreadable}
        for message in conversation.messages
        if message.unreadable
    ]
    return found


@dataclass
class Exported:
    """How much an export wrote."""

    conversations: int = 0
    messages: int = 0
    memory: int = 0
    mentions: int = 0
    unreadable: int = 0  # rows exported as stored because they could not be read whole
    not_searched: str | None = None  # why mentions were not searched, when they were not

    def counts(self) -> dict[str, int]:
        """Return the counts for an audit line."""
        return {
            "conversations": self.conversations,
            "messages": self.messages,
            "memory": self.memory,
            "mentions": self.mentions,
        }


def _json(document: Any) -> str:
    # Strict JSON: a value that is not (NaN, Infinity) is a bug upstream, never written.
    return json.dumps(_finite(document), ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    # Readers never return non-finite floats; this keeps a document valid JSON if one slips by.
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _unreadable_entry(row: MemoryRow) -> dict[str, str]:
    return {"table": "memory", "namespace": row.namespace, "key": row.key, "reason": row.unreadable or ""}


def export_subject(site: Site, subject: Subject, out: IO[str], exported: Exported | None = None) -> Exported:
    """Write everything held about ``subject`` to ``out`` as one JSON document, one conversation
    or entry per line, so a long history streams rather than being built in memory.

    ``memory`` holds the subject namespace's entries; ``mentions`` the entries elsewhere that
    mention the subject, each with the matched text (``mentions_searched`` false, with the
    reason, for an id too plain to search for). ``exported`` (counted into as the document is
    written) lets a caller report how far a failed export got.
    """
    exported = exported if exported is not None else Exported()
    now = int(site.clock())
    reason = mentions_not_searched(subject)
    exported.not_searched = reason
    header: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "generated_at": datetime.fromtimestamp(site.clock(), UTC).isoformat(),
        "subject": subject.describe(),
        "table_prefix": site.prefix,
    }
    if subject.user_id is not None:
        header["subject_namespace"] = own_namespace(site, subject)
    header["mentions_searched"] = reason is None
    if reason is not None:
        header["mentions_not_searched"] = reason
    # The header object is left open so that the arrays can follow it, item by item.
    out.write(_json(header)[:-1] + ',\n"conversations": [')
    unreadable: list[dict[str, str]] = []
    for conversation in subject_conversations(site, subject):
        separator = ",\n" if exported.conversations else "\n"
        out.write(separator + _json(conversation_document(conversation)))
        exported.conversations += 1
        exported.messages += len(conversation.messages)
        unreadable += unreadable_rows(conversation)
    out.write('\n],\n"memory": [')
    for row in subject_entries(site, subject):
        separator = ",\n" if exported.memory else "\n"
        out.write(separator + _json(entry_document(row, now)))
        exported.memory += 1
        if row.unreadable:
            unreadable.append(_unreadable_entry(row))
    out.write('\n],\n"mentions": [')
    for row, mention in subject_mentions(site, subject):
        separator = ",\n" if exported.mentions else "\n"
        document = entry_document(row, now) | {"matched_in": mention.where, "matched": mention.matched}
        out.write(separator + _json(document))
        exported.mentions += 1
        if row.unreadable:
            unreadable.append(_unreadable_entry(row))
    exported.unreadable = len(unreadable)
    # Rows another program wrote that could not be read whole: exported as stored, listed here.
    out.write('\n],\n"unreadable": ' + _json(unreadable))
    out.write(',\n"counts": ' + _json(exported.counts()) + "\n}\n")
    return exported


# -- erasure -------------------------------------------------------------------------------------


def erase_subject(
    site: Site,
    subject: Subject,
    batch_size: int = 1000,
    dry_run: bool = False,
    on_batch: OnBatch | None = None,
    *,
    mentions: bool = False,
    plan: SubjectPlan | None = None,
) -> Deleted:
    """Delete the subject's conversations in batches (messages first) and every entry of their
    subject namespace; with ``mentions``, also the entries elsewhere that mention them.

    ``plan`` (default: :func:`subject_plan` now) names exactly the entries that go, so a run
    deletes only what its plan listed. ``mentions_left`` of the result counts the mentions
    listed but kept. With a key store (``CLAW_KEYSTORE_URL``), a user id's data key goes last,
    after their rows (``subject_keys`` counts it), so that every older copy of those rows can no
    longer be read. Raises ``ValueError`` for a bad ``batch_size``.
    """
    plan = plan if plan is not None else subject_plan(site, subject)
    mentioned = tuple((mention.namespace, mention.key) for mention in plan.mentions)
    entries = tuple(dict.fromkeys(plan.entries + (mentioned if mentions else ())))
    left = 0 if mentions else len(dict.fromkeys(mentioned))
    where = _subject_where(site, subject)
    found = delete_conversations(site, where, "created_at", batch_size, dry_run, on_batch)
    if not dry_run:
        for namespace, key in entries:
            # As stored: another program's row under a name today's rules refuse goes too.
            site.driver.delete_stored(namespace, [key])
        after_erasure(site.engine)
        site.cipher.forget_opened()  # no opened text of the erased rows stays in this process
    keys = erase_subject_key(site, subject, dry_run)
    return Deleted(dry_run, found.conversations, found.messages, entries, found.batches, left, keys)


def subject_key_held(site: Site, subject: Subject) -> bool:
    """Return whether the key store holds a data key of ``subject`` (a user id); ``False``
    without a key store. Reads only."""
    keystore = keystore_of(cipher_for(site.settings))
    owner = subject_of_user(subject.user_id)
    return keystore is not None and owner is not None and keystore.has_key(owner)


def erase_subject_key(site: Site, subject: Subject, dry_run: bool = False) -> int:
    """Delete the data key of ``subject`` (a user id) from the key store, and from this process's
    cipher; return how many keys went (with ``dry_run``, would go). Nothing without a key store."""
    if dry_run:
        return int(subject_key_held(site, subject))
    cipher = cipher_for(site.settings)
    keystore = keystore_of(cipher)
    owner = subject_of_user(subject.user_id)
    if keystore is None or owner is None:
        return 0
    erased = keystore.erase(owner)
    for key_id in erased:
        cipher.forget_key(key_id)
    return len(erased)
