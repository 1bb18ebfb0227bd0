"""``forget | flush | sweep | prune``: retention and removal of data.

Every deleting command previews with ``--dry-run``, asks before deleting (``--yes`` skips the
question and is required without a terminal), prints what it deleted and appends one line to
the audit log. Commands touch only the tables of the configured ``CLAW_TABLE_PREFIX``.
"""

from __future__ import annotations

from typing import Any

import click

from clawmem.cli import current_site
from clawmem.cli.audit import AuditEntry, audited
from clawmem.cli.common import (
    Window,
    WindowType,
    batch_progress,
    check_key,
    check_namespace,
    checked_by,
    confirm_deletion,
    deleting_options,
    format_moment,
    plural,
    shown,
)
from clawmem.errors import InvalidNamespace
from clawmem.rules import validate_namespace
from clawmem.sites import operations
from clawmem.sql.conversations import ORDER_COLUMNS
from clawmem.sql.retention import parse_window
from clawmem.turn.messages import validate_conversation_id

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


@click.command("forget")
@click.argument(
    "key",
    required=False,
    callback=check_key,
)
@click.option(
    "--namespace",
    "-n",
    default="default",
    show_default=True,
    callback=check_namespace,
    help="The namespace of KEY.",
)
@click.option(
    "--conversation",
    callback=checked_by(validate_conversation_id),
    help="Delete this conversation and its messages instead of a key.",
)
@deleting_options(listing=None)
@audited("forget", hashed=("key", "namespace"), memory_only=lambda params: params.get("conversation") is None)
def forget(
    entry: AuditEntry, key: str | None, namespace: str, conversation: str | None, dry_run: bool, yes: bool
) -> None:
    """Delete one key, or one conversation with its messages.

    `forget KEY [--namespace NS]` deletes KEY (expired or not) from NS. `forget --conversation
    ID` deletes that conversation and its messages in one transaction. Something that does not
    exist is not an error: the command says so and exits 0.
    """
    if (key is None) == (conversation is None):
        raise click.UsageError("give a KEY or --conversation ID (not both)")
    site = current_site()
    if conversation is not None:
        preview = operations.forget_conversation(site, conversation, dry_run=True)
        name = f"conversation {conversation}"
        what = f"{name} and its {plural(preview.messages, 'message')}"
        counts = {"conversations": preview.conversations, "messages": preview.messages}
    else:
        preview = operations.forget_key(site, key, namespace, dry_run=True)
        name = what = f"key {key!r} in namespace {namespace!r}"
        counts = {"keys": len(preview.entries)}
    entry.counts = dict.fromkeys(counts, 0)
    if dry_run:
        entry.counts = counts
        click.echo(
            f"would delete {what} (dry run: nothing deleted)"
            if not preview.nothing
            else f"nothing to delete: no {name}"
        )
        return
    confirm_deletion(f"Delete {what}?", yes, nothing_to_delete=preview.nothing)
    if preview.nothing:
        click.echo(f"nothing to delete: no {name}")
        return
    entry.start(counts)
    if conversation is not None:
        done = operations.forget_conversation(site, conversation)
        entry.counts = {"conversations": done.conversations, "messages": done.messages}
    else:
        done = operations.forget_key(site, key, namespace)
        entry.counts = {"keys": len(done.entries)}
    click.echo(f"deleted {what}")


# -- flush ------------------------------------------------------------------------------------


@click.command("flush")
@click.option("--namespace", "-n", required=True, help="The namespace to empty.")
@deleting_options(listing="Also list the keys that go.")
@audited("flush", hashed=("namespace",), memory_only=lambda params: True)
def flush(entry: AuditEntry, namespace: str, dry_run: bool, yes: bool, verbose: bool) -> None:
    """Delete every entry of a key/value namespace.

    Expired entries go too. A namespace that breaks today's naming rule is accepted only when
    rows are stored under it (another program wrote them); quote it for the shell.
    Conversations are not in namespaces of the key/value store: delete them with `forget
    --conversation`, `prune` or `erase`.
    """
    site = current_site()
    try:
        validate_namespace(namespace)
        breaks_rule = None
    except InvalidNamespace as exc:
        breaks_rule = exc
    try:
        preview = operations.flush_namespace(site, namespace, dry_run=True)
    except ValueError as exc:  # text no backend can store, such as a NUL
        raise click.BadParameter(str(exc), param_hint="'--namespace'") from None
    if breaks_rule is not None:
        if not preview.entries:
            raise click.BadParameter(str(breaks_rule), param_hint="'--namespace'")
        click.echo(
            f"namespace {namespace!r} breaks today's naming rule ({breaks_rule}); another program "
            "wrote its rows, which are deleted as stored"
        )
    total = len(preview.entries)
    entry.counts = {"keys": 0}
    if dry_run:
        entry.counts = {"keys": total}
        click.echo(
            f"would delete {plural(total, 'entry')} of namespace {namespace!r} (dry run: nothing deleted)"
        )
        if verbose:
            for _, key in preview.entries:
                click.echo(f"  {shown(namespace)}/{shown(key)}")
        return
    confirm_deletion(f"Delete {plural(total, 'entry')} of namespace {namespace!r}?", yes, total == 0)
    entry.start({"keys": total})
    done = operations.flush_namespace(site, namespace)
    entry.counts = {"keys": len(done.entries)}
    click.echo(f"deleted {plural(len(done.entries), 'entry')} of namespace {namespace!r}")


# -- sweep ------------------------------------------------------------------------------------


@click.command("sweep")
@deleting_options(listing=None)
@audited("sweep", memory_only=lambda params: True)
def sweep(entry: AuditEntry, dry_run: bool, yes: bool) -> None:
    """Delete expired key/value entries in every namespace.

    Works on every driver (Redis also expires keys itself). Prints the count per namespace.
    Live entries are never touched.
    """
    site = current_site()
    expired = operations.sweep(site, dry_run=True)
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
    entry.start({"expired": total})
    deleted = operations.sweep(site) if total else {}
    entry.counts = {"expired": sum(deleted.values())}
    _print_namespace_counts(deleted, "deleted")
    click.echo(f"deleted {plural(sum(deleted.values()), 'expired entry')}")


def _print_namespace_counts(counts: dict[str, int], verb: str) -> None:
    for namespace in sorted(counts):
        click.echo(f"  {shown(namespace)}: {verb} {counts[namespace]}")


# -- prune ------------------------------------------------------------------------------------


def _window(option: Window | None) -> tuple[Window, str]:
    if option is not None:
        return option, "--older-than"
    days = current_site().settings.retention_days
    if days is None:
        raise click.UsageError(
            "no retention window: pass --older-than (for example 90d) or set CLAW_RETENTION_DAYS"
        )
    try:
        return Window(f"{days}d", parse_window(f"{days}d")), "CLAW_RETENTION_DAYS"
    except ValueError as exc:
        raise click.UsageError(f"CLAW_RETENTION_DAYS: {exc}") from None


@click.command("prune")
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
    site = current_site()
    cutoff = operations.retention_cutoff(site, window.delta)
    entry.arguments.update(older_than=window.text, window_from=source, cutoff=cutoff.isoformat())
    click.echo(
        f"pruning conversations of prefix {site.prefix!r} whose {by} is before "
        f"{cutoff:%Y-%m-%d %H:%M:%S} UTC (older than {window}, from {source})"
    )
    preview = operations.prune(site, window.delta, by, dry_run=True)
    summary = f"{plural(preview.conversations, 'conversation')} and {plural(preview.messages, 'message')}"
    entry.counts = {"conversations": 0, "messages": 0}
    if dry_run:
        entry.counts = {"conversations": preview.conversations, "messages": preview.messages}
        click.echo(f"would delete {summary} (dry run: nothing deleted)")
        if verbose:
            for conversation_id, moment in operations.conversations_to_prune(site, window.delta, by):
                click.echo(f"  {shown(conversation_id)}  {by} {format_moment(moment)}")
        return
    confirm_deletion(f"Delete {summary}?", yes, nothing_to_delete=preview.conversations == 0)
    previous = entry.start({"conversations": preview.conversations, "messages": preview.messages})
    if previous is not None:
        click.echo(previous.sentence())
    with batch_progress(preview.conversations, entry, verbose, "pruning") as on_batch:
        done = operations.prune(site, window.delta, by, batch_size, on_batch=on_batch)
    click.echo(
        f"deleted {plural(done.conversations, 'conversation')} and {plural(done.messages, 'message')} "
        f"in {plural(done.batches, 'batch')}"
    )


COMMANDS = [forget, flush, sweep, prune]
