"""Hostile requests: every route and every query parameter, given overflowing dates, lone
surrogates, NUL bytes, 1 MB values and tampered cursors, answers 400 or 404 (never a server
error), and nothing is logged above WARNING: bad input must not look like an outage.

Also one regression test per request finding of the review: the sign-in body cap, HEAD on the
sign-in page, invalid dates said on the page, and the readiness check.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard import accounts, create_app, state
from tests.dashboard_helpers import ADMIN, PASSWORD, csrf_from, page_text, sign_in
from tests.hostile import TRACEBACK

pytest_plugins = ["tests.dashboard_fixtures"]


def cursor_of(payload: Any) -> str:
    """Return a cursor in the list's format (base64 of JSON) holding ``payload``."""
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


LONE_SURROGATE_CURSOR = "WyJcdWQ4MDAiXQ"  # ["\ud800"], as the review found it
# Cursors no list issued: each must be refused with 400.
TAMPERED_CURSORS = [
    LONE_SURROGATE_CURSOR,
    cursor_of(["2024-01-01T00:00:00", "\ud800"]),
    cursor_of(['raw:"\\ud800"', "x"]),
    cursor_of(["\x00"]),
    cursor_of(["2024-01-01T00:00:00", "a\x00b"]),
    cursor_of([1, 2]),
    cursor_of({"a": 1}),
    cursor_of(['raw:{"blob": "zz"}', "x"]),
    cursor_of(["raw:[1]", "x"]),
    cursor_of(["raw:not json", "x"]),
    cursor_of(["9999-99-99", "x"]),
    "!!!not-base64!!!",
    "A" * 499,
]
# Not dates, or (for the end of a range, which takes in the whole day) past the last one.
BAD_DATES = ["0000-01-01", "99999-01-01", "2026-13-45", "2024-02-30", "+2024-01-01", "2024-1-1"]
OVERFLOWING_DATES = ["9999-12-31"]
NUL_VALUES = ["\x00", "a\x00b"]
HUGE = "x" * 1_000_000
DATE_PARAMETERS = ("since", "until", "from", "to")


def routes(conversation_id: str, message_id: str) -> dict[str, list[str]]:
    """Every page with the query parameters its view reads."""
    return {
        "/": [],
        "/conversations/": ["q", "user_id", "namespace", *DATE_PARAMETERS, "cursor"],
        f"/conversations/{conversation_id}": ["max_messages", "max_tokens", "cursor"],
        f"/conversations/{conversation_id}/turns/{message_id}": [],
        "/memory/": [],
        "/memory/default/": ["q", "state", "cursor"],
        "/memory/default/entry": ["key"],
        "/preview": ["message", "namespace", "cursor"],
        "/cold": ["n", "namespace", "cursor"],
        "/settings": [],
        "/healthz": [],
        "/readyz": [],
        "/login": ["next"],
    }


def hostile_values(parameter: str) -> Iterator[str]:
    """The values every parameter is tried with; each must be refused (400 or 404)."""
    yield from NUL_VALUES
    yield HUGE
    if parameter == "cursor":
        yield from TAMPERED_CURSORS
    if parameter in DATE_PARAMETERS:
        yield from BAD_DATES
    if parameter in ("until", "to"):
        yield from OVERFLOWING_DATES


@pytest.fixture
def site(app: Flask, demo: None, admin: tuple[str, str]) -> dict[str, str]:
    """The demo's first conversation and its first user message."""
    with app.app_context():
        store = state.conversations()
        conversation = store.list(limit=1).items[0]
        message = next(m for m in store.messages(conversation.id).items if m.role == "user")
    return {"conversation_id": conversation.id, "message_id": message.id}


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """Return a function giving every record logged above WARNING so far."""
    caplog.set_level(logging.WARNING)
    return lambda: [record.getMessage() for record in caplog.records if record.levelno > logging.WARNING]


def _assert_refused(client: FlaskClient, url: str, params: dict[str, str] | None = None) -> None:
    response = client.get(url, query_string=params)
    body = page_text(response)
    shown = {name: value[:40] for name, value in (params or {}).items()}
    assert response.status_code in (400, 404), (url, shown, response.status_code, body[:400])
    assert TRACEBACK not in body


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "postgres"], indirect=True)
@pytest.mark.slow
def test_every_route_refuses_every_hostile_parameter(
    app: Flask, site: dict[str, str], errors_logged: Callable[[], list[str]]
) -> None:
    client = app.test_client()
    sign_in(client, ADMIN, PASSWORD)
    for url, parameters in routes(**site).items():
        for parameter in parameters:
            for value in hostile_values(parameter):
                _assert_refused(client, url, {parameter: value})
    assert errors_logged() == []


BROKEN_ADDRESSES = [
    "/conversations/%00",
    "/conversations/a%00b/turns/x",
    "/memory/%00/",
    "/memory/default%00/entry?key=k",
    "/memory/default/entry?key=%00",
    "/conversations/?q=%00",
    "/conversations/?user_id=a%00",
    "/memory/default/?q=%00",
    "/memory/%ED%A0%80/",
    "/conversations/%ED%A0%80",
]


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "postgres"], indirect=True)
def test_a_nul_or_broken_byte_in_the_address_is_refused_and_not_an_outage(
    app: Flask, site: dict[str, str], errors_logged: Callable[[], list[str]]
) -> None:
    client = app.test_client()
    sign_in(client, ADMIN, PASSWORD)
    for path in BROKEN_ADDRESSES:
        _assert_refused(client, path)
    assert errors_logged() == []


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "postgres"], indirect=True)
@pytest.mark.slow
def test_any_query_value_never_fails_the_server(
    app: Flask, site: dict[str, str], errors_logged: Callable[[], list[str]]
) -> None:
    client = app.test_client()
    sign_in(client, ADMIN, PASSWORD)
    pages = routes(**site)
    pairs = [(url, parameter) for url, parameters in pages.items() for parameter in parameters]
    text = st.text(st.characters(codec="utf-8"), max_size=60)
    forged = st.lists(st.one_of(text, st.integers(), st.none()), max_size=3).map(cursor_of)
    values = text | forged | st.binary(max_size=40).map(lambda raw: base64.urlsafe_b64encode(raw).decode())

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(pair=st.sampled_from(pairs), value=values)
    def check(pair: tuple[str, str], value: str) -> None:
        url, parameter = pair
        response = client.get(url, query_string={parameter: value})
        assert response.status_code in (200, 302, 400, 404), (url, parameter, value, response.status_code)
        assert TRACEBACK not in page_text(response)

    check()
    assert errors_logged() == []


# -- one test per finding -------------------------------------------------------------------------


def test_a_date_past_the_calendar_is_a_400_said_on_the_page(signed_in: FlaskClient) -> None:
    response = signed_in.get("/conversations/?until=9999-12-31")
    assert response.status_code == 400
    assert "To: 9999-12-31 is past the last day a list can be filtered to." in page_text(response)


@pytest.mark.parametrize("name", ["from", "since"])
def test_an_invalid_date_is_said_on_the_page_beside_the_filters(signed_in: FlaskClient, name: str) -> None:
    response = signed_in.get(f"/conversations/?{name}=2026-13-45")
    body = page_text(response)
    assert response.status_code == 400
    assert "From: &#39;2026-13-45&#39; is not a date; write it YYYY-MM-DD" in body
    assert '<form class="filters"' in body, "the page with its filters, not a bare error"


def test_the_to_date_filters_like_until(signed_in: FlaskClient, demo: None) -> None:
    row = '<td><a href="/conversations/'
    assert page_text(signed_in.get("/conversations/?to=1999-01-01")).count(row) == 0
    assert page_text(signed_in.get("/conversations/?to=2999-01-01")).count(row) > 0


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "mysql", "postgres"], indirect=True)
@pytest.mark.parametrize("cursor", [LONE_SURROGATE_CURSOR, cursor_of(["2024-01-01T00:00:00", "\ud800"])])
def test_a_lone_surrogate_cursor_is_a_400(
    app: Flask, site: dict[str, str], signed_in: FlaskClient, cursor: str
) -> None:
    for url in ["/memory/default/", "/conversations/", f"/conversations/{site['conversation_id']}"]:
        response = signed_in.get(f"{url}?cursor={cursor}")
        assert response.status_code == 400, url
        assert "this cursor did not come from this list" in page_text(response)


def test_the_sign_in_body_is_capped(client: FlaskClient, admin: tuple[str, str]) -> None:
    token = csrf_from(client.get("/login"))
    body = f"csrf_token={token}&username=admin&password=" + "x" * (1024 * 1024)
    response = client.post("/login", data=body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413
    assert client.get("/").status_code == 302


def test_head_on_the_sign_in_page_never_signs_in(
    app: Flask, client: FlaskClient, admin: tuple[str, str]
) -> None:
    token = csrf_from(client.get("/login"))
    form = f"csrf_token={token}&username={ADMIN}&password={quote(PASSWORD)}"
    response = client.open(
        "/login", method="HEAD", data=form, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 200
    assert client.get("/").status_code == 302, "a HEAD with a form body must not open a session"
    with app.app_context():
        assert accounts.LoginSession.query.count() == 0


def test_readiness_checks_the_database(make_app: Callable[..., Flask], tmp_path: Any) -> None:
    ready = make_app().test_client().get("/readyz")
    assert (ready.status_code, ready.get_json()) == (200, {"status": "ready"})
    unreachable = "postgresql+psycopg://clawmem:S3cretPW@127.0.0.1:9/none?connect_timeout=2"
    down = create_app({"TESTING": True, "DATABASE_URL": unreachable}, instance_path=str(tmp_path / "down"))
    answer = down.test_client().get("/readyz")
    assert (answer.status_code, answer.get_json()) == (503, {"status": "unavailable", "failed": "database"})
    assert "S3cretPW" not in answer.get_data(as_text=True)
    # Liveness stays up: the process still answers.
    assert down.test_client().get("/healthz").status_code == 200
