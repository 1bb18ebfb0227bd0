"""Every statement on the key store's tables, ``{prefix}clawmem_subject_keys`` and
``{prefix}clawmem_key_generation``, in the key store's own database (``CLAW_KEYSTORE_URL``), never
the database of the three tables.

One row per subject of the site: the subject's hash, the data key's id, the id of the master key
that wraps it and the wrapped key. A data key is never stored unwrapped. The generation table has
one row, the number of keys ever deleted, raised in the transaction that deletes one, so a
process that kept keys learns of an erasure with one read by primary key.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from clawmem.crypto.keystore import WrappedKey
from clawmem.errors import KeyStoreError
from clawmem.rules import validate_prefix
from clawmem.sql.engine import current, describe_error, engine_for, write_transaction
from clawmem.sql.schema import ExactString

KEY_TABLE_SUFFIX = "clawmem_subject_keys"
GENERATION_TABLE_SUFFIX = "clawmem_key_generation"
_GENERATION_ROW = 1
_T = TypeVar("_T")


@functools.cache
def _metadata(prefix: str) -> sa.MetaData:
    return sa.MetaData()


@functools.cache
def key_table(prefix: str = "") -> sa.Table:
    """Return the key store table of the site whose table prefix is ``prefix``."""
    validate_prefix(prefix)
    metadata = _metadata(prefix)
    return sa.Table(
        f"{prefix}{KEY_TABLE_SUFFIX}",
        metadata,
        sa.Column("key_id", ExactString(32), primary_key=True),
        sa.Column("subject", ExactString(64), nullable=False),
        sa.Column("master_id", ExactString(32), nullable=False),
        sa.Column("wrapped", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("subject", name=f"{prefix}clawmem_keys_subject"),
        sa.Index(f"{prefix}clawmem_keys_master", "master_id"),
        mysql_charset="utf8mb4",
        mysql_engine="InnoDB",
    )


@functools.cache
def generation_table(prefix: str = "") -> sa.Table:
    """Return the key store's generation table (one row) of the site of ``prefix``."""
    validate_prefix(prefix)
    return sa.Table(
        f"{prefix}{GENERATION_TABLE_SUFFIX}",
        _metadata(prefix),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        mysql_charset="utf8mb4",
        mysql_engine="InnoDB",
    )


def _record(row: sa.Row[tuple[str, str, str, str, datetime]]) -> WrappedKey:
    return WrappedKey(row[0], row[1], row[2], row[3], row[4])


def _columns(table: sa.Table) -> list[sa.Column[object]]:
    return [table.c.key_id, table.c.subject, table.c.master_id, table.c.wrapped, table.c.created_at]


def key_table_exists(engine: Engine, prefix: str) -> bool:
    """Return whether the key store table of ``prefix`` exists (reading creates nothing)."""
    return sa.inspect(engine).has_table(key_table(prefix).name)


def generation_table_exists(engine: Engine, prefix: str) -> bool:
    """Return whether the generation table of ``prefix`` exists (a store made before it had none)."""
    return sa.inspect(engine).has_table(generation_table(prefix).name)


def create_key_table(engine: Engine, prefix: str) -> None:
    """Create the key store tables of ``prefix`` where they do not exist, with the generation's
    one row (idempotent: two processes may do it at once)."""
    tables = [key_table(prefix), generation_table(prefix)]
    tables[0].metadata.create_all(engine, tables=tables, checkfirst=True)
    generation = generation_table(prefix)
    try:
        with write_transaction(engine) as conn:
            found = conn.execute(sa.select(generation.c.id).where(generation.c.id == _GENERATION_ROW)).first()
            if found is None:
                conn.execute(sa.insert(generation).values(id=_GENERATION_ROW, generation=0))
    except sa.exc.IntegrityError:
        pass  # another process inserted the row first


@functools.cache
def _generation_select(prefix: str) -> sa.Select[tuple[int]]:
    # Built once: a process reads the generation at every turn.
    table = generation_table(prefix)
    return sa.select(table.c.generation).where(table.c.id == _GENERATION_ROW)


def read_generation(engine: Engine, prefix: str) -> int:
    """Return the store's generation: how many keys were ever deleted (0 without the row)."""
    with current(engine, reading=True).connect() as conn:
        found = conn.execute(_generation_select(prefix)).scalar()
    return 0 if found is None else int(found)


def key_of_subject(engine: Engine, prefix: str, subject: str) -> WrappedKey | None:
    """Return the wrapped key of the subject hash ``subject``, or ``None``."""
    table = key_table(prefix)
    with current(engine, reading=True).connect() as conn:
        row = conn.execute(sa.select(*_columns(table)).where(table.c.subject == subject)).first()
    return None if row is None else _record(row)


def key_by_id(engine: Engine, prefix: str, key_id: str) -> WrappedKey | None:
    """Return the wrapped key with id ``key_id``, or ``None``."""
    table = key_table(prefix)
    with current(engine, reading=True).connect() as conn:
        row = conn.execute(sa.select(*_columns(table)).where(table.c.key_id == key_id)).first()
    return None if row is None else _record(row)


def add_key(engine: Engine, prefix: str, key: WrappedKey) -> WrappedKey:
    """Store ``key`` unless its subject has one already; return the subject's key either way, so
    two processes that make a subject's first key at once agree on one."""
    table = key_table(prefix)
    try:
        with write_transaction(engine) as conn:
            conn.execute(
                sa.insert(table).values(
                    key_id=key.key_id,
                    subject=key.subject,
                    master_id=key.master_id,
                    wrapped=key.wrapped,
                    created_at=key.created_at,
                )
            )
    except sa.exc.IntegrityError:
        pass  # another process stored the subject's key first: that one is theirs
    found = key_of_subject(engine, prefix, key.subject)
    if found is None:  # pragma: no cover - only an erasure racing the first write gets here
        raise RuntimeError("the subject's data key vanished while it was being stored")
    return found


def delete_subject_key(engine: Engine, prefix: str, subject: str) -> list[str]:
    """Delete the subject hash's data key and raise the generation in the same transaction;
    return the ids deleted (none when it had no key). The generation's row must exist
    (:func:`create_key_table`)."""
    table, generation = key_table(prefix), generation_table(prefix)
    with write_transaction(engine) as conn:
        ids = list(conn.execute(sa.select(table.c.key_id).where(table.c.subject == subject)).scalars())
        if ids:
            conn.execute(sa.delete(table).where(table.c.subject == subject))
            raised = conn.execute(
                sa.update(generation)
                .where(generation.c.id == _GENERATION_ROW)
                .values(generation=generation.c.generation + 1)
            )
            if not raised.rowcount:
                # The row went missing (deleted by hand): it starts again at a number no process
                # can hold already, so every one of them sees this erasure.
                restart = secrets.randbelow(2**62) + 1
                conn.execute(sa.insert(generation).values(id=_GENERATION_ROW, generation=restart))
    return ids


def count_by_master(engine: Engine, prefix: str) -> dict[str, int]:
    """Return how many data keys each master key id wraps."""
    table = key_table(prefix)
    with current(engine, reading=True).connect() as conn:
        rows = conn.execute(sa.select(table.c.master_id, sa.func.count()).group_by(table.c.master_id))
        return {str(master_id): int(count) for master_id, count in rows}


def keys_not_under(engine: Engine, prefix: str, master_id: str, limit: int) -> list[WrappedKey]:
    """Return up to ``limit`` wrapped keys whose master key is not ``master_id``, by key id."""
    table = key_table(prefix)
    with current(engine, reading=True).connect() as conn:
        rows = conn.execute(
            sa.select(*_columns(table))
            .where(table.c.master_id != master_id)
            .order_by(table.c.key_id)
            .limit(limit)
        )
        return [_record(row) for row in rows]


def rewrap_keys(engine: Engine, prefix: str, rewrapped: list[tuple[WrappedKey, WrappedKey]]) -> int:
    """Replace each ``(old, new)`` pair's wrapping in one transaction, only where the row still
    holds ``old``'s (so a key erased or rewrapped meanwhile is left alone); return how many changed."""
    table = key_table(prefix)
    changed = 0
    with write_transaction(engine) as conn:
        for old, new in rewrapped:
            result = conn.execute(
                sa.update(table)
                .where(table.c.key_id == old.key_id, table.c.wrapped == old.wrapped)
                .values(master_id=new.master_id, wrapped=new.wrapped)
            )
            changed += result.rowcount or 0
    return changed


class SqlKeyBackend:
    """Wrapped keys in the table ``{prefix}clawmem_subject_keys`` of the key store's SQL database,
    created when the first key is stored; reads of a store without the table find nothing.
    Database failures raise :class:`KeyStoreError` naming the store (password hidden)."""

    def __init__(self, engine: Engine | None, prefix: str, where: str, url: str = "") -> None:
        self._engine = engine
        self.url = url
        self.prefix = prefix
        self.where = where
        self._ready = False
        self._generation_ready = False  # the generation table is known to exist
        self._generation_row = False  # and its row, made by this process

    @classmethod
    def from_url(cls, url: str, prefix: str, where: str) -> SqlKeyBackend:
        """Return the backend of the database at ``url``; its engine (the process's shared one)
        is made on first use, so opening a site creates no key store file."""
        return cls(None, prefix, where, url)

    @property
    def engine(self) -> Engine:
        """Return the key store's engine, made on first use."""
        if self._engine is None:
            self._engine = engine_for(self.url)
        return self._engine

    def _missing_file(self) -> bool:
        # A SQLite key store that does not exist yet holds no key; reading it must not create it.
        if self._engine is not None or not self.url:
            return False
        parsed = make_url(self.url)
        return parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file()

    def _run(self, operation: str, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except sa.exc.SQLAlchemyError as exc:
            raise KeyStoreError(operation, f"{self.where}: {describe_error(exc)}") from None

    def _exists(self) -> bool:
        if not self._ready and not self._missing_file():
            self._ready = self._run("read", lambda: key_table_exists(self.engine, self.prefix))
        return self._ready

    def by_subject(self, subject: str) -> WrappedKey | None:
        """Return the subject hash's wrapped key, or ``None``."""
        if not self._exists():
            return None
        return self._run("read", lambda: key_of_subject(self.engine, self.prefix, subject))

    def by_id(self, key_id: str) -> WrappedKey | None:
        """Return the wrapped key of ``key_id``, or ``None``."""
        if not self._exists():
            return None
        return self._run("read", lambda: key_by_id(self.engine, self.prefix, key_id))

    def add(self, key: WrappedKey) -> WrappedKey:
        """Store ``key`` unless its subject has one; return the subject's key."""
        if not self._exists():
            self._run("store", lambda: create_key_table(self.engine, self.prefix))
            self._ready = self._generation_ready = self._generation_row = True
        return self._run("store", lambda: add_key(self.engine, self.prefix, key))

    def delete_subject(self, subject: str) -> list[str]:
        """Delete the subject hash's key and raise the generation; return the ids deleted."""
        if not self._exists():
            return []
        if not self._generation_row:
            # A store made before the generation table gets it here, before its first deletion.
            self._run("erase", lambda: create_key_table(self.engine, self.prefix))
            self._generation_ready = self._generation_row = True
        return self._run("erase", lambda: delete_subject_key(self.engine, self.prefix, subject))

    def generation(self) -> int:
        """Return how many keys were ever deleted from this store: one read by primary key (0
        for a store with no table yet, whose keys none was ever deleted)."""
        if not self._generation_ready:
            if not self._exists():
                return 0
            self._generation_ready = self._run(
                "read", lambda: generation_table_exists(self.engine, self.prefix)
            )
            if not self._generation_ready:
                return 0
        return self._run("read", lambda: read_generation(self.engine, self.prefix))

    def count_by_master(self) -> dict[str, int]:
        """Return how many data keys each master key id wraps."""
        if not self._exists():
            return {}
        return self._run("read", lambda: count_by_master(self.engine, self.prefix))

    def not_under(self, master_id: str, limit: int) -> list[WrappedKey]:
        """Return up to ``limit`` keys wrapped by a master key other than ``master_id``."""
        if not self._exists():
            return []
        return self._run("read", lambda: keys_not_under(self.engine, self.prefix, master_id, limit))

    def rewrap(self, pairs: list[tuple[WrappedKey, WrappedKey]]) -> int:
        """Replace each ``(old, new)`` wrapping where the store still holds ``old``'s."""
        return self._run("rewrap", lambda: rewrap_keys(self.engine, self.prefix, pairs))
