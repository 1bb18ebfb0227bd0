"""Dashboard pages: one blueprint per area, every one of them GET-only and read-only."""

from __future__ import annotations

from pathlib import Path

from flask import Flask, current_app, render_template, request, url_for
from werkzeug.exceptions import HTTPException

from dashboard.views import conversations, health, memory, overview, recall, settings

BLUEPRINTS = (health.bp, overview.bp, conversations.bp, memory.bp, recall.bp, settings.bp)
HTMX_FILE = "vendor/htmx.min.js"


def _error(error: HTTPException) -> tuple[str | dict[str, str], int]:
    # JSON for API-style callers, an HTML page for browsers.
    body = {"error": error.name, "detail": error.description or ""}
    if request.accept_mimetypes.best_match(["text/html", "application/json"]) == "application/json":
        return body, error.code or 500
    return render_template("errors/error.html", error=body, code=error.code), error.code or 500


def _page_globals() -> dict[str, object]:
    static_folder = current_app.static_folder or ""
    has_htmx = (Path(static_folder) / HTMX_FILE).is_file()
    return {"htmx_url": url_for("static", filename=HTMX_FILE) if has_htmx else None}


def init_app(app: Flask) -> None:
    """Register every area's blueprint, the error pages and the template globals."""
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.register_error_handler(HTTPException, _error)
    app.context_processor(_page_globals)
