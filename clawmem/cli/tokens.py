"""``tokens create | list | revoke``: the access tokens of ``clawmem mcp --http``.

A token is printed once, by ``create``; the accounts database keeps only its hash. ``revoke``
ends one at its next request and is audited as every deleting command is.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import click

from clawmem.cli import current_site
from clawmem.cli.audit import AuditEntry, audited, one_line_errors
from clawmem.cli.common import Window, WindowType, check_text, shown
from clawmem.sql import tokens as store
from clawmem.sql.engine import engine_for


def _moment(stamp: float | None, never: str = "never") -> str:
    if stamp is None:
        return never
    return f"{datetime.fromtimestamp(stamp, UTC):%Y-%m-%d %H:%M:%S} UTC"


def _accounts(create: bool) -> tuple[object, str | None]:
    """Return the accounts engine, or ``None`` and why when a reading command finds no database."""
    instance = Path(current_site().settings.instance_path)
    url = store.accounts_url(instance)
    if url != store.default_accounts_url(instance):  # CLAW_SQLALCHEMY_DATABASE_URI: the dashboard's
        return engine_for(url), None
    path = instance / "dashboard.db"
    if not create and not path.exists():
        return None, f"no accounts database at {path}: no token has been made"
    if create:
        os.makedirs(instance, mode=0o700, exist_ok=True)
    return engine_for(url), None


@click.group("tokens")
def tokens() -> None:
    """Access tokens of the MCP HTTP server (clawmem mcp --http): make, list, revoke.

    Each token carries a scope (a namespace, a subject, read-only) that the server applies to
    every request. Only a hash is kept, in the dashboard's accounts database.
    """


@tokens.command("create")
@click.option("--name", required=True, help="The token's name (1-80 of A-Z a-z 0-9 . _ @ -).")
@click.option("--namespace", metavar="NS", help="Read and write only this namespace; recall reads it.")
@click.option(
    "--subject", metavar="USER_ID", callback=check_text, help="Bind recall and remember to this subject."
)
@click.option("--read-only", is_flag=True, help="Refuse remember: read and recall only.")
@click.option(
    "--expires", type=WindowType(), metavar="30d", help="Expire after <N>d or <N>h; default: never."
)
@one_line_errors
def create(
    name: str, namespace: str | None, subject: str | None, read_only: bool, expires: Window | None
) -> None:
    """Make a token and print it once (it is kept nowhere; only its hash is stored)."""
    site = current_site()
    now = site.clock()
    engine, _ = _accounts(create=True)
    try:
        token = store.create_token(
            engine,  # type: ignore[arg-type]
            name,
            now,
            namespace=namespace,
            subject=subject,
            read_only=read_only,
            expires_at=now + expires.delta.total_seconds() if expires is not None else None,
        )
    except store.TokenError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(token)
    click.echo(
        f"token {name!r} made; it is shown this once. Send it as: Authorization: Bearer <token>", err=True
    )


@tokens.command("list")
@one_line_errors
def list_() -> None:
    """List the tokens: name, scope, state, made, last used, expiry (never the token)."""
    engine, missing = _accounts(create=False)
    records = store.list_tokens(engine) if engine is not None else []  # type: ignore[arg-type]
    if not records:
        click.echo(missing or "no tokens; make one with: clawmem tokens create --name NAME")
        return
    now = current_site().clock()
    for record in records:
        click.echo(
            f"{shown(record.name)}  {record.state(now)}  {shown(record.describe_scope())}  "
            f"made {_moment(record.created_at)}  last used {_moment(record.last_used_at)}  "
            f"expires {_moment(record.expires_at)}"
        )


@tokens.command("revoke")
@click.argument("name")
@audited("tokens revoke")
def revoke(entry: AuditEntry, name: str) -> None:
    """End the token NAME: its next request is refused (HTTP 401)."""
    engine, missing = _accounts(create=False)
    if engine is None:
        raise click.ClickException(missing or "no accounts database")
    known = store.find_token(engine, name)  # type: ignore[arg-type]
    if known is None or known.revoked_at is not None:
        raise click.ClickException(
            f"token {name!r} is already revoked" if known is not None else f"no token named {name!r}"
        )
    entry.start({"tokens": 1})
    if not store.revoke_token(engine, name, current_site().clock()):  # type: ignore[arg-type]
        raise click.ClickException(f"token {name!r} was revoked meanwhile")
    entry.add("tokens")
    click.echo(f"revoked token {name!r}: its next request is refused")


COMMANDS = [tokens]
