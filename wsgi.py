"""WSGI entry point: ``gunicorn wsgi:app``."""

from dashboard import create_app

app = create_app()
