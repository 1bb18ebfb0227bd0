"""Encryption at rest as a whole (SPEC 13): the start-up check of the keys against the newest rows
under each key id, and the state the dashboard shows (key ids in use, rows per key, plaintext
rows left). The envelope, keys and cipher are in :mod:`clawmem.crypto`; the statements in
:mod:`clawmem.sql.keys`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from clawmem.crypto import Cipher, Context
from clawmem.errors import Undecryptable
from clawmem.sql import keys as sql
from clawmem.sql.engine import connect
from clawmem.sql.sizes import present_tables

log = logging.getLogger("clawmem.encryption.state")


def _context(prefix: str, row: sql.SealedRow) -> Context:
    if row.table == "memory":
        return Context.entry(prefix, row.namespace or "", row.key or "", row.column)
    return Context.row(prefix, row.table, row.row_id, row.column)


def check_keys(engine: Engine, prefix: str, cipher: Cipher) -> int:
    """Decrypt, in every encrypted column of the prefix's tables, the newest row under each
    configured key id and the newest sealed row of all (whatever key id it names); return how
    many rows were checked (0 for an empty database, or one without the tables).

    Raises :class:`~clawmem.errors.Undecryptable` naming the table, row id (or namespace and
    key), column and key id when one cannot be opened: a missing key, a wrong key or altered
    text is found at start-up, not at the first read.
    """
    return _check_present(engine, prefix, cipher) if present_tables(engine, prefix) else 0


def _check_present(engine: Engine, prefix: str, cipher: Cipher) -> int:
    key_ids: list[str | None] = [None, *(cipher.keyring.key_ids if cipher.keyring else ())]
    checked: set[tuple[str, str, str, str | None, str | None]] = set()
    with connect(engine) as conn:
        for key_id in key_ids:
            for row in sql.newest_sealed(conn, prefix, key_id):
                place = (row.table, row.column, row.row_id, row.namespace, row.key)
                if place in checked:
                    continue
                checked.add(place)
                cipher.open(row.text, _context(prefix, row))
    return len(checked)


@dataclass(frozen=True)
class EncryptionState:
    """What the dashboard shows of encryption: whether it is on, the key that encrypts and those
    that decrypt (ids only, never a key), strict mode, and, when counted, rows per key id and
    plaintext rows left per encrypted column. ``problem`` is the start-up check's error."""

    enabled: bool
    primary_id: str | None
    key_ids: tuple[str, ...]
    strict: bool
    columns: tuple[sql.ColumnKeys, ...] = ()
    counted: bool = False
    problem: str | None = None
    memory_counted: bool = True
    per_key: dict[str, int] = field(default_factory=dict)

    @property
    def plaintext_rows(self) -> int:
        """Return the plaintext rows left in every encrypted column counted."""
        return sum(column.plaintext for column in self.columns)


def encryption_state(
    engine: Engine, prefix: str, cipher: Cipher, count: bool = True, sql_memory: bool = True
) -> EncryptionState:
    """Return the encryption state of one site; with ``count``, scan the encrypted columns for
    rows per key id (two grouped queries per column: the Settings page's, never the Overview's).
    ``sql_memory`` says whether the memory table is the site's store (else its counts are left out)."""
    keyring = cipher.keyring
    state = EncryptionState(
        enabled=cipher.enabled,
        primary_id=cipher.primary_id,
        key_ids=keyring.key_ids if keyring else (),
        strict=cipher.strict,
        memory_counted=sql_memory,
    )
    problem = None
    present: list[str] | None = None
    try:
        present = present_tables(engine, prefix)
        if present:
            _check_present(engine, prefix, cipher)
    except Undecryptable as exc:
        problem = str(exc)
    except sa.exc.SQLAlchemyError:
        problem = None  # the page reports the database error itself
    if not count:
        return dataclasses.replace(state, problem=problem)
    columns: list[sql.ColumnKeys] = []
    if present is None:  # the database failed above: asked again, it raises for the page to report
        present = present_tables(engine, prefix)
    if present:
        with connect(engine) as conn:
            columns = [c for c in sql.column_keys(conn, prefix) if sql_memory or c.table != "memory"]
    per_key: dict[str, int] = {}
    for column in columns:
        for key_id, rows in column.per_key.items():
            per_key[key_id] = per_key.get(key_id, 0) + rows
    return dataclasses.replace(state, problem=problem, columns=tuple(columns), counted=True, per_key=per_key)
