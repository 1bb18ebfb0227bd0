"""Rows another program wrote: plain-SQL writers for the three tables, and what a page answering
them must never show (a server error, a traceback, unescaped text)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from flask import Flask
from werkzeug.test import TestResponse

from clawmem.sql.engine import create_engine
from clawmem.sql.schema import tables
from tests.conftest import sql_url

# Markup that must only ever reach a page escaped.
MARK = "<hostile-mark>"
TRACEBACK = "Traceback (most recent call last)"
DATETIME_COLUMNS = {"created_at", "updated_at"}
DEEP = "[" * 990 + "]" * 990

# What another program may leave as a stored value's text, by a name for each (the value column
# of a SQL table, the value inside a Redis entry, a namespace file's "value"): JSON that clawmem
# never writes or reads, text that is not JSON, nesting past the limit, and readable values that
# must reach a page escaped. Every driver takes the same set.
HOSTILE_VALUES = {
    "nan": "NaN",
    "surrogate": '"\\ud800"',
    "infinity": '{"a": Infinity}',
    "overflow": "1e999",
    "nested": "[" * 70 + "]" * 70,
    "deep": DEEP,
    "empty": "",
    "not_json": "order shipped {not json",
    "marked_text": MARK + " {not json",
    "bell": '"abc ring \\u0007 twice"',
    "markup": f'"{MARK}"',
}


def dialect_of(backend: str) -> str:
    """Return SQLAlchemy's dialect name for a test backend name."""
    return {"sqlite": "sqlite", "mysql": "mysql", "postgres": "postgresql"}[backend]


def write_rows(
    backend: str,
    tmp_path: Any,
    prefix: str,
    *,
    conversations: Iterable[Mapping[str, Any]] = (),
    messages: Iterable[Mapping[str, Any]] = (),
    memory: Iterable[Mapping[str, Any]] = (),
) -> None:
    """Insert rows as another program would: plain SQL, no clawmem code, any value the column's
    database takes (MariaDB without strict mode, so zero dates go in; PostgreSQL casting text).

    A connection of its own, never the app's pool: the session settings stay here."""
    engine = create_engine(sql_url(backend, tmp_path), poolclass=sa.pool.NullPool)
    schema = tables(prefix)
    try:
        with engine.begin() as conn:
            if engine.dialect.name in ("mysql", "mariadb"):
                conn.exec_driver_sql("SET SESSION sql_mode = ''")
            for table, rows in (
                (schema.conversations, conversations),
                (schema.messages, messages),
                (schema.memory, memory),
            ):
                for row in rows:
                    conn.execute(sa.text(_insert(table.name, row, engine.dialect.name)), dict(row))
    finally:
        engine.dispose()


def _insert(table: str, row: Mapping[str, Any], dialect: str) -> str:
    def placeholder(column: str) -> str:
        if dialect == "postgresql" and column in DATETIME_COLUMNS:
            return f"CAST(:{column} AS timestamp)"
        if dialect == "postgresql" and column == "expires_at":
            return f"CAST(:{column} AS bigint)"
        return f":{column}"

    columns = list(row)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(map(placeholder, columns))})"


def wipe(backend: str, tmp_path: Any, prefix: str) -> None:
    """Delete every row of the three tables of ``prefix``."""
    engine = create_engine(sql_url(backend, tmp_path), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for table in tables(prefix)[1:]:
                conn.execute(sa.delete(table))
    finally:
        engine.dispose()


def assert_answered(response: TestResponse, url: str, allowed: Iterable[int] = (200,)) -> str:
    """Assert a page answered with an allowed status, no traceback and no unescaped markup;
    return its body."""
    body = response.get_data(as_text=True)
    assert response.status_code in set(allowed), (url, response.status_code, body[:600])
    assert TRACEBACK not in body, url
    assert MARK not in body and "<hostile-mark" not in body, url
    return body


def signed_in_client(app: Flask) -> Any:
    """Return a test client of ``app`` signed in as the test admin (who must exist)."""
    from tests.dashboard_helpers import sign_in

    client = app.test_client()
    response = sign_in(client)
    assert response.status_code == 302, response.get_data(as_text=True)
    return client


STAMP = "2024-05-01 12:00:00"


def conversation_row(number: int, **columns: Any) -> dict[str, Any]:
    """A plain conversations row numbered ``number``, with ``columns`` replacing its values."""
    row = {
        "id": f"hc{number:024d}",
        "namespace": "default",
        "user_id": f"raw-user-{number}",
        "title": f"Hostile {number}",
        "metadata": None,
        "created_at": STAMP,
        "updated_at": STAMP,
    }
    return {**row, **columns}


def message_row(number: int, conversation_id: str, **columns: Any) -> dict[str, Any]:
    """A plain messages row of ``conversation_id``, with ``columns`` replacing its values."""
    row = {
        "id": f"hm{number:024d}",
        "conversation_id": conversation_id,
        "role": "user",
        "content": f"message {number}",
        "tool_name": None,
        "tool_input": None,
        "created_at": STAMP,
    }
    return {**row, **columns}


def memory_row(number: int, **columns: Any) -> dict[str, Any]:
    """A plain memory row, with ``columns`` replacing its values."""
    row = {
        "id": f"hk{number:024d}",
        "namespace": "default",
        "lookup_key": f"key-{number}",
        "value": '"a value"',
        "metadata": None,
        "expires_at": None,
        "created_at": STAMP,
        "updated_at": STAMP,
    }
    return {**row, **columns}
