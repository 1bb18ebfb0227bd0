"""The three tables, built per table prefix. clawmem creates these and writes to no others.

They come in two shapes (SPEC 4.8): ours (``clawmem``) and the one phpClaw's WordPress plugin
creates (``phpclaw-wordpress``), where the memory table has no ``metadata`` column, holds
``serialize()`` text and a UTC ``DATETIME`` expiry, and a conversation's ``user_id`` is a
WordPress user id. The shape of existing tables is read by :func:`detect_shape`; every place
that opens a site checks it against ``CLAW_SCHEMA`` with :func:`check_shape`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import Dialect, Engine, make_url

from clawmem.errors import ConfigError
from clawmem.rules import validate_prefix
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA
from clawmem.sql import changes as change_log
from clawmem.sql.lenient import LenientDateTime, as_text


class ExactString(sa.types.TypeDecorator[str]):
    """VARCHAR that compares exactly on every backend.

    MariaDB and MySQL default to case-insensitive, pad-space collations, under which ``"a"``,
    ``"A"`` and ``"a "`` collide in a unique index. There the column gets a binary, no-pad
    collation instead.
    """

    impl = sa.String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            collation = "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"
            return dialect.type_descriptor(mysql.VARCHAR(self.length, charset="utf8mb4", collation=collation))
        return dialect.type_descriptor(sa.String(self.length))


class RowId(sa.types.TypeDecorator[str]):
    """CHAR(26) holding a ULID or a conversation id, read back without padding.

    CHAR pads a shorter id with spaces, which PostgreSQL returns as stored; stripping them on
    read means every caller sees the id it wrote. On MariaDB/MySQL the column is ASCII with a
    binary collation, so ids that differ only in case (``c1``, ``C1``) stay two rows.
    """

    impl = sa.CHAR(26)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.CHAR(26, charset="ascii", collation="ascii_bin"))
        return dialect.type_descriptor(sa.CHAR(26))

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        text = as_text(value)  # SQLite keeps whatever another program wrote, bytes included
        return None if text is None else text.rstrip(" ")


def _long_text() -> sa.types.TypeEngine[str]:
    # The dialect's largest text type: a 5 MB message must round-trip on MariaDB too.
    return sa.Text().with_variant(mysql.LONGTEXT(charset="utf8mb4"), "mysql", "mariadb")


def _datetime() -> sa.types.TypeEngine[Any]:
    # Microseconds everywhere, so (created_at, id) orders messages the same on every backend;
    # read leniently, since another program may have written anything there.
    return LenientDateTime()


class UserId(sa.types.TypeDecorator[str]):
    """A conversation's subject, always read back as a ``str``: ``VARCHAR(180)`` in our shape
    (``""`` is anonymous), a WordPress user id (``BIGINT UNSIGNED NULL``) in phpClaw's, where
    ``7`` reads as ``"7"`` and ``NULL`` as ``""``."""

    impl = sa.String(180)
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> str:
        return "" if value is None else str(value)


def _seconds() -> sa.types.TypeEngine[Any]:
    # phpClaw's DATETIME: whole seconds, stored as MariaDB shows it ("2026-12-01 02:51:17").
    whole = "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d"
    return (
        sa.DateTime()
        .with_variant(mysql.DATETIME(), "mysql", "mariadb")
        .with_variant(sqlite.DATETIME(storage_format=whole), "sqlite")
    )


# Columns our shape gained after its first release: init-db adds them to existing tables.
# phpClaw's shape never gets them (SPEC 4.1), so there what they hold reads as "not reported".
ADDED_COLUMNS = {"conversations": ("total_tokens",), "messages": ("metadata",)}


def row_columns(table: sa.Table, shape: str = CLAWMEM_SCHEMA) -> list[sa.Column[Any]]:
    """Return the columns of ``table`` (a conversations or messages table of :func:`tables`)
    that its rows have in ``shape``: all of them in ours, all but :data:`ADDED_COLUMNS` in
    phpClaw's. A whole-row read selects these."""
    if shape == CLAWMEM_SCHEMA:
        return list(table.c)
    part = table.name.rpartition("phpclaw_")[2]
    return [column for column in table.c if column.name not in ADDED_COLUMNS.get(part, ())]


class Tables(NamedTuple):
    """The three tables of one prefix, and the metadata that creates them.

    The conversations and messages tables are the same objects in both shapes: their columns
    have the same names and read the same (see :class:`UserId`), so every statement on them
    works on either. Only the memory table differs between the shapes' statements.
    """

    metadata: sa.MetaData
    conversations: sa.Table
    messages: sa.Table
    memory: sa.Table


@functools.cache
def tables(prefix: str = "", shape: str = CLAWMEM_SCHEMA) -> Tables:
    """Return the three tables for ``prefix`` (for example ``wp_`` or ``wp_2_``) in ``shape``
    (``clawmem`` or ``phpclaw-wordpress``)."""
    if shape == PHPCLAW_SCHEMA:
        ours, theirs = tables(prefix), _phpclaw_tables(prefix)
        return Tables(theirs.metadata, ours.conversations, ours.messages, theirs.memory)
    if shape != CLAWMEM_SCHEMA:
        raise ConfigError(f"unknown table shape {shape!r}; use {CLAWMEM_SCHEMA} or {PHPCLAW_SCHEMA}")
    validate_prefix(prefix)
    metadata = sa.MetaData()
    options = {"mysql_charset": "utf8mb4", "mysql_engine": "InnoDB"}
    conversations = sa.Table(
        f"{prefix}phpclaw_conversations",
        metadata,
        sa.Column("id", RowId(), primary_key=True),
        sa.Column("namespace", ExactString(100), nullable=False, server_default="default"),
        sa.Column("user_id", UserId(), nullable=False, server_default=""),
        sa.Column("title", sa.String(255), nullable=True),
        sa.Column("metadata", sa.Text, nullable=True),
        sa.Column("created_at", _datetime(), nullable=False),
        sa.Column("updated_at", _datetime(), nullable=False),
        sa.Column("total_tokens", sa.BigInteger, nullable=True),
        sa.Index(f"{prefix}phpclaw_conv_ns_created", "namespace", "created_at"),
        # Serve each order of the dashboard's list (see sql/conversations.py SORTS) without a
        # sort of the whole table.
        sa.Index(f"{prefix}phpclaw_conv_created", "created_at", "id"),
        sa.Index(f"{prefix}phpclaw_conv_updated", "updated_at", "id"),
        sa.Index(f"{prefix}phpclaw_conv_title", "title", "id"),
        sa.Index(f"{prefix}phpclaw_conv_tokens", "total_tokens", "id"),
        sa.Index(f"{prefix}phpclaw_conv_user_ns_updated", "user_id", "namespace", "updated_at"),
        **options,
    )
    messages = sa.Table(
        f"{prefix}phpclaw_messages",
        metadata,
        sa.Column("id", RowId(), primary_key=True),
        sa.Column("conversation_id", RowId(), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("content", _long_text(), nullable=True),
        sa.Column("tool_name", sa.String(255), nullable=True),
        sa.Column("tool_input", sa.Text, nullable=True),
        sa.Column("metadata", sa.Text, nullable=True),
        sa.Column("created_at", _datetime(), nullable=False),
        sa.Index(f"{prefix}phpclaw_msg_conv_created", "conversation_id", "created_at"),
        # Counts a conversation's (or a subject's) messages by role from the index alone.
        sa.Index(f"{prefix}phpclaw_msg_conv_role", "conversation_id", "role"),
        # Serves the Overview's messages per day and the newest user messages (cold memory).
        sa.Index(f"{prefix}phpclaw_msg_created", "created_at", "id"),
        **options,
    )
    memory = sa.Table(
        f"{prefix}phpclaw_memory",
        metadata,
        sa.Column("id", RowId(), primary_key=True),
        sa.Column("namespace", ExactString(100), nullable=False, server_default="default"),
        sa.Column("lookup_key", ExactString(191), nullable=False),
        sa.Column("value", _long_text(), nullable=False),
        sa.Column("metadata", sa.Text, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=True),
        sa.Column("created_at", _datetime(), nullable=False),
        sa.Column("updated_at", _datetime(), nullable=False),
        sa.UniqueConstraint("namespace", "lookup_key", name=f"{prefix}phpclaw_mem_ns_key"),
        sa.Index(f"{prefix}phpclaw_mem_ns_expires", "namespace", "expires_at"),
        # Lets the recall index read what changed since it last looked (see memory/sql.py).
        sa.Index(f"{prefix}phpclaw_mem_ns_updated", "namespace", "updated_at"),
        # Serves the Overview's memory rows over time (rows first written per day).
        sa.Index(f"{prefix}phpclaw_mem_created", "created_at"),
        # Serve a namespace's keys by last write and by expiry, ties by key (sql/kv.py SORTS).
        sa.Index(f"{prefix}phpclaw_mem_ns_updated_key", "namespace", "updated_at", "lookup_key"),
        sa.Index(f"{prefix}phpclaw_mem_ns_expires_key", "namespace", "expires_at", "lookup_key"),
        **options,
    )
    return Tables(metadata, conversations, messages, memory)


# -- phpClaw's WordPress shape ----------------------------------------------------------------

# phpClaw's own key names. MariaDB names keys per table; SQLite names indexes per database, so
# there they carry the table's name in front.
PHPCLAW_INDEXES = {
    "conversations": {
        "namespace_created_at": ("namespace", "created_at"),
        "user_id_namespace_updated": ("user_id", "namespace", "updated_at"),
    },
    "messages": {"conversation_id_created_at": ("conversation_id", "created_at")},
    "memory": {"namespace_expires_at": ("namespace", "expires_at")},
}


@functools.cache
def _phpclaw_tables(prefix: str) -> Tables:
    """phpClaw's WordPress DDL (its migration, WordPress's utf8mb4_unicode_520_ci collation):
    secondary keys are made by :func:`create_tables`, under the names of :data:`PHPCLAW_INDEXES`."""
    validate_prefix(prefix)
    metadata = sa.MetaData()
    options = {
        "mysql_engine": "InnoDB",
        "mysql_charset": "utf8mb4",
        "mysql_collate": "utf8mb4_unicode_520_ci",
    }
    text = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
    conversations = sa.Table(
        f"{prefix}phpclaw_conversations",
        metadata,
        sa.Column("id", sa.CHAR(26), primary_key=True),
        sa.Column("namespace", sa.String(100), nullable=False, server_default="default"),
        sa.Column("title", sa.String(255), nullable=True),
        sa.Column("metadata", sa.Text().with_variant(mysql.JSON(), "mysql", "mariadb"), nullable=True),
        sa.Column(
            "user_id", sa.BigInteger().with_variant(mysql.BIGINT(20, unsigned=True), "mysql", "mariadb")
        ),
        sa.Column("created_at", _seconds(), nullable=False),
        sa.Column("updated_at", _seconds(), nullable=False),
        **options,
    )
    messages = sa.Table(
        f"{prefix}phpclaw_messages",
        metadata,
        sa.Column("id", sa.CHAR(26), primary_key=True),
        sa.Column("conversation_id", sa.CHAR(26), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("content", text, nullable=True),
        sa.Column("tool_name", sa.String(255), nullable=True),
        sa.Column("tool_input", sa.Text, nullable=True),
        sa.Column("created_at", _seconds(), nullable=False),
        **options,
    )
    memory = sa.Table(
        f"{prefix}phpclaw_memory",
        metadata,
        sa.Column("id", sa.CHAR(26), primary_key=True),
        sa.Column("namespace", sa.String(100), nullable=False, server_default="default"),
        sa.Column("lookup_key", sa.String(255), nullable=False),
        sa.Column("value", text, nullable=False),
        sa.Column("expires_at", _seconds(), nullable=True),
        sa.Column("created_at", _seconds(), nullable=False),
        sa.Column("updated_at", _seconds(), nullable=False),
        sa.UniqueConstraint("namespace", "lookup_key", name="namespace_key"),
        **options,
    )
    return Tables(metadata, conversations, messages, memory)


def _is_datetime(column: dict[str, Any]) -> bool:
    return isinstance(column["type"], sa.DateTime)


def _is_integer(column: dict[str, Any]) -> bool:
    return isinstance(column["type"], sa.Integer)


def detect_shape(engine: Engine, prefix: str = "") -> str | None:
    """Return the shape of the existing tables of ``prefix``, or ``None`` when there are none.

    The memory table decides: phpClaw's has no ``metadata`` column and a ``DATETIME`` expiry,
    ours has both a ``metadata`` column and a Unix-seconds expiry. Without a memory table the
    conversations table does: a numeric ``user_id`` is a WordPress user id. Raises
    :class:`ConfigError` for tables of neither shape.
    """
    inspector = sa.inspect(engine)
    present = set(inspector.get_table_names())
    memory, conversations = f"{prefix}phpclaw_memory", f"{prefix}phpclaw_conversations"
    if memory in present:
        columns = {column["name"]: column for column in inspector.get_columns(memory)}
        expires = columns.get("expires_at")
        if expires is not None and "metadata" not in columns and _is_datetime(expires):
            return PHPCLAW_SCHEMA
        if expires is not None and "metadata" in columns and _is_integer(expires):
            return CLAWMEM_SCHEMA
        raise ConfigError(
            f"the table {memory} has neither clawmem's shape nor phpClaw's WordPress shape "
            "(see CLAW_SCHEMA); clawmem will not read or write it"
        )
    if conversations in present:
        columns = {column["name"]: column for column in inspector.get_columns(conversations)}
        if "user_id" in columns:
            return PHPCLAW_SCHEMA if _is_integer(columns["user_id"]) else CLAWMEM_SCHEMA
    return None


def check_shape(engine: Engine, prefix: str, wanted: str) -> str:
    """Return the shape to use for the tables of ``prefix``: with ``wanted`` empty (``CLAW_SCHEMA``
    unset), the existing tables' shape, or ``clawmem`` when there are none; otherwise ``wanted``
    if the tables are missing or have that shape, else raise :class:`ConfigError` in one line
    naming both. phpClaw's shape is refused on PostgreSQL, where WordPress does not run."""
    if not wanted:
        return detect_shape(engine, prefix) or CLAWMEM_SCHEMA
    if wanted == PHPCLAW_SCHEMA and make_url(str(engine.url)).get_backend_name() == "postgresql":
        raise ConfigError(
            f"CLAW_SCHEMA is {PHPCLAW_SCHEMA}, which exists on MariaDB/MySQL (and SQLite), not PostgreSQL"
        )
    found = detect_shape(engine, prefix)
    if found is not None and found != wanted:
        raise ConfigError(
            f"CLAW_SCHEMA is {wanted} but the existing tables of prefix {prefix!r} have the {found} "
            f"shape; set CLAW_SCHEMA={found} to use them"
        )
    return wanted


def _create_missing(engine: Engine, metadata: sa.MetaData) -> set[str]:
    """Create the tables of ``metadata`` that do not exist, with their indexes, and return
    their names.

    MariaDB and MySQL alter a table once for each ``CREATE INDEX``, which takes longer than
    creating it, so there a new table is created with its indexes in one statement."""
    quote = engine.dialect.identifier_preparer.quote
    created = set()
    with engine.begin() as conn:
        existing = set(sa.inspect(conn).get_table_names())
        for table in metadata.sorted_tables:
            if table.name in existing:
                continue
            created.add(table.name)
            if engine.dialect.name not in ("mysql", "mariadb"):
                table.create(conn)
                continue
            statement = str(sa.schema.CreateTable(table).compile(dialect=engine.dialect))
            head, closing, options = statement.rpartition("\n)")
            indexes = [
                f"{'UNIQUE ' if index.unique else ''}INDEX {quote(str(index.name))} "
                f"({', '.join(quote(column.name) for column in index.columns)})"
                for index in sorted(table.indexes, key=lambda index: str(index.name))
            ]
            conn.exec_driver_sql("".join((head, *(f", \n\t{index}" for index in indexes), closing, options)))
    return created


def _create_phpclaw_indexes(engine: Engine, prefix: str) -> None:
    schema = _phpclaw_tables(prefix)
    quote = engine.dialect.identifier_preparer.quote
    by_table = {"conversations": schema.conversations, "messages": schema.messages, "memory": schema.memory}
    with engine.begin() as conn:
        inspector = sa.inspect(conn)
        for part, indexes in PHPCLAW_INDEXES.items():
            table = by_table[part].name
            present = {index["name"] for index in inspector.get_indexes(table)}
            for name, columns in indexes.items():
                named = name if engine.dialect.name in ("mysql", "mariadb") else f"{table}_{name}"
                if named not in present:
                    listed = ", ".join(quote(column) for column in columns)
                    conn.exec_driver_sql(f"CREATE INDEX {quote(named)} ON {quote(table)} ({listed})")


def create_tables(engine: Engine, prefix: str = "", shape: str = CLAWMEM_SCHEMA) -> list[str]:
    """Create the three tables of ``prefix`` in ``shape`` if they do not exist, and bring
    existing tables of our shape up to date: the columns of :data:`ADDED_COLUMNS` and the
    indexes an earlier version did not create (idempotent). Return what it added to existing
    tables. Raises :class:`ConfigError`, creating nothing, when tables of the other shape exist."""
    check_shape(engine, prefix, shape)
    if shape == PHPCLAW_SCHEMA:
        _create_missing(engine, _phpclaw_tables(prefix).metadata)
        _create_phpclaw_indexes(engine, prefix)
        return []
    schema = tables(prefix)
    created = _create_missing(engine, schema.metadata)
    changes = _install_change_log(engine, prefix, fresh=bool(created))
    inspector = sa.inspect(engine)
    quote = engine.dialect.identifier_preparer.quote
    for part, table in (("conversations", schema.conversations), ("messages", schema.messages)):
        if table.name in created:
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for name in ADDED_COLUMNS[part]:
            if name not in present:
                kind = table.c[name].type.compile(dialect=engine.dialect)
                with engine.begin() as conn:
                    conn.exec_driver_sql(
                        f"ALTER TABLE {quote(table.name)} ADD COLUMN {quote(name)} {kind} NULL"
                    )
                changes.append(f"added column {table.name}.{name}")
    for table in (schema.conversations, schema.messages, schema.memory):
        if table.name in created:
            continue
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:
                index.create(engine)
                changes.append(f"added index {index.name}")
    return changes


def _install_change_log(engine: Engine, prefix: str, fresh: bool) -> list[str]:
    """Add the change log to our shape's tables (see :mod:`clawmem.sql.changes`); return what
    was added to tables that existed before, or why it could not be (recall then counts)."""
    try:
        added = change_log.install(engine, prefix)
    except sa.exc.SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return [f"change log not installed ({reason}): recall counts the namespace each turn"]
    return [change_log.added(prefix)] if added and not fresh else []


def drop_tables(engine: Engine, prefix: str = "") -> None:
    """Drop the three tables of ``prefix`` and the change log, those that exist."""
    change_log.uninstall(engine, prefix)
    tables(prefix).metadata.drop_all(engine, checkfirst=True)
