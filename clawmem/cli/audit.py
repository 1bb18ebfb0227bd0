"""The audit log: JSON lines for every run of a command that deletes or exports data.

A run that deletes writes a ``started`` line with its plan (the counts it is about to delete)
before the first batch, one ``batch`` line per committed batch, and a ``finished`` line with the
counts and the outcome: ``ok``, ``aborted`` (the operator said no), ``refused`` (no terminal and
no ``--yes``) or ``error``. A run killed part-way therefore leaves its committed deletions on
record, and the next run of the same command says so. Every line holds the UTC time, the command,
the run's id and its arguments with subject text (user ids, match text, keys, namespaces)
replaced by a keyed hash; never stored content. Lines go to ``<instance>/audit.log`` (0600).

The hash is an HMAC-SHA256 under a random key kept beside the log (``<instance>/audit_key``,
0600, made on first use by a command that deletes): without the key, a short id such as
``cust-1001`` cannot be found by trying every candidate; with it, ``audit-hash TEXT`` gives the
hash to look for. A command that only reads never makes the key (nor the folder): before the
first deletion its subject is logged as ``null``, with ``unhashed`` saying why.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import sqlalchemy as sa

from clawmem.cli import current_site
from clawmem.crypto.keyfile import kept_key
from clawmem.errors import KeyFileError, StorageError, redact
from clawmem.ids import new_id
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
    random bytes as hex) on first use, as :func:`clawmem.crypto.keyfile.kept_key` does. Raises
    :class:`~clawmem.errors.KeyFileError` when it cannot be read or made, or is damaged."""
    key = kept_key(Path(instance_path) / AUDIT_KEY_FILE, "an audit key", "restore it from a backup")
    return key.encode("ascii", errors="replace")


def running_audit_key() -> bytes:
    """Return the audit key of the running command's install (made on first use)."""
    return audit_key(current_site().audit_path.parent)


def existing_audit_key() -> bytes | None:
    """Return the audit key of the running command's install, or ``None`` when none was made
    yet (a command that only reads never makes one). Raises as :func:`audit_key` does."""
    instance = current_site().audit_path.parent
    return audit_key(instance) if (instance / AUDIT_KEY_FILE).exists() else None


class Refused(click.ClickException):
    """A deleting command was run without ``--yes`` and without a terminal to ask on (exit 1)."""


# Arguments that change how a run goes, not what it concerns, and the cutoff a retention window
# gives at each run's moment: runs differing only in these are "the same command" when a run
# looks for an interrupted predecessor.
_HOW_ARGUMENTS = frozenset({"dry_run", "yes", "verbose", "batch_size", "mentions", "cutoff"})


@dataclass
class AuditEntry:
    """What one run did; the command body fills ``counts`` as it goes, so a failed run still
    records what it had already deleted.

    A deleting run calls :meth:`start` with its plan before the first batch and
    :meth:`committed` after each committed batch; each writes its line at once.
    """

    command: str
    arguments: dict[str, Any]
    dry_run: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    outcome: str = "ok"
    error: str | None = None
    run: str = field(default_factory=new_id)
    note: str | None = None  # why the subject is not hashed, when it is not
    write: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False)
    log_path: Path | None = field(default=None, repr=False)
    batches: int = 0

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to the count ``name``."""
        self.counts[name] = self.counts.get(name, 0) + amount

    def record(self, phase: str, **fields: Any) -> dict[str, Any]:
        """Return the line of ``phase`` (without its time) as written to the log."""
        line = {
            "command": self.command,
            "run": self.run,
            "phase": phase,
            "arguments": self.arguments,
            "dry_run": self.dry_run,
        }
        if self.note is not None:
            line["unhashed"] = self.note
        return line | fields

    def start(self, plan: dict[str, int]) -> Interrupted | None:
        """Write the "started" line with ``plan`` (what the run is about to delete), before the
        first deletion, and return the previous run of the same command when it did not finish
        (it is named in the line too). Raises ``OSError`` when the line cannot be written."""
        previous = interrupted_run(self.log_path, self) if self.log_path is not None else None
        fields: dict[str, Any] = {"plan": plan}
        if previous is not None:
            fields["previous_run_interrupted"] = previous.describe()
        self._write(self.record("started", **fields))
        return previous

    def committed(self, batch: dict[str, int]) -> None:
        """Count one committed batch into the run and write its "batch" line at once."""
        self.batches += 1
        for name, amount in batch.items():
            self.add(name, amount)
        self._write(self.record("batch", batch=self.batches, counts=batch, total=dict(self.counts)))

    def finished(self) -> dict[str, Any]:
        """Return the "finished" line: the counts and the outcome."""
        fields: dict[str, Any] = {"counts": self.counts, "outcome": self.outcome}
        if self.error is not None:
            fields["error"] = self.error
        return self.record("finished", **fields)

    def _write(self, line: dict[str, Any]) -> None:
        if self.write is not None:
            self.write(line)


@dataclass(frozen=True)
class Interrupted:
    """A previous run of the same command that wrote "started" and never "finished"."""

    run: str
    started: str
    batches: int
    committed: dict[str, int]

    def describe(self) -> dict[str, Any]:
        """Return the run as the next run's "started" line names it."""
        return {
            "run": self.run,
            "started": self.started,
            "batches": self.batches,
            "committed": self.committed,
        }

    def sentence(self) -> str:
        """Return one line for the operator saying what the interrupted run had committed."""
        counts = ", ".join(f"{amount} {name}" for name, amount in self.committed.items()) or "nothing"
        return (
            f"the previous run of this command (started {self.started}, run {self.run}) did not finish: "
            f"it had committed {self.batches} batch{'es' if self.batches != 1 else ''} ({counts})"
        )


def _same_command(line: dict[str, Any], entry: AuditEntry) -> bool:
    if line.get("command") != entry.command or not isinstance(line.get("arguments"), dict):
        return False
    mine = {name: value for name, value in entry.arguments.items() if name not in _HOW_ARGUMENTS}
    theirs = {name: value for name, value in line["arguments"].items() if name not in _HOW_ARGUMENTS}
    return mine == theirs


def interrupted_run(path: Path, entry: AuditEntry) -> Interrupted | None:
    """Return the last run of ``entry``'s command (same subject arguments) in the log at ``path``
    when it started deleting and never finished (killed, or still running), else ``None``."""
    runs: dict[str, dict[str, Any]] = {}
    last: str | None = None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a line cut short by a full disk is not a run
        if not isinstance(line, dict) or not _same_command(line, entry) or line.get("run") == entry.run:
            continue
        run = line.get("run")
        phase = line.get("phase")
        if not isinstance(run, str) or phase not in ("started", "batch", "finished"):
            continue
        state = runs.setdefault(run, {"started": None, "finished": False, "batches": 0, "total": {}})
        if phase == "started":
            state["started"] = line.get("time", "")
            last = run
        elif phase == "batch":
            state["batches"] += 1
            if isinstance(line.get("total"), dict):
                state["total"] = line["total"]
        else:
            state["finished"] = True
    if last is None or runs[last]["finished"]:
        return None
    state = runs[last]
    return Interrupted(last, str(state["started"]), state["batches"], dict(state["total"]))


def audit_line(line: dict[str, Any], moment: datetime) -> str:
    """Return ``line`` as one JSON line (with the newline) stamped with the aware UTC ``moment``."""
    record = {"time": moment.astimezone(UTC).isoformat(timespec="seconds")} | line
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


Params = dict[str, Any]
Decides = Callable[[Params], bool]


def _dry_run(params: Params) -> bool:
    return bool(params.get("dry_run", False))


def _never(params: Params) -> bool:
    return False


NO_KEY_YET = "no audit key yet: the first command that deletes makes it, so this run's subject is not hashed"


def audited(
    command: str,
    *,
    hashed: Iterable[str] = (),
    reads: Decides = _dry_run,
    memory_only: Decides = _never,
) -> Callable[[F], F]:
    """Wrap a command body ``body(entry, **params)`` so that every run is in the audit log.

    Parameters named in ``hashed`` are logged as :func:`subject_hash` values under the install's
    audit key. A run for which ``reads(params)`` is true (a dry run, an export) only reads: it
    refuses a database that does not exist, and creates no instance folder, database or audit
    key (its subject is logged as ``null`` while there is no key); ``memory_only(params)`` says
    such a run needs the SQL database only when the memory driver is ``sql``. Expected failures
    (database, driver, file system, bad values) become a one-line ``Error:`` and exit 1.
    """
    secret = frozenset(hashed)

    def decorate(body: F) -> F:
        @functools.wraps(body)
        def run(**params: Any) -> None:
            read_only = reads(params)
            try:
                site = current_site()
                missing = site.missing_database(memory_only=memory_only(params)) if read_only else None
            except EXPECTED_FAILURES as exc:  # a setting that cannot be used: one line, nothing run
                raise click.ClickException(describe_failure(exc)) from None
            if missing is not None:
                raise click.ClickException(missing)
            needs_key = any(isinstance(params.get(name), str) for name in secret)
            try:
                key = (existing_audit_key() if read_only else running_audit_key()) if needs_key else b""
            except KeyFileError as exc:
                raise click.ClickException(f"cannot read the audit key: {describe_failure(exc)}") from None
            note = NO_KEY_YET if key is None else None
            arguments = {
                name: (None if key is None else subject_hash(value, key))
                if name in secret and isinstance(value, str)
                else value
                for name, value in params.items()
            }
            entry = AuditEntry(command, arguments, dry_run=bool(params.get("dry_run", False)), note=note)
            descriptor = None
            if not read_only or site.audit_path.parent.is_dir():
                try:
                    descriptor = open_audit_log(audit_path())
                except OSError as exc:
                    raise click.ClickException(
                        f"cannot open the audit log: {describe_failure(exc)}"
                    ) from None
                entry.log_path = site.audit_path
                entry.write = functools.partial(_append, descriptor, site)
            else:
                click.echo(
                    f"not recorded in the audit log: the instance folder {site.audit_path.parent} does not "
                    "exist (a command that only reads creates nothing)",
                    err=True,
                )
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
                if descriptor is not None:
                    try:
                        _append(descriptor, site, entry.finished())
                    except OSError as exc:
                        raise click.ClickException(
                            f"the run finished ({entry.outcome}) but its audit line could not be written: "
                            f"{describe_failure(exc)}"
                        ) from None
                    finally:
                        os.close(descriptor)

        return run  # type: ignore[return-value]

    return decorate


def _append(descriptor: int, site: Any, line: dict[str, Any]) -> None:
    write_line(descriptor, audit_line(line, datetime.fromtimestamp(site.clock(), UTC)))
