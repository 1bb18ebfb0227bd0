"""The health check load balancers call; public and free of data."""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> dict[str, str]:
    """Return ``{"status": "ok"}`` while the app can answer requests."""
    return {"status": "ok"}
