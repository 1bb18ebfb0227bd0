"""What the deleting commands share: option types, confirmation and progress."""

from __future__ import annotations

import contextlib
import sys
import unicodedata
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import click

from clawmem.cli.audit import AuditEntry, Refused
from clawmem.rules import validate_key, validate_namespace
from clawmem.sql.retention import Batch, parse_window

F = TypeVar("F", bound=Callable[..., Any])


class Window(NamedTuple):
    """A retention window as typed (``90d``) and as a duration."""

    text: str
    delta: timedelta

    def __str__(self) -> str:
        return self.text


class WindowType(click.ParamType):
    """``<N>d`` or ``<N>h`` with N >= 1; anything else is a usage error (exit 2)."""

    name = "window"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Window:
        if isinstance(value, Window):
            return value
        try:
            return Window(str(value).strip(), parse_window(str(value)))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


Callback = Callable[[click.Context, click.Parameter, "str | None"], "str | None"]


def checked_by(rule: Callable[[str], str]) -> Callback:
    """Return a click callback that applies ``rule`` (a validator of the core) to an option's
    value, making its ``ValueError`` a usage error (exit 2); an absent value passes."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return rule(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return check


check_namespace = checked_by(validate_namespace)  # the namespace rule of the memory contract
check_key = checked_by(validate_key)  # the key rule of the memory contract


def check_text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: a subject text must hold something other than whitespace."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty or only whitespace", ctx, param)
    return value


def deleting_options(listing: str | None) -> Callable[[F], F]:
    """Add ``--dry-run`` and ``--yes`` to a deleting command, and ``--verbose`` (help ``listing``)
    when the command can list what goes."""

    def decorate(function: F) -> F:
        if listing is not None:
            function = click.option("-v", "--verbose", is_flag=True, help=listing)(function)
        function = click.option(
            "--yes",
            "-y",
            is_flag=True,
            help="Do not ask for confirmation; required when stdin is not a terminal.",
        )(function)
        return click.option(
            "--dry-run", is_flag=True, help="Print exactly what would be deleted and delete nothing."
        )(function)

    return decorate


def stdin_is_terminal() -> bool:
    """Return whether there is a person at a terminal to answer a confirmation."""
    return sys.stdin is not None and sys.stdin.isatty()


def stdout_is_terminal() -> bool:
    """Return whether output goes to a terminal (progress bar) rather than a log (plain lines)."""
    return sys.stdout is not None and sys.stdout.isatty()


def confirm_deletion(question: str, yes: bool, nothing_to_delete: bool = False) -> None:
    """Return when deleting may go ahead; raise :class:`Refused` or ``click.Abort`` otherwise.

    Without ``--yes`` and without a terminal the run is refused even when there is nothing to
    delete, so an unattended job fails the same way every time until it is given ``--yes``.
    """
    if yes:
        return
    if not stdin_is_terminal():
        raise Refused(
            "refusing to delete without --yes: stdin is not a terminal "
            "(add --yes to run unattended, or --dry-run to preview)"
        )
    if nothing_to_delete:
        return
    click.confirm(question, default=False, abort=True)


def shown(text: object) -> str:
    """Return stored text (a key, a namespace, an id another program may have written) for a
    terminal or a log: control, format and separator characters (an escape sequence, a
    right-to-left override, a newline) are written as ``\\x1b``-style escapes, never sent raw."""
    return "".join(_escape(char) if unicodedata.category(char) in _UNSHOWN else char for char in str(text))


def format_moment(moment: object) -> str:
    """Return a time read from a table as ``2024-05-01 12:03:04``, or ``unreadable time`` for
    what another program stored there that is not one (a zero date, ``'soon'``)."""
    return f"{moment:%Y-%m-%d %H:%M:%S}" if isinstance(moment, datetime) else "unreadable time"


_UNSHOWN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plural(count: int, noun: str) -> str:
    """Return ``"1 conversation"`` / ``"3 conversations"``, ``"2 memory entries"``, ``"2 batches"``."""
    if count == 1:
        return f"{count} {noun}"
    if noun.endswith("ry"):
        return f"{count} {noun[:-1]}ies"
    return f"{count} {noun}es" if noun.endswith(("ch", "sh", "s")) else f"{count} {noun}s"


@contextlib.contextmanager
def batch_progress(
    total: int, entry: AuditEntry, verbose: bool, label: str
) -> Iterator[Callable[[Batch], None]]:
    """Yield the ``on_batch`` callback of a deleting operation: it counts each committed batch
    into ``entry`` and writes its audit line at once (so a killed run's deletions are on
    record), and shows progress.

    A terminal gets a progress bar; anything else one plain line per committed batch.
    """
    bar = click.progressbar(length=total, label=label, file=sys.stdout) if stdout_is_terminal() else None
    done = count = 0

    def report(batch: Batch) -> None:
        nonlocal done, count
        count += 1
        done += batch.conversations
        entry.committed({"conversations": batch.conversations, "messages": batch.messages})
        if bar is not None:
            bar.update(batch.conversations)
        else:
            click.echo(
                f"batch {count}: deleted {plural(batch.conversations, 'conversation')} and "
                f"{plural(batch.messages, 'message')} ({done} of {total})"
            )
        if verbose:
            for conversation_id in batch.conversation_ids:
                click.echo(f"  deleted conversation {shown(conversation_id)}")

    try:
        yield report
    finally:
        if bar is not None:
            bar.render_finish()
