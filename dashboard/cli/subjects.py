"""``flask claw export | erase``: subject access and erasure.

A subject is ``--user-id`` (their conversations, by exact user id), ``--conversation`` (export
only) or ``--match`` (conversations whose title, user id, metadata or any message contains the
text). Memory entries concern the subject when their key or JSON value contains the user id,
conversation id or match text. Matching is exact and case-sensitive on every database: run once
per spelling. On the SQL driver expired-but-unswept entries are included; other drivers only
show live entries (run ``flask claw sweep`` to remove expired ones).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import click

from clawmem.clock import now_seconds
from clawmem.memory.base import BaseMemory, MemoryInterface
from clawmem.memory.rules import is_expired
from clawmem.memory.sql import SqlMemory
from clawmem.memory.wrappers import serving_driver
from clawmem.sql.conversations import ConversationStore
from clawmem.sql.retention import count_conversations, delete_in_batches, iter_conversation_ids
from clawmem.sql.subjects import (
    ConversationRecord,
    Subject,
    conversations_where,
    count_memory,
    delete_memory,
    entry_matches,
    iter_conversations,
    iter_memory,
)
from dashboard import state
from dashboard.cli import claw
from dashboard.cli.audit import AuditEntry, audited, subject_hash
from dashboard.cli.common import (
    check_text,
    confirm_deletion,
    deleting_options,
    plural,
    run_batches,
)

EXPORT_FORMAT = "clawmem-export/1"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.replace(tzinfo=UTC).isoformat()


def _subject(user_id: str | None, conversation: str | None, match: str | None) -> Subject:
    if [user_id, conversation, match].count(None) != 2:
        raise click.UsageError("give exactly one of --user-id, --conversation or --match")
    return Subject(user_id=user_id, conversation_id=conversation, match=match)


# -- memory entries, on whichever driver holds them ---------------------------------------------


def _memory_matches(memory: MemoryInterface, text: str) -> Iterator[dict[str, Any]]:
    """Yield every key/value entry concerning ``text`` as an export record."""
    driver, _ = serving_driver(memory, "default")
    if isinstance(driver, SqlMemory):
        now = now_seconds(driver.clock)
        for row in iter_memory(driver.engine, driver.prefix, text):
            yield {
                "namespace": row.namespace,
                "key": row.key,
                "value": row.value,
                "expires_at": None
                if row.expires_at is None
                else datetime.fromtimestamp(row.expires_at, UTC).isoformat(),
                "expired": is_expired(row.expires_at, now),
                "created_at": _iso(row.created_at),
                "updated_at": _iso(row.updated_at),
            }
        return
    # Drivers without SQL are scanned namespace by namespace; they only show live entries.
    if not isinstance(driver, BaseMemory):
        raise RuntimeError(f"the {type(driver).__name__} driver cannot list its namespaces to search them")
    for namespace in driver.namespaces():
        if serving_driver(memory, namespace)[0] is not driver:
            continue  # the router sends this namespace to another driver
        for key, value in driver.all(namespace).items():
            if entry_matches(key, value, text):
                yield {"namespace": namespace, "key": key, "value": value, "driver": driver.name}


def _matched_pairs(memory: MemoryInterface, text: str) -> list[tuple[str, str]]:
    """Return the (namespace, key) of every key/value entry concerning ``text``."""
    return [(record["namespace"], record["key"]) for record in _memory_matches(memory, text)]


# -- export -----------------------------------------------------------------------------------


def _conversation_record(conversation: ConversationRecord) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "namespace": conversation.namespace,
        "user_id": conversation.user_id,
        "title": conversation.title,
        "metadata": conversation.metadata,
        "created_at": _iso(conversation.created_at),
        "updated_at": _iso(conversation.updated_at),
        "messages": [
            {
                "id": message.id,
                "role": message.role,
                "content": message.content,
                "tool_name": message.tool_name,
                "tool_input": message.tool_input,
                "created_at": _iso(message.created_at),
            }
            for message in conversation.messages
        ],
    }


def write_export(out: IO[str], subject: Subject, entry: AuditEntry) -> None:
    """Write the subject's JSON document to ``out``, one conversation or memory entry per line,
    so a large history is streamed rather than built in memory; counts go into ``entry``."""
    settings = state.settings()
    generated = datetime.fromtimestamp(state.clock()(), UTC).isoformat()
    header = {
        "format": EXPORT_FORMAT,
        "generated_at": generated,
        "subject": subject.describe(),
        "table_prefix": settings.table_prefix,
    }
    # The header object is left open so the two arrays can follow it, item by item.
    out.write(json.dumps(header, ensure_ascii=False)[:-1] + ',\n"conversations": [')
    entry.counts = {"conversations": 0, "messages": 0, "memory": 0}
    where = conversations_where(settings.table_prefix, subject)
    for conversation in iter_conversations(state.engine(), settings.table_prefix, where):
        out.write(
            ("\n" if not entry.counts["conversations"] else ",\n")
            + json.dumps(_conversation_record(conversation), ensure_ascii=False)
        )
        entry.add("conversations")
        entry.add("messages", len(conversation.messages))
    out.write('\n],\n"memory": [')
    for record in _memory_matches(state.memory(), subject.text):
        out.write(("\n" if not entry.counts["memory"] else ",\n") + json.dumps(record, ensure_ascii=False))
        entry.add("memory")
    out.write('\n],\n"counts": ' + json.dumps(entry.counts) + "\n}\n")


def _export_to_file(path: Path, force: bool, subject: Subject, entry: AuditEntry) -> None:
    # Written to a private temporary file beside the target and moved into place at the end,
    # so a failed export never leaves a partial document, and the file is never world-readable.
    if path.exists() and not force:
        raise click.ClickException(f"{path} already exists; pass --force to replace it")
    directory = path.resolve().parent
    descriptor, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            write_export(out, subject, entry)
            out.flush()
            os.fsync(out.fileno())
        if force:
            os.replace(temp_name, path)
        else:
            os.link(temp_name, path)  # fails instead of overwriting a file created meanwhile
            os.unlink(temp_name)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


@claw.command("export")
@click.option("--user-id", callback=check_text, help="Everything held about this user id (exact).")
@click.option("--conversation", callback=check_text, help="One conversation, by id.")
@click.option("--match", callback=check_text, help="Everything containing this text (exact, case-sensitive).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here (mode 0600) instead of stdout.",
)
@click.option("--force", is_flag=True, help="Replace --output if it already exists.")
@audited("export", hashed=("user_id", "match"))
def export(
    entry: AuditEntry,
    user_id: str | None,
    conversation: str | None,
    match: str | None,
    output: Path | None,
    force: bool,
) -> None:
    """Export everything held about a subject, as JSON.

    Subject access: every conversation (with all its messages, tool rows included) and every
    memory entry that concerns the subject.

    Give exactly one of --user-id, --conversation, --match. The run is recorded in the audit
    log with the subject hashed.
    """
    subject = _subject(user_id, conversation, match)
    if subject.conversation_id is not None:
        store = ConversationStore(state.engine(), state.settings().table_prefix)
        if store.get(subject.conversation_id) is None:
            raise click.ClickException(f"no conversation with id {subject.conversation_id!r}")
    if output is None:
        write_export(sys.stdout, subject, entry)
        return
    _export_to_file(output, force, subject, entry)
    click.echo(
        f"wrote {output}: {plural(entry.counts['conversations'], 'conversation')}, "
        f"{plural(entry.counts['messages'], 'message')}, {plural(entry.counts['memory'], 'memory entry')}",
        err=True,
    )


# -- erase ------------------------------------------------------------------------------------


@claw.command("erase")
@click.option("--user-id", callback=check_text, help="Erase this user's conversations (exact user id).")
@click.option("--match", callback=check_text, help="Erase conversations containing this text (exact).")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Conversations (or memory rows) per transaction.",
)
@deleting_options(listing="Also list the conversation ids and namespace/key pairs that go.")
@audited("erase", hashed=("user_id", "match"))
def erase(
    entry: AuditEntry,
    user_id: str | None,
    match: str | None,
    batch_size: int,
    dry_run: bool,
    yes: bool,
    verbose: bool,
) -> None:
    """Erase everything held about a subject.

    Deletes the subject's conversations with their messages, and every memory entry whose
    key or value contains the user id / match text.

    Give exactly one of --user-id or --match; preview with --dry-run -v. Conversations go in
    batches, each one transaction, messages first. Running it again deletes nothing and still
    records the run in the audit log.
    """
    if (user_id is None) == (match is None):
        raise click.UsageError("give exactly one of --user-id or --match")
    subject = Subject(user_id=user_id, match=match)
    settings, engine, memory = state.settings(), state.engine(), state.memory()
    prefix = settings.table_prefix
    where = conversations_where(prefix, subject)
    driver, _ = serving_driver(memory, "default")
    with engine.connect() as conn:
        counts = count_conversations(conn, prefix, where)
    if isinstance(driver, SqlMemory):
        with driver.engine.connect() as conn:
            memory_total = count_memory(conn, driver.prefix, subject.text)
        scanned: list[tuple[str, str]] = []
    else:
        scanned = _matched_pairs(memory, subject.text)
        memory_total = len(scanned)
    label = "user id" if user_id is not None else "match"
    click.echo(f"subject: {label} {subject.text!r} (audit log: {subject_hash(subject.text)})")
    summary = (
        f"{plural(counts.conversations, 'conversation')}, {plural(counts.messages, 'message')} "
        f"and {plural(memory_total, 'memory entry')}"
    )
    entry.counts = {"conversations": 0, "messages": 0, "memory": 0}
    if dry_run:
        entry.counts.update(conversations=counts.conversations, messages=counts.messages, memory=memory_total)
        click.echo(f"would delete {summary} (dry run: nothing deleted)")
        if verbose:
            with engine.connect() as conn:
                for conversation_id, _ in iter_conversation_ids(conn, prefix, where):
                    click.echo(f"  conversation {conversation_id}")
            # Only the SQL driver was counted without being read; the others were scanned above.
            listed = _matched_pairs(memory, subject.text) if isinstance(driver, SqlMemory) else scanned
            for namespace, key in listed:
                click.echo(f"  memory {namespace}/{key}")
        return
    nothing = counts.conversations == 0 and memory_total == 0
    confirm_deletion(f"Delete {summary}?", yes, nothing_to_delete=nothing)
    batches = delete_in_batches(engine, prefix, where, batch_size=batch_size)
    conversations, messages, _ = run_batches(batches, counts.conversations, entry, verbose, "erasing")
    if isinstance(driver, SqlMemory):
        for batch in delete_memory(driver.engine, driver.prefix, subject.text, batch_size):
            entry.add("memory", len(batch.entries))
            if verbose:
                for namespace, key in batch.entries:
                    click.echo(f"  deleted memory {namespace}/{key}")
    else:
        for namespace, key in scanned:
            driver.forget(key, namespace)
            entry.add("memory")
            if verbose:
                click.echo(f"  deleted memory {namespace}/{key}")
    click.echo(
        f"deleted {plural(conversations, 'conversation')}, {plural(messages, 'message')} "
        f"and {plural(entry.counts['memory'], 'memory entry')}"
    )
