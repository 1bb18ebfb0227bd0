"""The three tables of a prefix as a whole: which exist, their rows and bytes per dialect (the
inspection query), and dropping them."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.sql.changes import change_table
from clawmem.sql.changes import has_table as has_change_table
from clawmem.sql.engine import connect
from clawmem.sql.schema import drop_tables, tables
from clawmem.sql.vectors import drop_vector_table, has_vector_table, vector_table


@dataclass(frozen=True)
class TableStats:
    """One table of the prefix: whether it exists, its exact row count and its size on disk.

    ``bytes`` is ``None`` when the database cannot tell (SQLite without the dbstat table).
    """

    name: str
    exists: bool
    rows: int | None
    bytes: int | None


def _three(prefix: str) -> list[sa.Table]:
    schema = tables(prefix)
    return [schema.conversations, schema.messages, schema.memory]


def table_names(prefix: str) -> list[str]:
    """Return the names of the prefix's three tables: conversations, messages, memory."""
    return [table.name for table in _three(prefix)]


def _mysql_sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    # The inspection query of the phpClaw article, limited to this prefix's tables.
    rows = conn.execute(
        sa.text(
            "SELECT table_name, data_length + index_length FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name IN :names"
        ).bindparams(sa.bindparam("names", expanding=True)),
        {"names": names},
    )
    return {name: int(size or 0) for name, size in rows}


def _postgres_sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    # Looked up by relname rather than a regclass cast, so a prefix with capitals needs no quoting.
    rows = conn.execute(
        sa.text(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname IN :names"
        ).bindparams(sa.bindparam("names", expanding=True)),
        {"names": names},
    )
    return {name: int(size) for name, size in rows}


def _sqlite_sizes(conn: Connection, names: list[str]) -> dict[str, int]:
    # dbstat lists b-trees by their own name, so a table's size is its b-tree plus its indexes'.
    owners = dict(
        conn.execute(
            sa.text("SELECT name, tbl_name FROM sqlite_master WHERE tbl_name IN :names").bindparams(
                sa.bindparam("names", expanding=True)
            ),
            {"names": names},
        ).all()
    )
    sizes = dict.fromkeys(names, 0)
    try:
        rows = conn.execute(
            sa.text("SELECT name, SUM(pgsize) FROM dbstat WHERE name IN :btrees GROUP BY name").bindparams(
                sa.bindparam("btrees", expanding=True)
            ),
            {"btrees": list(owners)},
        ).all()
    except sa.exc.OperationalError:
        return {}  # this SQLite was built without the dbstat virtual table
    for btree, size in rows:
        if btree in owners:
            sizes[owners[btree]] += int(size or 0)
    return sizes


_SIZE_QUERIES = {
    "mysql": _mysql_sizes,
    "mariadb": _mysql_sizes,
    "postgresql": _postgres_sizes,
    "sqlite": _sqlite_sizes,
}


def table_stats(engine: Engine, prefix: str) -> list[TableStats]:
    """Return rows and bytes of the prefix's three tables on MariaDB/MySQL, PostgreSQL or SQLite.

    Rows are exact counts; a missing table is reported with ``exists=False``.
    """
    found = {stats.name: stats for stats in existing_tables(engine, prefix)}
    sizes: dict[str, int] = {}
    if found:
        measure = _SIZE_QUERIES.get(engine.dialect.name)
        if measure is not None:
            with connect(engine) as conn:
                sizes = measure(conn, list(found))
    return [
        TableStats(name, name in found, found[name].rows if name in found else None, sizes.get(name))
        for name in table_names(prefix)
    ]


def sqlite_file_bytes(engine: Engine) -> int | None:
    """Return page_count * page_size of a SQLite database (the whole file), else ``None``."""
    if engine.dialect.name != "sqlite":
        return None
    with connect(engine) as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar()
    return int(pages or 0) * int(size or 0)


def present_tables(engine: Engine, prefix: str) -> list[str]:
    """Return the names of the prefix's three tables that exist, in :func:`table_names` order."""
    with connect(engine) as conn:
        existing = set(sa.inspect(conn).get_table_names())
    return [name for name in table_names(prefix) if name in existing]


def existing_tables(engine: Engine, prefix: str) -> list[TableStats]:
    """Return the prefix's tables that exist (the three, then the vectors and the change log
    derived from the memory table), with exact row counts (sizes left out)."""
    derived = (vector_table(prefix), change_table(prefix))
    with connect(engine) as conn:
        existing = set(sa.inspect(conn).get_table_names())
        counted = [table for table in (*_three(prefix), *derived) if table.name in existing]
        if not counted:
            return []
        # One statement for every count: one round trip, not four.
        select = sa.select(
            *(sa.select(sa.func.count()).select_from(table).scalar_subquery() for table in counted)
        )
        rows = conn.execute(select).one()
    return [
        TableStats(table.name, True, int(count or 0), None)
        for table, count in zip(counted, rows, strict=True)
    ]


def drop_prefix_tables(engine: Engine, prefix: str) -> list[str]:
    """Drop the prefix's three tables, its vectors table and its change log with the triggers
    (those that exist); return the names of the tables dropped."""
    present = present_tables(engine, prefix)
    if has_vector_table(engine, prefix):
        present.append(vector_table(prefix).name)
    with connect(engine) as conn:
        if has_change_table(conn, prefix):
            present.append(change_table(prefix).name)
    drop_tables(engine, prefix)
    drop_vector_table(engine, prefix)
    return present


TABLE_SUFFIXES = ("phpclaw_conversations", "phpclaw_messages", "phpclaw_memory")


def prefixes_found(engine: Engine) -> dict[str, list[str]]:
    """Return every table prefix that has one of the three tables in the database, sorted, with
    the names of those of its tables that exist: the sites this database holds, configured or not."""
    found: dict[str, list[str]] = {}
    for name in sorted(sa.inspect(engine).get_table_names()):
        for suffix in TABLE_SUFFIXES:
            if name.endswith(suffix):
                found.setdefault(name[: -len(suffix)], []).append(name)
    return dict(sorted(found.items()))
