"""Access tokens of the MCP HTTP server, kept in the dashboard's accounts database.

A token is printed once when it is made; only its SHA-256 is stored, beside its name, its scope
(a namespace, a subject, read-only), when it was made, when it was last used and when it
expires. Failed attempts are recorded per client address, so every worker process of the server
shares one rate limit, as the dashboard's sign-ins do. Nothing here touches the site's three
tables: the accounts database is the dashboard's (:func:`accounts_url`), ``<instance>/dashboard.db``
unless ``CLAW_SQLALCHEMY_DATABASE_URI`` names another.

The reads and writes of a request's check go through :func:`clawmem.sql.engine.connect` and
:func:`~clawmem.sql.engine.write_transaction`, so on the async path
(:mod:`clawmem.integrations.aio`) an accounts database on PostgreSQL or MariaDB is checked over
its asyncio driver, on the server's event loop.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from clawmem.rules import validate_namespace
from clawmem.sql.engine import connect, write_transaction

TOKEN_PREFIX = "clawmem_"
NAME_RULE = re.compile(r"[A-Za-z0-9._@-]{1,80}")
FAILURE_WINDOW_SECONDS = 15 * 60
MAX_FAILURES_PER_ADDRESS = 30  # failed token attempts per client address within the window
TOUCH_SECONDS = 60  # last_used_at is written at most once a minute per token
# The dashboard's own setting for its accounts database (Flask's SQLALCHEMY_DATABASE_URI, read
# from the environment under the CLAW_ prefix): the tokens live where its admins do.
ACCOUNTS_URL_VARIABLE = "CLAW_SQLALCHEMY_DATABASE_URI"

metadata = sa.MetaData()

tokens_table = sa.Table(
    "dashboard_mcp_tokens",
    metadata,
    sa.Column("name", sa.String(80), primary_key=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("namespace", sa.String(100)),
    sa.Column("subject", sa.String(191)),
    sa.Column("read_only", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("expires_at", sa.Double),
    sa.Column("last_used_at", sa.Double),
    sa.Column("revoked_at", sa.Double),
)

failures_table = sa.Table(
    "dashboard_mcp_token_failures",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("address", sa.String(64), nullable=False),
    sa.Column("failed_at", sa.Double, nullable=False),
    sa.Index("dashboard_mcp_token_failures_lookup", "address", "failed_at"),
)


class TokenError(ValueError):
    """A token could not be made or ended; the message says why."""


@dataclass(frozen=True)
class TokenRecord:
    """One stored token, as ``tokens list`` shows it (never the token itself)."""

    name: str
    namespace: str | None
    subject: str | None
    read_only: bool
    created_at: float
    expires_at: float | None
    last_used_at: float | None
    revoked_at: float | None

    def state(self, now: float) -> str:
        """Return ``revoked``, ``expired`` or ``active``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def describe_scope(self) -> str:
        """Return the scope in a few words: namespace, subject, read-only."""
        parts = [f"namespace {self.namespace}" if self.namespace else "any namespace"]
        if self.subject is not None:
            parts.append(f"subject {self.subject}")
        parts.append("read-only" if self.read_only else "read and write")
        return ", ".join(parts)


def accounts_url(instance_path: str | Path) -> str:
    """Return the URL of the dashboard's accounts database: ``CLAW_SQLALCHEMY_DATABASE_URI`` when
    it is set (as the dashboard reads it), else ``dashboard.db`` in ``instance_path``."""
    return os.environ.get(ACCOUNTS_URL_VARIABLE) or default_accounts_url(instance_path)


def default_accounts_url(instance_path: str | Path) -> str:
    """Return the URL of the SQLite accounts database in ``instance_path``, the default one."""
    return f"sqlite:///{Path(instance_path) / 'dashboard.db'}"


def create_tables(engine: Engine) -> None:
    """Create the token tables if they are missing (several processes may race: IF NOT EXISTS),
    and widen the times of tables an earlier version made on MySQL/MariaDB (see
    :func:`_widen_times`)."""
    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            conn.execute(sa.schema.CreateTable(table, if_not_exists=True))
            for index in table.indexes:
                conn.execute(sa.schema.CreateIndex(index, if_not_exists=True))
    if engine.dialect.name in ("mysql", "mariadb"):
        _widen_times(engine)


def _widen_times(engine: Engine) -> None:
    """Make the times DOUBLE where an earlier version made them FLOAT: MySQL's FLOAT keeps about
    six digits, so a Unix time read back was off by up to an hour and a half, and failed attempts
    fell out of the rate limit's window at once."""
    inspector = sa.inspect(engine)
    quote = engine.dialect.identifier_preparer.quote
    for table in metadata.sorted_tables:
        narrow = [
            column["name"]
            for column in inspector.get_columns(table.name)
            if isinstance(column["type"], sa.Float) and not isinstance(column["type"], sa.Double)
        ]
        for name in narrow:
            null = "NULL" if table.c[name].nullable else "NOT NULL"
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {quote(table.name)} MODIFY {quote(name)} DOUBLE {null}")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _record(row: sa.Row) -> TokenRecord:
    return TokenRecord(
        name=row.name,
        namespace=row.namespace,
        subject=row.subject,
        read_only=bool(row.read_only),
        created_at=row.created_at,
        expires_at=row.expires_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )


def create_token(
    engine: Engine,
    name: str,
    now: float,
    *,
    namespace: str | None = None,
    subject: str | None = None,
    read_only: bool = False,
    expires_at: float | None = None,
) -> str:
    """Store a new token's hash and scope; return the token (shown once, kept nowhere).

    Raises :class:`TokenError` for a bad or taken name, or a namespace that breaks the naming
    rules (nothing is stored then).
    """
    if not NAME_RULE.fullmatch(name):
        raise TokenError("a token name is 1-80 ASCII letters, digits or . _ @ -")
    if namespace is not None:
        try:
            validate_namespace(namespace)
        except ValueError as exc:
            raise TokenError(f"the token's namespace cannot be used: {exc}") from None
    if subject is not None and not subject.strip():
        raise TokenError("a token's subject is a user id: it cannot be empty")
    create_tables(engine)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with engine.begin() as conn:
            conn.execute(
                tokens_table.insert().values(
                    name=name,
                    token_hash=_hash(token),
                    namespace=namespace,
                    subject=subject,
                    read_only=read_only,
                    created_at=now,
                    expires_at=expires_at,
                )
            )
    except sa.exc.IntegrityError:
        raise TokenError(f"a token named {name!r} already exists; revoke it or choose another name") from None
    return token


def list_tokens(engine: Engine) -> list[TokenRecord]:
    """Return every stored token (revoked ones too), by name; none when the table is missing."""
    if not sa.inspect(engine).has_table(tokens_table.name):
        return []
    with engine.connect() as conn:
        rows = conn.execute(sa.select(tokens_table).order_by(tokens_table.c.name)).all()
    return [_record(row) for row in rows]


def find_token(engine: Engine, name: str) -> TokenRecord | None:
    """Return the token named ``name``, or ``None``."""
    if not sa.inspect(engine).has_table(tokens_table.name):
        return None
    with engine.connect() as conn:
        row = conn.execute(sa.select(tokens_table).where(tokens_table.c.name == name)).first()
    return None if row is None else _record(row)


def revoke_token(engine: Engine, name: str, now: float) -> bool:
    """Mark the token ``name`` revoked, so its next request is refused; return whether an active
    one was found (a revoked one stays revoked, at its first time)."""
    if not sa.inspect(engine).has_table(tokens_table.name):
        return False
    with engine.begin() as conn:
        result = conn.execute(
            tokens_table.update()
            .where(tokens_table.c.name == name, tokens_table.c.revoked_at.is_(None))
            .values(revoked_at=now)
        )
    return result.rowcount == 1


_BY_HASH = sa.select(tokens_table).where(tokens_table.c.token_hash == sa.bindparam("token_hash"))
_RECENT_FAILURES = (
    sa.select(failures_table.c.failed_at)
    .where(
        failures_table.c.address == sa.bindparam("address"),
        failures_table.c.failed_at > sa.bindparam("since"),
    )
    .order_by(failures_table.c.failed_at.desc())
    .limit(MAX_FAILURES_PER_ADDRESS)
    .subquery("recent")
)
# When the address has used up its attempts, the oldest of them: the window ends a
# FAILURE_WINDOW_SECONDS after it. NULL while it may try.
_BLOCKED_SINCE = (
    sa.select(
        sa.case((sa.func.count() >= MAX_FAILURES_PER_ADDRESS, sa.func.min(_RECENT_FAILURES.c.failed_at)))
    )
    .select_from(_RECENT_FAILURES)
    .scalar_subquery()
)
# The address's state and the token's row in one round trip: one row, its token columns NULL
# when no token has the hash.
_ADMISSION = sa.select(_BLOCKED_SINCE.label("blocked_since"), *tokens_table.c).select_from(
    sa.select(sa.literal(1).label("one"))
    .subquery("one")
    .outerjoin(tokens_table, tokens_table.c.token_hash == sa.bindparam("token_hash"))
)


def authenticate(engine: Engine, token: str, now: float) -> TokenRecord | None:
    """Return the stored token that ``token`` is, or ``None`` when no token matches.

    The stored hash is compared in constant time; a revoked or expired token is returned (its
    :meth:`TokenRecord.state` says so), and its use is not recorded. A live one's last use is
    written at most once a minute.
    """
    token_hash = _hash(token)
    with connect(engine) as conn:
        row = conn.execute(_BY_HASH, {"token_hash": token_hash}).first()
    return _matched(engine, row, token_hash, now)


def _matched(engine: Engine, row: sa.Row | None, token_hash: str, now: float) -> TokenRecord | None:
    if row is None or row.token_hash is None or not hmac.compare_digest(row.token_hash, token_hash):
        return None
    record = _record(row)
    if record.state(now) == "active" and (
        record.last_used_at is None or now - record.last_used_at > TOUCH_SECONDS
    ):
        with write_transaction(engine) as conn:
            conn.execute(
                tokens_table.update().where(tokens_table.c.name == record.name).values(last_used_at=now)
            )
    return record


def _wait(blocked_since: float | None, now: float) -> float:
    return 0.0 if blocked_since is None else max(0.0, blocked_since + FAILURE_WINDOW_SECONDS - now)


def blocked_for(engine: Engine, address: str, now: float) -> float:
    """Return the seconds until ``address`` may try a token again (0 when it may now)."""
    with connect(engine) as conn:
        since = conn.execute(
            sa.select(_BLOCKED_SINCE), {"address": address[:64], "since": now - FAILURE_WINDOW_SECONDS}
        ).scalar()
    return _wait(since, now)


def admit(engine: Engine, address: str, token: str, now: float) -> tuple[float, TokenRecord | None]:
    """Return the seconds until ``address`` may try a token again (0 when it may now) and, when
    it may and ``token`` is given, what :func:`authenticate` returns for it; both read in one
    statement, a request's one round trip to the accounts database (a live token's last use
    written once a minute aside)."""
    token_hash = _hash(token)
    parameters = {"address": address[:64], "since": now - FAILURE_WINDOW_SECONDS, "token_hash": token_hash}
    with connect(engine) as conn:
        row = conn.execute(_ADMISSION, parameters).one()
    wait = _wait(row.blocked_since, now)
    if wait > 0 or not token:
        return wait, None
    return 0.0, _matched(engine, row, token_hash, now)


def record_failure(engine: Engine, address: str, now: float) -> None:
    """Record one failed token attempt of ``address`` (and forget those older than the window)."""
    with write_transaction(engine) as conn:
        conn.execute(
            failures_table.delete().where(failures_table.c.failed_at <= now - FAILURE_WINDOW_SECONDS)
        )
        conn.execute(failures_table.insert().values(address=address[:64], failed_at=now))
