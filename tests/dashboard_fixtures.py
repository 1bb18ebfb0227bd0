"""Fixtures of the dashboard tests: an app per test on its own database and instance folder,
an admin, a signed-in client, and the demo data (per test, or one app with it per module for
tests that only read). Load with ``pytest_plugins``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables
from dashboard import accounts, create_app, state
from tests.conftest import sql_url
from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in


@pytest.fixture
def dashboard_backend(request: pytest.FixtureRequest) -> str:
    """The SQL backend of the app's data: sqlite unless a test parametrises it indirectly."""
    return getattr(request, "param", "sqlite")


def build_app(url: str, prefix: str, instance: Any, clock: FakeClock, **config: Any) -> Flask:
    """Return a dashboard app on ``url`` and ``prefix`` with its tables made, reading ``clock``."""
    settings = {
        "TESTING": True,
        "ARGON2_PROFILE": "CHEAPEST",  # hashing speed is not under test; the hash type is
        "DATABASE_URL": url,
        "TABLE_PREFIX": prefix,
        **config,
    }
    app = create_app(settings, instance_path=str(instance))
    app.extensions["clawmem.clock"] = clock
    with app.app_context():
        create_tables(state.engine(), prefix)
    return app


@pytest.fixture
def make_app(
    tmp_path: Any, clock: FakeClock, prefix: str, dashboard_backend: str
) -> Iterator[Callable[..., Flask]]:
    """Return ``build(**config)``: a dashboard app on this test's database, prefix, instance
    folder and fake clock. Apps built in one test share all of these."""
    url = sql_url(dashboard_backend, tmp_path)

    def build(**config: Any) -> Flask:
        return build_app(url, prefix, tmp_path / "instance", clock, **config)

    yield build
    engine = engine_for(url)
    drop_tables(engine, prefix)
    engine.dispose()


@pytest.fixture
def app(make_app: Callable[..., Flask]) -> Flask:
    """A dashboard app with default settings (the ``client`` fixture of pytest-flask uses it)."""
    return make_app()


@pytest.fixture
def admin(app: Flask, clock: FakeClock) -> tuple[str, str]:
    """An admin account; returns ``(username, password)``."""
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, clock())
    return ADMIN, PASSWORD


@pytest.fixture
def signed_in(client: FlaskClient, admin: tuple[str, str]) -> FlaskClient:
    """A test client with a live session of the admin."""
    response = sign_in(client, *admin)
    assert response.status_code == 302, response.get_data(as_text=True)
    return client


@pytest.fixture
def demo(app: Flask) -> None:
    """Load the demo data through ``flask claw demo``."""
    load_demo(app)


def load_demo(app: Flask) -> None:
    """Load the demo data into ``app`` through ``flask claw demo``."""
    result = app.test_cli_runner().invoke(args=["claw", "demo"])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def demo_app(tmp_path_factory: pytest.TempPathFactory) -> Flask:
    """One app on SQLite with the demo data and an admin, shared by the tests of a module that
    only read it (each takes a client of its own): loading the demo takes about a second."""
    directory = tmp_path_factory.mktemp("demo")
    clock = FakeClock(1_700_000_000.25)
    app = build_app(sql_url("sqlite", directory), f"t{uuid.uuid4().hex[:8]}_", directory / "instance", clock)
    load_demo(app)
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, clock())
    return app


@pytest.fixture
def demo_signed_in(demo_app: Flask) -> FlaskClient:
    """A client of :func:`demo_app` with a live session of its admin."""
    client = demo_app.test_client()
    response = sign_in(client)
    assert response.status_code == 302, response.get_data(as_text=True)
    return client
