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
import shutil
import sys
import tempfile
from pathlib import Path

import click

from clawmem.cli import current_site
from clawmem.cli.audit import (
    AUDIT_KEY_FILE,
    AuditEntry,
    audited,
    existing_audit_key,
    running_audit_key,
    subject_hash,
)
from clawmem.cli.common import batch_progress, check_text, confirm_deletion, deleting_options, plural, shown
from clawmem.cli.worker import ERASE_WAIT_SECONDS, settle_queued_turns
from clawmem.encryption.ciphers import cipher_for, keystore_of
from clawmem.errors import KeyFileError
from clawmem.privacy import erasure
from clawmem.privacy.subjects import Subject
from clawmem.sites.site import Site


def _subject(user_id: str | None, conversation: str | None, match: str | None) -> Subject:
    if [user_id, conversation, match].count(None) != 2:
        raise click.UsageError("give exactly one of --user-id, --conversation or --match")
    return Subject(user_id=user_id, conversation_id=conversation, match=match)


# -- export -----------------------------------------------------------------------------------


def _export_to_file(path: Path, force: bool, subject: Subject, exported: erasure.Exported) -> None:
    # Written to a private temporary file beside the target and moved into place at the end,
    # so a failed export never leaves a partial document, and the file is never world-readable.
    if path.exists() and not force:
        raise click.ClickException(f"{path} already exists; pass --force to replace it")
    directory = path.resolve().parent
    descriptor, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            erasure.export_subject(current_site(), subject, out, exported)
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


def _export_to_stdout(site: Site, subject: Subject, exported: erasure.Exported) -> None:
    # Spooled to an unnamed private file first, so a failed export prints nothing rather than
    # a truncated document, and a long one is never held in memory.
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
        erasure.export_subject(site, subject, spool, exported)
        spool.seek(0)
        shutil.copyfileobj(spool, sys.stdout)
    sys.stdout.flush()


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
@audited("export", hashed=("user_id", "match"), reads=lambda params: True)
def export(
    entry: AuditEntry,
    user_id: str | None,
    conversation: str | None,
    match: str | None,
    output: Path | None,
    force: bool,
) -> None:
    """Export everything held about a subject, as JSON.

    Subject access: every conversation (with all its messages, tool rows included), for
    --user-id the whole subject namespace (CLAW_SUBJECT_NAMESPACE), and under "mentions" the
    entries elsewhere that mention the subject (the id as a whole token), each with the matched
    text. An id of only digits or shorter than 6 characters is never matched as a mention.
    Expired-but-unswept entries are included. Only reads: a missing database is an error, and
    nothing is created.

    Give exactly one of --user-id, --conversation, --match. The run is recorded in the audit
    log with the subject hashed.
    """
    subject = _subject(user_id, conversation, match)
    site = current_site()
    if subject.conversation_id is not None and site.conversations.get(subject.conversation_id) is None:
        raise click.ClickException(f"no conversation with id {subject.conversation_id!r}")
    exported = erasure.Exported()
    try:
        if output is None:
            _export_to_stdout(site, subject, exported)
        else:
            _export_to_file(output, force, subject, exported)
    finally:
        entry.counts = exported.counts()
    click.echo(
        f"wrote {output or 'stdout'}: {plural(exported.conversations, 'conversation')}, "
        f"{plural(exported.messages, 'message')}, {plural(exported.memory, 'memory entry')} of the subject "
        f"namespace and {plural(exported.mentions, 'mention')} elsewhere",
        err=True,
    )
    if exported.not_searched is not None:
        click.echo(
            f"mentions of this user id in other namespaces were not searched: {exported.not_searched}; "
            "export --match TEXT with a text only this subject has finds them",
            err=True,
        )
    if exported.unreadable:
        click.echo(
            f"{plural(exported.unreadable, 'row')} could not be read whole (another program wrote them): "
            'exported as stored and listed under "unreadable"',
            err=True,
        )


# -- erase ------------------------------------------------------------------------------------


def _mention_lines(plan: erasure.SubjectPlan, deleting: bool) -> list[str]:
    """Return what the operator must know about mentions: why they were not searched, or how
    many are listed and whether they go."""
    if not plan.mentions_searched:
        return [
            f"mentions of this user id in other namespaces were not searched: {plan.not_searched}, so it "
            "cannot be told apart from ordinary text. To find entries that name this subject, preview "
            "`erase --match TEXT --dry-run` (or `export --match TEXT`) with a text only they have, such "
            "as their e-mail address, and add --mentions to delete what it lists"
        ]
    if not plan.mentions:
        return []
    count = plural(len(plan.mentions), "mention")
    if deleting:
        return [f"{count} of the subject in other namespaces go too (--mentions)"]
    return [f"{count} of the subject in other namespaces are kept; add --mentions to delete them"]


def _list_mentions(plan: erasure.SubjectPlan) -> None:
    for mention in plan.mentions:
        click.echo(
            f"  mention {shown(mention.namespace)}/{shown(mention.key)} "
            f"({mention.where}): {shown(mention.matched)}"
        )


def _shown_subject(label: str, subject: Subject, dry_run: bool) -> str:
    # Never the subject itself: this output ends up in cron logs. The audit-hash command gives
    # the same hash for a subject on this install.
    key = existing_audit_key() if dry_run else running_audit_key()
    if key is None:
        return f"subject: {label} (no hash shown: the install has no audit key yet, and a dry run makes none)"
    return f"subject: {label} {subject_hash(subject.text, key)} (as in the audit log)"


@click.command("erase")
@click.option("--user-id", callback=check_text, help="Erase everything held about this user id (exact).")
@click.option(
    "--match", callback=check_text, help="Erase everything containing this text (exact, case-sensitive)."
)
@click.option(
    "--mentions",
    is_flag=True,
    help="Also delete the entries in other namespaces that mention the subject (a dry run lists them).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Conversations per transaction.",
)
@click.option(
    "--wait",
    type=click.IntRange(0, 3600),
    default=ERASE_WAIT_SECONDS,
    show_default=True,
    help="Seconds to wait for the subject's running background turns to finish before deleting.",
)
@deleting_options(listing="Also list the conversation ids and namespace/key pairs that go.")
@audited("erase", hashed=("user_id", "match"))
def erase(
    entry: AuditEntry,
    user_id: str | None,
    match: str | None,
    mentions: bool,
    batch_size: int,
    wait: int,
    dry_run: bool,
    yes: bool,
    verbose: bool,
) -> None:
    """Erase everything held about a subject.

    Deletes the subject's conversations with their messages and, for --user-id, every entry
    of their subject namespace (CLAW_SUBJECT_NAMESPACE), expired ones included. Entries in
    other namespaces that mention the subject (the id as a whole token, or the --match text)
    are listed, with the matched text, and deleted only with --mentions. An id of only digits
    or shorter than 6 characters is never matched as a mention.

    Give exactly one of --user-id or --match; preview with --dry-run (-v lists every row).
    Conversations go in batches, each one transaction, messages first; the audit log gets a
    line before the first batch, one per batch and one at the end. Running it again deletes
    nothing and still records the run.

    For --user-id, the subject's queued background turns are cancelled first, and erase waits
    (up to --wait seconds) for their running ones to finish; if one is still running then, it
    stops before deleting anything, naming the jobs.
    """
    if (user_id is None) == (match is None):
        raise click.UsageError("give exactly one of --user-id or --match")
    subject = Subject(user_id=user_id, match=match)
    site = current_site()
    plan = erasure.subject_plan(site, subject)
    click.echo(_shown_subject("user id" if user_id is not None else "match", subject, dry_run))
    memory = len(plan.entries) + (len(plan.mentions) if mentions else 0)
    summary = (
        f"{plural(plan.conversations, 'conversation')}, {plural(plan.messages, 'message')} "
        f"and {plural(memory, 'memory entry')}"
    )
    plan_counts = plan.counts() | {"memory": memory, "mentions_kept": 0 if mentions else len(plan.mentions)}
    keyed = user_id is not None and keystore_of(cipher_for(site.settings)) is not None
    if keyed:  # the key store's part of the plan: the subject's data key, deleted last
        plan_counts["subject_keys"] = erasure.erase_subject_key(site, subject, dry_run=True)
    entry.counts = {"conversations": 0, "messages": 0}
    if dry_run:
        entry.counts = plan_counts
        click.echo(f"would delete {summary} (dry run: nothing deleted)")
        if keyed:
            click.echo(_key_line(plan_counts["subject_keys"], dry_run=True))
        if user_id is not None:
            settle_queued_turns(site, user_id, dry_run=True, wait_seconds=wait)
        for line in _mention_lines(plan, mentions):
            click.echo(line)
        if verbose:
            for conversation_id in erasure.subject_conversation_ids(site, subject):
                click.echo(f"  conversation {shown(conversation_id)}")
            for namespace, key in plan.entries:
                click.echo(f"  memory {shown(namespace)}/{shown(key)}")
        _list_mentions(plan)
        return
    for line in _mention_lines(plan, mentions):
        click.echo(line)
    if mentions:
        _list_mentions(plan)
    nothing = plan.conversations == 0 and memory == 0 and not plan_counts.get("subject_keys")
    confirm_deletion(f"Delete {summary}?", yes, nothing_to_delete=nothing)
    if user_id is not None:  # before the conversations go, so no queued or running turn brings one back
        settle_queued_turns(site, user_id, dry_run=False, wait_seconds=wait)
    previous = entry.start(plan_counts)
    if previous is not None:
        click.echo(previous.sentence())
    with batch_progress(plan.conversations, entry, verbose, "erasing") as on_batch:
        done = erasure.erase_subject(
            site, subject, batch_size, on_batch=on_batch, mentions=mentions, plan=plan
        )
    entry.counts = done.counts() | {"mentions_kept": done.mentions_left}
    if keyed:
        entry.counts["subject_keys"] = done.subject_keys
    if verbose:
        for namespace, key in done.entries:
            click.echo(f"  deleted memory {shown(namespace)}/{shown(key)}")
    kept = f"; kept {plural(done.mentions_left, 'mention')} in other namespaces" if done.mentions_left else ""
    click.echo(
        f"deleted {plural(done.conversations, 'conversation')}, {plural(done.messages, 'message')} "
        f"and {plural(len(done.entries), 'memory entry')}{kept}"
    )
    if keyed:
        click.echo(_key_line(done.subject_keys, dry_run=False))


def _key_line(keys: int, dry_run: bool) -> str:
    if not keys:
        return "the key store (CLAW_KEYSTORE_URL) holds no data key of this subject"
    if dry_run:
        return "would delete the subject's data key from the key store (CLAW_KEYSTORE_URL), last"
    return (
        "deleted the subject's data key from the key store (CLAW_KEYSTORE_URL): their rows in any older "
        "copy of the database can no longer be read"
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
        key = existing_audit_key()
    except KeyFileError as exc:
        raise click.ClickException(f"cannot read the audit key: {exc}") from None
    if key is None:
        raise click.ClickException(
            f"no audit key at {current_site().audit_path.parent / AUDIT_KEY_FILE}: no command that deletes "
            "has run on this install yet (set CLAW_INSTANCE_PATH to the instance folder of the install)"
        )
    click.echo(subject_hash(text, key))


COMMANDS = [export, erase, audit_hash]
