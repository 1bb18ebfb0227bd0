"""The operations an operator runs on one site: forgetting, flushing, sweeping, retention,
subject export and erasure, sizes and uninstall.

Each is a function of a :class:`~clawmem.site.Site` returning a typed result. With
``dry_run=True`` it deletes nothing and returns the same result it would have returned, so a
preview and a run can be compared line by line. The CLI (``clawmem`` and ``flask claw``) and
the dashboard call these and nothing below them; none of them asks which driver it runs on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from clawmem.clock import utc_datetime
from clawmem.memory.file import remove_store_files, store_files
from clawmem.memory.file import site_directory as file_site_directory
from clawmem.records import MemoryRow
from clawmem.rules import is_expired
from clawmem.site import Site
from clawmem.sql import activity as sql_activity
from clawmem.sql import sizes
from clawmem.sql.activity import Activity
from clawmem.sql.conversations import Conversation
from clawmem.sql.engine import after_erasure
from clawmem.sql.lenient import unix_to_datetime
from clawmem.sql.retention import Batch, count_conversations, delete_in_batches, iter_conversation_ids
from clawmem.sql.retention import older_than as older_than_condition
from clawmem.sql.schema import create_tables
from clawmem.sql.subjects import conversations_where, iter_conversations
from clawmem.subjects import Subject, mention_pattern, mentions, subject_namespace

EXPORT_FORMAT = "clawmem-export/1"
OnBatch = Callable[[Batch], None]


@dataclass(frozen=True)
class Deleted:
    """What an operation deleted or, with ``dry_run``, would delete.

    ``entries`` lists the (namespace, key) pairs of key/value entries; conversation ids are
    reported per batch to ``on_batch``, so a large run never holds them all.
    """

    dry_run: bool
    conversations: int = 0
    messages: int = 0
    entries: tuple[tuple[str, str], ...] = ()
    batches: int = 0

    def counts(self) -> dict[str, int]:
        """Return the counts for an audit line: conversations, messages and memory entries."""
        return {"conversations": self.conversations, "messages": self.messages, "memory": len(self.entries)}

    @property
    def nothing(self) -> bool:
        """Return whether the operation found nothing to delete."""
        return not (self.conversations or self.messages or self.entries)


# -- one key, one conversation, one namespace ---------------------------------------------------


def forget_key(site: Site, key: str, namespace: str = "default", dry_run: bool = False) -> Deleted:
    """Delete one key/value entry, expired or not. A missing key deletes nothing."""
    exists = site.driver.entry(namespace, key) is not None
    if exists and not dry_run:
        site.memory.forget(key, namespace)
    return Deleted(dry_run, entries=((namespace, key),) if exists else ())


def forget_conversation(site: Site, conversation_id: str, dry_run: bool = False) -> Deleted:
    """Delete one conversation with its messages, in one transaction. A missing id deletes nothing."""
    found = site.conversations.get(conversation_id)
    if found is None:
        return Deleted(dry_run)
    if dry_run:
        return Deleted(True, conversations=1, messages=found.row_count)
    conversations, messages = site.conversations.delete(conversation_id)
    return Deleted(False, conversations=conversations, messages=messages)


def flush_namespace(site: Site, namespace: str, dry_run: bool = False) -> Deleted:
    """Delete every entry of one key/value namespace, expired ones included, exactly as stored:
    a namespace another program wrote under a name today's rule refuses is reached too."""
    keys = tuple((namespace, row.key) for row in site.driver.stored_records(namespace))
    if dry_run or not keys:
        return Deleted(dry_run, entries=keys)
    site.driver.delete_stored(namespace)
    return Deleted(False, entries=keys)


def sweep(site: Site, dry_run: bool = False) -> dict[str, int]:
    """Delete expired key/value entries in every namespace; return the count per namespace."""
    return site.driver.sweep(dry_run=dry_run)


# -- retention -----------------------------------------------------------------------------------


def retention_cutoff(site: Site, window: timedelta) -> datetime:
    """Return the naive UTC moment before which a conversation is outside ``window``."""
    return utc_datetime(site.clock) - window


def prune(
    site: Site,
    window: timedelta,
    by: str = "created_at",
    batch_size: int = 1000,
    dry_run: bool = False,
    on_batch: OnBatch | None = None,
) -> Deleted:
    """Delete conversations whose ``by`` column is older than ``window``, with their messages.

    Oldest first, ``batch_size`` conversations per transaction, messages first: a run killed at
    any moment leaves no orphans, and the next run finishes the job. ``on_batch`` sees each
    committed batch. Raises ``ValueError`` for a bad ``by`` or ``batch_size``.
    """
    where = older_than_condition(site.prefix, by, retention_cutoff(site, window))
    return _delete_conversations(site, where, by, batch_size, dry_run, on_batch)


def conversations_to_prune(
    site: Site, window: timedelta, by: str = "created_at"
) -> Iterator[tuple[str, datetime]]:
    """Yield ``(id, moment)`` of every conversation :func:`prune` would delete, oldest first."""
    where = older_than_condition(site.prefix, by, retention_cutoff(site, window))
    with site.engine.connect() as conn:
        yield from iter_conversation_ids(conn, site.prefix, where, by)


def _delete_conversations(
    site: Site, where: Any, by: str, batch_size: int, dry_run: bool, on_batch: OnBatch | None
) -> Deleted:
    if dry_run:
        with site.engine.connect() as conn:
            counts = count_conversations(conn, site.prefix, where)
        return Deleted(True, conversations=counts.conversations, messages=counts.messages)
    conversations = messages = batches = 0
    for batch in delete_in_batches(site.engine, site.prefix, where, order_by=by, batch_size=batch_size):
        conversations += batch.conversations
        messages += batch.messages
        batches += 1
        if on_batch is not None:
            on_batch(batch)
    return Deleted(False, conversations=conversations, messages=messages, batches=batches)


# -- subjects ------------------------------------------------------------------------------------


def _subject_where(site: Site, subject: Subject) -> Any:
    return conversations_where(
        site.prefix, user_id=subject.user_id, conversation_id=subject.conversation_id, match=subject.match
    )


def subject_conversations(site: Site, subject: Subject) -> Iterator[Conversation]:
    """Yield the subject's conversations, oldest first, each with all its messages (summaries
    and recall records included), one page at a time."""
    return iter_conversations(
        site.engine, site.prefix, _subject_where(site, subject), shape=site.conversations.shape
    )


def subject_memory(site: Site, subject: Subject) -> Iterator[MemoryRow]:
    """Yield every key/value entry that concerns the subject, expired ones included (SPEC 4.7).

    For a user id: their whole subject namespace, then entries elsewhere whose key or value
    mentions the id as a whole token (``cust-42`` never matches ``cust-420``). For a
    conversation id or a match text: entries whose key or value contains it.
    """
    driver = site.driver
    if subject.user_id is None:
        yield from driver.find(subject.text)
        return
    own = subject_namespace(subject.user_id, site.settings.subject_namespace)
    yield from driver.records(own)
    pattern = mention_pattern(subject.user_id)
    for row in driver.find(subject.user_id):
        if row.namespace != own and mentions(pattern, row.key, row.value):
            yield row


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
    unreadable: int = 0  # rows exported as stored because they could not be read whole

    def counts(self) -> dict[str, int]:
        """Return the counts for an audit line."""
        return {"conversations": self.conversations, "messages": self.messages, "memory": self.memory}


def export_subject(site: Site, subject: Subject, out: IO[str], exported: Exported | None = None) -> Exported:
    """Write everything held about ``subject`` to ``out`` as one JSON document, one conversation
    or entry per line, so a long history streams rather than being built in memory.

    ``exported`` (counted into as the document is written) lets a caller report how far a
    failed export got.
    """
    exported = exported if exported is not None else Exported()
    now = int(site.clock())
    header = {
        "format": EXPORT_FORMAT,
        "generated_at": datetime.fromtimestamp(site.clock(), UTC).isoformat(),
        "subject": subject.describe(),
        "table_prefix": site.prefix,
    }
    if subject.user_id is not None:
        header["subject_namespace"] = subject_namespace(subject.user_id, site.settings.subject_namespace)
    # The header object is left open so that the two arrays can follow it, item by item.
    out.write(json.dumps(header, ensure_ascii=False)[:-1] + ',\n"conversations": [')
    unreadable: list[dict[str, str]] = []
    for conversation in subject_conversations(site, subject):
        separator = ",\n" if exported.conversations else "\n"
        out.write(separator + json.dumps(conversation_document(conversation), ensure_ascii=False))
        exported.conversations += 1
        exported.messages += len(conversation.messages)
        unreadable += unreadable_rows(conversation)
    out.write('\n],\n"memory": [')
    for row in subject_memory(site, subject):
        separator = ",\n" if exported.memory else "\n"
        out.write(separator + json.dumps(entry_document(row, now), ensure_ascii=False))
        exported.memory += 1
        if row.unreadable:
            unreadable.append(
                {"table": "memory", "namespace": row.namespace, "key": row.key, "reason": row.unreadable}
            )
    exported.unreadable = len(unreadable)
    # Rows another program wrote that could not be read whole: exported as stored, listed here.
    out.write('\n],\n"unreadable": ' + json.dumps(unreadable, ensure_ascii=False))
    out.write(',\n"counts": ' + json.dumps(exported.counts()) + "\n}\n")
    return exported


def erase_subject(
    site: Site,
    subject: Subject,
    batch_size: int = 1000,
    dry_run: bool = False,
    on_batch: OnBatch | None = None,
) -> Deleted:
    """Delete everything :func:`export_subject` would return for ``subject``: their
    conversations in batches (messages first) and every key/value entry that concerns them."""
    entries = tuple(dict.fromkeys((row.namespace, row.key) for row in subject_memory(site, subject)))
    where = _subject_where(site, subject)
    found = _delete_conversations(site, where, "created_at", batch_size, dry_run, on_batch)
    if not dry_run:
        for namespace, key in entries:
            # As stored: another program's row under a name today's rules refuse goes too.
            site.driver.delete_stored(namespace, [key])
        after_erasure(site.engine)
    return Deleted(dry_run, found.conversations, found.messages, entries, found.batches)


def subject_conversation_ids(site: Site, subject: Subject) -> Iterator[str]:
    """Yield the ids of the subject's conversations, oldest first (for a dry run's listing)."""
    with site.engine.connect() as conn:
        for conversation_id, _ in iter_conversation_ids(conn, site.prefix, _subject_where(site, subject)):
            yield conversation_id


# -- the tables as a whole -------------------------------------------------------------------


def init_db(site: Site) -> tuple[list[str], list[str]]:
    """Create the site's three tables in the shape of ``CLAW_SCHEMA`` if they do not exist, and
    bring existing ones of our shape up to date; return their names and what was added to them.
    Raises :class:`clawmem.ConfigError` when tables of the other shape exist."""
    changes = create_tables(site.engine, site.prefix, site.settings.schema)
    return sizes.table_names(site.prefix), changes


def activity(site: Site, days: int = 30) -> Activity:
    """Return the messages written and conversations begun on each of the last ``days`` UTC
    days, today (on the site's clock) last, with the conversations stored now. Raises
    ``ValueError`` for days outside 1..366."""
    with site.engine.connect() as conn:
        return sql_activity.activity(conn, site.prefix, utc_datetime(site.clock), days)


def table_stats(site: Site) -> list[sizes.TableStats]:
    """Return rows and bytes of the site's three tables (the inspection query of its dialect)."""
    return sizes.table_stats(site.engine, site.prefix)


def message_roles(site: Site) -> dict[str, int]:
    """Return how many stored messages each role has, when the messages table exists."""
    if sizes.table_names(site.prefix)[1] not in sizes.present_tables(site.engine, site.prefix):
        return {}
    return site.conversations.role_counts()


@dataclass(frozen=True)
class Uninstalled:
    """What an uninstall dropped or, with ``dry_run``, would drop."""

    dry_run: bool
    tables: tuple[sizes.TableStats, ...]
    files: tuple[str, ...] = field(default=())

    @property
    def rows(self) -> int:
        """Return the rows the dropped tables held."""
        return sum(table.rows or 0 for table in self.tables)

    def counts(self) -> dict[str, int]:
        """Return the counts for an audit line."""
        return {"tables": len(self.tables), "rows": self.rows, "files": len(self.files)}


def uninstall(site: Site, files: bool = False, dry_run: bool = False) -> Uninstalled:
    """Drop the site's three tables and, with ``files``, the file driver's directory of this
    site. Other sites' tables and files are never touched. Raises ``ValueError`` (before
    anything is deleted) when the site's directory holds files the driver did not write."""
    present = tuple(sizes.existing_tables(site.engine, site.prefix))
    store_files = site_files(site) if files else []
    result = Uninstalled(dry_run, present, tuple(str(path) for path in store_files))
    if dry_run:
        return result
    sizes.drop_prefix_tables(site.engine, site.prefix)
    if files:
        remove_store_files(site.settings.file_dir, site.prefix)
    return result


def site_files(site: Site) -> list[Path]:
    """Return the file driver's files of this site (none when it has no directory)."""
    return store_files(site.settings.file_dir, site.prefix)


def site_directory(site: Site) -> Path:
    """Return the file driver's directory for this site."""
    return file_site_directory(site.settings.file_dir, site.prefix)
