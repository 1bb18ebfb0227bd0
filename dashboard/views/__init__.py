"""Dashboard pages: one blueprint per area, every one of them GET-only and read-only."""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from flask import Flask, current_app, render_template, request, url_for
from werkzeug.exceptions import BadRequest, HTTPException, ServiceUnavailable

from clawmem.errors import ConfigError, InvalidCursor, InvalidNamespace, StorageError, redact
from clawmem.sql.engine import describe_error
from clawmem.sql.sizes import present_tables, table_names
from dashboard import state
from dashboard.views import (
    conversations,
    health,
    jobs,
    memory,
    overview,
    recall,
    rendering,
    settings,
    sites,
    subjects,
    tokens,
)
from dashboard.views.rendering import shell_command

BLUEPRINTS = (
    health.bp,
    overview.bp,
    conversations.bp,
    subjects.bp,
    memory.bp,
    recall.bp,
    jobs.bp,
    sites.bp,
    tokens.bp,
    settings.bp,
)
HTMX_FILE = "vendor/htmx.min.js"


def _error(error: HTTPException, command: str | None = None) -> tuple[str | dict[str, str], int]:
    # JSON for API-style callers, an HTML page for browsers; ``command`` is what fixes it.
    body = {"error": error.name, "detail": error.description or ""}
    if command:
        body["command"] = command
    if request.accept_mimetypes.best_match(["text/html", "application/json"]) == "application/json":
        return body, error.code or 500
    # Rebuilt from the route, never the raw path, so the link cannot point off this site.
    retry_url = url_for(request.endpoint, **(request.view_args or {})) if request.url_rule else None
    page = render_template("errors/error.html", error=body, code=error.code, retry_url=retry_url)
    return page, error.code or 500


def _bad_cursor(error: InvalidCursor) -> tuple[str | dict[str, str], int]:
    # Cursors are opaque: a forged, stale or cross-list one means only "start over".
    return _error(BadRequest("this cursor did not come from this list; start again from the first page"))


def _bad_namespace(error: InvalidNamespace) -> tuple[str | dict[str, str], int]:
    # The same answer on every page that names a namespace, in the path or in a filter.
    return _error(BadRequest(str(error)))


def _missing_tables() -> list[str]:
    # Asked only once a page failed; [] when even that cannot be told (the database is down).
    try:
        site = state.site()
        present = set(present_tables(site.engine, site.prefix))
    except (sa.exc.SQLAlchemyError, StorageError, ConfigError):
        return []
    return [name for name in table_names(site.prefix) if name not in present]


def _storage_down(error: Exception) -> tuple[str | dict[str, str], int]:
    # The database or a memory backend failed: say which, without SQL, values or passwords.
    logging.getLogger(__name__).error("storage failed on %s: %s", request.path, type(error).__name__)
    missing = _missing_tables()
    if missing:
        detail = f"This site's tables do not exist yet ({', '.join(missing)} missing)."
        return _error(ServiceUnavailable(detail), command=shell_command("flask", "claw", "init-db"))
    if isinstance(error, StorageError):
        detail = error.detail
    elif isinstance(error, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        detail = describe_error(error)  # connection trouble: the driver's words help the operator
    else:
        detail = type(error).__name__  # any other message may quote a row's text
    return _error(ServiceUnavailable(f"The storage behind this page failed: {redact(detail)}"))


def _misconfigured(error: ConfigError) -> tuple[str | dict[str, str], int]:
    # Found when a page first opened the site (e.g. CLAW_SCHEMA against the tables): one line.
    logging.getLogger(__name__).error("configuration refused on %s: %s", request.path, error)
    return _error(ServiceUnavailable(f"clawmem refuses to open this site: {redact(str(error))}"))


def _page_globals() -> dict[str, object]:
    has_htmx = current_app.extensions["dashboard.has_htmx"]
    return {
        "htmx_url": url_for("static", filename=HTMX_FILE) if has_htmx else None,
        "display_zone_name": rendering.zone_name(),
    }


def init_app(app: Flask) -> None:
    """Register every area's blueprint, the error pages and the template globals."""
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.register_error_handler(HTTPException, _error)
    app.register_error_handler(InvalidCursor, _bad_cursor)
    app.register_error_handler(InvalidNamespace, _bad_namespace)
    app.register_error_handler(sa.exc.SQLAlchemyError, _storage_down)
    app.register_error_handler(StorageError, _storage_down)
    app.register_error_handler(ConfigError, _misconfigured)
    # Looked up once: htmx is fetched before the app starts (make run), not while it serves.
    app.extensions["dashboard.has_htmx"] = (Path(app.static_folder or "") / HTMX_FILE).is_file()
    app.context_processor(_page_globals)
    app.jinja_env.filters.update(rendering.TEMPLATE_FILTERS)
