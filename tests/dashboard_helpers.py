"""Helpers of the dashboard tests: the test admin, signing in as a browser does, reading pages."""

from __future__ import annotations

import re

from flask.testing import FlaskClient
from werkzeug.test import TestResponse

ADMIN = "admin"
PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_from(page: TestResponse) -> str:
    """Return the CSRF token of the first form on ``page``."""
    found = _CSRF.search(page.get_data(as_text=True))
    assert found, "the page has no CSRF token"
    return found.group(1)


def sign_in(client: FlaskClient, username: str = ADMIN, password: str = PASSWORD) -> TestResponse:
    """Post the sign-in form as a browser would (token from the form) and return the response."""
    token = csrf_from(client.get("/login"))
    return client.post("/login", data={"csrf_token": token, "username": username, "password": password})


def page_text(response: TestResponse) -> str:
    """Return a response body as text."""
    return response.get_data(as_text=True)
