"""Every statement on the ``{prefix}phpclaw_memory`` table; :class:`clawmem.SqlMemory` runs them.

Each takes the table ``shape`` (SPEC 4.8): in ours ``expires_at`` holds Unix seconds and values
are JSON; in phpClaw's WordPress shape ``expires_at`` is a UTC ``DATETIME`` and values are PHP
``serialize()`` text. Either way expiry is compared with the injected clock, never ``NOW()``,
and rows come back with ``expires_at`` in Unix seconds and values decoded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection

from clawmem.clock import Clock, utc_datetime
from clawmem.codecs import codec_for
from clawmem.crypto.stored import StoredValues
from clawmem.errors import Undecryptable
from clawmem.ids import new_id
from clawmem.paging import is_descending
from clawmem.records import MemoryRow, NamespaceCount
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA
from clawmem.sql.lenient import (
    LenientDateTime,
    Sealed,
    as_text,
    raw_moment,
    read_expiry,
    read_json,
    read_moment,
    read_value,
    reasons,
)
from clawmem.sql.paging import sorted_rows
from clawmem.sql.schema import tables


def stored_moment(table: sa.Table, seconds: int) -> int | datetime:
    """Return Unix ``seconds`` as the table's ``expires_at`` holds them: as they are, or as the
    naive UTC ``DATETIME`` of phpClaw's shape."""
    if isinstance(table.c.expires_at.type, sa.DateTime):
        return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    return seconds


def unix_seconds(moment: int | datetime | None) -> int | None:
    """Return an ``expires_at`` read from either shape as Unix seconds (``None`` stays)."""
    if isinstance(moment, datetime):
        return int(moment.replace(tzinfo=UTC).timestamp())
    return moment


Now = int | sa.BindParameter[Any]  # Unix seconds, or the bound parameter of a prebuilt statement


def _now(table: sa.Table, now: Now) -> Any:
    return now if isinstance(now, sa.BindParameter) else stored_moment(table, now)


def _now_parameter(table: sa.Table) -> sa.BindParameter[Any]:
    # ``now`` of a statement built once, bound at execution as stored_moment gives it.
    return sa.bindparam("now", type_=table.c.expires_at.type)


def _live(table: sa.Table, now: Now) -> sa.ColumnElement[bool]:
    return sa.or_(table.c.expires_at.is_(None), table.c.expires_at > _now(table, now))


def _expired(table: sa.Table, now: Now) -> sa.ColumnElement[bool]:
    return table.c.expires_at <= _now(table, now)


def get_entry(
    conn: Connection, prefix: str, namespace: str, key: str, now: int, shape: str = CLAWMEM_SCHEMA
) -> str | None:
    """Return the JSON text of a live entry, or ``None``."""
    table = tables(prefix, shape).memory
    bound = {"namespace": namespace, "key": key, "now": stored_moment(table, now)}
    return conn.execute(_entry_select(prefix, shape), bound).scalar_one_or_none()


@functools.cache
def _entry_select(prefix: str, shape: str) -> sa.Select[Any]:
    # Built once: every get() asks it, and building it costs more than the lookup by key.
    table = tables(prefix, shape).memory
    return sa.select(table.c.value).where(
        table.c.namespace == sa.bindparam("namespace", type_=table.c.namespace.type),
        table.c.lookup_key == sa.bindparam("key", type_=table.c.lookup_key.type),
        _live(table, _now_parameter(table)),
    )


def upsert_entry(
    conn: Connection,
    prefix: str,
    namespace: str,
    key: str,
    encoded: str,
    expires_at: int | None,
    clock: Clock,
    shape: str = CLAWMEM_SCHEMA,
    metadata: str | None = None,
) -> None:
    """Create or replace an entry in one atomic statement on every dialect. In clawmem's shape
    the entry's ``metadata`` (stored text, or ``None``) replaces what the row held; phpClaw's
    has no such column."""
    table = tables(prefix, shape).memory
    stamp = utc_datetime(clock)
    if shape == PHPCLAW_SCHEMA:
        stamp = stamp.replace(microsecond=0)  # phpClaw's gmdate('Y-m-d H:i:s')
    row = {
        "id": new_id(),
        "namespace": namespace,
        "lookup_key": key,
        "value": encoded,
        "expires_at": None if expires_at is None else stored_moment(table, expires_at),
        "created_at": stamp,
        "updated_at": stamp,
    }
    if shape == CLAWMEM_SCHEMA:
        row["metadata"] = metadata
    conn.execute(_entry_upsert(prefix, shape, conn.dialect.name), row)


@functools.cache
def _entry_upsert(prefix: str, shape: str, dialect: str) -> sa.Insert:
    # Built once per table and dialect, its values bound at execution: building the statement
    # cost more than running it, and every job record of a queued turn is written through it.
    table = tables(prefix, shape).memory
    names = ["id", "namespace", "lookup_key", "value", "expires_at", "created_at", "updated_at"]
    changes: tuple[str, ...] = ("value", "expires_at", "updated_at")
    if shape == CLAWMEM_SCHEMA:
        names.append("metadata")
        changes = (*changes, "metadata")
    values = {name: sa.bindparam(name, type_=table.c[name].type) for name in names}
    if dialect in ("mysql", "mariadb"):
        insert = mysql.insert(table).values(values)
        return insert.on_duplicate_key_update({name: insert.inserted[name] for name in changes})
    module = postgresql if dialect == "postgresql" else sqlite
    insert = module.insert(table).values(values)
    return insert.on_conflict_do_update(
        index_elements=["namespace", "lookup_key"],
        set_={name: insert.excluded[name] for name in changes},
    )


def delete_entry(conn: Connection, prefix: str, namespace: str, key: str, shape: str = CLAWMEM_SCHEMA) -> int:
    """Delete one entry; return the number of rows removed (0 or 1)."""
    table = tables(prefix, shape).memory
    return conn.execute(
        sa.delete(table).where(table.c.namespace == namespace, table.c.lookup_key == key)
    ).rowcount


def delete_namespace(conn: Connection, prefix: str, namespace: str, shape: str = CLAWMEM_SCHEMA) -> int:
    """Delete every entry of ``namespace``; return how many went."""
    table = tables(prefix, shape).memory
    return conn.execute(sa.delete(table).where(table.c.namespace == namespace)).rowcount


def live_entries(
    conn: Connection, prefix: str, namespace: str, now: int, shape: str = CLAWMEM_SCHEMA
) -> Iterator[tuple[str, str]]:
    """Yield ``(key, JSON text)`` of every live entry of ``namespace``."""
    table = tables(prefix, shape).memory
    result = conn.execute(
        sa.select(table.c.lookup_key, table.c.value).where(table.c.namespace == namespace, _live(table, now))
    )
    yield from result


def live_entries_in_order(
    conn: Connection, prefix: str, namespace: str, now: int, shape: str = CLAWMEM_SCHEMA
) -> list[tuple[str, str]]:
    """Return ``(key, stored text)`` of every live entry of ``namespace`` in the order phpClaw's
    ``all()`` sees them: by row id, which is insertion order (an overwrite keeps its row)."""
    table = tables(prefix, shape).memory
    select = (
        sa.select(table.c.lookup_key, table.c.value)
        .where(table.c.namespace == namespace, _live(table, now))
        .order_by(table.c.id)
    )
    return [(key, text) for key, text in conn.execute(select)]


def expired_counts(conn: Connection, prefix: str, now: int, shape: str = CLAWMEM_SCHEMA) -> dict[str, int]:
    """Return the number of expired rows per namespace."""
    table = tables(prefix, shape).memory
    rows = conn.execute(
        sa.select(table.c.namespace, sa.func.count()).where(_expired(table, now)).group_by(table.c.namespace)
    )
    return {namespace: count for namespace, count in rows}


def delete_expired(
    conn: Connection, prefix: str, namespace: str, now: int, shape: str = CLAWMEM_SCHEMA
) -> int:
    """Delete the expired rows of ``namespace``; return how many went.

    The condition is re-checked row by row, so an entry a concurrent writer just renewed stays.
    """
    table = tables(prefix, shape).memory
    return conn.execute(sa.delete(table).where(table.c.namespace == namespace, _expired(table, now))).rowcount


def expired_keys(
    conn: Connection, prefix: str, namespace: str, now: int, shape: str = CLAWMEM_SCHEMA
) -> list[str]:
    """Return the keys of the expired rows of ``namespace``."""
    table = tables(prefix, shape).memory
    expired = sa.select(table.c.lookup_key).where(table.c.namespace == namespace, _expired(table, now))
    rows = conn.execute(expired)
    return [as_text(key) or "" for key in rows.scalars()]


def namespaces(conn: Connection, prefix: str, shape: str = CLAWMEM_SCHEMA) -> list[str]:
    """Return every namespace with at least one row."""
    table = tables(prefix, shape).memory
    return list(conn.execute(sa.select(table.c.namespace).distinct()).scalars())


def like_pattern(text: str) -> str:
    """Return a LIKE pattern matching ``text`` anywhere, with ``\\`` escaping % and _."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# -- the operator's read API (expired rows included) ------------------------------------------


def memory_row(row: Any, shape: str = CLAWMEM_SCHEMA, values: StoredValues | None = None) -> MemoryRow:
    """Return a row of the memory table as a :class:`MemoryRow` (value and metadata decoded,
    and opened with ``values``' cipher when sealed).

    Columns that cannot be read (see :mod:`clawmem.sql.lenient`), or decrypted, are named in
    ``unreadable``.
    """
    values = values or StoredValues(codec_for(shape))
    namespace, key, text = as_text(row.namespace), as_text(row.lookup_key), as_text(row.value) or ""
    # Another program's row may hold anything: what cannot be read is kept raw and said.
    value, bad_value = read_value(lambda raw: values.read(namespace, key, raw), text)
    metadata, bad_metadata = read_json(row._mapping.get("metadata"), "metadata")  # not in phpClaw's shape
    if isinstance(metadata, Sealed):
        try:
            metadata, bad_metadata = read_json(values.open(namespace, key, metadata, "metadata"), "metadata")
        except Undecryptable as exc:
            bad_metadata = f"metadata cannot be decrypted ({exc.reason})"
    expires_at, bad_expiry = read_expiry(unix_seconds(row.expires_at))
    created_at, bad_created = read_moment(row.created_at, "created_at")
    updated_at, bad_updated = read_moment(row.updated_at, "updated_at")
    return MemoryRow(
        namespace=namespace,
        key=key,
        value=value,
        expires_at=expires_at,
        bytes=len(text.encode("utf-8")),
        metadata=metadata,
        created_at=created_at,
        updated_at=updated_at,
        unreadable=reasons(bad_value, bad_metadata, bad_expiry, bad_created, bad_updated),
        raw_value=bad_value is not None,
        raw_updated_at=raw_moment(row.updated_at),
        raw_expires_at=row.expires_at if bad_expiry else None,
    )


def namespace_counts(
    conn: Connection, prefix: str, now: int, shape: str = CLAWMEM_SCHEMA
) -> list[NamespaceCount]:
    """Return every namespace with its total, live and expired counts, sorted by name."""
    table = tables(prefix, shape).memory
    found = conn.execute(namespace_counts_select(prefix, shape), {"now": stored_moment(table, now)})
    return [namespace_count(*row) for row in found]


def namespace_count(namespace: str, total: int, expired: int | None, expiring: int | None) -> NamespaceCount:
    """Return the :class:`NamespaceCount` of a row of :func:`namespace_counts_select`: its
    rows, those expired at the bound ``now`` and those with an expiry."""
    gone = int(expired or 0)
    return NamespaceCount(namespace, total, total - gone, gone, int(expiring or 0) - gone)


@functools.cache
def namespace_counts_select(prefix: str, shape: str) -> sa.Select[Any]:
    """Return the statement of :func:`namespace_counts`, ``now`` a bound parameter."""
    # Built once: the Overview asks it on every load, and building it costs more than a
    # statement of a few hundred rows takes to run.
    table = tables(prefix, shape).memory
    return (
        sa.select(table.c.namespace, *namespace_count_columns(table))
        .group_by(table.c.namespace)
        .order_by(table.c.namespace)
    )


def namespace_count_columns(table: sa.Table) -> tuple[sa.ColumnElement[Any], ...]:
    """Return what :func:`namespace_count` reads of a namespace's group of rows: how many, how
    many expired at the bound parameter ``now``, and how many have an expiry."""
    expired = _expired(table, _now_parameter(table))
    return sa.func.count(), sa.func.sum(sa.case((expired, 1), else_=0)), sa.func.count(table.c.expires_at)


def count_namespace(conn: Connection, prefix: str, namespace: str, shape: str = CLAWMEM_SCHEMA) -> int:
    """Return how many rows ``namespace`` holds, expired-but-unswept ones included."""
    table = tables(prefix, shape).memory
    found = conn.execute(sa.select(sa.func.count()).select_from(table).where(table.c.namespace == namespace))
    return int(found.scalar() or 0)


def count_by_the_rest(
    conn: Connection, prefix: str, namespace: str, shape: str = CLAWMEM_SCHEMA
) -> tuple[int, int]:
    """Return how many rows ``namespace`` holds (as :func:`count_namespace` does) and how many
    the whole table holds, in one statement: the table's count less the other namespaces' rows.

    SQLite counts a whole table by adding up its leaf pages' cell counts, not by stepping
    through rows, so where the namespace holds most of the table this costs a few of the
    namespace count's steps (and an index search per other namespace's rows)."""
    counts = conn.execute(_count_by_the_rest_select(prefix, shape), {"namespace": namespace})
    total, below, above = counts.one()
    return int(total) - int(below) - int(above), int(total)


@functools.cache
def _count_by_the_rest_select(prefix: str, shape: str) -> sa.Select[Any]:
    table = tables(prefix, shape).memory
    namespace = sa.bindparam("namespace")

    def rows(*where: Any) -> Any:
        return sa.select(sa.func.count()).select_from(table).where(*where).scalar_subquery()

    return sa.select(rows(), rows(table.c.namespace < namespace), rows(table.c.namespace > namespace))


def newest_write(conn: Connection, prefix: str, shape: str = CLAWMEM_SCHEMA) -> datetime | None:
    """Return the latest ``updated_at`` of any row (the newest write), or ``None``."""
    return conn.execute(sa.select(sa.func.max(tables(prefix, shape).memory.c.updated_at))).scalar()


def _listed(
    select: sa.Select[Any], table: sa.Table, now: int, state: str | None, query: str | None
) -> sa.Select[Any]:
    # The filters of a namespace listing: a TTL state, and text in the key or the value.
    if state == "live":
        select = select.where(_live(table, now))
    elif state == "permanent":
        select = select.where(table.c.expires_at.is_(None))
    elif state == "expiring":
        select = select.where(table.c.expires_at > stored_moment(table, now))
    elif state == "expired":
        select = select.where(_expired(table, now))
    if query:
        pattern = like_pattern(query)
        select = select.where(
            sa.or_(table.c.lookup_key.ilike(pattern, escape="\\"), table.c.value.ilike(pattern, escape="\\"))
        )
    return select


# The column each order of :data:`clawmem.paging.SORTS` reads, ties broken by key.
SORT_COLUMNS = {"key": "lookup_key", "updated": "updated_at", "expires": "expires_at"}


def namespace_rows(
    conn: Connection,
    prefix: str,
    namespace: str,
    now: int,
    *,
    state: str | None = None,
    query: str | None = None,
    sort: str = "key",
    descending: bool | None = None,
    start: tuple[Any, str] | None = None,
    limit: int | None = None,
    shape: str = CLAWMEM_SCHEMA,
    values: StoredValues | None = None,
) -> list[MemoryRow]:
    """Return a namespace's rows in ``sort`` order (by key unless told; see
    :data:`clawmem.paging.SORTS`), the other way round when ``descending`` says so, after the
    ``start`` of a cursor, filtered by ``state``
    (one of :data:`clawmem.memory.base.FILTERS`) and by ``query`` in key or value
    (case-insensitive)."""
    table = tables(prefix, shape).memory
    select = _listed(sa.select(table).where(table.c.namespace == namespace), table, now, state, query)
    if limit is None:
        return [memory_row(row, shape, values) for row in conn.execute(select.order_by(table.c.lookup_key))]
    if start is not None and sort == "expires" and isinstance(start[0], int):
        start = (stored_moment(table, start[0]), start[1])
    columns = [table.c[SORT_COLUMNS[sort]], table.c.lookup_key]
    direction = is_descending(sort, descending)
    rows = sorted_rows(conn, select, columns, limit, start, descending=direction, nullable=sort != "key")
    return [memory_row(row, shape, values) for row in rows]


def newest_rows(
    conn: Connection,
    prefix: str,
    namespace: str,
    now: int,
    limit: int,
    *,
    state: str | None = None,
    shape: str = CLAWMEM_SCHEMA,
    values: StoredValues | None = None,
) -> list[MemoryRow]:
    """Return up to ``limit`` of a namespace's rows passing ``state``, newest write first: what a
    search of sealed values decrypts and scans (SQL cannot match text it cannot read)."""
    table = tables(prefix, shape).memory
    select = _listed(sa.select(table).where(table.c.namespace == namespace), table, now, state, None)
    select = select.order_by(table.c.updated_at.desc(), table.c.lookup_key).limit(limit)
    return [memory_row(row, shape, values) for row in conn.execute(select)]


def count_rows(
    conn: Connection,
    prefix: str,
    namespace: str,
    now: int,
    *,
    state: str | None = None,
    query: str | None = None,
    shape: str = CLAWMEM_SCHEMA,
) -> int:
    """Return how many rows :func:`namespace_rows` lists under the same filters, in one query."""
    table = tables(prefix, shape).memory
    select = sa.select(sa.func.count()).select_from(table).where(table.c.namespace == namespace)
    return int(conn.execute(_listed(select, table, now, state, query)).scalar() or 0)


def one_row(
    conn: Connection,
    prefix: str,
    namespace: str,
    key: str,
    shape: str = CLAWMEM_SCHEMA,
    values: StoredValues | None = None,
) -> MemoryRow | None:
    """Return one row, expired or not, or ``None``."""
    table = tables(prefix, shape).memory
    row = conn.execute(
        sa.select(table).where(table.c.namespace == namespace, table.c.lookup_key == key)
    ).first()
    return None if row is None else memory_row(row, shape, values)


# -- what the recall index reads --------------------------------------------------------------


def row_version(table: sa.Table, dialect: str) -> sa.ColumnElement[Any]:
    """Return what changes whenever a row is written, whoever writes it and whatever its
    ``updated_at`` says: PostgreSQL's ``xmin`` (the writing transaction), MariaDB's MD5 of the
    value, and on SQLite the value itself (it has no hash function, and no network to cross)."""
    if dialect == "postgresql":
        return sa.literal_column("xmin", sa.Text).cast(sa.Text)
    if dialect in ("mysql", "mariadb"):
        return sa.func.md5(table.c.value)
    return table.c.value


def index_rows(
    conn: Connection,
    prefix: str,
    namespace: str,
    since: datetime | None = None,
    shape: str = CLAWMEM_SCHEMA,
) -> Iterator[tuple[str, str, int | None, datetime]]:
    """Yield ``(key, stored text, expires_at, updated_at)`` of the namespace's rows, expired ones
    included; with ``since``, only rows whose ``updated_at`` is at or after it."""
    table = tables(prefix, shape).memory
    select = sa.select(table.c.lookup_key, table.c.value, table.c.expires_at, table.c.updated_at).where(
        table.c.namespace == namespace
    )
    if since is not None:
        select = select.where(table.c.updated_at >= since)
    for key, text, expires_at, updated_at in conn.execution_options(yield_per=5000).execute(select):
        yield key, text, unix_seconds(expires_at), updated_at


def newest_stamp(conn: Connection, prefix: str, namespace: str, shape: str = CLAWMEM_SCHEMA) -> Any:
    """Return the latest ``updated_at`` of the namespace's rows, or ``None``."""
    table = tables(prefix, shape).memory
    newest = sa.select(sa.func.max(table.c.updated_at)).where(table.c.namespace == namespace)
    return conn.execute(newest).scalar()


def index_probe(
    conn: Connection, prefix: str, namespace: str, since: datetime | None, shape: str = CLAWMEM_SCHEMA
) -> list[tuple[Any, Any, Any, Any]]:
    """Return ``(key, updated_at, expires_at, version)`` of the namespace's rows stamped at or
    after ``since`` (every row without it), as stored: what tells the recall index which rows
    changed, without reading their values (except on SQLite, see :func:`row_version`). SQLite's
    stamps come as their text, which :func:`read_stamp` reads: a turn after another
    connection's commit probes hundreds of rows, and needs the time of only those that changed."""
    select = _index_probe_select(prefix, shape, conn.dialect.name, since is not None)
    return [tuple(row) for row in conn.execute(select, {"namespace": namespace, "since": since})]


@functools.cache
def _index_probe_select(prefix: str, shape: str, dialect: str, bounded: bool) -> sa.Select[Any]:
    table = tables(prefix, shape).memory
    stamp: sa.ColumnElement[Any] = table.c.updated_at
    if dialect == "sqlite":
        stamp = sa.type_coerce(stamp, sa.Text)
    select = sa.select(table.c.lookup_key, stamp, table.c.expires_at, row_version(table, dialect)).where(
        table.c.namespace == sa.bindparam("namespace")
    )
    if bounded:
        select = select.where(table.c.updated_at >= sa.bindparam("since", type_=table.c.updated_at.type))
    return select


def read_stamp(conn: Connection, stored: Any) -> Any:
    """Return an ``updated_at`` of :func:`index_probe` as the table's column reads it: a
    ``datetime``, or the raw value when it is not one (another program's row)."""
    if not isinstance(stored, str):
        return stored
    return _stamp_reader(conn.dialect)(stored)


@functools.cache
def _stamp_reader(dialect: Any) -> Callable[[Any], Any]:
    return LenientDateTime().dialect_impl(dialect).result_processor(dialect, None) or (lambda value: value)


def window_digest(
    conn: Connection, prefix: str, namespace: str, since: datetime | None, shape: str = CLAWMEM_SCHEMA
) -> tuple[tuple[int, int], int] | None:
    """Return, on MariaDB/MySQL, the count and a 64-bit XOR of a hash of each row's key, stamp,
    expiry and value among the rows :func:`index_probe` would return (equal twice only if none
    of them changed, up to a 2^-64 chance), and how many rows the namespace holds, in one
    statement. ``None`` elsewhere."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        return None
    bounds = {"namespace": namespace, "since": since}
    count, digest, rows = conn.execute(_window_digest_select(prefix, shape, since is not None), bounds).one()
    return (int(count), int(digest or 0)), int(rows)


@functools.cache
def _window_digest_select(prefix: str, shape: str, bounded: bool) -> sa.Select[Any]:
    # Built once per shape: asked on every catch-up of a namespace's index (every turn and
    # Overview), and building it costs about as much as running it on a quiet namespace.
    table = tables(prefix, shape).memory
    namespace = sa.bindparam("namespace", type_=table.c.namespace.type)
    expires = sa.func.coalesce(table.c.expires_at, "none")
    row = sa.func.concat_ws("|", table.c.lookup_key, table.c.updated_at, expires, table.c.value)
    hashed = sa.cast(sa.func.conv(sa.func.left(sa.func.md5(row), 16), 16, 10), mysql.BIGINT(unsigned=True))
    total = sa.select(sa.func.count()).select_from(table).where(table.c.namespace == namespace)
    select = sa.select(sa.func.count(), sa.func.bit_xor(hashed), total.scalar_subquery()).where(
        table.c.namespace == namespace
    )
    if bounded:
        select = select.where(table.c.updated_at >= sa.bindparam("since", type_=table.c.updated_at.type))
    return select


def commit_marker(conn: Connection) -> str | None:
    """Return what changes whenever any transaction commits, or ``None`` where the database
    does not say. PostgreSQL's current snapshot (the next transaction id and those still in
    progress) is equal at two moments only if nothing committed in between."""
    if conn.dialect.name != "postgresql":
        return None
    return str(conn.execute(_SNAPSHOT).scalar())


# Built once: asked before every recall, where building it and its cache key cost about a
# tenth of running it.
_SNAPSHOT = sa.select(sa.func.pg_current_snapshot().cast(sa.Text))


def parse_snapshot(text: str) -> tuple[int, int, frozenset[int]]:
    """Return ``(xmin, xmax, in progress)`` of a PostgreSQL snapshot as :func:`commit_marker`
    gives it (``xmin:xmax:xip,xip``)."""
    low, high, running = text.split(":")
    return int(low), int(high), frozenset(int(xid) for xid in running.split(",") if xid)


def written_after(earlier: str, later: str) -> int:
    """Return a transaction id (64-bit) at or below that of every transaction that committed
    between the PostgreSQL snapshots ``earlier`` and ``later``.

    Such a transaction either began after ``earlier`` (its id is at least that snapshot's
    xmax) or was in progress then and no longer is in ``later``. The oldest of those bounds
    them all, subtransactions included, whose ids come after their parent's. A transaction in
    progress at both moments has committed nothing yet, so however old it is, it does not
    move the bound back."""
    _, high, running = parse_snapshot(earlier)
    finished = running - parse_snapshot(later)[2]
    return min(finished, default=high)


def versions_since(
    conn: Connection, prefix: str, namespace: str, xid: int, shape: str = CLAWMEM_SCHEMA
) -> tuple[int, set[str]]:
    """Return, on PostgreSQL, how many rows the namespace holds and the keys of those whose row
    version was written by transaction ``xid`` (64-bit) or a later one, in one pass.

    ``age(xmin)`` counts transactions back from now, so the comparison is safe across the
    32-bit wrap of ``xmin``; a frozen row's age is the largest there is."""
    table = tables(prefix, shape).memory
    recent = sa.text("age(xmin) <= age(CAST(:since AS xid))").bindparams(since=str(xid % 2**32))
    select = sa.select(sa.func.count(), sa.func.array_agg(table.c.lookup_key).filter(recent)).where(
        table.c.namespace == namespace
    )
    count, keys = conn.execute(select).one()
    return int(count), {as_text(key) for key in keys or ()}


def namespace_keys(conn: Connection, prefix: str, namespace: str, shape: str = CLAWMEM_SCHEMA) -> set[str]:
    """Return every key of the namespace, expired ones included."""
    table = tables(prefix, shape).memory
    return set(conn.execute(sa.select(table.c.lookup_key).where(table.c.namespace == namespace)).scalars())


def rows_of_keys(
    conn: Connection,
    prefix: str,
    namespace: str,
    keys: Sequence[str],
    shape: str = CLAWMEM_SCHEMA,
    values: StoredValues | None = None,
) -> list[MemoryRow]:
    """Return the rows of ``keys`` in the namespace that exist, expired ones included."""
    found = conn.execute(_rows_of_keys_select(prefix, shape), {"namespace": namespace, "keys": list(keys)})
    return [memory_row(row, shape, values) for row in found]


@functools.cache
def _rows_of_keys_select(prefix: str, shape: str) -> sa.Select[Any]:
    # Built once per prefix and bound at execution, as the recall turn's other statements
    # (the window probe, the count by the rest): building one took about as long as SQLite
    # took to run it.
    table = tables(prefix, shape).memory
    return sa.select(table).where(
        table.c.namespace == sa.bindparam("namespace"),
        table.c.lookup_key.in_(sa.bindparam("keys", expanding=True)),
    )


def rows_across(
    conn: Connection,
    prefix: str,
    wanted: Mapping[str, Sequence[str]],
    shape: str = CLAWMEM_SCHEMA,
    values: StoredValues | None = None,
) -> list[MemoryRow]:
    """Return the rows of each namespace's keys in ``wanted`` that exist, expired ones
    included, in one statement."""
    table = tables(prefix, shape).memory
    select = sa.select(table).where(
        sa.or_(
            *(
                sa.and_(table.c.namespace == namespace, table.c.lookup_key.in_(list(keys)))
                for namespace, keys in wanted.items()
            )
        )
    )
    return [memory_row(row, shape, values) for row in conn.execute(select)]
