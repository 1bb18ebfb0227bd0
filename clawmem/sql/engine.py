"""Engines: one per database URL per process, configured the same way everywhere."""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers run beside one writer; the busy timeout makes concurrent writers wait
    # for the lock instead of failing with "database is locked".
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 30000")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def create_engine(url: str, **options: Any) -> Engine:
    """Return a new engine for ``url`` with utf8mb4 on MySQL/MariaDB and WAL on SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    options.setdefault("pool_pre_ping", True)
    engine = sa.create_engine(parsed, **options)
    if parsed.get_backend_name() == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


@functools.cache
def engine_for(url: str) -> Engine:
    """Return the process-wide shared engine for ``url``."""
    return create_engine(url)
