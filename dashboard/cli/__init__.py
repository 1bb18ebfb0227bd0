"""``flask claw``: the only place anything is deleted."""

from __future__ import annotations

import click
from flask import Flask
from flask.cli import AppGroup

from clawmem.sql.retention import table_names
from clawmem.sql.schema import create_tables
from dashboard import state
from dashboard.cli.audit import one_line_errors

claw = AppGroup("claw", help="Inspect, retain and delete clawmem data.")


@claw.command("init-db")
@one_line_errors
def init_db() -> None:
    """Create the three tables of the configured prefix (safe to run again)."""
    settings = state.settings()
    create_tables(state.engine(), settings.table_prefix)
    click.echo(f"tables ready: {', '.join(table_names(settings.table_prefix))}")


def init_app(app: Flask) -> None:
    """Register the ``claw`` command group."""
    from dashboard.cli import admin, data, subjects, tables  # noqa: F401  (they add their commands to ``claw``)

    app.cli.add_command(claw)
