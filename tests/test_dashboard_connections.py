"""What a page costs the database, and what a connection the server killed costs a page.

Each request reads on one connection of the pool (checked out once, returned at its end) and
sends at most a fixed number of queries; a connection killed under the pool fails no more than
the request that finds it, on MariaDB and PostgreSQL, where a server can kill one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.errors import StorageError
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import connect, held_connections
from dashboard import state
from tests.conftest import SQL_BACKENDS
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

# Queries a page may send, transaction control (BEGIN, COMMIT, ROLLBACK) not counted: the
# counts of these pages before their reads were spread over one connection each.
BUDGETS = {"overview": 11, "conversations": 4, "conversation": 4}
TRANSACTION_CONTROL = re.compile(r"\s*(BEGIN|COMMIT|ROLLBACK)\b", re.I)
# The Overview's table counts and sizes, taken once a minute: the tables' names, their row
# counts, their sizes (two on SQLite) and the messages per role.
TOTALS_QUERIES = 5
CONVERSATION_LINK = re.compile(r'href="(/conversations/[0-9A-Z]{26})"')


class Counted:
    """The queries and pool checkouts of the engine seen since the last :meth:`clear`."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.checkouts = 0

    def clear(self) -> None:
        self.queries.clear()
        self.checkouts = 0


@contextmanager
def counting(engine: sa.engine.Engine) -> Iterator[Counted]:
    """Count the queries and checkouts of ``engine`` inside the block."""
    counted = Counted()

    def query(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not TRANSACTION_CONTROL.match(statement):
            counted.queries.append(" ".join(statement.split()))

    def checkout(*args: Any) -> None:
        counted.checkouts += 1

    sa.event.listen(engine, "before_cursor_execute", query)
    sa.event.listen(engine.pool, "checkout", checkout)
    try:
        yield counted
    finally:
        sa.event.remove(engine, "before_cursor_execute", query)
        sa.event.remove(engine.pool, "checkout", checkout)


def _engine(app: Flask) -> sa.engine.Engine:
    with app.app_context():
        return state.engine()


def _cost(client: FlaskClient, counted: Counted, url: str) -> tuple[int, int]:
    counted.clear()
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(counted.queries), counted.checkouts


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_each_page_reads_on_one_connection_within_its_query_budget(
    app: Flask, demo: None, signed_in: FlaskClient, clock: FakeClock
) -> None:
    listing = page_text(signed_in.get("/conversations/"))
    conversations = sorted(set(CONVERSATION_LINK.findall(listing)))
    assert len(conversations) >= 20, "the demo's conversations are listed"
    signed_in.get("/")  # the first page of a process also opens the memory driver
    with counting(_engine(app)) as counted:
        costs = {
            "overview": _cost(signed_in, counted, "/"),
            "conversations": _cost(signed_in, counted, "/conversations/"),
        }
        # Every conversation: some hold recall records of several namespaces, some none.
        costs["conversation"] = max(_cost(signed_in, counted, url) for url in conversations)
        clock.advance(state.COUNTS_MAX_AGE + 1)
        recounted = _cost(signed_in, counted, "/")
    over = {page: queries for page, (queries, _) in costs.items() if queries > BUDGETS[page]}
    assert not over, f"pages over their query budget {BUDGETS}: {over}"
    assert {page: checkouts for page, (_, checkouts) in costs.items()} == dict.fromkeys(costs, 1)
    # Once a minute the Overview counts and measures the tables again, on the same connection.
    assert recounted[1] == 1
    assert recounted[0] <= BUDGETS["overview"] + TOTALS_QUERIES


def test_the_budget_counts_every_query_of_a_page(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    """A page that reads once more is seen: the counter is not blind to the views' reads."""
    with counting(_engine(app)) as counted:
        _cost(signed_in, counted, "/conversations/")
        before = len(counted.queries)
        counted.clear()
        with app.test_request_context():
            state.conversations().count()
        assert len(counted.queries) == 1
    assert before >= 2  # the page (its count read with it) and the namespaces of the filter


def test_reads_of_one_block_share_a_connection_returned_at_its_end(app: Flask) -> None:
    engine = _engine(app)
    with held_connections():
        with connect(engine) as first, connect(engine) as second:
            assert first is second
        with connect(engine) as again:
            assert again is first
        assert engine.pool.checkedout() == 1
    assert engine.pool.checkedout() == 0
    with connect(engine) as alone:
        assert alone is not first


@pytest.mark.parametrize("sql_backend", SQL_BACKENDS)
def test_a_failed_read_does_not_fail_the_reads_after_it(engine: sa.engine.Engine, prefix: str) -> None:
    """On PostgreSQL a failed statement aborts its transaction; the held connection begins anew."""
    with held_connections():
        with pytest.raises(sa.exc.DBAPIError), connect(engine) as conn:
            conn.execute(sa.text(f"SELECT missing_column FROM {prefix}phpclaw_memory"))
        with connect(engine) as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1


# -- a connection the server killed ------------------------------------------------------------

KILL = {
    "mysql": ("SELECT CONNECTION_ID()", "KILL {}"),
    "postgres": ("SELECT pg_backend_pid()", "SELECT pg_terminate_backend({})"),
}


@contextmanager
def server_ids(engine: sa.engine.Engine) -> Iterator[list[int]]:
    """Collect the server's id of every connection ``engine`` opens inside the block."""
    ids: list[int] = []
    ask = KILL[{"mysql": "mysql", "mariadb": "mysql", "postgresql": "postgres"}[engine.dialect.name]][0]

    def opened(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(ask)
        ids.append(int(cursor.fetchone()[0]))
        cursor.close()
        if engine.dialect.name == "postgresql":
            dbapi_connection.commit()  # the id query begins a transaction on psycopg

    sa.event.listen(engine, "connect", opened)
    try:
        yield ids
    finally:
        sa.event.remove(engine, "connect", opened)


def _kill(backend: str, url: str, ids: list[int]) -> None:
    # From a connection of its own, outside the pool under test.
    killer = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with killer.connect() as conn:
            for server_id in ids:
                conn.exec_driver_sql(KILL[backend][1].format(int(server_id)))
            conn.commit()
    finally:
        killer.dispose()


@pytest.mark.parametrize("dashboard_backend", ["mysql", "postgres"], indirect=True)
def test_a_killed_connection_fails_at_most_the_request_that_finds_it(
    app: Flask, demo: None, signed_in: FlaskClient, dashboard_backend: str
) -> None:
    engine = _engine(app)
    engine.dispose()  # every connection of the pool from here on is one the test knows
    with server_ids(engine) as ids:
        assert signed_in.get("/conversations/").status_code == 200
        assert ids, "the page opened a connection"
        _kill(dashboard_backend, engine.url.render_as_string(hide_password=False), ids)
        found = signed_in.get("/conversations/")
        after = signed_in.get("/conversations/")
    # The request in flight may fail, with the database's error page; the next one is whole.
    assert found.status_code in (200, 503), found.status_code
    if found.status_code == 503:
        assert "The storage behind this page failed" in page_text(found)
    assert after.status_code == 200
    assert len(set(CONVERSATION_LINK.findall(page_text(after)))) >= 20


@pytest.mark.parametrize("sql_backend", ["mysql", "postgres"])
def test_a_killed_connection_fails_at_most_one_operation_of_a_program(
    engine: sa.engine.Engine, prefix: str, sql_backend: str
) -> None:
    """Outside the dashboard (a worker, a command) each read checks a connection out: one that
    the server killed fails that read only."""
    memory = SqlMemory(engine, prefix)
    memory.set("order", "shipped")
    engine.dispose()
    with server_ids(engine) as ids:
        assert memory.get("order") == "shipped"
        _kill(sql_backend, engine.url.render_as_string(hide_password=False), ids)
        outcomes = []
        for _ in range(2):
            try:
                outcomes.append(memory.get("order"))
            except StorageError:
                outcomes.append("failed")
    assert outcomes in (["failed", "shipped"], ["shipped", "shipped"])
    assert outcomes[-1] == "shipped"
