"""The audit log: one JSON line per run of a command that deletes or exports data.

Each line of ``<instance>/audit.log`` (created 0600) holds the UTC time, the command, its
arguments with subject text (user ids, match text, keys, namespaces) replaced by a keyed hash, the
dry-run flag, the counts and the outcome: ``ok``, ``aborted`` (the operator said no), ``refused``
(no terminal and no ``--yes``) or ``error``. It never holds stored content.

The hash is an HMAC-SHA256 under a random key kept beside the log (``<instance>/audit_key``,
0600, made on first use): without the key, a short id such as ``cust-1001`` cannot be found by
trying every candidate; with it, ``audit-hash TEXT`` gives the hash to look for.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import sqlalchemy as sa

from clawmem.cli import current_site
from clawmem.errors import StorageError, redact
from clawmem.sql.engine import describe_error

HASH_HEX_CHARS = 32
HASH_PREFIX = "hmac-sha256:"
AUDIT_KEY_FILE = "audit_key"

F = TypeVar("F", bound=Callable[..., Any])


def subject_hash(text: str, key: bytes) -> str:
    """Return ``hmac-sha256:`` and the first 32 hex digits of the HMAC-SHA256 of ``text`` (UTF-8)
    under ``key``: the same text gives the same hash on one install, and nothing on another."""
    digest = hmac.new(key, text.encode("utf-8", errors="surrogatepass"), hashlib.sha256).hexdigest()
    return HASH_PREFIX + digest[:HASH_HEX_CHARS]


def audit_key(instance_path: str | os.PathLike[str]) -> bytes:
    """Return the install's audit key, ``<instance>/audit_key``, creating it (mode 0600, 32
    random bytes as hex) on first use. Concurrent first runs agree on one key: it is written to
    a private temporary file and linked into place, and a run that loses reads the winner's.
    Raises ``OSError`` when it cannot be read or made, and ``ValueError`` for a damaged file."""
    path = Path(instance_path) / AUDIT_KEY_FILE
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{AUDIT_KEY_FILE}.")
        try:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(32))
            with contextlib.suppress(FileExistsError):
                os.link(temp_name, path)
        finally:
            os.unlink(temp_name)
    key = path.read_text().strip()
    if len(key) < 32:
        raise ValueError(f"{path} holds an audit key shorter than 32 characters; restore it from a backup")
    return key.encode("ascii", errors="replace")


def running_audit_key() -> bytes:
    """Return the audit key of the running command's install."""
    return audit_key(current_site().audit_path.parent)


class Refused(click.ClickException):
    """A deleting command was run without ``--yes`` and without a terminal to ask on (exit 1)."""


@dataclass
class AuditEntry:
    """What one run did; the command body fills ``counts`` as it goes, so a failed run still
    records what it had already deleted."""

    command: str
    arguments: dict[str, Any]
    dry_run: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    outcome: str = "ok"
    error: str | None = None

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to the count ``name``."""
        self.counts[name] = self.counts.get(name, 0) + amount


def audit_line(entry: AuditEntry, moment: datetime) -> str:
    """Return ``entry`` as one JSON line (with the newline) stamped with the aware UTC ``moment``."""
    record = {
        "time": moment.astimezone(UTC).isoformat(timespec="seconds"),
        "command": entry.command,
        "arguments": entry.arguments,
        "dry_run": entry.dry_run,
        "counts": entry.counts,
        "outcome": entry.outcome,
    }
    if entry.error is not None:
        record["error"] = entry.error
    return json.dumps(record, ensure_ascii=False, sort_keys=True, default=str) + "\n"


def open_audit_log(path: Path) -> int:
    """Return a descriptor appending to ``path``, creating it with mode 0600.

    Opened before any work starts, so a run that could not be audited deletes nothing.
    Raises ``OSError`` when the file cannot be opened.
    """
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


def write_line(descriptor: int, line: str) -> None:
    """Append ``line`` in a single write (O_APPEND keeps concurrent runs' lines whole) and sync."""
    os.write(descriptor, line.encode("utf-8"))
    os.fsync(descriptor)


def audit_path() -> Path:
    """Return the running command's audit log, ``<instance>/audit.log``; the instance folder is
    created (mode 0700) when it does not exist yet."""
    path = current_site().audit_path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def describe_failure(exc: BaseException) -> str:
    """Return a one-line, password-free description of ``exc`` for the operator."""
    if isinstance(exc, sa.exc.SQLAlchemyError):
        return redact(f"database error: {describe_error(exc)}")
    if isinstance(exc, OSError) and exc.strerror:
        return redact(f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return redact(text)


# Failures at the command boundary that become one line on stderr and exit 1, never a traceback.
EXPECTED_FAILURES = (sa.exc.SQLAlchemyError, StorageError, OSError, ValueError, RuntimeError)


def one_line_errors(function: F) -> F:
    """Turn expected failures of a command that deletes nothing into a one-line ``Error:``, exit 1."""

    @functools.wraps(function)
    def run(*args: Any, **params: Any) -> Any:
        try:
            return function(*args, **params)
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the entry point stops quietly
        except EXPECTED_FAILURES as exc:
            raise click.ClickException(describe_failure(exc)) from None

    return run  # type: ignore[return-value]


def audited(command: str, *, hashed: Iterable[str] = ()) -> Callable[[F], F]:
    """Wrap a command body ``body(entry, **params)`` so that every run appends one audit line.

    Parameters named in ``hashed`` are logged as :func:`subject_hash` values under the install's
    audit key. Expected failures (database, driver, file system, bad values) become a one-line
    ``Error:`` and exit 1.
    """
    secret = frozenset(hashed)

    def decorate(body: F) -> F:
        @functools.wraps(body)
        def run(**params: Any) -> None:
            try:
                site = current_site()
            except EXPECTED_FAILURES as exc:  # a setting that cannot be used: one line, nothing run
                raise click.ClickException(describe_failure(exc)) from None
            needs_key = any(isinstance(params.get(name), str) for name in secret)
            try:
                key = audit_key(site.audit_path.parent) if needs_key else b""
            except (OSError, ValueError) as exc:
                raise click.ClickException(f"cannot read the audit key: {describe_failure(exc)}") from None
            arguments = {
                name: subject_hash(value, key) if name in secret and isinstance(value, str) else value
                for name, value in params.items()
            }
            entry = AuditEntry(command, arguments, dry_run=bool(params.get("dry_run", False)))
            try:
                descriptor = open_audit_log(audit_path())
            except OSError as exc:
                raise click.ClickException(f"cannot open the audit log: {describe_failure(exc)}") from None
            try:
                body(entry, **params)
            except click.Abort:
                entry.outcome = "aborted"
                raise
            except Refused:
                entry.outcome = "refused"
                raise
            except click.ClickException as exc:
                entry.outcome, entry.error = "error", type(exc).__name__
                raise
            except EXPECTED_FAILURES as exc:
                entry.outcome, entry.error = "error", type(exc).__name__
                if isinstance(exc, BrokenPipeError):
                    raise  # the reader went away (`| head`): the entry point stops quietly
                raise click.ClickException(describe_failure(exc)) from None
            except BaseException as exc:
                entry.outcome, entry.error = "error", type(exc).__name__
                raise
            finally:
                moment = datetime.fromtimestamp(current_site().clock(), UTC)
                try:
                    write_line(descriptor, audit_line(entry, moment))
                except OSError as exc:
                    raise click.ClickException(
                        f"the run finished ({entry.outcome}) but its audit line could not be written: "
                        f"{describe_failure(exc)}"
                    ) from None
                finally:
                    os.close(descriptor)

        return run  # type: ignore[return-value]

    return decorate
