"""Dashboard pages."""

from __future__ import annotations

from flask import Blueprint, Flask, render_template

bp = Blueprint("overview", __name__)


@bp.get("/")
def index() -> str:
    return render_template("overview/index.html")


@bp.get("/healthz")
def health() -> dict[str, str]:
    return {"status": "ok"}


def init_app(app: Flask) -> None:
    """Register the dashboard's blueprints."""
    app.register_blueprint(bp)
