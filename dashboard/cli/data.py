"""``flask claw forget | flush | sweep | prune``: retention and removal of data.

Every deleting command previews with ``--dry-run``, asks before deleting (``--yes`` skips the
question and is required without a terminal), prints what it deleted and appends one line to
the audit log. Commands touch only the tables of the configured ``CLAW_TABLE_PREFIX``.
"""

from __future__ import annotations

from typing import Any

import click
import sqlalchemy as sa

from clawmem.clock import utc_datetime
from clawmem.memory.base import BaseMemory
from clawmem.memory.conversations import SqlConversationMemory
from clawmem.memory.sql import SqlMemory
from clawmem.memory.wrappers import serving_driver, sweep_any
from clawmem.sql.conversations import ORDER_COLUMNS, ConversationStore
from clawmem.sql.kv import MemoryStore
from clawmem.sql.retention import (
    count_conversations,
    delete_in_batches,
    iter_conversation_ids,
    parse_window,
)
from clawmem.sql.retention import older_than as older_than_condition
from clawmem.sql.schema import tables
from dashboard import state
from dashboard.cli import claw
from dashboard.cli.audit import AuditEntry, audited
from dashboard.cli.common import (
    Window,
    WindowType,
    check_key,
    check_namespace,
    confirm_deletion,
    deleting_options,
    plural,
    run_batches,
)

LIST_IDS = "Also list the ids of the conversations that go."


def _batch_size_option(function: Any) -> Any:
    return click.option(
        "--batch-size",
        type=click.IntRange(1, 100_000),
        default=1000,
        show_default=True,
        help="Conversations per transaction; a killed run loses at most one uncommitted batch.",
    )(function)


# -- forget -----------------------------------------------------------------------------------


@claw.command("forget")
@click.argument("key", callback=check_key)
@click.option(
    "--namespace",
    "-n",
    default="default",
    show_default=True,
    callback=check_namespace,
    help="The namespace of KEY. In 'conversations', KEY is a conversation id.",
)
@deleting_options(listing=None)
@audited("forget", hashed=("key",))
def forget(entry: AuditEntry, key: str, namespace: str, dry_run: bool, yes: bool) -> None:
    """Delete one key (or one conversation and its messages).

    Deletes KEY from NAMESPACE; in 'conversations', KEY is a conversation id and its messages
    go with it, in one transaction. A key that does not exist is not an error: the command
    says so and exits 0.
    """
    memory = state.memory()
    driver, _ = serving_driver(memory, namespace)
    if isinstance(driver, SqlConversationMemory):
        found = ConversationStore(driver.engine, driver.prefix).get(key)
        exists = found is not None and found.namespace == namespace
        messages = found.message_count if found is not None and exists else 0
        name = f"conversation {key} in namespace {namespace!r}"
        what = f"{name} and its {plural(messages, 'message')}"
        counts = {"conversations": int(exists), "messages": messages}
    else:
        if isinstance(driver, SqlMemory):
            exists = MemoryStore(driver.engine, driver.prefix).entry(namespace, key) is not None
        else:
            exists = driver.has(key, namespace)
        name = what = f"key {key!r} in namespace {namespace!r}"
        counts = {"keys": int(exists)}
    entry.counts = dict.fromkeys(counts, 0)
    if dry_run:
        entry.counts = counts
        click.echo(
            f"would delete {what} (dry run: nothing deleted)" if exists else f"nothing to delete: no {name}"
        )
        return
    confirm_deletion(f"Delete {what}?", yes, nothing_to_delete=not exists)
    if not exists:
        click.echo(f"nothing to delete: no {name}")
        return
    memory.forget(key, namespace)
    entry.counts = counts
    click.echo(f"deleted {what}")


# -- flush ------------------------------------------------------------------------------------


@claw.command("flush")
@click.option("--namespace", "-n", required=True, callback=check_namespace, help="The namespace to empty.")
@deleting_options(listing="Also list the keys (or conversation ids) that go.")
@audited("flush")
def flush(entry: AuditEntry, namespace: str, dry_run: bool, yes: bool, verbose: bool) -> None:
    """Delete every entry of a namespace.

    Expired entries go too. In 'conversations' this deletes every conversation with its
    messages, in batches of 1000, each batch one transaction.
    """
    memory = state.memory()
    driver, _ = serving_driver(memory, namespace)
    if isinstance(driver, SqlConversationMemory):
        _flush_conversations(entry, driver, namespace, dry_run, yes, verbose)
        return
    if isinstance(driver, SqlMemory):
        total, scanned = MemoryStore(driver.engine, driver.prefix).count(namespace), None
    else:
        scanned = list(driver.all(namespace))
        total = len(scanned)
    entry.counts = {"keys": 0}
    if dry_run:
        entry.counts = {"keys": total}
        click.echo(
            f"would delete {plural(total, 'entry')} of namespace {namespace!r} (dry run: nothing deleted)"
        )
        if verbose:
            for key in _sql_keys(driver, namespace) if scanned is None else scanned:
                click.echo(f"  {namespace}/{key}")
        return
    confirm_deletion(f"Delete {plural(total, 'entry')} of namespace {namespace!r}?", yes, total == 0)
    if isinstance(driver, BaseMemory):
        removed = driver.purge(namespace)
    else:  # a custom driver reports no count: what the preview counted is what went
        memory.flush(namespace)
        removed = total
    entry.counts = {"keys": removed}
    click.echo(f"deleted {plural(removed, 'entry')} of namespace {namespace!r}")


def _sql_keys(driver: SqlMemory, namespace: str) -> list[str]:
    store, keys, cursor = MemoryStore(driver.engine, driver.prefix), [], None
    while True:
        page = store.entries(namespace, limit=500, cursor=cursor)
        keys.extend(row.key for row in page.items)
        if page.next_cursor is None:
            return keys
        cursor = page.next_cursor


def _flush_conversations(
    entry: AuditEntry, driver: SqlConversationMemory, namespace: str, dry_run: bool, yes: bool, verbose: bool
) -> None:
    where = tables(driver.prefix).conversations.c.namespace == namespace
    with driver.engine.connect() as conn:
        counts = count_conversations(conn, driver.prefix, where)
    entry.counts = {"conversations": 0, "messages": 0}
    summary = f"{plural(counts.conversations, 'conversation')} and {plural(counts.messages, 'message')}"
    if dry_run:
        entry.counts = {"conversations": counts.conversations, "messages": counts.messages}
        click.echo(f"would delete {summary} of namespace {namespace!r} (dry run: nothing deleted)")
        if verbose:
            _list_conversations(driver.engine, driver.prefix, where, "created_at")
        return
    confirm_deletion(f"Delete {summary} of namespace {namespace!r}?", yes, counts.conversations == 0)
    batches = delete_in_batches(driver.engine, driver.prefix, where)
    done, messages, _ = run_batches(batches, counts.conversations, entry, verbose, "flushing")
    click.echo(
        f"deleted {plural(done, 'conversation')} and {plural(messages, 'message')} of namespace {namespace!r}"
    )


def _list_conversations(engine: sa.engine.Engine, prefix: str, where: Any, by: str) -> None:
    with engine.connect() as conn:
        for conversation_id, moment in iter_conversation_ids(conn, prefix, where, by):
            click.echo(f"  {conversation_id}  {by} {moment:%Y-%m-%d %H:%M:%S}")


# -- sweep ------------------------------------------------------------------------------------


@claw.command("sweep")
@deleting_options(listing=None)
@audited("sweep")
def sweep(entry: AuditEntry, dry_run: bool, yes: bool) -> None:
    """Delete expired key/value entries in every namespace.

    Works on every driver that keeps its own expiry (SQL, file; Redis expires keys itself).
    Prints the count per namespace. Live entries are never touched.
    """
    memory = state.memory()
    expired = sweep_any(memory, dry_run=True)
    total = sum(expired.values())
    entry.counts = {"expired": 0}
    if dry_run:
        entry.counts = {"expired": total}
        _print_namespace_counts(expired, "would delete")
        click.echo(f"would delete {plural(total, 'expired entry')} (dry run: nothing deleted)")
        return
    confirm_deletion(
        f"Delete {plural(total, 'expired entry')} in {plural(len(expired), 'namespace')}?",
        yes,
        nothing_to_delete=total == 0,
    )
    deleted = sweep_any(memory, dry_run=False) if total else {}
    entry.counts = {"expired": sum(deleted.values())}
    _print_namespace_counts(deleted, "deleted")
    click.echo(f"deleted {plural(sum(deleted.values()), 'expired entry')}")


def _print_namespace_counts(counts: dict[str, int], verb: str) -> None:
    for namespace in sorted(counts):
        click.echo(f"  {namespace}: {verb} {counts[namespace]}")


# -- prune ------------------------------------------------------------------------------------


def _window(option: Window | None) -> tuple[Window, str]:
    if option is not None:
        return option, "--older-than"
    days = state.settings().retention_days
    if days is None:
        raise click.UsageError(
            "no retention window: pass --older-than (for example 90d) or set CLAW_RETENTION_DAYS"
        )
    try:
        return Window(f"{days}d", parse_window(f"{days}d")), "CLAW_RETENTION_DAYS"
    except ValueError as exc:
        raise click.UsageError(f"CLAW_RETENTION_DAYS: {exc}") from None


@claw.command("prune")
@click.option(
    "--older-than",
    type=WindowType(),
    default=None,
    help="Delete conversations older than this: <N>d or <N>h. Default: CLAW_RETENTION_DAYS.",
)
@click.option(
    "--by",
    type=click.Choice(ORDER_COLUMNS),
    default="created_at",
    show_default=True,
    help="Age by when a conversation started, or by its last activity.",
)
@_batch_size_option
@deleting_options(listing=LIST_IDS)
@audited("prune")
def prune(
    entry: AuditEntry,
    older_than: Window | None,
    by: str,
    batch_size: int,
    dry_run: bool,
    yes: bool,
    verbose: bool,
) -> None:
    """Delete conversations older than a retention window.

    Messages go first and then their conversations, BATCH-SIZE conversations per transaction,
    oldest first, so a run that is killed leaves no orphan messages and the next run finishes
    the job. Safe to schedule: add --yes in cron.
    """
    window, source = _window(older_than)
    settings = state.settings()
    prefix, engine = settings.table_prefix, state.engine()
    cutoff = utc_datetime(state.clock()) - window.delta
    entry.arguments.update(older_than=window.text, window_from=source, cutoff=cutoff.isoformat())
    where = older_than_condition(prefix, by, cutoff)
    with engine.connect() as conn:
        counts = count_conversations(conn, prefix, where)
    click.echo(
        f"pruning conversations of prefix {prefix!r} whose {by} is before {cutoff:%Y-%m-%d %H:%M:%S} UTC "
        f"(older than {window}, from {source})"
    )
    summary = f"{plural(counts.conversations, 'conversation')} and {plural(counts.messages, 'message')}"
    entry.counts = {"conversations": 0, "messages": 0}
    if dry_run:
        entry.counts = {"conversations": counts.conversations, "messages": counts.messages}
        click.echo(f"would delete {summary} (dry run: nothing deleted)")
        if verbose:
            _list_conversations(engine, prefix, where, by)
        return
    confirm_deletion(f"Delete {summary}?", yes, nothing_to_delete=counts.conversations == 0)
    batches = delete_in_batches(engine, prefix, where, order_by=by, batch_size=batch_size)
    done, messages, count = run_batches(batches, counts.conversations, entry, verbose, "pruning")
    click.echo(
        f"deleted {plural(done, 'conversation')} and {plural(messages, 'message')} "
        f"in {plural(count, 'batch')}"
    )
