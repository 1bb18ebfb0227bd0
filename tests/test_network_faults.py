"""A commit whose answer never came back, on MariaDB and PostgreSQL.

A real TCP proxy (the one ``bench.faults`` drives) sits between clawmem and the server and, once
told, resets a connection right after the server has read its ``COMMIT``: the rows are stored but
the client only sees its connection drop. clawmem must report that failure and never run the
transaction again by itself, and a queued turn sent again with its job id must find its turn
stored, not write a second copy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from bench.faults import FaultProxy
from clawmem.ids import new_id
from clawmem.providers.echo import EchoProvider
from clawmem.settings import Settings
from clawmem.sql.engine import _async_connect_args, async_url, create_engine
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.turn.conversations import ConversationLog, Message
from clawmem.turn.pipeline import Claw
from tests.conftest import backend_url

PORTS = {"mysql": 3306, "postgres": 5432}


@pytest.fixture(params=sorted(PORTS))
def server(request: pytest.FixtureRequest, prefix: str, tmp_path: Any) -> Iterator[dict[str, Any]]:
    """The server's direct settings, settings through a fresh proxy to it, and the proxy."""
    url = backend_url(request.param)
    proxy = FaultProxy(("127.0.0.1", sa.engine.make_url(url).port or PORTS[request.param])).start()
    direct = Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix, pii_guard="off")
    proxied = Settings(
        instance_path=str(tmp_path), database_url=proxy.url_for(url), table_prefix=prefix, pii_guard="off"
    )
    engine = create_engine(url)
    create_tables(engine, prefix)
    yield {"direct": direct, "proxied": proxied, "proxy": proxy}
    proxy.stop()
    drop_tables(engine, prefix)
    engine.dispose()


def _user_texts(settings: Settings, conversation_id: str) -> list[str]:
    stored = ConversationLog.from_settings(settings).load(conversation_id)
    return [message.content for message in stored.messages if message.role == "user"] if stored else []


def test_a_cut_commit_fails_the_append_once_and_is_not_run_again(server: dict[str, Any]) -> None:
    log = ConversationLog.from_settings(server["proxied"])
    conversation_id = new_id()
    log.append(conversation_id, [Message("user", "first")])
    server["proxy"].set_fault("commit")
    with pytest.raises(sa.exc.DBAPIError):
        log.append(conversation_id, [Message("user", "second")])
    server["proxy"].set_fault(None)
    assert server["proxy"].commits_cut == 1
    # The server committed it, once: the error is the client's not knowing, and nothing retried.
    assert _user_texts(server["direct"], conversation_id) == ["first", "second"]
    log.append(conversation_id, [Message("user", "third")])  # the pool recovers at once
    assert _user_texts(server["direct"], conversation_id) == ["first", "second", "third"]


def test_a_queued_turn_sent_again_after_a_cut_commit_is_stored_once(server: dict[str, Any]) -> None:
    claw = Claw.from_settings(server["proxied"], EchoProvider())
    conversation_id, job_id = new_id(), new_id()
    claw.send("hello", conversation_id=conversation_id)
    server["proxy"].set_fault("commit")
    with pytest.raises(sa.exc.DBAPIError):
        claw.send("where is my parcel", conversation_id=conversation_id, job_id=job_id)
    # The worker's retry, with the fault still on: it finds the job's turn and commits nothing.
    reply = claw.send("where is my parcel", conversation_id=conversation_id, job_id=job_id)
    server["proxy"].set_fault(None)
    assert reply.text == "echo: where is my parcel"
    assert server["proxy"].commits_cut == 1
    assert _user_texts(server["direct"], conversation_id) == ["hello", "where is my parcel"]


# -- a server that stops answering ---------------------------------------------------------------


def test_sql_connections_have_timeouts_unless_the_url_sets_its_own() -> None:
    for url in (backend_url("mysql"), backend_url("postgres")):
        query = create_engine(url).url.query
        assert query["connect_timeout"] == "10"
        assert query.get("read_timeout", query.get("tcp_user_timeout")) in ("60", "60000")
    tuned = create_engine(backend_url("mysql") + "?read_timeout=7").url.query
    assert tuned["read_timeout"] == "7"  # the operator's own value wins


def test_the_async_twins_keep_the_timeouts_under_their_drivers_names() -> None:
    # What the async path's twin connects with: a pymysql or psycopg name the asyncio driver does
    # not take would fail every connect (asyncmy has no write_timeout, asyncpg no connect_timeout).
    mysql = async_url(create_engine(backend_url("mysql")).url)
    assert mysql is not None and "write_timeout" not in mysql.query
    assert (mysql.query["connect_timeout"], mysql.query["read_timeout"]) == ("10", "60")
    postgres = create_engine(backend_url("postgres")).url
    twin = async_url(postgres)
    assert twin is not None and not {"connect_timeout", "tcp_user_timeout"} & set(twin.query)
    assert _async_connect_args(postgres) == {"timeout": 10.0, "command_timeout": 60.0}


def test_a_stalled_mariadb_fails_the_append_in_bounded_time_and_loses_nothing(
    prefix: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default read timeout, shortened for the test: the URL itself sets no timeout.
    monkeypatch.setattr("clawmem.sql.engine.SQL_READ_TIMEOUT_SECONDS", 2)
    url = backend_url("mysql")
    proxy = FaultProxy(("127.0.0.1", sa.engine.make_url(url).port or PORTS["mysql"])).start()
    direct = Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix, pii_guard="off")
    engine = create_engine(url)
    create_tables(engine, prefix)
    try:
        log = ConversationLog.from_settings(direct.replace(database_url=proxy.url_for(url)))
        conversation_id = new_id()
        log.append(conversation_id, [Message("user", "first")])
        proxy.set_fault("timeout")
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="timed out|Lost connection"):
            log.append(conversation_id, [Message("user", "second")])
        assert time.monotonic() - started < 10  # not until TCP gives up
        proxy.set_fault(None)
        log.append(conversation_id, [Message("user", "third")])  # the pool recovers
        texts = _user_texts(direct, conversation_id)
        assert texts[0] == "first" and texts[-1] == "third"
        assert texts.count("second") <= 1  # the stalled append is stored at most once, never twice
    finally:
        proxy.stop()
        drop_tables(engine, prefix)
        engine.dispose()


def test_a_stalled_redis_fails_the_write_in_bounded_time_with_a_clear_error(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clawmem.errors import StorageError
    from clawmem.memory.redis import RedisMemory

    monkeypatch.setattr("clawmem.memory.redis.REDIS_READ_TIMEOUT_SECONDS", 1)
    url = backend_url("redis")
    port = int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    database = url.rsplit("/", 1)[1]
    proxy = FaultProxy(("127.0.0.1", port)).start()
    direct = RedisMemory(url=url, prefix=f"{prefix}:")
    memory = RedisMemory(url=f"redis://127.0.0.1:{proxy.port}/{database}", prefix=f"{prefix}:")
    try:
        memory.set("kept", "before the stall")
        proxy.set_fault("timeout")
        started = time.monotonic()
        with pytest.raises(StorageError, match="redis.*(Timeout|timed out)"):
            memory.set("stalled", "during the stall")
        assert time.monotonic() - started < 5
        proxy.set_fault(None)
        memory.set("after", "after the stall")  # the client reconnects
        assert direct.get("kept") == "before the stall"
        assert direct.get("after") == "after the stall"
    finally:
        proxy.stop()
        direct.flush()
