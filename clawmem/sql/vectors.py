"""Every statement on ``{prefix}clawmem_vectors``: the entries' embeddings, a store derived from
the memory table and kept apart from it (phpClaw's shape has no column for them).

A row is one entry's unit vector: its namespace and key, the model id and dimension that made
it, a fingerprint of the text it was computed from, and the vector as bytes, its scale and int8
codes (:func:`clawmem.recall.persisted.pack_vector`), in a binary column; sealed, when
encryption at rest is on, as the ASCII of its sealed text. A table made before the column was
binary holds text (a mark and the base64 of the same bytes, or an older base64 of
little-endian float32): it is read and written as text until ``clawmem embed --replace``
makes the column binary (:func:`make_binary`, which keeps every row's bytes) and rewrites its
rows. ``init-db`` creates the table; ``uninstall`` drops it with the three tables.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from clawmem.codecs import VectorData, read_vector
from clawmem.rules import validate_prefix
from clawmem.sql.lenient import as_text
from clawmem.sql.schema import ExactString

VectorRow = tuple[str, str, VectorData]  # (key, text fingerprint, vector: bytes or text)
_CHUNK = 500  # keys per IN (...) list


class VectorColumn(sa.types.TypeDecorator[VectorData]):
    """The ``vector`` column: binary (MEDIUMBLOB on MariaDB), its values bound and read as the
    driver gives them, so that a table whose column is still text reads and takes text."""

    impl = sa.LargeBinary
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.MEDIUMBLOB())
        return dialect.type_descriptor(sa.LargeBinary())

    def bind_processor(self, dialect: sa.Dialect) -> None:
        return None

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> None:
        return None


@functools.cache
def vector_table(prefix: str = "") -> sa.Table:
    """Return the vectors table of ``prefix``."""
    validate_prefix(prefix)
    return sa.Table(
        f"{prefix}clawmem_vectors",
        sa.MetaData(),
        sa.Column("namespace", ExactString(100), primary_key=True),
        # 255: phpClaw's shape holds keys that long, written by other programs.
        sa.Column("lookup_key", ExactString(255), primary_key=True),
        sa.Column("model_id", sa.String(100), nullable=False),
        sa.Column("dimension", sa.Integer, nullable=False),
        sa.Column("text_print", sa.String(64), nullable=False),
        sa.Column("vector", VectorColumn(), nullable=False),
        # Answers "which models made these vectors" from the index, not a scan of every vector.
        sa.Index(f"{prefix}clawmem_vectors_model", "model_id", "dimension"),
        mysql_charset="utf8mb4",
        mysql_engine="InnoDB",
    )


def has_vector_table(engine: Engine, prefix: str) -> bool:
    """Return whether the vectors table of ``prefix`` exists."""
    return sa.inspect(engine).has_table(vector_table(prefix).name)


def create_vector_table(engine: Engine, prefix: str) -> bool:
    """Create the vectors table of ``prefix`` unless it exists; return whether it was created."""
    if has_vector_table(engine, prefix):
        return False
    vector_table(prefix).create(engine, checkfirst=True)
    return True


def drop_vector_table(engine: Engine, prefix: str) -> None:
    """Drop the vectors table of ``prefix`` if it exists."""
    vector_table(prefix).drop(engine, checkfirst=True)


def is_binary(engine: Engine, prefix: str) -> bool:
    """Return whether the vectors table of ``prefix`` stores bytes: its column is binary (on
    SQLite any column holds bytes as they are)."""
    if engine.dialect.name == "sqlite":
        return True
    columns = sa.inspect(engine).get_columns(vector_table(prefix).name)
    found = [column["type"] for column in columns if column["name"] == "vector"]
    return bool(found) and isinstance(found[0], sa.types._Binary)


def make_binary(engine: Engine, prefix: str) -> bool:
    """Make the ``vector`` column of a table made when it held text binary, keeping each row's
    bytes (its text's ASCII); return whether it changed."""
    if is_binary(engine, prefix):
        return False
    name = vector_table(prefix).name  # validated: letters, digits and underscores
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(
                f"ALTER TABLE {name} ALTER COLUMN vector TYPE bytea USING convert_to(vector, 'UTF8')"
            )
        else:
            conn.exec_driver_sql(f"ALTER TABLE {name} MODIFY vector MEDIUMBLOB NOT NULL")
    return True


def _bound(data: VectorData, binary: bool) -> VectorData:
    """Return a vector as the column takes it: bytes where it is binary, text where it is not."""
    if binary and isinstance(data, str):
        return data.encode("ascii")
    return data


def models(conn: Connection, prefix: str) -> list[tuple[str, int]]:
    """Return every ``(model id, dimension)`` the table holds vectors of."""
    table = vector_table(prefix)
    rows = conn.execute(sa.select(table.c.model_id, table.c.dimension).distinct())
    return sorted((as_text(model) or "", int(dimension)) for model, dimension in rows)


def namespaces(conn: Connection, prefix: str) -> list[str]:
    """Return every namespace the table holds vectors of."""
    table = vector_table(prefix)
    return sorted(as_text(name) or "" for (name,) in conn.execute(sa.select(table.c.namespace).distinct()))


def replace_vector(
    conn: Connection, prefix: str, namespace: str, key: str, old: VectorData, new: VectorData, binary: bool
) -> int:
    """Store ``new`` as the vector of ``key`` only where it still holds ``old``; return
    whether it changed (``binary``: the column is, :func:`is_binary`)."""
    table = vector_table(prefix)
    return conn.execute(
        sa.update(table)
        .where(
            table.c.namespace == namespace,
            table.c.lookup_key == key,
            table.c.vector == _bound(old, binary),
        )
        .values(vector=_bound(new, binary))
    ).rowcount


def namespace_rows(conn: Connection, prefix: str, namespace: str) -> Iterator[VectorRow]:
    """Yield every vector row of ``namespace``, read as they are consumed (not all held at once)."""
    table = vector_table(prefix)
    rows = conn.execute(
        sa.select(table.c.lookup_key, table.c.text_print, table.c.vector).where(
            table.c.namespace == namespace
        )
    )
    for part in rows.partitions(_CHUNK):  # fetched a few hundred rows at a time, not one by one
        for key, printed, vector in part:
            yield as_text(key) or "", as_text(printed) or "", read_vector(vector)


def rows_of_keys(conn: Connection, prefix: str, namespace: str, keys: Sequence[str]) -> list[VectorRow]:
    """Return the vector rows of ``keys`` in ``namespace`` that exist."""
    table = vector_table(prefix)
    found: list[VectorRow] = []
    for start in range(0, len(keys), _CHUNK):
        rows = conn.execute(
            sa.select(table.c.lookup_key, table.c.text_print, table.c.vector).where(
                table.c.namespace == namespace, table.c.lookup_key.in_(list(keys[start : start + _CHUNK]))
            )
        )
        found.extend((as_text(key) or "", as_text(p) or "", read_vector(v)) for key, p, v in rows)
    return found


def prints_of(conn: Connection, prefix: str, namespace: str) -> dict[str, str]:
    """Return the text fingerprint of every vector of ``namespace``, by key."""
    table = vector_table(prefix)
    rows = conn.execute(
        sa.select(table.c.lookup_key, table.c.text_print).where(table.c.namespace == namespace)
    )
    return {as_text(key) or "": as_text(printed) or "" for key, printed in rows}


def upsert_vectors(
    conn: Connection,
    prefix: str,
    namespace: str,
    model_id: str,
    dimension: int,
    rows: Iterable[VectorRow],
    binary: bool = True,
) -> None:
    """Create or replace the vectors of ``rows``: one statement, executed for every row at once
    (``binary``: the column is, :func:`is_binary`)."""
    table = vector_table(prefix)
    params = [
        {
            "namespace": namespace,
            "lookup_key": key,
            "model_id": model_id,
            "dimension": dimension,
            "text_print": printed,
            "vector": _bound(vector, binary),
        }
        for key, printed, vector in rows
    ]
    if not params:
        return
    changes = ("model_id", "dimension", "text_print", "vector")
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        insert = mysql.insert(table)
        statement = insert.on_duplicate_key_update({name: insert.inserted[name] for name in changes})
    else:
        module = postgresql if dialect == "postgresql" else sqlite
        insert = module.insert(table)
        statement = insert.on_conflict_do_update(
            index_elements=["namespace", "lookup_key"],
            set_={name: insert.excluded[name] for name in changes},
        )
    conn.execute(statement, params)


def delete_keys(conn: Connection, prefix: str, namespace: str, keys: Sequence[str]) -> int:
    """Delete the vectors of ``keys`` in ``namespace``; return how many went."""
    table = vector_table(prefix)
    deleted = 0
    for start in range(0, len(keys), _CHUNK):
        chunk = list(keys[start : start + _CHUNK])
        deleted += conn.execute(
            sa.delete(table).where(table.c.namespace == namespace, table.c.lookup_key.in_(chunk))
        ).rowcount
    return deleted


def delete_stale(conn: Connection, prefix: str, namespace: str, key: str, printed: str) -> int:
    """Delete the vector of ``key`` only if it was computed from the text of ``printed``: a
    vector of the entry's newer text, written meanwhile by another worker, stays."""
    table = vector_table(prefix)
    return conn.execute(
        sa.delete(table).where(
            table.c.namespace == namespace, table.c.lookup_key == key, table.c.text_print == printed
        )
    ).rowcount


def delete_namespace(conn: Connection, prefix: str, namespace: str) -> int:
    """Delete every vector of ``namespace``; return how many went."""
    table = vector_table(prefix)
    return conn.execute(sa.delete(table).where(table.c.namespace == namespace)).rowcount


def delete_other_models(conn: Connection, prefix: str, model_id: str, dimension: int) -> int:
    """Delete every vector not made by ``model_id`` at ``dimension``; return how many went."""
    table = vector_table(prefix)
    return conn.execute(
        sa.delete(table).where(sa.or_(table.c.model_id != model_id, table.c.dimension != dimension))
    ).rowcount


def count(conn: Connection, prefix: str, namespace: str | None = None) -> int:
    """Return how many vectors the table holds (of ``namespace`` when given)."""
    table = vector_table(prefix)
    query = sa.select(sa.func.count()).select_from(table)
    if namespace is not None:
        query = query.where(table.c.namespace == namespace)
    return int(conn.execute(query).scalar_one())
