"""Helpers of the dashboard tests: the test admin, signing in as a browser does, reading pages."""

from __future__ import annotations

import html
import re
import shlex

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


def claw_words(command: str) -> tuple[dict[str, str], list[str]]:
    """Split a claw command the dashboard shows into its ``CLAW_*`` variables and the words after
    the program (``clawmem``, or ``…/flask --app …/wsgi.py claw``)."""
    words = shlex.split(html.unescape(command))
    environment = {}
    while words and re.fullmatch(r"CLAW_[A-Z_]+=.*", words[0], re.S):
        name, _, value = words.pop(0).partition("=")
        environment[name] = value
    if words[:1] == ["clawmem"]:
        return environment, words[1:]
    if words[:2] == ["flask", "claw"]:  # as a view writes it, outside a request
        return environment, words[2:]
    assert words[0].endswith("/flask") and words[1] == "--app" and words[2].endswith("wsgi.py"), words
    assert words[3] == "claw", words
    return environment, words[4:]
