"""``export | erase``: subject access and erasure.

A subject is ``--user-id`` (their conversations, their whole subject namespace, and entries
elsewhere that mention the id as a whole token), ``--conversation`` (export only: one
conversation, and entries containing its id) or ``--match`` (conversations whose title, user
id, metadata or any message contains the text, and entries containing it). Matching is exact
and case-sensitive on every database: run once per spelling. Expired-but-unswept entries are
included on every driver.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click

from clawmem import operations
from clawmem.cli import current_site
from clawmem.cli.audit import AuditEntry, audited, running_audit_key, subject_hash
from clawmem.cli.common import batch_progress, check_text, confirm_deletion, deleting_options, plural, shown
from clawmem.cli.worker import cancel_queued_turns
from clawmem.subjects import Subject


def _subject(user_id: str | None, conversation: str | None, match: str | None) -> Subject:
    if [user_id, conversation, match].count(None) != 2:
        raise click.UsageError("give exactly one of --user-id, --conversation or --match")
    return Subject(user_id=user_id, conversation_id=conversation, match=match)


# -- export -----------------------------------------------------------------------------------


def _export_to_file(path: Path, force: bool, subject: Subject, exported: operations.Exported) -> None:
    # Written to a private temporary file beside the target and moved into place at the end,
    # so a failed export never leaves a partial document, and the file is never world-readable.
    if path.exists() and not force:
        raise click.ClickException(f"{path} already exists; pass --force to replace it")
    directory = path.resolve().parent
    descriptor, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            operations.export_subject(current_site(), subject, out, exported)
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


@click.command("export")
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
    memory entry that concerns the subject: for --user-id, the whole subject namespace
    (CLAW_SUBJECT_NAMESPACE) and entries elsewhere that mention the id as a whole token.
    Expired-but-unswept entries are included.

    Give exactly one of --user-id, --conversation, --match. The run is recorded in the audit
    log with the subject hashed.
    """
    subject = _subject(user_id, conversation, match)
    site = current_site()
    if subject.conversation_id is not None and site.conversations.get(subject.conversation_id) is None:
        raise click.ClickException(f"no conversation with id {subject.conversation_id!r}")
    exported = operations.Exported()
    try:
        if output is None:
            operations.export_subject(site, subject, sys.stdout, exported)
            return
        _export_to_file(output, force, subject, exported)
    finally:
        entry.counts = exported.counts()
    click.echo(
        f"wrote {output}: {plural(exported.conversations, 'conversation')}, "
        f"{plural(exported.messages, 'message')}, {plural(exported.memory, 'memory entry')}",
        err=True,
    )
    if exported.unreadable:
        click.echo(
            f"{plural(exported.unreadable, 'row')} could not be read whole (another program wrote them): "
            'exported as stored and listed under "unreadable"',
            err=True,
        )


# -- erase ------------------------------------------------------------------------------------


@click.command("erase")
@click.option("--user-id", callback=check_text, help="Erase everything held about this user id (exact).")
@click.option(
    "--match", callback=check_text, help="Erase everything containing this text (exact, case-sensitive)."
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Conversations per transaction.",
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

    Deletes exactly what export would return: the subject's conversations with their
    messages, and every memory entry that concerns them (for --user-id, the whole subject
    namespace and whole-token mentions of the id elsewhere), expired ones included.

    Give exactly one of --user-id or --match; preview with --dry-run -v. Conversations go in
    batches, each one transaction, messages first. Running it again deletes nothing and still
    records the run in the audit log.
    """
    if (user_id is None) == (match is None):
        raise click.UsageError("give exactly one of --user-id or --match")
    subject = Subject(user_id=user_id, match=match)
    site = current_site()
    preview = operations.erase_subject(site, subject, dry_run=True)
    label = "user id" if user_id is not None else "match"
    # Never the subject itself: this output ends up in cron logs. The audit-hash command gives
    # the same hash for a subject on this install.
    click.echo(f"subject: {label} {subject_hash(subject.text, running_audit_key())} (as in the audit log)")
    summary = (
        f"{plural(preview.conversations, 'conversation')}, {plural(preview.messages, 'message')} "
        f"and {plural(len(preview.entries), 'memory entry')}"
    )
    entry.counts = {"conversations": 0, "messages": 0, "memory": 0}
    if dry_run:
        entry.counts = preview.counts()
        click.echo(f"would delete {summary} (dry run: nothing deleted)")
        if user_id is not None:
            cancel_queued_turns(site, user_id, dry_run=True)
        if verbose:
            for conversation_id in operations.subject_conversation_ids(site, subject):
                click.echo(f"  conversation {shown(conversation_id)}")
            for namespace, key in preview.entries:
                click.echo(f"  memory {shown(namespace)}/{shown(key)}")
        return
    confirm_deletion(f"Delete {summary}?", yes, nothing_to_delete=preview.nothing)
    if user_id is not None:  # before the conversations go, so no queued turn brings one back
        cancel_queued_turns(site, user_id, dry_run=False)
    with batch_progress(preview.conversations, entry, verbose, "erasing") as on_batch:
        done = operations.erase_subject(site, subject, batch_size, on_batch=on_batch)
    entry.counts = done.counts()
    if verbose:
        for namespace, key in done.entries:
            click.echo(f"  deleted memory {shown(namespace)}/{shown(key)}")
    click.echo(
        f"deleted {plural(done.conversations, 'conversation')}, {plural(done.messages, 'message')} "
        f"and {plural(len(done.entries), 'memory entry')}"
    )


# -- audit-hash -------------------------------------------------------------------------------


@click.command("audit-hash")
@click.argument("text", required=False)
def audit_hash(text: str | None) -> None:
    """Print the hash the audit log holds for TEXT on this install.

    The audit log never holds a subject (user id, match text, key, namespace), only its keyed
    hash, so a line cannot be traced back without this install's audit key. To find a
    subject's lines: grep "$(clawmem audit-hash cust-1001)" instance/audit.log. Without TEXT,
    one line is read from stdin, which keeps the subject out of the shell's history.
    """
    if text is None:
        text = sys.stdin.readline().rstrip("\r\n")
    if not text:
        raise click.UsageError("give the TEXT to hash, as an argument or one line on stdin")
    try:
        key = running_audit_key()
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read the audit key: {exc}") from None
    click.echo(subject_hash(text, key))


COMMANDS = [export, erase, audit_hash]
