"""Access to the app's clawmem objects from views and commands."""

from __future__ import annotations

from flask import current_app
from sqlalchemy.engine import Engine

from clawmem.settings import Settings
from clawmem.sql.engine import engine_for


def settings() -> Settings:
    """Return the effective clawmem settings of the current app."""
    return current_app.extensions["clawmem.settings"]


def setting_sources() -> dict[str, str]:
    """Return where each setting came from: default, environment, instance config file, test config."""
    return current_app.extensions["clawmem.sources"]


def engine() -> Engine:
    """Return the shared engine of the configured database."""
    return engine_for(settings().database_url)
