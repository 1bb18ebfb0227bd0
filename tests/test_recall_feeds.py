"""Each driver's change feed as recall follows it: regressions found along the way (the state
machines that prove freshness are in tests/conformance/)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.sql import SqlMemory
from clawmem.records import MemoryHit
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from tests.conftest import backend_url, sql_url


def test_sqlite_drivers_on_one_engine_leave_its_pool_alone(tmp_path: Path, clock: FakeClock) -> None:
    # Each SQLite driver watches PRAGMA data_version on a connection it keeps; that connection
    # must not be one of the pool's, or a few drivers on a shared engine exhaust it.
    engine = create_engine(f"sqlite:///{tmp_path / 'shared.db'}", pool_size=1, max_overflow=0, pool_timeout=1)
    create_tables(engine, "")
    drivers = [SqlMemory(engine, clock=clock) for _ in range(3)]
    try:
        for number, driver in enumerate(drivers):
            driver.set(f"tea-{number}", "green tea", "notes")
            assert [hit.key for hit in driver.search("tea", 5, "notes")] == [
                f"tea-{n}" for n in range(number + 1)
            ]
    finally:
        engine.dispose()


def test_a_redis_index_built_on_an_empty_log_notices_the_log_was_cut(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    import redis

    from clawmem.memory import redis as redis_driver

    monkeypatch.setattr(redis_driver, "LOG_LENGTH", 20)
    client = redis.Redis.from_url(backend_url("redis"))
    prefix = f"clawtest:{uuid.uuid4().hex[:8]}:"
    a = redis_driver.RedisMemory(client=client, prefix=prefix, clock=clock)
    b = redis_driver.RedisMemory(client=client, prefix=prefix, clock=clock)
    try:
        assert b.search("tea", 5, "notes") == []  # B's index starts from an empty log
        for number in range(400):  # far more changes than the log keeps
            a.set(f"k{number:03d}", "green tea" if number == 0 else f"coffee {number}", "notes")
        assert client.xlen(a.log_key("notes")) < 400
        assert b.search("tea", 5, "notes") == [MemoryHit("k000", "green tea", "notes", 1)]
    finally:
        for name in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(name)
        client.close()


@pytest.mark.parametrize("backend", ["mysql", "postgres"])
def test_a_bulk_stamped_namespace_reads_again_only_the_rows_that_changed(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # A bulk import stamps every row alike, so all of them stay within the overlap window. A row
    # another program rewrites without changing its stamp is still seen, only the values of the
    # rows that changed are read again (plus the hits' own, to answer), and when nothing changed
    # the window is not read at all.
    url = sql_url(backend, tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    table = tables(prefix).memory
    stamp = utc_datetime(clock)
    rows = [
        {"id": new_id(), "namespace": "bulk", "lookup_key": f"k{number:03d}", "expires_at": None,
         "value": json.dumps(f"note {number}"), "created_at": stamp, "updated_at": stamp}
        for number in range(300)
    ]  # fmt: skip
    rows[7]["value"] = json.dumps("green tea")
    values_read: list[int] = []

    def count_values(conn: Any, cursor: Any, *args: Any) -> None:
        if any(column[0] == "value" for column in cursor.description or ()):
            values_read.append(cursor.rowcount)

    try:
        with program.begin() as conn:
            conn.execute(sa.insert(table), rows)
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k007"]
        with program.begin() as conn:
            for key, value in (("k007", "coffee"), ("k123", "green tea, again")):
                where = (table.c.namespace == "bulk", table.c.lookup_key == key)
                conn.execute(sa.update(table).where(*where).values(value=json.dumps(value)))
        sa.event.listen(engine, "after_cursor_execute", count_values)
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k123"]
        assert 0 < sum(values_read) <= 3
        # Nothing changed since: not even the marks of the window's 300 rows are read again.
        rows_read: list[int] = []
        sa.event.listen(engine, "after_cursor_execute", lambda *args: rows_read.append(args[1].rowcount))
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k123"]
        assert rows_read and max(rows_read) < 300
    finally:
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


def _hold_transaction(conn: sa.Connection, prefix: str, clock: FakeClock) -> None:
    """Give ``conn``'s open transaction an id by writing a conversation it has not committed."""
    stamp = utc_datetime(clock)
    conn.execute(sa.insert(tables(prefix).conversations).values(
        id=new_id(), namespace="elsewhere", user_id="", created_at=stamp, updated_at=stamp))  # fmt: skip


def test_an_old_transaction_left_open_on_postgresql_does_not_make_a_quiet_turn_read_again(
    tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # The feed asks PostgreSQL which transactions committed between two turns. One that was
    # open at both, however old, has committed nothing, so it must not send the namespace's rows
    # back to be read when some other transaction finishes in between.
    url = sql_url("postgres", tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    ancient, short = program.connect(), program.connect()
    try:
        ancient.begin()
        _hold_transaction(ancient, prefix, clock)  # open before the rows were written
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        for number in range(300):
            memory.set(f"k{number:03d}", "green tea" if number == 7 else f"note {number}", "quiet")
        other = SqlMemory(program, prefix=prefix, clock=clock)
        other.set("seen", "a first change by another program", "quiet")
        assert [hit.key for hit in memory.search("tea", 5, "quiet")] == ["k007"]
        short.begin()
        _hold_transaction(short, prefix, clock)  # in progress at this turn, finished by the next
        # A later transaction's commit puts the short one among the snapshot's in-progress ids.
        other.set("seen", "a second change by another program", "quiet")
        assert [hit.key for hit in memory.search("tea", 5, "quiet")] == ["k007"]
        short.commit()
        rows_read: list[int] = []
        sa.event.listen(engine, "after_cursor_execute", lambda *args: rows_read.append(args[1].rowcount))
        assert [hit.key for hit in memory.search("tea", 5, "quiet")] == ["k007"]
        assert max(rows_read) < 300  # the hit's own row, to answer; not the namespace's rows
    finally:
        ancient.rollback()
        ancient.close()
        short.close()
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


def test_a_row_written_in_a_savepoint_of_a_long_postgresql_transaction_is_seen_once_it_commits(
    tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # A savepoint's rows carry the id of a subtransaction, which no snapshot lists as in
    # progress; the feed must still find them when their transaction commits after some turns.
    url = sql_url("postgres", tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    writer = program.connect()
    try:
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        memory.set("first", "black coffee", "notes")
        assert memory.search("tea", 5, "notes") == []
        writer.begin()
        _hold_transaction(writer, prefix, clock)
        with writer.begin_nested():
            stamp = utc_datetime(clock)
            writer.execute(sa.insert(tables(prefix).memory).values(
                id=new_id(), namespace="notes", lookup_key="late", value=json.dumps("green tea"),
                expires_at=None, created_at=stamp, updated_at=stamp))  # fmt: skip
        assert memory.search("tea", 5, "notes") == []  # not committed yet
        memory.set("second", "more coffee", "notes")  # another commit between the turns
        assert memory.search("tea", 5, "notes") == []
        writer.commit()
        assert [hit.key for hit in memory.search("tea", 5, "notes")] == ["late"]
    finally:
        writer.close()
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


def test_a_sqlite_namespace_counted_by_the_rest_of_the_table_sees_deletes_beside_inserts(
    tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # The namespace holding most of the table is counted as the table less the namespaces below
    # and above it. Another program's commit that deletes one of its rows and adds one elsewhere
    # leaves the table's count as it was; the deleted entry must still stop being recalled, and
    # a row it adds with an old stamp (outside the re-read window) must start being recalled.
    url = f"sqlite:///{tmp_path / 'counted.db'}"
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    table = tables(prefix).memory
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    for number in range(10):
        memory.set(f"m{number}", f"green tea {number}", "m")
    for namespace in ("a", "z"):
        memory.set(f"{namespace}0", "green tea", namespace)

    def row(namespace: str, key: str, stamp: Any) -> dict[str, Any]:
        value = json.dumps("green tea, from elsewhere")
        return {"id": new_id(), "namespace": namespace, "lookup_key": key, "expires_at": None,
                "value": value, "created_at": stamp, "updated_at": stamp}  # fmt: skip

    try:
        assert sorted(hit.key for hit in memory.search("tea", 20, "m")) == [f"m{n}" for n in range(10)]
        with program.begin() as conn:
            conn.execute(sa.delete(table).where(table.c.namespace == "m", table.c.lookup_key == "m3"))
            conn.execute(sa.insert(table), row("a", "a1", utc_datetime(clock)))
        assert "m3" not in {hit.key for hit in memory.search("tea", 20, "m")}
        old = utc_datetime(clock) - timedelta(days=1)
        with program.begin() as conn:
            conn.execute(sa.delete(table).where(table.c.namespace == "z"))
            conn.execute(sa.insert(table), row("m", "m-old", old))
        assert "m-old" in {hit.key for hit in memory.search("tea", 20, "m")}
        assert len(memory.search("tea", 20, "m")) == 10
    finally:
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


def test_a_sql_cursor_follows_the_way_it_was_made(tmp_path: Path, prefix: str, clock: FakeClock) -> None:
    # A cursor made for a copy that says which keys it holds keeps none itself: called without
    # them, the feed starts again from a full read rather than guess. One made without them goes on.
    engine = create_engine(f"sqlite:///{tmp_path / 'ways.db'}")
    create_tables(engine, prefix)
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    memory.set("k1", "green tea", "n")
    try:
        told = memory.changes("n", None, set())
        assert told.reset and [key for key, _, _ in told.entries] == ["k1"]
        assert not memory.changes("n", told.cursor, {"k1"}).reset
        again = memory.changes("n", told.cursor)
        assert again.reset and [key for key, _, _ in again.entries] == ["k1"]
        kept = memory.changes("n")
        memory.set("k2", "black tea", "n")
        later = memory.changes("n", kept.cursor)
        assert not later.reset and [key for key, _, _ in later.entries] == ["k2"]
    finally:
        drop_tables(engine, prefix)
        engine.dispose()
