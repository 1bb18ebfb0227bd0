"""The Tokens page: what ``tokens list`` shows (names, scopes, states, times, never a token),
read from the accounts database the CLI writes, with the commands and no control that makes or
ends a token."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.sql import tokens as store
from clawmem.sql.engine import engine_for
from dashboard.extensions import db
from tests.dashboard_helpers import page_text


def words(body: str) -> str:
    """The text of the page's main part, its tags removed and its spaces collapsed."""
    main = body.split("<main>", 1)[1].split("</main>", 1)[0]
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", main)))


pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent


def test_the_page_lists_tokens_made_on_the_command_line_and_never_a_token(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "from clawmem.cli import main; main()",
            "tokens",
            "create",
            "--name",
            "from-cli",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT), "CLAW_INSTANCE_PATH": app.instance_path},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    cli_token = made.stdout.strip()
    now = clock()
    with app.app_context():
        engine = db.engine
        assert str(engine.url) == store.accounts_url(app.instance_path)  # the file the CLI writes
        shop = store.create_token(engine, "shop-reader", now, namespace="shop", read_only=True)
        store.create_token(engine, "old", now - 90 * 86400, expires_at=now - 86400)
        store.create_token(engine, "alice", now, subject="alice@example.com")
        store.create_token(engine, "ended", now)
        store.revoke_token(engine, "ended", now)
    response = signed_in.get("/tokens")
    assert response.status_code == 200
    text = words(page_text(response))
    assert "shop-reader active namespace shop, read-only" in text
    assert "old expired any namespace, read and write" in text
    assert "alice active any namespace, subject alice@example.com, read and write" in text
    assert "ended revoked" in text
    assert "from-cli active" in text
    for token in (shop, cli_token):
        assert token not in response.get_data(as_text=True)
    assert "tokens create --name" in text and "tokens revoke" in text
    body = response.get_data(as_text=True)
    main = body.split("<main>", 1)[1]
    assert "<form" not in main and "<button" not in main
    engine_for(store.accounts_url(app.instance_path)).dispose()


def test_the_page_says_when_no_token_exists(signed_in: FlaskClient) -> None:
    text = words(page_text(signed_in.get("/tokens")))
    assert "No token has been made yet." in text
    assert "Tokens" in text
