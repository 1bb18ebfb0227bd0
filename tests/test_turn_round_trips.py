"""What a recall turn costs the database it stands on, as the wire sees it.

A turn with nothing committed since the last one needs to learn just that, then read back the
few entries it injects: at most two round trips on PostgreSQL (libpq's own trace counts every
request, ``BEGIN``, ``ROLLBACK`` and the pool's pre-ping included) and on Redis (every command
or pipeline redis-py sends). A reading connection the server dropped is opened again, and the
turn after it still answers with what the backend holds.
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.memory.redis import RedisMemory
from clawmem.memory.sql import SqlMemory
from clawmem.recall import MessageAugmenter
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables
from tests.conftest import backend_url

ENTRIES = {f"note{number}": f"tea order {number} shipped with green tea" for number in range(40)}
MESSAGE = "where is my green tea order"


class PostgresRequests:
    """Counts the requests libpq sends on every connection opened while it listens: one
    ``ReadyForQuery`` from the server ends each."""

    def __init__(self) -> None:
        self._traces: list[Any] = []

    def __call__(self, dbapi_connection: Any, _record: Any) -> None:
        from psycopg import pq

        trace = tempfile.TemporaryFile()  # noqa: SIM115  # closed in close()
        dbapi_connection.pgconn.trace(trace.fileno())
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self._traces.append(trace)

    def total(self) -> int:
        ctypes.CDLL(None).fflush(None)  # libpq writes its trace through stdio buffers
        count = 0
        for trace in self._traces:
            trace.seek(0)
            count += trace.read().count(b"\tReadyForQuery")
        return count

    def close(self) -> None:
        for trace in self._traces:
            trace.close()


@pytest.fixture
def postgres(prefix: str) -> Iterator[tuple[sa.engine.Engine, PostgresRequests]]:
    url = backend_url("postgres")  # skips before anything listens, which would outlive the test
    requests = PostgresRequests()
    sa.event.listen(sa.pool.Pool, "connect", requests)
    engine = create_engine(url)
    create_tables(engine, prefix)
    try:
        yield engine, requests
    finally:
        sa.event.remove(sa.pool.Pool, "connect", requests)
        drop_tables(engine, prefix)
        engine.dispose()
        requests.close()


def augmenter(memory: Any) -> MessageAugmenter:
    return MessageAugmenter(memory, namespace="default", announce=False)


def test_a_postgres_turn_with_nothing_committed_takes_two_round_trips(
    postgres: tuple[sa.engine.Engine, PostgresRequests], prefix: str, clock: FakeClock
) -> None:
    engine, requests = postgres
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    for key, value in ENTRIES.items():
        memory.set(key, value)
    turns = augmenter(memory)
    first = turns.augment(MESSAGE)
    assert first.text  # the index is built and the entries are injected
    counts = []
    for _ in range(10):
        before = requests.total()
        assert turns.augment(MESSAGE).text == first.text
        counts.append(requests.total() - before)
    # Other programs' commits anywhere on the server move the snapshot, and such a turn also
    # catches up (one more statement, and one to read back rows written since); a turn with
    # nothing committed anywhere costs two.
    assert min(counts) == 2, counts


def test_a_redis_turn_with_nothing_committed_takes_two_round_trips(clock: FakeClock, prefix: str) -> None:
    import redis

    sent = []

    class Counted(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent.append(command)
            super().send_packed_command(command, check_health)

    pool = redis.ConnectionPool.from_url(backend_url("redis"), connection_class=Counted)
    client = redis.Redis(connection_pool=pool)
    memory = RedisMemory(client=client, prefix=f"{prefix}:", clock=clock)
    try:
        for key, value in ENTRIES.items():
            memory.set(key, value)
        turns = augmenter(memory)
        first = turns.augment(MESSAGE)
        assert first.text
        for _ in range(5):
            sent.clear()
            assert turns.augment(MESSAGE).text == first.text
            assert len(sent) <= 2
    finally:
        memory.flush()
        client.close()


@pytest.mark.parametrize("backend", ["postgres", "mysql"])
def test_a_turn_after_the_server_dropped_the_reading_connection_still_answers(
    backend: str, prefix: str, clock: FakeClock
) -> None:
    engine = create_engine(backend_url(backend))
    create_tables(engine, prefix)
    try:
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        for key, value in ENTRIES.items():
            memory.set(key, value)
        turns = augmenter(memory)
        first = turns.augment(MESSAGE)
        assert "note0" in first.text
        line = memory._line
        assert line is not None
        own = "pg_backend_pid()" if backend == "postgres" else "connection_id()"
        reading = line.run(lambda conn: conn.execute(sa.text(f"SELECT {own}")).scalar())
        with engine.begin() as conn:
            kill = "SELECT pg_terminate_backend(:id)" if backend == "postgres" else "KILL :id"
            conn.execute(sa.text(kill), {"id": reading})
        memory.forget("note0")  # and the turn must see this
        after = turns.augment(MESSAGE)
        assert after.error is None
        assert "note0" not in after.text
        assert after.text != first.text
    finally:
        drop_tables(engine, prefix)
        engine.dispose()
