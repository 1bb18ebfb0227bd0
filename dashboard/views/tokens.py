"""Tokens: the access tokens of the MCP HTTP server, as ``tokens list`` shows them.

Read-only like every page: tokens are made and revoked with the CLI only, whose commands the
page shows. No token is shown, only its name, scope, state and times.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from clawmem.clock import utc_datetime
from clawmem.sql import tokens as store
from dashboard import state
from dashboard.extensions import db
from dashboard.views.rendering import format_time, render_page, shell_command

bp = Blueprint("tokens", __name__)


def _moment(stamp: float | None, missing: str) -> str:
    return missing if stamp is None else format_time(utc_datetime(lambda: stamp))


def _row(record: store.TokenRecord, now: float) -> dict[str, Any]:
    return {
        "name": record.name,
        "state": record.state(now),
        "scope": record.describe_scope(),
        "created": _moment(record.created_at, ""),
        "last_used": _moment(record.last_used_at, "never"),
        "expires": _moment(record.expires_at, "never"),
    }


@bp.get("/tokens")
def index() -> str:
    """Every token with its scope, state, made, last used and expiry; the CLI commands."""
    now = state.clock()()
    rows = [_row(record, now) for record in store.list_tokens(db.engine)]
    return render_page(
        "tokens/index.html",
        {},
        rows=rows,
        create=shell_command(
            "flask",
            "claw",
            "tokens",
            "create",
            "--name",
            "support-agent",
            "--namespace",
            "support",
            "--read-only",
            "--expires",
            "30d",
        ),
        listing=shell_command("flask", "claw", "tokens", "list"),
        revoke=shell_command("flask", "claw", "tokens", "revoke", "support-agent"),
        serve=shell_command("flask", "claw", "mcp", "--http", "127.0.0.1:8765"),
    )
