"""Shared fixtures: a fake clock, real backends (SQLite, MariaDB, PostgreSQL, Redis) and drivers.

Remote backends come from ``CLAW_TEST_MYSQL_URL``, ``CLAW_TEST_POSTGRES_URL`` and
``CLAW_TEST_REDIS_URL``. Locally an unset or unreachable backend skips with the reason; with
``CI=true`` it fails the run instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem import events
from clawmem.clock import FakeClock
from clawmem.integrations import aio
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables

IN_CI = os.environ.get("CI", "").lower() == "true"
SQL_BACKENDS = ["sqlite", "mysql", "postgres"]
_URL_VARIABLES = {
    "mysql": "CLAW_TEST_MYSQL_URL",
    "postgres": "CLAW_TEST_POSTGRES_URL",
    "redis": "CLAW_TEST_REDIS_URL",
}
_reachable: dict[str, str] = {}


SERVER_SQL_BACKENDS = set(SQL_BACKENDS) - {"sqlite"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``servers`` every test that runs on MariaDB or PostgreSQL by a parameter of its own
    (``make test-fast`` leaves them to ``make test``)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and SERVER_SQL_BACKENDS & set(callspec.id.split("-")):
            item.add_marker(pytest.mark.servers)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def backend_url(name: str) -> str:
    """Return the test URL of remote backend ``name``, or skip (locally) / fail (in CI)."""
    if name in _reachable:
        return _reachable[name]
    variable = _URL_VARIABLES[name]
    url = os.environ.get(variable)
    if not url:
        _unavailable(f"{variable} is not set, so {name} tests cannot run")
    try:
        if name == "redis":
            import redis

            redis.Redis.from_url(url, socket_connect_timeout=3).ping()
        else:
            engine = create_engine(url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 3})
            with engine.connect():
                pass
            engine.dispose()
    except Exception as exc:  # any failure to reach the service means the same thing here
        _unavailable(f"{name} at {variable} is unreachable: {type(exc).__name__}")
    _reachable[name] = url
    return url


Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=[aio.ASYNC_DRIVER, aio.THREAD_HOP], ids=["async", "thread"])
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    """``run(coroutine)`` on one event loop for the test, an adapter's async methods taking each
    path in turn: the asyncio drivers on the loop (on MariaDB, PostgreSQL and Redis; SQLite and
    the file driver hop to a thread either way), and the worker thread of every call."""
    with contextlib.ExitStack() as stack:
        if request.param == aio.THREAD_HOP:
            stack.enter_context(aio.thread_hop())
        runner = stack.enter_context(asyncio.Runner())
        yield runner.run
        runner.run(aio.close_engines())


@pytest.fixture
def clock() -> FakeClock:
    """A clock at a fixed, fractional instant that moves only when told to."""
    return FakeClock(1_700_000_000.25)


@pytest.fixture
def recorded() -> Iterator[list[dict[str, Any]]]:
    """Every event emitted during the test, in order."""
    seen: list[dict[str, Any]] = []
    events.on("*", seen.append)
    yield seen
    events.off("*", seen.append)


@pytest.fixture
def prefix() -> str:
    """A table prefix of its own for this test, so tests never share rows."""
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def lite(tmp_path: Any, prefix: str) -> Iterator[sa.engine.Engine]:
    """SQLite tables of this test's prefix: for what a check decides alone, the same on every
    backend."""
    engine = create_engine(f"sqlite:///{tmp_path / 'lite.db'}")
    create_tables(engine, prefix)
    yield engine
    engine.dispose()


def sql_url(backend: str, tmp_path: Any) -> str:
    """Return the SQLAlchemy URL of ``backend`` (a fresh file database for SQLite)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'clawmem.db'}"
    return backend_url(backend)


@pytest.fixture(params=SQL_BACKENDS)
def sql_backend(request: pytest.FixtureRequest) -> str:
    """Each SQL backend in turn: sqlite, mysql, postgres."""
    return request.param


@pytest.fixture
def engine(sql_backend: str, tmp_path: Any, prefix: str) -> Iterator[sa.engine.Engine]:
    """An engine on the current SQL backend with this test's three tables created (and dropped)."""
    engine = create_engine(sql_url(sql_backend, tmp_path))
    create_tables(engine, prefix)
    yield engine
    drop_tables(engine, prefix)
    engine.dispose()


@pytest.fixture
def redis_client() -> Any:
    """A Redis client on the test server; keys are isolated by a per-test key prefix."""
    import redis

    return redis.Redis.from_url(backend_url("redis"))


# -- drivers ---------------------------------------------------------------------------------

DriverFactory = Callable[[pytest.FixtureRequest, FakeClock], Any]


def _array(request: pytest.FixtureRequest, clock: FakeClock) -> Any:
    from clawmem.memory.array import ArrayMemory

    return ArrayMemory(clock=clock)


def _file(request: pytest.FixtureRequest, clock: FakeClock) -> Any:
    from clawmem.memory.file import FileMemory

    return FileMemory(request.getfixturevalue("tmp_path") / "memory", clock=clock)


def _redis(request: pytest.FixtureRequest, clock: FakeClock) -> Any:
    from clawmem.memory.redis import RedisMemory

    client = request.getfixturevalue("redis_client")
    key_prefix = f"clawtest:{uuid.uuid4().hex[:8]}:"
    memory = RedisMemory(client=client, prefix=key_prefix, clock=clock)
    request.addfinalizer(lambda: [client.delete(k) for k in client.scan_iter(match=f"{key_prefix}*")])
    return memory


def _sql(backend: str) -> DriverFactory:
    def factory(request: pytest.FixtureRequest, clock: FakeClock) -> Any:
        from clawmem.memory.sql import SqlMemory

        tmp_path = request.getfixturevalue("tmp_path")
        prefix = f"t{uuid.uuid4().hex[:8]}_"
        engine = create_engine(sql_url(backend, tmp_path))
        create_tables(engine, prefix)

        def cleanup() -> None:
            drop_tables(engine, prefix)
            engine.dispose()

        request.addfinalizer(cleanup)
        return SqlMemory(engine, prefix=prefix, clock=clock)

    return factory


DRIVERS: dict[str, DriverFactory] = {
    "array": _array,
    "file": _file,
    "sql-sqlite": _sql("sqlite"),
    "sql-mysql": _sql("mysql"),
    "sql-postgres": _sql("postgres"),
    "redis": _redis,
}


def _plain(memory: Any) -> Any:
    return memory


def _routed(memory: Any) -> Any:
    from clawmem.memory.array import ArrayMemory
    from clawmem.memory.wrappers import RouterMemory

    # A decoy route proves the router sends other namespaces to the default driver.
    return RouterMemory(memory, {"elsewhere": ArrayMemory()})


def _private(memory: Any) -> Any:
    from clawmem.memory.wrappers import PrivacyAwareMemory

    return PrivacyAwareMemory(memory, store_messages=True)


WRAPPERS = {"plain": _plain, "router": _routed, "privacy": _private}


@pytest.fixture(params=list(DRIVERS))
def driver_name(request: pytest.FixtureRequest) -> str:
    """Each storage driver in turn."""
    return request.param


@pytest.fixture
def make_driver(request: pytest.FixtureRequest, clock: FakeClock) -> Callable[[str], Any]:
    """Build a fresh, empty driver by name on the shared fake clock."""
    return lambda name: DRIVERS[name](request, clock)
