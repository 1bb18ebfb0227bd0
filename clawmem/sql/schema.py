"""The three tables, built per table prefix. clawmem creates these and writes to no others."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect, Engine

from clawmem.memory.rules import validate_prefix


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

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else value.rstrip(" ")


def _long_text() -> sa.types.TypeEngine[str]:
    # The dialect's largest text type: a 5 MB message must round-trip on MariaDB too.
    return sa.Text().with_variant(mysql.LONGTEXT(charset="utf8mb4"), "mysql", "mariadb")


def _datetime() -> sa.types.TypeEngine[Any]:
    # Microseconds everywhere, so (created_at, id) orders messages the same on every backend.
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


class Tables(NamedTuple):
    """The three tables of one prefix, and the metadata that creates them."""

    metadata: sa.MetaData
    conversations: sa.Table
    messages: sa.Table
    memory: sa.Table


@functools.cache
def tables(prefix: str = "") -> Tables:
    """Return the three tables for ``prefix`` (for example ``wp_`` or ``wp_2_``)."""
    validate_prefix(prefix)
    metadata = sa.MetaData()
    options = {"mysql_charset": "utf8mb4", "mysql_engine": "InnoDB"}
    conversations = sa.Table(
        f"{prefix}phpclaw_conversations",
        metadata,
        sa.Column("id", RowId(), primary_key=True),
        sa.Column("namespace", ExactString(100), nullable=False, server_default="default"),
        sa.Column("user_id", sa.String(180), nullable=False, server_default=""),
        sa.Column("title", sa.String(255), nullable=True),
        sa.Column("metadata", sa.Text, nullable=True),
        sa.Column("created_at", _datetime(), nullable=False),
        sa.Column("updated_at", _datetime(), nullable=False),
        sa.Index(f"{prefix}phpclaw_conv_ns_created", "namespace", "created_at"),
        # Serves the newest-first listing without a sort of the whole table.
        sa.Index(f"{prefix}phpclaw_conv_created", "created_at", "id"),
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
        sa.Column("created_at", _datetime(), nullable=False),
        sa.Index(f"{prefix}phpclaw_msg_conv_created", "conversation_id", "created_at"),
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
        **options,
    )
    return Tables(metadata, conversations, messages, memory)


def create_tables(engine: Engine, prefix: str = "") -> None:
    """Create the three tables of ``prefix`` if they do not exist, and any of their indexes an
    earlier version did not create (idempotent)."""
    schema = tables(prefix)
    schema.metadata.create_all(engine, checkfirst=True)
    inspector = sa.inspect(engine)
    for table in (schema.conversations, schema.messages, schema.memory):
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:
                index.create(engine)


def drop_tables(engine: Engine, prefix: str = "") -> None:
    """Drop the three tables of ``prefix`` if they exist."""
    tables(prefix).metadata.drop_all(engine, checkfirst=True)
