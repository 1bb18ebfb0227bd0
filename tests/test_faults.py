"""Other faults of the review: the sign-in limit under concurrent guesses, settings that cannot
work, rows under names today's rules refuse, and the file driver's directory on uninstall."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask

from clawmem.cli import main
from clawmem.errors import ConfigError, InvalidNamespace
from clawmem.settings import Settings
from dashboard import accounts, create_app, state
from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in
from tests.hostile import conversation_row, memory_row, write_rows

pytest_plugins = ["tests.dashboard_fixtures"]

GUESSES = 20


def _claw(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["claw", *args])


# -- the sign-in limit --------------------------------------------------------------------------------


def test_concurrent_wrong_passwords_get_exactly_the_limit_of_tries(
    app: Flask, admin: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every guess that gets past the limit waits inside the password check until every guess
    # has either reached it or been refused: the widest window a race could use.
    settled = threading.Condition()
    arrived = refused = 0
    checked = accounts.authenticate

    def slow_check(username: str, password: str) -> Any:
        nonlocal arrived
        with settled:
            arrived += 1
            settled.notify_all()
            assert settled.wait_for(lambda: arrived + refused == GUESSES, timeout=60)
        return checked(username, password)

    monkeypatch.setattr(accounts, "authenticate", slow_check)

    def guess(number: int) -> int:
        nonlocal refused
        status = sign_in(app.test_client(), ADMIN, f"wrong password {number}").status_code
        if status == 429:
            with settled:
                refused += 1
                settled.notify_all()
        return status

    with ThreadPoolExecutor(max_workers=GUESSES) as pool:
        statuses = list(pool.map(guess, range(GUESSES)))
    assert statuses.count(200) == accounts.MAX_FAILURES_PER_ACCOUNT
    assert statuses.count(429) == GUESSES - accounts.MAX_FAILURES_PER_ACCOUNT
    monkeypatch.setattr(accounts, "authenticate", checked)
    assert sign_in(app.test_client(), ADMIN, PASSWORD).status_code == 429, "the right password waits too"


def test_a_successful_sign_in_clears_its_recorded_attempt(app: Flask, admin: tuple[str, str]) -> None:
    for _ in range(accounts.MAX_FAILURES_PER_ACCOUNT * 2):
        assert sign_in(app.test_client(), ADMIN, PASSWORD).status_code == 302


# -- settings that cannot work ---------------------------------------------------------------------


def test_a_short_secret_key_is_refused_in_one_line(make_app: Callable[..., Flask]) -> None:
    with pytest.raises(ConfigError) as refused:
        make_app(SECRET_KEY="a")
    assert str(refused.value) == (
        "CLAW_SECRET_KEY must be at least 32 characters (got 1); unset it to use a generated key kept "
        "in the instance folder"
    )


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("DATABASE_URL", "mysql+pymysql://clawmem:p@ss@db.internal/clawmem"),
        ("REDIS_URL", "redis://:pa@ss@cache:6379/0"),
    ],
)
def test_an_unencoded_at_sign_in_a_password_is_refused_in_one_line(
    name: str, url: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_mapping({name: url}, tmp_path)
    message = str(refused.value)
    assert message.startswith(f"CLAW_{name} holds more than one '@' before its host")
    assert "\n" not in message and "ss@" not in message and "%40" in message
    with pytest.raises(ConfigError, match="more than one '@'"):
        create_app({"TESTING": True, name: url}, instance_path=str(tmp_path / "instance"))
    environment = {f"CLAW_{name}": url, "CLAW_INSTANCE_PATH": str(tmp_path / "cli")}
    result = CliRunner().invoke(main, ["flush", "--namespace", "x", "--dry-run"], env=environment)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {message}"]


def test_an_encoded_at_sign_and_sqlite_paths_with_one_are_accepted(tmp_path: Path) -> None:
    Settings.from_mapping({"DATABASE_URL": "mysql+pymysql://clawmem:p%40ss@db/clawmem"}, tmp_path)
    Settings.from_mapping({"DATABASE_URL": "sqlite:////srv/me@host/claw.db"}, tmp_path)


# -- rows under names today's rules refuse -------------------------------------------------------------


BAD_NAMESPACES = ["default --yes #", "has space", "a..b", "x{y}", "n" * 100 + "!"]


def test_flush_reaches_a_namespace_another_program_wrote_and_never_writes_one(
    app: Flask, tmp_path: Path, prefix: str
) -> None:
    write_rows(
        "sqlite",
        tmp_path,
        prefix,
        memory=[
            *(
                memory_row(number, namespace=namespace, lookup_key="k\x1b[2J")
                for number, namespace in enumerate(BAD_NAMESPACES)
            ),
            memory_row(99, lookup_key="keep"),
        ],
    )
    for namespace in BAD_NAMESPACES:
        dry = _claw(app, "flush", "--namespace", namespace, "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert "breaks today's naming rule" in dry.output and "would delete 1 entry" in dry.output
        done = _claw(app, "flush", "--namespace", namespace, "--yes")
        assert done.exit_code == 0 and "deleted 1 entry" in done.output, done.output
    with app.app_context():
        driver = state.driver()
        assert [row.key for ns in driver.namespaces() for row in driver.stored_records(ns)] == ["keep"]
        with pytest.raises(InvalidNamespace):
            state.memory().set("k", "v", "default --yes #")
    refused = _claw(app, "flush", "--namespace", "never stored here", "--yes")
    assert refused.exit_code == 2 and "illegal characters" in refused.output


def test_erase_reaches_rows_under_names_todays_rules_refuse(app: Flask, tmp_path: Path, prefix: str) -> None:
    write_rows(
        "sqlite",
        tmp_path,
        prefix,
        conversations=[conversation_row(1, user_id="cust-9")],
        memory=[
            memory_row(1, namespace="crm export", lookup_key="phone", value='"cust-9: 555-0100"'),
            memory_row(2, namespace="default", lookup_key="cust-9\x07note", value='"x"'),
            memory_row(3, namespace="default", lookup_key="other", value='"cust-90 only"'),
        ],
    )
    result = _claw(app, "erase", "--user-id", "cust-9", "--mentions", "--yes")
    assert result.exit_code == 0, result.output
    assert "deleted 1 conversation, 0 messages and 2 memory entries" in result.output
    with app.app_context():
        left = [
            (row.namespace, row.key)
            for ns in state.driver().namespaces()
            for row in state.driver().stored_records(ns)
        ]
        assert left == [("default", "other")]
        assert state.conversations().counts()["conversations"] == 0


# -- the file driver's directory -----------------------------------------------------------------------


def test_uninstall_files_touches_only_the_sites_own_directory(
    make_app: Callable[..., Flask], tmp_path: Path
) -> None:
    application = tmp_path / "application"
    application.mkdir()
    for name in ("config.json", "data.json", "users.json"):
        (application / name).write_text("{}")
    app = make_app(MEMORY_DRIVER="file", FILE_DIR=str(application))
    with app.app_context():
        state.memory().set("note", "clawmem's own")
    dry = _claw(app, "uninstall", "--files", "--dry-run", "-v")
    assert dry.exit_code == 0, dry.output
    assert not any(name in dry.output for name in ("config.json", "data.json", "users.json"))
    assert _claw(app, "uninstall", "--files", "--yes").exit_code == 0
    assert sorted(path.name for path in application.iterdir()) == ["config.json", "data.json", "users.json"]
