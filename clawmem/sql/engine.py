"""Engines: one per database URL per process, configured the same way everywhere."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

_WRITE = "clawmem_write"
_T = TypeVar("_T")
_RETRIES = 5
_MYSQL_DEADLOCK = 1213
_POSTGRES_RETRYABLE = {"40P01", "40001"}  # deadlock detected, serialization failure


# str(raw, "utf-8", "replace") without a Python-level call per value.
_LENIENT_TEXT = functools.partial(str, encoding="utf-8", errors="replace")


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Transactions are begun explicitly (see _sqlite_begin). WAL lets readers run beside one
    # writer; the busy timeout makes concurrent writers wait instead of failing at once.
    dbapi_connection.isolation_level = None
    # Text another program wrote as invalid UTF-8 reads with U+FFFD in place of the bad bytes,
    # instead of failing every query that touches the row.
    dbapi_connection.text_factory = _LENIENT_TEXT
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 30000")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    # Deleted rows are overwritten, not left readable in free pages until they are reused.
    cursor.execute("PRAGMA secure_delete = ON")
    cursor.close()


@functools.cache
def _lenient_timestamp_loaders() -> dict[str, type]:
    # Built on first use: psycopg is only needed for PostgreSQL.
    import psycopg
    from psycopg.types.datetime import TimestampLoader, TimestamptzLoader

    def lenient(base: type) -> type:
        def load(self: Any, data: Any) -> Any:
            try:
                return base.load(self, data)
            except psycopg.DataError:
                return bytes(data).decode("utf-8", errors="replace")

        return type(f"Lenient{base.__name__}", (base,), {"load": load})

    return {"timestamp": lenient(TimestampLoader), "timestamptz": lenient(TimestamptzLoader)}


def _postgres_connect(dbapi_connection: Any, _record: Any) -> None:
    # A timestamp Python cannot hold ('infinity', a year past 9999, a BC date), written by
    # another program, reads as PostgreSQL's text for it instead of failing every query that
    # touches the row; the row mappers then mark the row unreadable (clawmem.sql.lenient).
    for type_name, loader in _lenient_timestamp_loaders().items():
        dbapi_connection.adapters.register_loader(type_name, loader)


def _sqlite_begin(connection: Connection) -> None:
    # A write transaction takes the write lock up front: a deferred one that reads first and
    # then writes would fail with "database is locked" instead of waiting its turn.
    immediate = connection.get_execution_options().get(_WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_engine(url: str, **options: Any) -> Engine:
    """Return a new engine for ``url`` with utf8mb4 on MySQL/MariaDB and WAL on SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    options.setdefault("pool_pre_ping", True)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _private_file(parsed.database)
    engine = sa.create_engine(parsed, **options)
    if parsed.get_backend_name() == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        sa.event.listen(engine, "connect", _postgres_connect)
    return engine


def _private_file(path: str) -> None:
    """Create a new SQLite database file readable by its owner only; SQLite gives its -wal and
    -shm files the same mode. A missing directory is left for SQLite to report."""
    if os.path.exists(path) or not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def after_erasure(engine: Engine) -> None:
    """Make deleted rows unreadable on disk at once: on SQLite, write the WAL back into the
    database and truncate it (other databases need nothing here)."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


@functools.cache
def engine_for(url: str) -> Engine:
    """Return the process-wide shared engine for ``url``."""
    return create_engine(url)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """Yield a connection inside one transaction that will write (committed on success)."""
    with engine.connect() as connection:
        connection = connection.execution_options(**{_WRITE: True})
        with connection.begin():
            yield connection


def describe_error(exc: BaseException) -> str:
    """Return a one-line description of a database error without SQL parameters (they may hold data)."""
    original = getattr(exc, "orig", None)
    if original is not None:
        return f"{type(original).__name__}: {original}".splitlines()[0]
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def is_deadlock(exc: BaseException) -> bool:
    """Return whether ``exc`` is a deadlock the database resolved by rolling this transaction back."""
    original = getattr(exc, "orig", None)
    if getattr(original, "sqlstate", None) in _POSTGRES_RETRYABLE:
        return True
    args = getattr(original, "args", ())
    return bool(args) and args[0] == _MYSQL_DEADLOCK


def retry_deadlocks(operation: Callable[[], _T]) -> _T:
    """Run ``operation`` (one whole transaction) again when the database picked it as a deadlock
    victim; the rollback undid it entirely, so a rerun is safe."""
    for attempt in range(_RETRIES):
        try:
            return operation()
        except sa.exc.DBAPIError as exc:
            if not is_deadlock(exc) or attempt == _RETRIES - 1:
                raise
    raise AssertionError("unreachable")
