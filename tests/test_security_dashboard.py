"""An ASVS-style pass over the dashboard, each check enumerated from the app itself so a route
added later is covered too: session fixation, CSRF on every POST route, the cookies' flags, the
security headers on every kind of response, open redirects through ``next``, path traversal in
every route parameter, and errors that show a plain page (no traceback, SQL or row text).

What tests/test_dashboard_auth.py and tests/test_dashboard_pages.py already prove for one route
(the sign-in form's token, the headers of the data pages) is not repeated here."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.routing import Rule
from werkzeug.test import TestResponse

from dashboard import accounts
from dashboard.auth import PUBLIC_ENDPOINTS, SESSION_TOKEN
from dashboard.security import CONTENT_SECURITY_POLICY
from dashboard.views import settings as settings_view
from tests.dashboard_helpers import ADMIN, PASSWORD, csrf_from, page_text, sign_in
from tests.hostile import TRACEBACK

pytest_plugins = ["tests.dashboard_fixtures"]

SIGN_IN_FORM = {"username": ADMIN, "password": PASSWORD}
CANARY = "canary-8f3e1d0c-outside-the-site"
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE)\b.*\b(FROM|INTO|SET|WHERE)\b", re.S)


def session_cookie(client: FlaskClient, app: Flask) -> str | None:
    """Return the value of the client's session cookie, or ``None``."""
    cookie = client.get_cookie(app.config["SESSION_COOKIE_NAME"])
    return cookie.value if cookie else None


def post_rules(app: Flask) -> list[Rule]:
    """Every rule of the app that accepts POST."""
    return [rule for rule in app.url_map.iter_rules() if "POST" in (rule.methods or ())]


def assert_security_headers(response: TestResponse, where: str) -> None:
    """Assert the headers every response of the dashboard carries."""
    headers = response.headers
    assert headers.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY, where
    assert headers.get("X-Content-Type-Options") == "nosniff", where
    assert headers.get("X-Frame-Options") == "DENY", where
    assert headers.get("Referrer-Policy") == "same-origin", where


# -- session fixation ------------------------------------------------------------------------------


def test_signing_in_issues_a_new_session_and_the_one_before_it_stays_signed_out(
    app: Flask, client: FlaskClient, admin: tuple[str, str]
) -> None:
    before_token = csrf_from(client.get("/login"))
    before = session_cookie(client, app)
    assert before is not None, "the sign-in form's token lives in a session cookie"
    response = client.post("/login", data={"csrf_token": before_token, **SIGN_IN_FORM})
    assert response.status_code == 302
    after = session_cookie(client, app)
    assert after is not None and after != before
    assert csrf_from(client.get("/login?next=/settings", follow_redirects=True)) != before_token
    # A cookie planted before the sign-in (the fixation attack) does not ride on it.
    planted = app.test_client()
    planted.set_cookie(app.config["SESSION_COOKIE_NAME"], before)
    assert planted.get("/settings").status_code == 302
    assert client.get("/settings").status_code == 200


def test_two_sign_ins_of_one_admin_get_different_sessions(app: Flask, admin: tuple[str, str]) -> None:
    first, second = app.test_client(), app.test_client()
    sign_in(first)
    sign_in(second)
    with first.session_transaction() as one, second.session_transaction() as other:
        assert one[SESSION_TOKEN] != other[SESSION_TOKEN]
    assert session_cookie(first, app) != session_cookie(second, app)


def test_a_session_id_written_into_a_cookie_by_hand_opens_nothing(app: Flask, admin: tuple[str, str]) -> None:
    visitor = app.test_client()
    with visitor.session_transaction() as planted:  # a correctly signed cookie, an invented id
        planted[SESSION_TOKEN] = "A" * 43
    assert visitor.get("/settings").status_code == 302


# -- CSRF on every POST route ----------------------------------------------------------------------


def test_every_post_route_is_known_and_checks_the_form_token(app: Flask) -> None:
    # A new POST route must be added to this test and give the same answers.
    assert sorted(rule.rule for rule in post_rules(app)) == ["/login", "/logout"]


@pytest.mark.parametrize("signed", [True, False], ids=["signed-in", "signed-out"])
def test_every_post_route_refuses_a_missing_forged_or_foreign_token(
    app: Flask, client: FlaskClient, admin: tuple[str, str], signed: bool
) -> None:
    if signed:
        sign_in(client)
    else:
        client.get("/login")  # a session with a token of its own, which the forms below do not send
    foreign = app.test_client()
    foreign_token = csrf_from(foreign.get("/login"))  # valid, but another browser's
    for rule in post_rules(app):
        for token in (None, "", "forged", foreign_token, foreign_token + "x"):
            form = dict(SIGN_IN_FORM)
            if token is not None:
                form["csrf_token"] = token
            response = client.post(rule.rule, data=form)
            where = (rule.rule, token, response.status_code)
            if not signed and rule.endpoint not in PUBLIC_ENDPOINTS:
                # The sign-in gate answers first: nothing to forge for a visitor with no session.
                assert response.status_code == 302, where
                assert urlsplit(response.headers["Location"]).path == "/login", where
                continue
            assert response.status_code == 400, where
            assert "did not come from this dashboard" in page_text(response)
            assert TRACEBACK not in page_text(response)
        assert client.get("/settings").status_code == (200 if signed else 302), rule.rule
    with app.app_context():
        assert accounts.LoginSession.query.count() == (1 if signed else 0)


def test_the_token_travels_only_in_the_form_body_never_the_query_string(
    client: FlaskClient, admin: tuple[str, str]
) -> None:
    token = csrf_from(client.get("/login"))
    response = client.post(f"/login?csrf_token={token}", data=SIGN_IN_FORM)
    assert response.status_code == 400
    assert client.get("/settings").status_code == 302


# -- cookies ---------------------------------------------------------------------------------------


def cookies_of(response: TestResponse) -> list[SimpleCookie]:
    parsed = []
    for header in response.headers.getlist("Set-Cookie"):
        cookie: SimpleCookie = SimpleCookie()
        cookie.load(header)
        parsed.append(cookie)
    return parsed


def every_cookie_set_while_signing_in_and_out(client: FlaskClient, base: str = "") -> list[str]:
    """Sign in and out through ``base`` (``https://localhost`` or ``""``); return every Set-Cookie."""
    headers = []
    page = client.get(f"{base}/login")
    headers += page.headers.getlist("Set-Cookie")
    signed = client.post(f"{base}/login", data={"csrf_token": csrf_from(page), **SIGN_IN_FORM})
    assert signed.status_code == 302
    headers += signed.headers.getlist("Set-Cookie")
    out = client.post(f"{base}/logout", data={"csrf_token": csrf_from(client.get(f"{base}/"))})
    assert out.status_code == 302
    headers += out.headers.getlist("Set-Cookie")
    return headers


def test_every_cookie_is_httponly_and_samesite_lax_and_not_secure_over_plain_http(
    client: FlaskClient, admin: tuple[str, str]
) -> None:
    headers = every_cookie_set_while_signing_in_and_out(client)
    assert len(headers) >= 3, "the form, the sign-in and the sign-out each set the cookie"
    for header in headers:
        assert "HttpOnly" in header and "SameSite=Lax" in header, header
        assert "Secure" not in header, header
        assert "Domain=" not in header, header  # host-only: no sibling host receives it


def test_secure_when_configured_even_over_plain_http(make_app: Callable[..., Flask]) -> None:
    app = make_app(SESSION_COOKIE_SECURE=True)
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 1_700_000_000.0)
    # The test client keeps Secure cookies only for https, so sign in over https and look at
    # what the plain http form would be given.
    headers = every_cookie_set_while_signing_in_and_out(app.test_client(), "https://localhost")
    headers += app.test_client().get("/login").headers.getlist("Set-Cookie")
    assert headers and all("Secure" in header and "HttpOnly" in header for header in headers), headers


def test_signing_out_deletes_the_cookie_in_the_browser(signed_in: FlaskClient, app: Flask) -> None:
    response = signed_in.post("/logout", data={"csrf_token": csrf_from(signed_in.get("/"))})
    expired = [cookie for cookie in cookies_of(response) if app.config["SESSION_COOKIE_NAME"] in cookie]
    assert expired, "sign-out must tell the browser to drop the cookie"
    morsel = expired[0][app.config["SESSION_COOKIE_NAME"]]
    assert morsel.value == "" and (morsel["max-age"] == "0" or "1970" in morsel["expires"])


# -- headers on every kind of response -------------------------------------------------------------


def test_every_kind_of_response_carries_the_security_headers(
    failing: tuple[Flask, FlaskClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, signed_in = failing
    anonymous = app.test_client()
    answers = {
        "sign-in page": anonymous.get("/login"),
        "redirect to sign-in": anonymous.get("/settings"),
        "htmx 401": anonymous.get("/settings", headers={"HX-Request": "true"}),
        "health": anonymous.get("/healthz"),
        "readiness": anonymous.get("/readyz"),
        "CSRF 400": anonymous.post("/login", data={}),
        "413": anonymous.post("/login", data={"password": "x" * (1024 * 1024)}),
        "404": signed_in.get("/no/such/page"),
        "JSON 404": signed_in.get("/no/such/page", headers={"Accept": "application/json"}),
        "405": signed_in.put("/settings"),
        "400 NUL": signed_in.get("/conversations/?q=%00"),
        "data page": signed_in.get("/settings"),
    }
    monkeypatch.setattr(settings_view, "deletion_commands", _raise_with_sql)
    answers["500"] = signed_in.get("/settings")
    assert [answers[name].status_code for name in ("htmx 401", "CSRF 400", "413", "405", "500")] == [
        401,
        400,
        413,
        405,
        500,
    ]
    for where, response in answers.items():
        assert_security_headers(response, where)
        assert response.headers.get("Cache-Control") == "no-store", where
    with anonymous.get("/static/app.css") as static:  # cacheable, but just as guarded
        assert_security_headers(static, "static file")


# -- open redirects --------------------------------------------------------------------------------

# Each of these leaves the site in some browser (directly, or once the browser has dropped the
# tabs and newlines in it and read backslashes as slashes, as WHATWG URL parsing does), or holds
# what no address of this site does (controls, spaces, no leading slash): all lead to the overview.
OFF_SITE = [
    "//evil.example/",
    "///evil.example/",
    "////evil.example/",
    "https://evil.example/",
    "http:evil.example",
    "HTTPS://evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "\\/evil.example",
    "/\t/evil.example",
    "/\t//evil.example",
    "/\n//evil.example",
    "/\r\n//evil.example",
    "/\r//evil.example",
    "\t//evil.example",
    " //evil.example",
    "/ /\\evil.example",
    "/\x0b//evil.example",
    "/\x00//evil.example",
    "/\u3000//evil.example",
    "javascript:alert(1)",
    "JaVaScRiPt:alert(1)",
    "data:text/html,hi",
    "evil.example",
    "",
]


def browser_would_leave(location: str) -> bool:
    """Return whether a browser following ``location`` from http://localhost/login ends up on
    another host, reading it as WHATWG URL parsing does (tabs and newlines dropped, ``\\`` as ``/``)."""
    cleaned = re.sub(r"[\t\n\r]", "", location).strip("\x00 ").replace("\\", "/")
    parts = urlsplit(cleaned)
    if parts.scheme and parts.scheme.lower() not in ("http", "https"):
        return True  # javascript:, data:
    if parts.scheme and not cleaned.lower().startswith(f"{parts.scheme.lower()}://"):
        cleaned = "//" + cleaned.split(":", 1)[1].lstrip("/")  # http:evil.example
    return cleaned.startswith("//") or bool(parts.netloc and parts.netloc != "localhost")


@pytest.mark.parametrize("target", OFF_SITE, ids=[repr(target) for target in OFF_SITE])
def test_next_never_leads_off_the_site_when_signing_in_or_already_signed_in(
    app: Flask, admin: tuple[str, str], target: str
) -> None:
    client = app.test_client()
    token = csrf_from(client.get("/login"))
    posted = client.post("/login", data={"csrf_token": token, "next": target, **SIGN_IN_FORM})
    assert posted.status_code == 302, page_text(posted)[:300]
    assert posted.headers["Location"] == "/", posted.headers["Location"]
    if "\x00" not in target:  # a NUL in the query string is refused with 400 before any view
        already = client.get("/login", query_string={"next": target})
        assert already.status_code == 302 and already.headers["Location"] == "/"


def test_the_model_of_a_browser_catches_what_it_should() -> None:
    leaving = ["//e.example", "https://e.example", "http:e.example", "/\\e.example", "/\t//e.example"]
    assert all(browser_would_leave(target) for target in leaving)
    assert not any(browser_would_leave(target) for target in ["/memory/?x=1", "/subjects/a%20b", "/"])


@pytest.mark.parametrize(
    "path", ["/subjects/alice smith", "/subjects/back\\slash", "/subjects/tab%09id", "/subjects/caf%C3%A9"]
)
def test_a_page_asked_for_while_signed_out_is_opened_after_signing_in(
    app: Flask, admin: tuple[str, str], path: str
) -> None:
    client = app.test_client()
    gate = client.get(path)
    assert gate.status_code == 302
    login = client.get(gate.headers["Location"])
    hidden = re.search(r'name="next" value="([^"]*)"', page_text(login))
    assert hidden is not None
    form = {"csrf_token": csrf_from(login), "next": html.unescape(hidden.group(1)), **SIGN_IN_FORM}
    signed = client.post("/login", data=form)
    location = signed.headers["Location"]
    assert not browser_would_leave(location)
    assert client.get(location).request.path == client.get(path).request.path


# -- path traversal in every route parameter -------------------------------------------------------

TRAVERSALS = [
    "..",
    "../..",
    "../../../../etc/passwd",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "%252e%252e%252f",
    "..%5c..%5cwsgi.py",
    "..\\..\\wsgi.py",
    "%c0%ae%c0%ae%c0%af",
    "....//....//etc/passwd",
    "..%00",
    "%00",
    "canary%00.json",
    "../canary",
    "../../canary",
    "/etc/passwd",
]


_PLACEHOLDER = re.compile(r"<(?:[^<>:]+:)?([^<>:]+)>")
_HARMLESS = {"format": "json", "filename": "app.css", "namespace": "default"}


def traversal_urls(app: Flask) -> Iterator[tuple[str, str]]:
    """Every rule with parameters, each parameter in turn given each traversal (the others a
    harmless value); yields ``(rule, url)``."""
    for rule in app.url_map.iter_rules():
        for argument in sorted(rule.arguments):
            for value in TRAVERSALS:

                def fill(match: re.Match[str], hostile: str = argument, value: str = value) -> str:
                    name = match.group(1)
                    return value if name == hostile else _HARMLESS.get(name, "x")

                yield rule.rule, _PLACEHOLDER.sub(fill, rule.rule)


@pytest.fixture
def canaries(tmp_path: Path) -> None:
    """Files a traversal would reach: above the file store's site folder, in and above the
    instance folder, each readable as a file-driver namespace."""
    store = f'{{"k": {{"value": "{CANARY}", "expires_at": null}}}}'
    for place in (tmp_path, tmp_path / "instance", tmp_path / "instance" / "memory"):
        place.mkdir(parents=True, exist_ok=True)
        for name in ("canary", "canary.json", "canary.css"):
            (place / name).write_text(store)


@pytest.mark.parametrize("memory_driver", ["sql", "file"])
def test_no_route_parameter_reaches_a_file_outside_the_site(
    make_app: Callable[..., Flask], admin: tuple[str, str], canaries: None, memory_driver: str
) -> None:
    app = make_app(MEMORY_DRIVER=memory_driver)
    client = app.test_client()
    sign_in(client)
    secret_key = app.config["SECRET_KEY"]
    wsgi_source = (Path(app.root_path).parent / "wsgi.py").read_text()
    checked = 0
    for rule, url in traversal_urls(app):
        response = client.get(url)
        body = response.get_data()
        where = (rule, url, response.status_code)
        assert response.status_code in (200, 302, 308, 400, 404), where
        if response.status_code == 308:  # werkzeug merging "//" in a path: to this site only
            assert not browser_would_leave(response.headers["Location"].removeprefix("http://localhost")), (
                where
            )
        assert CANARY.encode() not in body, where
        assert b"root:x:0:0" not in body, where
        assert secret_key.encode() not in body, where
        assert wsgi_source.encode() not in body, where
        assert TRACEBACK.encode() not in body, where
        if rule.startswith("/static"):
            assert response.status_code in (308, 400, 404), where
        checked += 1
    assert checked >= len(TRAVERSALS) * 10, checked


# -- verbose errors --------------------------------------------------------------------------------


def _raise_with_sql(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("SELECT value FROM t_memory WHERE key = 'alice-secret-row-text'")


@pytest.fixture
def failing(make_app: Callable[..., Flask]) -> tuple[Flask, FlaskClient]:
    """An app that does not let exceptions through as tests normally do, and a signed-in client."""
    app = make_app(TESTING=False)
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 1_700_000_000.0)
    client = app.test_client()
    assert sign_in(client).status_code == 302
    return app, client


def _assert_plain(response: TestResponse, *leaks: str) -> None:
    body = page_text(response)
    assert TRACEBACK not in body and 'File "' not in body
    assert not SQL_WORDS.search(body), body[:500]
    for leak in leaks:
        assert leak not in body, leak


@pytest.mark.parametrize("accept", ["text/html", "application/json"])
def test_a_bug_in_a_view_shows_a_plain_500(
    failing: tuple[Flask, FlaskClient], monkeypatch: pytest.MonkeyPatch, accept: str
) -> None:
    _, client = failing
    monkeypatch.setattr(settings_view, "deletion_commands", _raise_with_sql)
    response = client.get("/settings", headers={"Accept": accept})
    assert response.status_code == 500
    _assert_plain(response, "alice-secret-row-text", "RuntimeError", "deletion_commands")
    if accept == "application/json":
        assert response.get_json()["error"] == "Internal Server Error"
    else:
        assert "<h1>500 Internal Server Error</h1>" in page_text(response)


@pytest.mark.parametrize(
    "error",
    [
        sa.exc.ProgrammingError(
            "SELECT value FROM t_memory WHERE key = %s", ("alice-secret-row-text",), Exception("syntax error")
        ),
        sa.exc.OperationalError(
            "UPDATE t_memory SET value = %s",
            ("alice-secret-row-text",),
            Exception(
                "server closed the connection\nLINE 1: UPDATE t_memory SET value = 'alice-secret-row-text'"
            ),
        ),
        sa.exc.IntegrityError(
            "INSERT INTO t_memory VALUES (%s)", ("alice-secret-row-text",), Exception("dup")
        ),
    ],
    ids=["programming", "operational", "integrity"],
)
def test_a_database_error_shows_a_plain_503_without_the_statement(
    failing: tuple[Flask, FlaskClient], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    _, client = failing

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(settings_view, "deletion_commands", fail)
    response = client.get("/settings")
    assert response.status_code == 503
    _assert_plain(response, "alice-secret-row-text", "t_memory", "%s")
    assert "The storage behind this page failed" in page_text(response)


def test_a_bad_request_shows_a_plain_400(failing: tuple[Flask, FlaskClient]) -> None:
    _, client = failing
    for url in ["/conversations/?cursor=!!!", "/conversations/?since=2026-13-45", "/memory/a%20b/"]:
        response = client.get(url)
        assert response.status_code == 400, url
        _assert_plain(response)


def test_the_error_pages_link_only_inside_the_site(failing: tuple[Flask, FlaskClient]) -> None:
    _, client = failing
    for url in [f"/memory/{quote('//evil.example')}/", "/conversations/%2F%2Fevil.example"]:
        body = page_text(client.get(url))
        for link in re.findall(r'href="([^"]*)"', body):
            assert not browser_would_leave(link), (url, link)


@pytest.mark.parametrize(
    "cookie",
    [
        "garbage",
        "eyJzaWQiOiJ4In0",
        "eyJzaWQiOiJ4In0.AAAAAA.forged-signature",
        "eyJzaWQiOiJ4In0..",
        "." * 3000,
    ],
    ids=["garbage", "unsigned", "forged-signature", "empty-signature", "dots"],
)
def test_a_tampered_session_cookie_is_a_visitor_not_an_error(
    failing: tuple[Flask, FlaskClient], cookie: str
) -> None:
    app, _ = failing
    visitor = app.test_client()
    visitor.set_cookie(app.config["SESSION_COOKIE_NAME"], cookie)
    response = visitor.get("/settings")
    assert response.status_code == 302 and urlsplit(response.headers["Location"]).path == "/login"


def test_hostile_sign_in_bodies_get_a_plain_answer_and_sign_no_one_in(
    failing: tuple[Flask, FlaskClient],
) -> None:
    app, _ = failing
    client = app.test_client()
    token = csrf_from(client.get("/login"))
    bodies = {
        "broken multipart": (
            b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nzz',
            "multipart/form-data; boundary=x",
        ),
        "multipart without a boundary": (b"abc", "multipart/form-data"),
        "JSON": (b'{"csrf_token": "%s"}' % token.encode(), "application/json"),
        "5000 fields": (
            "&".join(f"f{i}=1" for i in range(5000)).encode(),
            "application/x-www-form-urlencoded",
        ),
        "broken UTF-8": (
            f"csrf_token={token}&username=%ff%fe&password=%ff".encode(),
            "application/x-www-form-urlencoded",
        ),
    }
    for name, (body, content_type) in bodies.items():
        response = client.post("/login", data=body, content_type=content_type)
        assert response.status_code in (200, 400), (name, response.status_code)
        _assert_plain(response)
        assert client.get("/settings").status_code == 302, name
