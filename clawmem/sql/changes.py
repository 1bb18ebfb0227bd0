"""Every statement on ``{prefix}clawmem_changes``: the memory table's change log, kept by
triggers, so that a write by any program (PHP included, with plain SQL) is seen by the next
recall turn without counting the namespace (SPEC 4.1).

Each insert, update or delete of a memory row adds one row here naming its namespace and key
(an update that moves a row names both places). The log holds nothing that cannot be rebuilt:
dropping it (or its triggers) only sends recall back to counting. ``seq`` grows with each change,
but it is not commit order: a transaction that took a lower number can commit after a higher
one was read, so a reader keeps the numbers it has not seen yet (see
:mod:`clawmem.memory.sql_feed`). ``sweep`` trims the log to its newest :data:`KEEP` rows and
adds a row whose ``through`` says how far it trimmed, so a reader that had not got that far
reads the namespace again instead of missing a change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.rules import validate_prefix
from clawmem.settings import CLAWMEM_SCHEMA

KEEP = 100_000  # rows a trim keeps: minutes of constant writes, far more than a turn's gap
_EVENTS = ("insert", "update", "delete")


class Change(NamedTuple):
    """One row of the log: a change to (namespace, key), or a trim through ``through``."""

    seq: int
    namespace: str | None
    key: str | None
    through: int | None


@functools.cache
def change_table(prefix: str = "") -> sa.Table:
    """Return the change log of ``prefix``."""
    validate_prefix(prefix)
    return sa.Table(
        f"{prefix}clawmem_changes",
        sa.MetaData(),
        # INTEGER PRIMARY KEY AUTOINCREMENT on SQLite: never a number used before, even after a
        # trim emptied the table.
        sa.Column(
            "seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("namespace", sa.String(100), nullable=True),  # NULL: a trim's row
        sa.Column("lookup_key", sa.String(255), nullable=True),
        sa.Column("through", sa.BigInteger, nullable=True),
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )


def trigger_names(prefix: str) -> list[str]:
    """Return the names of the triggers that keep the log of ``prefix``."""
    return [f"{prefix}clawmem_changes_{event}" for event in _EVENTS]


def _function_name(prefix: str) -> str:
    return f"{prefix}clawmem_changes_write"  # PostgreSQL: what the triggers execute


def _statements(dialect: str, prefix: str) -> list[str]:
    """Return the DDL that creates the triggers of ``prefix`` on ``dialect``."""
    memory, log = f"{prefix}phpclaw_memory", change_table(prefix).name
    insert, update, delete = trigger_names(prefix)
    if dialect in ("mysql", "mariadb"):
        add = f"INSERT INTO `{log}` (namespace, lookup_key) VALUES"
        moved = (
            "NOT (BINARY OLD.namespace <=> BINARY NEW.namespace "
            "AND BINARY OLD.lookup_key <=> BINARY NEW.lookup_key)"
        )
        return [
            f"CREATE TRIGGER `{insert}` AFTER INSERT ON `{memory}` FOR EACH ROW "
            f"{add} (NEW.namespace, NEW.lookup_key)",
            f"CREATE TRIGGER `{update}` AFTER UPDATE ON `{memory}` FOR EACH ROW BEGIN "
            f"{add} (NEW.namespace, NEW.lookup_key); "
            f"IF {moved} THEN {add} (OLD.namespace, OLD.lookup_key); END IF; END",
            f"CREATE TRIGGER `{delete}` AFTER DELETE ON `{memory}` FOR EACH ROW "
            f"{add} (OLD.namespace, OLD.lookup_key)",
        ]
    if dialect == "sqlite":
        add = f'INSERT INTO "{log}" (namespace, lookup_key)'
        moved = "OLD.namespace IS NOT NEW.namespace OR OLD.lookup_key IS NOT NEW.lookup_key"
        return [
            f'CREATE TRIGGER "{insert}" AFTER INSERT ON "{memory}" BEGIN '
            f"{add} VALUES (NEW.namespace, NEW.lookup_key); END",
            f'CREATE TRIGGER "{update}" AFTER UPDATE ON "{memory}" BEGIN '
            f"{add} VALUES (NEW.namespace, NEW.lookup_key); "
            f"{add} SELECT OLD.namespace, OLD.lookup_key WHERE {moved}; END",
            f'CREATE TRIGGER "{delete}" AFTER DELETE ON "{memory}" BEGIN '
            f"{add} VALUES (OLD.namespace, OLD.lookup_key); END",
        ]
    if dialect == "postgresql":
        # Statement triggers over transition tables: one INSERT ... SELECT per statement, so a
        # bulk UPDATE of every row costs one statement more, not one function call per row.
        function = _function_name(prefix)
        add = f'INSERT INTO "{log}" (namespace, lookup_key) SELECT namespace, lookup_key FROM'
        body = (
            "BEGIN "
            f"IF TG_OP <> 'DELETE' THEN {add} new_rows; END IF; "
            f"IF TG_OP = 'DELETE' THEN {add} old_rows; END IF; "
            f"IF TG_OP = 'UPDATE' THEN {add} (SELECT namespace, lookup_key FROM old_rows "
            "EXCEPT SELECT namespace, lookup_key FROM new_rows) AS moved; END IF; "
            "RETURN NULL; END"
        )
        on = f'ON "{memory}"'
        run = f'FOR EACH STATEMENT EXECUTE FUNCTION "{function}"()'
        return [
            f'CREATE OR REPLACE FUNCTION "{function}"() RETURNS trigger LANGUAGE plpgsql AS $${body}$$',
            f'CREATE TRIGGER "{insert}" AFTER INSERT {on} REFERENCING NEW TABLE AS new_rows {run}',
            f'CREATE TRIGGER "{update}" AFTER UPDATE {on} '
            f"REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows {run}",
            f'CREATE TRIGGER "{delete}" AFTER DELETE {on} REFERENCING OLD TABLE AS old_rows {run}',
        ]
    raise ValueError(f"no change log on {dialect}")


def describe(engine: Engine, prefix: str) -> list[str]:
    """Return, one line each, what :func:`install` adds to the database of ``engine``."""
    memory = f"{prefix}phpclaw_memory"
    lines = [f"table {change_table(prefix).name} (seq, namespace, lookup_key, through): derived, rebuildable"]
    if engine.dialect.name == "postgresql":
        lines.append(f"function {_function_name(prefix)}() that the triggers run")
    lines += [
        f"trigger {name} AFTER {name.rpartition('_')[2].upper()} ON {memory}"
        for name in trigger_names(prefix)
    ]
    return lines


def added(prefix: str) -> str:
    """Return the line init-db prints when it added the log of ``prefix`` to existing tables."""
    return f"added change log {change_table(prefix).name} and its triggers"


def install(engine: Engine, prefix: str) -> bool:
    """Create the log of ``prefix`` and its triggers where they are missing; return whether
    anything was created. Raises :class:`sqlalchemy.exc.SQLAlchemyError` (for example without
    the TRIGGER privilege), leaving no trigger behind."""
    created = False
    table = change_table(prefix)
    if not sa.inspect(engine).has_table(table.name):
        table.create(engine, checkfirst=True)
        created = True
        if engine.dialect.name == "postgresql":
            # Statistics kept fresh by autovacuum every 1,000 changes, not every 10% of the log:
            # without them the planner takes "after the newest" for a third of the log and
            # reads it whole instead of through its primary key.
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    f'ALTER TABLE "{table.name}" SET (autovacuum_analyze_scale_factor = 0, '
                    "autovacuum_analyze_threshold = 1000)"
                )
    with engine.connect() as conn:
        if armed(conn, prefix):
            return created
    try:
        with engine.begin() as conn:
            _drop_triggers(conn, prefix)
            for statement in _statements(engine.dialect.name, prefix):
                conn.exec_driver_sql(statement)
    except sa.exc.SQLAlchemyError:
        with engine.begin() as conn:  # MariaDB commits each CREATE TRIGGER on its own
            _drop_triggers(conn, prefix)
        raise
    return True


def _drop_triggers(conn: Connection, prefix: str) -> None:
    memory = f"{prefix}phpclaw_memory"
    postgres = conn.dialect.name == "postgresql"
    # PostgreSQL's triggers belong to their table (gone with it); elsewhere they are named alone.
    if not postgres or sa.inspect(conn).has_table(memory):
        quote = conn.dialect.identifier_preparer.quote
        for name in trigger_names(prefix):
            conn.exec_driver_sql(
                f"DROP TRIGGER IF EXISTS {quote(name)}" + (f" ON {quote(memory)}" if postgres else "")
            )
    if postgres:
        conn.exec_driver_sql(f'DROP FUNCTION IF EXISTS "{_function_name(prefix)}"()')


def uninstall(engine: Engine, prefix: str) -> bool:
    """Drop the triggers and the log of ``prefix``; return whether the log existed."""
    table = change_table(prefix)
    existed = sa.inspect(engine).has_table(table.name)
    with engine.begin() as conn:
        _drop_triggers(conn, prefix)
    table.drop(engine, checkfirst=True)
    return existed


def has_table(conn: Connection, prefix: str) -> bool:
    """Return whether the log table of ``prefix`` exists."""
    return sa.inspect(conn).has_table(change_table(prefix).name)


def armed(conn: Connection, prefix: str) -> bool:
    """Return whether all three triggers of ``prefix`` are in place, so that the log names every
    change: asked at each catch-up, so that triggers dropped by hand are noticed at once."""
    return int(conn.execute(_armed_select(conn.dialect.name, prefix)).scalar() or 0) == len(_EVENTS)


@functools.cache
def _armed_select(dialect: str, prefix: str) -> sa.TextClause:
    names = ", ".join(f"'{name}'" for name in trigger_names(prefix))
    memory = f"{prefix}phpclaw_memory"
    if dialect == "sqlite":
        sql = f"SELECT count(*) AS n FROM sqlite_master WHERE type = 'trigger' AND name IN ({names})"
    elif dialect == "postgresql":
        sql = (
            f"SELECT count(*) AS n FROM pg_trigger WHERE tgrelid = to_regclass('\"{memory}\"') "
            f"AND tgname IN ({names}) AND tgenabled <> 'D'"
        )
    else:
        sql = (
            "SELECT count(*) AS n FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() "
            f"AND EVENT_OBJECT_TABLE = '{memory}' AND TRIGGER_NAME IN ({names})"
        )
    return sa.text(sql)


def bounds(conn: Connection, prefix: str) -> tuple[int, int, int]:
    """Return the lowest and highest ``seq`` in the log and how many rows it holds (0, 0, 0
    when it is empty)."""
    table = change_table(prefix)
    low, high, rows = conn.execute(
        sa.select(sa.func.min(table.c.seq), sa.func.max(table.c.seq), sa.func.count())
    ).one()
    return int(low or 0), int(high or 0), int(rows or 0)


def seqs_between(conn: Connection, prefix: str, low: int, high: int) -> set[int]:
    """Return the numbers of the log's rows from ``low`` to ``high``."""
    table = change_table(prefix)
    return set(conn.execute(sa.select(table.c.seq).where(table.c.seq.between(low, high))).scalars())


def read(
    conn: Connection, prefix: str, after: int, also: Sequence[int] = (), below: int | None = None
) -> tuple[bool, list[Change]]:
    """Return whether the log's triggers are all in place (as :func:`armed`) and the log's rows
    after ``after``, those numbered ``also`` and those below ``below``, in order of their
    numbers: one statement, so a turn pays one round trip for both, each part a range of the
    primary key (a log the planner has no statistics for yet is never read whole), built once
    per shape of the question and bound at execution."""
    spread = len(also) > 500  # then the range from the lowest, not a list
    select = _read_select(conn.dialect.name, prefix, bool(also) and not spread, spread, below is not None)
    values: dict[str, Any] = {"after": after}
    if also:
        values.update(also=list(also)) if not spread else values.update(low=min(also))
    if below is not None:
        values["below"] = below
    found = conn.execute(select, values).all()
    changed = {
        int(seq): Change(int(seq), namespace, key, through) for _, seq, namespace, key, through in found[1:]
    }
    return int(found[0][0] or 0) == len(_EVENTS), [changed[seq] for seq in sorted(changed)]


_LAST_SEQ = 2**63 - 1  # the largest number a log row can have (a signed 64-bit integer)


@functools.cache
def _read_select(dialect: str, prefix: str, listed: bool, spread: bool, below: bool) -> sa.TextClause:
    quote = "`" if dialect in ("mysql", "mariadb") else '"'
    log = f"{quote}{change_table(prefix).name}{quote}"
    rows = f"SELECT NULL, seq, namespace, lookup_key, through FROM {log} WHERE"
    # The triggers' count first, as a row of its own: the turn checks them with the same trip.
    # Each part bounded on both sides: a log without statistics (PostgreSQL before its first
    # ANALYZE, which never comes with autovacuum off) is planned at a third of its rows for an
    # open range, so read whole at every catch-up (5 ms at 100,000 rows), but at a few rows
    # for a closed one, so read through its primary key (0.1 ms).
    parts = [
        f"SELECT ({_armed_select(dialect, prefix).text}) AS n, NULL, NULL, NULL, NULL",
        f"{rows} seq > :after AND seq <= {_LAST_SEQ}",
    ]
    if listed:
        parts.append(f"{rows} seq IN :also AND seq <= :after")
    if spread:
        parts.append(f"{rows} seq BETWEEN :low AND :after")
    if below:
        parts.append(f"{rows} seq < :below AND seq >= {-_LAST_SEQ}")
    text = sa.text(" UNION ALL ".join(parts))
    return text.bindparams(sa.bindparam("also", expanding=True)) if listed else text


def in_flight(
    conn: Connection, prefix: str, seqs: Sequence[int], below: int | None = None
) -> set[int] | None:
    """MariaDB/MySQL: return which of ``seqs`` (and of the numbers below ``below``) are rows
    now, committed or not, or ``None`` when one of them is a row still being written (locked by
    its transaction, which may yet commit).

    A locking read sees rows that a consistent read does not yet: ``NOWAIT`` fails at once on
    one whose transaction is open, instead of waiting for it."""
    table = change_table(prefix)
    where: list[Any] = []
    if seqs:
        where.append(table.c.seq.in_(list(seqs)))
    if below is not None:
        where.append(table.c.seq < below)
    if not where:
        return set()
    select = sa.select(table.c.seq).where(sa.or_(*where)).with_for_update(nowait=True)
    try:
        return {int(seq) for seq in conn.execute(select).scalars()}
    except sa.exc.OperationalError as exc:
        if _lock_refused(exc):
            return None
        raise


def _lock_refused(exc: sa.exc.OperationalError) -> bool:
    code = getattr(exc.orig, "args", (None,))[0]
    return code in (1205, 3572)  # lock wait timeout (MariaDB's NOWAIT), ER_LOCK_NOWAIT (MySQL)


def trim(conn: Connection, prefix: str, keep: int | None = None) -> int:
    """Delete all but the newest ``keep`` (:data:`KEEP`) rows of the log, and add the row that
    says so; return how many rows went."""
    keep = KEEP if keep is None else keep
    table = change_table(prefix)
    high = conn.execute(sa.select(sa.func.max(table.c.seq))).scalar()
    if high is None or int(high) <= keep:
        return 0
    through = int(high) - keep
    gone = conn.execute(sa.delete(table).where(table.c.seq <= through)).rowcount
    if gone:
        conn.execute(sa.insert(table).values(through=through))
    return int(gone or 0)


def size(conn: Connection, prefix: str) -> int:
    """Return how many rows the log holds."""
    return bounds(conn, prefix)[2]


class LogState(NamedTuple):
    """Which way recall follows the memory table of a prefix, in words for an operator."""

    on: bool
    line: str


def state(engine: Engine, prefix: str, shape: str) -> LogState:
    """Return whether recall follows the change log of ``prefix`` or counts the namespace each
    turn, and how to turn the log on."""
    flag, name = (" --change-log" if shape != CLAWMEM_SCHEMA else ""), change_table(prefix).name
    with engine.connect() as conn:
        if armed(conn, prefix):
            return LogState(True, f"recall reads only what changed, from the change log {name}")
        table = sa.inspect(conn).has_table(name)
    why = "its triggers are missing" if table else "there is no change log"
    return LogState(False, f"recall counts the namespace every turn ({why}); run init-db{flag} to add it")
