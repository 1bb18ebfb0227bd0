"""Flask extensions, created unbound here and bound to the app by :func:`init_app`."""

from __future__ import annotations

import os
from pathlib import Path

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from htmx_flask import Htmx
from sqlalchemy.schema import CreateIndex, CreateTable

from clawmem.sql import tokens

# The dashboard's own data (admin accounts, sessions, login failures, and the MCP server's access
# tokens). It lives in the instance folder and never in clawmem's three tables.
db = SQLAlchemy()
htmx = Htmx()


def _create_own_tables() -> None:
    # IF NOT EXISTS, because several gunicorn workers may start at the same moment.
    with db.engine.begin() as conn:
        for table in db.metadata.sorted_tables:
            conn.execute(CreateTable(table, if_not_exists=True))
            for index in table.indexes:
                conn.execute(CreateIndex(index, if_not_exists=True))
    tokens.create_tables(db.engine)  # the MCP server's access tokens, written by the CLI


def _private_file(path: Path) -> None:
    # Password hashes and session records: readable by the app's user only.
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(path, 0o600)


def init_app(app: Flask) -> None:
    """Bind the extensions; the account database defaults to ``<instance>/dashboard.db`` (mode 0600)."""
    default = Path(app.instance_path) / "dashboard.db"
    app.config.setdefault("SQLALCHEMY_DATABASE_URI", f"sqlite:///{default}")
    if app.config["SQLALCHEMY_DATABASE_URI"] == f"sqlite:///{default}":
        _private_file(default)
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        # Workers share the file: wait for a writer's lock instead of failing at once.
        app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", {"connect_args": {"timeout": 30}})
    db.init_app(app)
    htmx.init_app(app)
    # The models on db.metadata are registered by their modules, which import this one (the
    # app factory imports them first), so the tables made here are theirs.
    with app.app_context():
        _create_own_tables()
