"""WSGI entry point: ``gunicorn wsgi:app`` (and ``flask --app wsgi``)."""

from clawmem.errors import ConfigError
from dashboard import create_app

try:
    app = create_app()
except ConfigError as exc:
    # A malformed CLAW_* setting is the operator's to fix: one line, not a traceback.
    raise SystemExit(f"Error: {exc}") from None
