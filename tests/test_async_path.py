"""The async path (clawmem.integrations.aio): an adapter's async methods over asyncpg and asyncmy on the
event loop, with encryption at rest as on the worker-thread path, and many tasks of one loop at
once (reads that wait on each other must never stop the loop)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
pytest.importorskip("agents")

from clawmem import events  # noqa: E402
from clawmem.crypto import generate_key  # noqa: E402
from clawmem.encryption.ciphers import keystore_of  # noqa: E402
from clawmem.errors import Undecryptable  # noqa: E402
from clawmem.integrations import aio  # noqa: E402
from clawmem.integrations.openai_agents import ClawSession  # noqa: E402
from clawmem.memory.sql import SqlMemory  # noqa: E402
from clawmem.settings import Settings  # noqa: E402
from clawmem.sites.site import Site  # noqa: E402
from clawmem.sql.engine import create_engine  # noqa: E402
from clawmem.sql.keystore import key_table  # noqa: E402
from clawmem.sql.schema import create_tables, drop_tables  # noqa: E402
from clawmem.turn.conversations import ConversationLog  # noqa: E402
from tests.conftest import Run, backend_url  # noqa: E402
from tests.test_crypto_erasure import raw_text  # noqa: E402

SECRET = "ZEBRA-7 lives at 1 Main St"
USER = {"role": "user", "content": f"My address is {SECRET}"}


@pytest.fixture(params=["mysql", "postgres"])
def sealed(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[Settings]:
    """Settings of a site on a server database whose key store is a table of the other one."""
    database = backend_url(request.param)
    keys = backend_url("postgres" if request.param == "mysql" else "mysql")
    settings = Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=database,
        table_prefix=prefix,
        encryption_keys=generate_key("site1"),
        keystore_url=keys,
    )
    engine, keys_engine = create_engine(database), create_engine(keys)
    create_tables(engine, prefix)
    yield settings
    key_table(prefix).metadata.drop_all(keys_engine)
    drop_tables(engine, prefix)
    engine.dispose()
    keys_engine.dispose()


def test_a_sealed_sessions_items_are_sealed_at_rest_and_erased_with_the_subjects_key(
    run: Run, sealed: Settings
) -> None:
    site = Site(sealed)
    site.memory.set("address", SECRET, "user:cust-7")
    session = ClawSession.from_settings("sealed", sealed, user_id="cust-7")
    run(session.add_items([USER]))
    assert run(session.get_items()) == [USER]
    stored = site.conversations.load("sealed")
    assert stored is not None and [m.content for m in stored.messages] == [USER["content"]]
    assert SECRET not in raw_text(site)
    keystore = keystore_of(site.cipher)
    assert keystore is not None and keystore.erase("cust-7")
    with pytest.raises(Undecryptable):
        run(ClawSession.from_settings("sealed", sealed, user_id="cust-7").get_items())


def test_many_sessions_of_one_loop_at_once_get_what_each_stored(
    run: Run, engine: Any, prefix: str, clock: Any
) -> None:
    log = ConversationLog(engine, prefix, clock)
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    memory.set("shipping", "orders ship within two days")

    async def one(number: int) -> list[Any]:
        session = ClawSession(f"c{number}", log, memory=memory)
        said = {"role": "user", "content": f"when do orders ship {number}"}
        await session.session_input_callback([], [said])  # recall, from the index all share
        await session.add_items([said])
        return await session.get_items()

    async def all_at_once() -> list[list[Any]]:
        return await asyncio.gather(*(one(number) for number in range(40)))

    found = run(all_at_once())
    assert [[item["content"] for item in items] for items in found] == [
        [f"when do orders ship {number}"] for number in range(40)
    ]
    for number in (0, 7, 39):  # each turn's recall record, stored before its message, found the fact
        stored = log.load(f"c{number}")
        assert stored is not None and [m.role for m in stored.messages] == ["recall", "user"]
        assert json.loads(stored.messages[0].content or "")[0]["key"] == "shipping"


def test_an_engine_takes_the_async_path_on_a_server_database_only(engine: Any, sql_backend: str) -> None:
    assert aio.engine_on_loop(engine) is (sql_backend != "sqlite")
    assert aio.path_name(aio.engine_on_loop(engine)) == (
        aio.THREAD_HOP if sql_backend == "sqlite" else aio.ASYNC_DRIVER
    )


@pytest.mark.parametrize("driver", ["redis", "sql-postgres", "sql-mysql", "sql-sqlite", "file"])
def test_a_langgraph_store_reads_on_the_loops_thread_where_its_driver_has_an_async_client(
    run: Run, make_driver: Any, driver: str
) -> None:
    from clawmem.integrations.langgraph import ClawStore

    store = ClawStore(make_driver(driver))
    threads: list[int] = []

    def seen(event: dict[str, Any]) -> None:
        threads.append(threading.get_ident())

    async def put_and_get() -> tuple[int, Any]:
        await store.aput(("docs",), "k", {"text": "kept"})
        return threading.get_ident(), await store.aget(("docs",), "k")

    events.on("memory.read", seen)
    try:
        loop_thread, found = run(put_and_get())
    finally:
        events.off("memory.read", seen)
    assert found is not None and found.value == {"text": "kept"} and threads
    on_loop = driver in ("redis", "sql-postgres", "sql-mysql") and not aio.hopping()
    assert all((thread == loop_thread) is on_loop for thread in threads)
