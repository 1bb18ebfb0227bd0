"""Dashboard admin accounts, login sessions and failed-login records, kept in the instance database."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import argon2
import sqlalchemy as sa
from argon2.exceptions import InvalidHashError, VerificationError
from flask import current_app
from sqlalchemy import Index, String, delete, func, insert, literal, select
from sqlalchemy.orm import Mapped, mapped_column

from clawmem.sql.engine import is_deadlock
from dashboard.extensions import db

_T = TypeVar("_T")

USERNAME_RULE = re.compile(r"[A-Za-z0-9._@-]{1,80}")
MIN_PASSWORD_CHARS = 12
FAILURE_WINDOW_SECONDS = 15 * 60
MAX_FAILURES_PER_ACCOUNT = 5  # per client address and username, within the window
MAX_FAILURES_PER_ADDRESS = 30  # per client address over every username, within the window
SESSION_MAX_SECONDS = 12 * 3600
SESSION_IDLE_SECONDS = 2 * 3600


class AccountError(ValueError):
    """An admin account could not be created or changed; the message says why."""


class Admin(db.Model):
    """A person who may sign in to the dashboard. Only the Argon2id hash of the password is kept."""

    __tablename__ = "dashboard_admins"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(80), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float]


class LoginSession(db.Model):
    """One signed-in browser. The cookie holds a random token; only its SHA-256 is stored."""

    __tablename__ = "dashboard_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    admin_id: Mapped[int] = mapped_column(index=True)
    created_at: Mapped[float]
    last_seen_at: Mapped[float]


class LoginFailure(db.Model):
    """One failed sign-in, for rate limiting across every worker process."""

    __tablename__ = "dashboard_login_failures"
    __table_args__ = (Index("dashboard_login_failures_lookup", "address", "username", "failed_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    address: Mapped[str] = mapped_column(String(64))
    username: Mapped[str] = mapped_column(String(80))
    failed_at: Mapped[float]


def password_hasher() -> argon2.PasswordHasher:
    """Return the Argon2id hasher; config ``ARGON2_PROFILE`` names an ``argon2.profiles`` entry."""
    profile = current_app.config.get("ARGON2_PROFILE", "RFC_9106_LOW_MEMORY")
    parameters = getattr(argon2.profiles, profile, None)
    if not isinstance(parameters, argon2.Parameters):
        raise AccountError(f"ARGON2_PROFILE {profile!r} is not a profile of argon2.profiles")
    return argon2.PasswordHasher.from_parameters(parameters)


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_CHARS:
        raise AccountError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")


def generate_password() -> str:
    """Return a new random password of 24 URL-safe characters."""
    return secrets.token_urlsafe(18)


def admin_count() -> int:
    """Return how many admin accounts exist."""
    return db.session.scalar(select(func.count()).select_from(Admin)) or 0


def check_new_username(username: str) -> None:
    """Return when ``username`` can name a new admin; raises :class:`AccountError` for a bad or
    taken name, so a command can say so before it asks for a password."""
    if not USERNAME_RULE.fullmatch(username):
        raise AccountError("a username is 1-80 ASCII letters, digits or . _ @ -")
    if db.session.scalar(select(Admin).where(Admin.username == username)) is not None:
        raise AccountError(f"an admin named {username!r} already exists; use set-password to change it")


def create_admin(username: str, password: str, now: float) -> Admin:
    """Create an admin; raises :class:`AccountError` for a bad name, a short password or a taken name."""
    check_new_username(username)
    _check_password(password)
    admin = Admin(username=username, password_hash=password_hasher().hash(password), created_at=now)
    db.session.add(admin)
    db.session.commit()
    return admin


def set_password(username: str, password: str) -> None:
    """Replace an admin's password and end every session they have; raises :class:`AccountError`."""
    _check_password(password)
    admin = db.session.scalar(select(Admin).where(Admin.username == username))
    if admin is None:
        raise AccountError(f"no admin named {username!r}; create it with create-admin")
    admin.password_hash = password_hasher().hash(password)
    db.session.execute(delete(LoginSession).where(LoginSession.admin_id == admin.id))
    db.session.commit()


def authenticate(username: str, password: str) -> Admin | None:
    """Return the admin whose name and password match, else ``None``.

    An unknown name costs one hash verification too, so timing does not reveal which names exist.
    """
    hasher = password_hasher()
    admin = db.session.scalar(select(Admin).where(Admin.username == username))
    stored = admin.password_hash if admin is not None else _dummy_hash(hasher)
    try:
        hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return None
    if admin is None:
        return None
    if hasher.check_needs_rehash(stored):
        admin.password_hash = hasher.hash(password)
        db.session.commit()
    return admin


def _dummy_hash(hasher: argon2.PasswordHasher) -> str:
    cache = current_app.extensions.setdefault("dashboard.dummy_hash", {})
    key = (hasher.time_cost, hasher.memory_cost, hasher.parallelism)
    if key not in cache:
        cache[key] = hasher.hash(secrets.token_urlsafe(18))
    return cache[key]


# -- rate limiting ---------------------------------------------------------------------------


def _failure_key(username: str) -> str:
    # Case variants of one name share a budget.
    return username.casefold()[:80]


def login_blocked_for(address: str, username: str, now: float) -> float:
    """Return the seconds until ``address`` may try ``username`` again (0 when it may now)."""
    recent = db.session.execute(
        select(LoginFailure.failed_at, LoginFailure.username)
        .where(LoginFailure.address == address, LoginFailure.failed_at > now - FAILURE_WINDOW_SECONDS)
        .order_by(LoginFailure.failed_at)
    ).all()
    key = _failure_key(username)
    per_address = [failed_at for failed_at, _ in recent]
    per_account = [failed_at for failed_at, name in recent if name == key]
    waits = [0.0]
    if len(per_account) >= MAX_FAILURES_PER_ACCOUNT:
        waits.append(per_account[-MAX_FAILURES_PER_ACCOUNT] + FAILURE_WINDOW_SECONDS - now)
    if len(per_address) >= MAX_FAILURES_PER_ADDRESS:
        waits.append(per_address[-MAX_FAILURES_PER_ADDRESS] + FAILURE_WINDOW_SECONDS - now)
    return max(waits)


def begin_attempt(address: str, username: str, now: float) -> bool:
    """Record a sign-in attempt of ``address`` on ``username`` as a failure, unless the limits
    are reached; return whether it was recorded (the password may then be checked).

    The check and the record are one ``INSERT ... SELECT ... WHERE`` statement, and SQLite (the
    instance database) runs one writer at a time, so concurrent attempts cannot all pass the
    check before any is recorded. A successful sign-in clears the record (:func:`clear_failures`).
    """
    key, since = _failure_key(username), now - FAILURE_WINDOW_SECONDS
    recent = LoginFailure.address == address, LoginFailure.failed_at > since

    def failures(*where: Any) -> Any:
        return select(func.count()).select_from(LoginFailure).where(*recent, *where).scalar_subquery()

    attempt = select(literal(address), literal(key), literal(now)).where(
        failures(LoginFailure.username == key) < MAX_FAILURES_PER_ACCOUNT,
        failures() < MAX_FAILURES_PER_ADDRESS,
    )
    db.session.commit()  # start a fresh transaction: it must see every attempt committed so far

    def record() -> int:
        db.session.execute(delete(LoginFailure).where(LoginFailure.failed_at <= since))
        statement = insert(LoginFailure).from_select(["address", "username", "failed_at"], attempt)
        if not db.session.get_bind().dialect.insert_returning:  # MySQL: its rowcount is right
            return db.session.execute(statement).rowcount
        # The new rows' ids are counted: psycopg reports no rowcount (-1) for this insert, so
        # on PostgreSQL every attempt would look refused.
        return len(db.session.execute(statement.returning(LoginFailure.id)).all())

    return _retrying_deadlocks(record) == 1


def clear_failures(address: str, username: str) -> None:
    """Forget the failures of ``address`` on ``username`` after a successful sign-in."""

    def clear() -> None:
        db.session.execute(
            delete(LoginFailure).where(
                LoginFailure.address == address, LoginFailure.username == _failure_key(username)
            )
        )

    _retrying_deadlocks(clear)


DEADLOCK_RETRIES = 5


def _retrying_deadlocks(transaction: Callable[[], _T]) -> _T:
    """Run ``transaction`` and commit it; when the database rolled it back as a deadlock victim
    (MySQL 1213, PostgreSQL 40P01), run it again, at most :data:`DEADLOCK_RETRIES` times in all.
    The last deadlock propagates, and the app answers it with 503."""
    for attempt in range(DEADLOCK_RETRIES):
        try:
            outcome = transaction()
            db.session.commit()
            return outcome
        except sa.exc.DBAPIError as exc:
            db.session.rollback()
            if not is_deadlock(exc) or attempt == DEADLOCK_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


# -- sessions ----------------------------------------------------------------------------------


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def start_session(admin: Admin, now: float) -> str:
    """Record a new signed-in session for ``admin``; return the token for the cookie."""
    token = secrets.token_urlsafe(32)
    record = LoginSession(token_hash=_token_hash(token), admin_id=admin.id, created_at=now, last_seen_at=now)
    db.session.add(record)
    db.session.commit()
    return token


class SignedIn(NamedTuple):
    """The admin a live session belongs to, as the pages name them."""

    id: int
    username: str


# Built once: every signed-in request asks it, and building it costs about what running it does.
_SESSION_ADMIN = (
    select(LoginSession.created_at, LoginSession.last_seen_at, Admin.id, Admin.username)
    .join(Admin, Admin.id == LoginSession.admin_id)
    .where(LoginSession.token_hash == sa.bindparam("token_hash"))
)


def session_admin(token: str | None, now: float) -> SignedIn | None:
    """Return the admin of a live session token, or ``None`` (unknown, ended, idle or too old,
    or its admin removed): one statement, the same for every request."""
    if not token or not isinstance(token, str):
        return None
    token_hash = _token_hash(token)
    found = db.session.execute(_SESSION_ADMIN, {"token_hash": token_hash}).first()
    if found is None:
        return None
    created_at, last_seen_at, admin_id, username = found
    this_session = LoginSession.token_hash == token_hash
    if now - created_at > SESSION_MAX_SECONDS or now - last_seen_at > SESSION_IDLE_SECONDS:
        db.session.execute(delete(LoginSession).where(this_session))
        db.session.commit()
        return None
    if now - last_seen_at > 60:  # one write a minute is enough to track idleness
        db.session.execute(sa.update(LoginSession).where(this_session).values(last_seen_at=now))
        db.session.commit()
    return SignedIn(admin_id, username)


def end_session(token: str | None) -> None:
    """End a session so its cookie is refused from now on (an unknown token is not an error)."""
    if token and isinstance(token, str):
        db.session.execute(delete(LoginSession).where(LoginSession.token_hash == _token_hash(token)))
        db.session.commit()
