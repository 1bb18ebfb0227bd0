"""Sign-in on a shared account database: a statement the database rolled back as a deadlock
victim (MySQL 1213, PostgreSQL 40P01) is run again a bounded number of times, and only then is
the answer 503.

The account tables have fixed names, so each test gets a database of its own. The deadlock is
the driver's own error class raised at the cursor for the first attempts: a real InnoDB deadlock
on the failed-login statement needs many concurrent sign-ins and cannot be timed to a test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.engine import make_url

from clawmem.clock import FakeClock
from clawmem.sql.engine import create_engine
from dashboard import accounts, create_app
from dashboard.auth import LOGIN_ERROR
from dashboard.extensions import db
from tests.conftest import backend_url
from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in


def _deadlock(backend: str) -> BaseException:
    if backend == "mysql":
        import pymysql

        return pymysql.err.OperationalError(
            1213, "Deadlock found when trying to get lock; try restarting transaction"
        )
    import psycopg

    return psycopg.errors.DeadlockDetected("deadlock detected")


@pytest.fixture(params=["mysql", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def accounts_url(backend: str) -> Iterator[str]:
    """A database of this test's own on the server of ``backend``."""
    url = make_url(backend_url(backend))
    name = f"clawmem_accounts_{uuid.uuid4().hex[:10]}"
    server = create_engine(
        url.set(database=None if backend == "mysql" else "postgres").render_as_string(hide_password=False),
        isolation_level="AUTOCOMMIT",
    )
    with server.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    yield url.set(database=name).render_as_string(hide_password=False)
    with server.connect() as conn:
        conn.exec_driver_sql(
            f"DROP DATABASE IF EXISTS {name}" + (" WITH (FORCE)" if backend == "postgres" else "")
        )
    server.dispose()


@pytest.fixture
def app(accounts_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Flask]:
    app = create_app(
        {
            "TESTING": True,
            "ARGON2_PROFILE": "CHEAPEST",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'claw.db'}",
            "SQLALCHEMY_DATABASE_URI": accounts_url,
        },
        instance_path=str(tmp_path / "instance"),
    )
    app.extensions["clawmem.clock"] = clock
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, clock())
    yield app
    with app.app_context():
        db.engine.dispose()


def _fail_failed_login_inserts(app: Flask, backend: str, times: int) -> list[str]:
    """Make the next ``times`` statements that record a failed sign-in die as deadlock victims."""
    seen: list[str] = []

    def victim(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if (
            statement.lstrip().upper().startswith("INSERT INTO DASHBOARD_LOGIN_FAILURES")
            and len(seen) < times
        ):
            seen.append(statement)
            raise _deadlock(backend)

    with app.app_context():
        sa.event.listen(db.engine, "before_cursor_execute", victim)
    return seen


@pytest.mark.slow
def test_a_deadlocked_sign_in_is_retried_and_answers_as_usual(app: Flask, backend: str) -> None:
    deadlocks = _fail_failed_login_inserts(app, backend, accounts.DEADLOCK_RETRIES - 1)
    wrong = sign_in(app.test_client(), ADMIN, "not the password")
    right = sign_in(app.test_client(), ADMIN, PASSWORD)
    assert len(deadlocks) == accounts.DEADLOCK_RETRIES - 1
    assert wrong.status_code == 200 and LOGIN_ERROR in wrong.get_data(as_text=True)
    assert right.status_code == 302
    with app.app_context():
        # The failure was recorded once, and the successful sign-in cleared it.
        assert db.session.execute(sa.select(sa.func.count()).select_from(accounts.LoginFailure)).scalar() == 0


def test_a_sign_in_that_keeps_deadlocking_is_a_503_after_the_bounded_retries(
    app: Flask, backend: str
) -> None:
    deadlocks = _fail_failed_login_inserts(app, backend, 100)
    answer = sign_in(app.test_client(), ADMIN, "not the password")
    assert answer.status_code == 503
    assert len(deadlocks) == accounts.DEADLOCK_RETRIES
