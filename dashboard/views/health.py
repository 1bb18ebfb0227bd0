"""The health checks load balancers call; public and free of data.

``/healthz`` is liveness: the process answers. ``/readyz`` is readiness: the database behind the
three tables answers too, so a worker whose database is unreachable is taken out of rotation.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from flask import Blueprint

from dashboard import state

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> dict[str, str]:
    """Return ``{"status": "ok"}`` while the app can answer requests."""
    return {"status": "ok"}


@bp.get("/readyz")
def readyz() -> tuple[dict[str, str], int]:
    """Return ``{"status": "ready"}`` (200) when the database answers a query, else
    ``{"status": "unavailable", "failed": "database"}`` (503), with no detail of why."""
    try:
        with state.engine().connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except sa.exc.SQLAlchemyError as exc:
        logging.getLogger(__name__).warning("readiness check: the database failed (%s)", type(exc).__name__)
        return {"status": "unavailable", "failed": "database"}, 503
    return {"status": "ready"}, 200
