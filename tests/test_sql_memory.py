"""SqlMemory and the conversation log on real SQLite, MariaDB and PostgreSQL."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import sqlalchemy as sa

import clawmem
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import tables
from clawmem.turn.conversations import ConversationLog
from tests.conftest import sql_url

KEYS = [f"key-{n}" for n in range(10)]
WRITES = 40


def _upsert_worker(url: str, prefix: str, worker: int) -> None:
    engine = create_engine(url)
    memory = SqlMemory(engine, prefix=prefix)
    for round_ in range(WRITES):
        for key in KEYS:
            memory.set(key, {"worker": worker, "round": round_})
    engine.dispose()


@pytest.mark.slow
def test_concurrent_upserts_keep_one_row_per_key(
    engine: Any, sql_backend: str, prefix: str, tmp_path: Any
) -> None:
    url = sql_url(sql_backend, tmp_path)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_upsert_worker, args=(url, prefix, n)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    table = tables(prefix).memory
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.lookup_key, sa.func.count()).group_by(table.c.lookup_key)).all()
    assert sorted(rows) == [(key, 1) for key in sorted(KEYS)]
    values = SqlMemory(engine, prefix=prefix).all()
    for value in values.values():
        assert value["worker"] in range(4)
        assert value["round"] == WRITES - 1  # every worker's last write is its final round


def test_large_value_and_message_round_trip_byte_identical(engine: Any, prefix: str, clock: Any) -> None:
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    value = ("Grüße 🦀 漢字 " * 5000)[:70_000]
    memory.set("big", value)
    assert memory.get("big") == value
    assert memory.get("big").encode() == value.encode()

    conversations = ConversationLog(engine, prefix=prefix, clock=clock)
    message = "🦀é\u200d" * (5 * 1024 * 1024 // 9)
    assert len(message.encode()) > 4_900_000
    conversations.append("c1", [{"role": "user", "content": message}])
    loaded = conversations.load("c1")
    assert loaded is not None
    assert loaded.messages[0].content.encode() == message.encode()


def test_two_prefixes_never_see_each_other(engine: Any, prefix: str, clock: Any) -> None:
    other = prefix[:-1] + "x_"
    clawmem_tables = tables(other)
    clawmem_tables.metadata.create_all(engine)
    try:
        first = SqlMemory(engine, prefix=prefix, clock=clock)
        second = SqlMemory(engine, prefix=other, clock=clock)
        first.set("shared", "first")
        second.set("shared", "second")
        second.flush()
        assert first.all() == {"shared": "first"}
        assert second.all() == {}
    finally:
        clawmem_tables.metadata.drop_all(engine)


@pytest.mark.parametrize(
    "url",
    [
        "mysql+pymysql://clawuser:s3cretpw@127.0.0.1:1/nowhere",
        "postgresql+psycopg://clawuser:s3cretpw@127.0.0.1:1/nowhere",
        "sqlite:////dev/null/clawmem.db",  # a directory that cannot be made
    ],
)
def test_unreachable_database_raises_memory_error_without_password(url: str) -> None:
    memory = SqlMemory(create_engine(url, connect_args={"connect_timeout": 2} if "sqlite" not in url else {}))
    for call in (lambda: memory.get("k"), lambda: memory.set("k", 1), lambda: memory.all()):
        with pytest.raises(clawmem.StorageError) as raised:
            call()
        assert raised.value.driver == "sql"
        assert "s3cretpw" not in str(raised.value)
        assert isinstance(raised.value, RuntimeError)


def test_database_error_message_holds_no_value_text(engine: Any, prefix: str) -> None:
    memory = SqlMemory(engine, prefix=prefix)
    tables(prefix).memory.drop(engine)
    try:
        with pytest.raises(clawmem.StorageError) as raised:
            memory.set("k", "customer secret text")
        assert raised.value.operation == "set"
        assert "customer secret text" not in str(raised.value)
    finally:
        tables(prefix).memory.create(engine)
