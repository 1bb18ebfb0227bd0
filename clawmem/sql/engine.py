"""Engines: one per database URL per process, configured the same way everywhere."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import NoSuchModuleError

from clawmem.errors import ConfigError
from clawmem.loop import ASYNC_PATH, pause
from clawmem.settings import CONNECT_TIMEOUT_SECONDS, SQL_READ_TIMEOUT_SECONDS

_WRITE = "clawmem_write"
_T = TypeVar("_T")
_RETRIES = 8
# The first rerun waits up to this long, each later one up to twice as long as the one before:
# victims rerun at once met again (forty new conversations at once on InnoDB used up five reruns).
_BACKOFF_SECONDS = 0.002
_MYSQL_DEADLOCK = 1213
_POSTGRES_RETRYABLE = {"40P01", "40001"}  # deadlock detected, serialization failure
# backend: the driver clawmem is tested with, and the package extra that installs it
_DRIVERS = {
    "mysql": ("pymysql", "mysql"),
    "mariadb": ("pymysql", "mysql"),
    "postgresql": ("psycopg", "postgres"),
}
_SUPPORTED = "use sqlite:///…, mysql+pymysql://… or postgresql+psycopg://…"
# backend: the asyncio driver its reads and writes take on the async path (clawmem.integrations.aio)
ASYNC_DRIVERS = {"mysql": "asyncmy", "mariadb": "asyncmy", "postgresql": "asyncpg"}
# Seconds a pooled connection is kept before it is replaced at checkout: below MySQL's and
# MariaDB's default wait_timeout (8 hours) and any proxy's idle limit likely in front of them,
# so an idle pool does not hand out connections the server has closed.
POOL_RECYCLE = 1800
# The connections held by held_connections(), by engine, in this thread or task.
_HELD: contextvars.ContextVar[dict[Engine, Connection] | None] = contextvars.ContextVar(
    "clawmem_held_connections", default=None
)


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
    # No pre-ping: it costs a round trip on every checkout. A connection the server closed fails
    # the one statement that finds it, SQLAlchemy then discards every pooled connection older
    # than that failure, and the next checkout connects afresh (tests/test_dashboard_connections.py).
    if parsed.get_backend_name() != "sqlite":
        options.setdefault("pool_recycle", POOL_RECYCLE)
        parsed = _with_timeouts(parsed)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _private_file(parsed.database)
    try:
        engine = sa.create_engine(parsed, **options)
    except ModuleNotFoundError as exc:
        raise ConfigError(_missing_driver_message(parsed, exc.name or str(exc))) from None
    except NoSuchModuleError:
        raise ConfigError(
            f"the database URL scheme '{parsed.drivername}://' is not one SQLAlchemy knows: {_SUPPORTED}"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        sa.event.listen(engine, "connect", _postgres_connect)
    _forget_pool_in_children(engine)
    return engine


def _with_timeouts(parsed: URL) -> URL:
    """Return ``parsed`` with clawmem's connect and read timeouts (see
    :data:`clawmem.settings.SQL_READ_TIMEOUT_SECONDS`) where the URL sets none of its own: a
    server that stops answering then fails the statement instead of hanging it. PostgreSQL's
    libpq has no read timeout; ``tcp_user_timeout`` bounds a network that stops acknowledging."""
    connect, read = str(CONNECT_TIMEOUT_SECONDS), str(SQL_READ_TIMEOUT_SECONDS)
    if parsed.get_backend_name() in ("mysql", "mariadb") and parsed.get_driver_name() == "pymysql":
        wanted = {"connect_timeout": connect, "read_timeout": read, "write_timeout": read}
    elif parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        wanted = {"connect_timeout": connect, "tcp_user_timeout": str(SQL_READ_TIMEOUT_SECONDS * 1000)}
    else:
        return parsed
    missing = {name: value for name, value in wanted.items() if name not in parsed.query}
    return parsed.update_query_dict(missing) if missing else parsed


def _forget_pool_in_children(engine: Engine) -> None:
    """Give a forked child (a gunicorn worker of a preloaded app) a pool of its own. Its parent's
    connections are dropped unclosed: closing one would end the session the parent still uses."""
    reference = weakref.ref(engine)

    def after_fork() -> None:
        forked = reference()
        if forked is not None:
            forked.dispose(close=False)

    os.register_at_fork(after_in_child=after_fork)


class ReadingLine:
    """One connection of an engine's database kept for the short reads of a recall turn: no
    checkout from the pool, so no pre-ping, and threads take turns on it.

    To a server (PostgreSQL, MariaDB) it stays open in autocommit, so a read is one round trip
    with no ``BEGIN`` or ``ROLLBACK``; a connection the server dropped is opened again and the
    read run once more (reads only, so running one twice is harmless).

    On a SQLite file the driver also writes through it (:meth:`write`): ``PRAGMA data_version``
    on it then changes only when another connection commits, so a feed can tell its own
    process's writes, which it logs, from everyone else's."""

    def __init__(self, engine: Engine) -> None:
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        base = weakref.ref(engine)  # the lines of engines are kept only while they are
        self.sqlite = engine.dialect.name == "sqlite"
        if self.sqlite:
            held: list[Any] = []  # the connection, out of reach of a cycle through the line
            self._held = held
            # Bumped when the connection is closed: data_version counts per connection.
            self._opened = 0

            def connect() -> Any:
                # One of the engine's own connections (its pragmas set), held until the line
                # is closed, out of the pool it came from; opened on first use, as a pool's are.
                found = base()
                if found is None:
                    raise sa.exc.InvalidRequestError("the engine of this reading line is gone")
                raw = found.raw_connection()
                raw.detach()
                held[:] = [raw]
                return raw.dbapi_connection

            self.engine = sa.create_engine(engine.url, creator=connect, poolclass=sa.pool.StaticPool)
            sa.event.listen(self.engine, "begin", _sqlite_begin)
        else:
            self.engine = create_engine(
                engine.url,  # type: ignore[arg-type]  # make_url takes a URL as it is
                poolclass=sa.pool.StaticPool,
                isolation_level="AUTOCOMMIT",
                pool_pre_ping=False,
                pool_reset_on_return=None,
            )
        # What listens to the engine's statements (a query count, a trace) hears the line's too.
        for name in ("before_cursor_execute", "after_cursor_execute"):
            sa.event.listen(self.engine, name, _relay(base, name))
        line = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (kept := line()) is not None and kept._forked())

    def _forked(self) -> None:
        """In a forked child (a gunicorn worker of a preloaded app): open a connection of its own
        on first use. The parent's is dropped unclosed, since the parent still uses it, and on
        SQLite the marker then names another connection, so the child's first read catches up."""
        self._lock = threading.Lock()
        self._connection = None
        self.engine.dispose(close=False)
        if self.sqlite and self._held:
            _INHERITED.extend(self._held)  # kept, so that no finaliser closes the parent's
            self._held.clear()
            self._opened += 1

    def run(self, work: Callable[[Connection], _T]) -> _T:
        """Return ``work(connection)`` run on the line (on SQLite, in one read transaction)."""
        if self.sqlite:
            with self._lock, self.engine.connect() as connection:
                return work(connection)
        for attempt in range(2):
            with self._lock:
                if self._connection is None:
                    # Never closed between reads: closing ends its (empty) transaction with a
                    # ROLLBACK that PyMySQL sends even in autocommit.
                    self._connection = self.engine.connect()
                try:
                    return work(self._connection)
                except BaseException as exc:
                    self._drop()  # whatever it was in the middle of goes with it
                    dropped = isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
                    if attempt or not dropped:
                        raise
        raise AssertionError("unreachable")

    def write(self, work: Callable[[Connection], _T], then: Callable[[_T], None]) -> _T:
        """SQLite: return ``work(connection)`` run in one write transaction on the line, and
        call ``then`` with its result once committed, before any other use of the line."""
        with self._lock:
            with self.engine.connect() as connection:
                connection = connection.execution_options(**{_WRITE: True})
                with connection.begin():
                    done = work(connection)
            then(done)
            return done

    def data_version(self) -> tuple[int, int]:
        """SQLite: return ``PRAGMA data_version`` of the line's connection, which changes when
        another connection commits, with how many connections the line had closed before it.
        Call it from ``run``'s work, before its first statement."""
        cursor = self._held[0].dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA data_version")
            return self._opened, int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                connection.close()

    def close(self) -> None:
        """Close the line's connection (the next use opens another)."""
        with self._lock:
            self._drop()
            self.engine.dispose()
            if self.sqlite and self._held:
                # A new connection's data_version starts afresh: the marker says it is another.
                self._opened += 1
                self._held.clear()


def _relay(engine: weakref.ref[Engine], event: str) -> Callable[..., None]:
    def relay(*args: Any) -> None:
        found = engine()
        if found is not None:
            getattr(found.dispatch, event)(*args)

    return relay


_INHERITED: list[Any] = []  # a parent's SQLite connections, held in a forked child so none closes
_LINES: weakref.WeakKeyDictionary[Engine, ReadingLine] = weakref.WeakKeyDictionary()
_LINES_LOCK = threading.Lock()


def reading_line(engine: Engine) -> ReadingLine | None:
    """Return the process's :class:`ReadingLine` to ``engine``'s database (one per engine,
    closed when the engine is disposed), or ``None`` for an in-memory SQLite database, which
    every connection sees apart, and on the async path, whose tasks take connections from the
    pool of their loop's engine (a line's lock, held across a read, would stop the loop)."""
    if engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:"):
        return None
    if ASYNC_PATH.get() and async_url(engine.url) is not None:
        return None
    with _LINES_LOCK:
        line = _LINES.get(engine)
        if line is None:
            line = _LINES[engine] = ReadingLine(engine)
            disposed = weakref.ref(line)

            def close(_engine: Engine) -> None:
                if (kept := disposed()) is not None:
                    kept.close()

            sa.event.listen(engine, "engine_disposed", close)
        return line


def _missing_driver_message(url: URL, module: str) -> str:
    """Return the one line that says which URL scheme or package extra gives ``url`` the driver
    ``module`` it could not import."""
    needs = f"the database URL scheme '{url.drivername}://' needs the {module} module, which is not installed"
    known = _DRIVERS.get(url.get_backend_name())
    if known is None:
        return f"{needs}; {_SUPPORTED}"
    driver, extra = known
    install = f"pip install 'clawmem[{extra}]'"
    if url.get_driver_name() == driver:
        return f"{needs}: {install}"
    return f"{needs}: write {url.get_backend_name()}+{driver}://… instead ({install})"


def _private_file(path: str) -> None:
    """Create a new SQLite database file readable by its owner only; SQLite gives its -wal and
    -shm files the same mode. A missing directory (the default ``instance/``) is created first,
    readable by its owner only, as the file driver does, so a first run needs no set-up."""
    if os.path.exists(path):
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        # One that cannot be made is reported by SQLite on first use, like any unreachable database.
        with contextlib.suppress(OSError):
            os.makedirs(directory, mode=0o700)
            os.chmod(directory, 0o700)  # makedirs' mode is filtered by the umask
    if not os.path.isdir(directory):
        return
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def after_erasure(engine: Engine) -> None:
    """Make deleted rows unreadable on disk at once: on SQLite, write the WAL back into the
    database and truncate it (other databases need nothing here)."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


# Per running event loop (gone with it), each engine's twin on the asyncio driver.
_TWINS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Engine, bool], Engine]] = (
    weakref.WeakKeyDictionary()
)


def async_url(url: URL) -> URL | None:
    """Return ``url`` with the asyncio driver of its backend (:data:`ASYNC_DRIVERS`), or ``None``
    for a backend that has none (SQLite), whose async callers run it in a worker thread."""
    driver = ASYNC_DRIVERS.get(url.get_backend_name())
    if driver is None:
        return None
    return _async_timeouts(url.set(drivername=f"{url.get_backend_name()}+{driver}"))


def _async_timeouts(url: URL) -> URL:
    """Return ``url`` without the timeouts of :func:`_with_timeouts` its asyncio driver does not
    take by those names (asyncmy has no write timeout; asyncpg takes its own, given by
    :func:`_async_connect_args`)."""
    if url.get_driver_name() == "asyncmy":
        return url.difference_update_query(["write_timeout"])
    if url.get_driver_name() == "asyncpg":
        return url.difference_update_query(["connect_timeout", "tcp_user_timeout"])
    return url


def _async_connect_args(url: URL) -> dict[str, Any]:
    """Return what a twin on asyncpg connects with: ``timeout`` to connect (the URL's own
    ``connect_timeout``, else clawmem's) and, awaiting on the loop, ``command_timeout`` as the
    read timeout libpq lacks."""
    if url.get_backend_name() != "postgresql":
        return {}
    connect = url.query.get("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    return {"timeout": float(str(connect)), "command_timeout": float(SQL_READ_TIMEOUT_SECONDS)}


def current(engine: Engine, reading: bool = False) -> Engine:
    """Return the engine to run a statement on: ``engine`` itself, or on the async path (in a
    :func:`clawmem.integrations.aio.run` call, on its event loop) the twin of ``engine`` on the asyncio
    driver of the same database, one per engine and loop. The twin compiles the same statements
    for the same dialect; its connections await their I/O, so the loop serves other tasks
    meanwhile. ``reading``: for a read outside a transaction; on PostgreSQL the twin then reads in
    autocommit, one round trip with no ``BEGIN`` or ``ROLLBACK`` (as a reading line does)."""
    if not ASYNC_PATH.get() or engine.dialect.is_async:
        return engine
    url = async_url(engine.url)
    if url is None:
        return engine
    loop = asyncio.get_running_loop()
    twins = _TWINS.get(loop)
    if twins is None:
        twins = _TWINS[loop] = {}
    twin = twins.get((engine, reading))
    if twin is None and reading:
        twin = current(engine)
        if twin.dialect.name == "postgresql":
            twin = twin.execution_options(isolation_level="AUTOCOMMIT")
        twins[engine, reading] = twin
    if twin is None:
        size = getattr(engine.pool, "size", lambda: _TWIN_POOL)()
        twin = twins[engine, reading] = create_engine(  # type: ignore[arg-type]
            url, pool_size=size, max_overflow=_TWIN_OVERFLOW, connect_args=_async_connect_args(engine.url)
        )
    return twin


_TWIN_POOL = 5  # SQLAlchemy's default pool size, for a twin of an engine whose pool has none
_TWIN_OVERFLOW = 20  # connections a twin opens past its pool when many tasks read at once


@functools.cache
def engine_for(url: str) -> Engine:
    """Return the process-wide shared engine for ``url``."""
    return create_engine(url)


@contextlib.contextmanager
def held_connections() -> Iterator[None]:
    """Within this block, every :func:`connect` on an engine reads on one connection of that
    engine, checked out at its first use and returned at the end (its transaction rolled back).

    The dashboard holds one per request: a page's reads then cost one checkout and one
    transaction, not one of each per read, and see one snapshot of the database.
    """
    token = _HELD.set({})
    try:
        yield
    finally:
        held = _HELD.get() or {}
        _HELD.reset(token)
        for connection in held.values():
            connection.close()


@contextlib.contextmanager
def connect(engine: Engine) -> Iterator[Connection]:
    """Yield a connection to read on: the one :func:`held_connections` holds for ``engine``, else
    a new one from the pool, returned when the block ends."""
    held = _HELD.get()
    engine = current(engine, reading=held is None)
    if held is None:
        with engine.connect() as connection:
            yield connection
        return
    connection = held.get(engine)
    if connection is None or connection.closed:
        connection = held[engine] = engine.connect()
    try:
        yield connection
    except BaseException:
        # A failed statement aborts the transaction on PostgreSQL: end it, so a read that
        # catches the error (a missing table, say) does not fail every read after it.
        connection.rollback()
        raise


def _end_held_read(engine: Engine) -> None:
    # After a write, the held connection's reads start a new transaction that sees it.
    held = _HELD.get()
    connection = held.get(engine) if held is not None else None
    if connection is not None and not connection.closed and connection.in_transaction():
        connection.rollback()


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """Yield a connection inside one transaction that will write (committed on success)."""
    engine = current(engine)
    with engine.connect() as connection:
        connection = connection.execution_options(**{_WRITE: True})
        with connection.begin():
            yield connection
    _end_held_read(engine)


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
    victim; the rollback undid it entirely, so a rerun is safe. Each rerun waits a random time,
    up to twice as long as the last, so writers that met once do not meet again at once."""
    for attempt in range(_RETRIES):
        try:
            return operation()
        except sa.exc.DBAPIError as exc:
            if not is_deadlock(exc) or attempt == _RETRIES - 1:
                raise
        pause(random.uniform(0, _BACKOFF_SECONDS * 2**attempt))
    raise AssertionError("unreachable")
