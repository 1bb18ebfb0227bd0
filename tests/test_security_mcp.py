"""An ASVS-style pass over ``clawmem mcp --http``, on a real uvicorn process (the fixtures of
tests/test_mcp_http.py): the headers on every kind of answer, no ambient credential (no cookie,
no session id, so nothing a cross-site request could ride on), path traversal in the address,
and errors that never show a traceback, a SQL statement or a token's hash.

What tests/test_mcp_http.py proves (401s, Origin, the body limit, the rate limit, scopes) is
not repeated here."""

from __future__ import annotations

import re
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from clawmem.integrations.mcp.http import RESPONSE_HEADERS
from clawmem.sql import tokens as store
from tests.hostile import TRACEBACK
from tests.test_mcp_http import Served, _serve, _stop, call, tool_call

pytestmark = pytest.mark.slow

LISTING = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
CANARY = "canary-3b9d-outside-the-server"
LEAKS = ("SELECT", "INSERT", "[SQL:", "[parameters:", "sqlalche.me", TRACEBACK, 'File "')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A running server on SQLite, with files a traversal would reach beside its instance folder."""
    tmp = tmp_path_factory.mktemp("mcp_security")
    for place in (tmp, tmp / "instance"):
        place.mkdir(exist_ok=True)
        (place / "canary.json").write_text(CANARY)
    served = _serve(tmp, f"sqlite:///{tmp / 'memory.db'}", "claw_")
    yield served
    _stop(served)


@pytest.fixture(scope="module")
def token(server: Served) -> str:
    """A token of the whole site."""
    return server.token("security")


def raw_request(served: Served, request_line: str, token: str) -> bytes:
    """Send one HTTP/1.1 request with the path exactly as written (no client normalising it)."""
    port = int(served.url.split(":")[2].split("/")[0])
    head = (
        f"{request_line}\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head.encode("latin-1"))
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def assert_guarded(response: httpx2.Response, where: str) -> None:
    for name, value in RESPONSE_HEADERS:
        assert response.headers.get(name.decode()) == value.decode(), (where, name)
    assert "set-cookie" not in response.headers, where
    assert "mcp-session-id" not in response.headers, where


def test_every_kind_of_answer_carries_the_headers_and_no_session(server: Served, token: str) -> None:
    port = server.url.split(":")[2].split("/")[0]
    answers = {
        "200": call(server.url, token, LISTING),
        "tool result": call(server.url, token, tool_call("get", {"key": "k"})),
        "401 none": call(server.url, None, LISTING),
        "401 unknown": call(server.url, "clawmem_unknown", LISTING),
        "403 origin": call(server.url, token, LISTING, origin="http://rebound.example"),
        "400 parse": call(server.url, token, b"{"),
        "404": call(server.url.replace("/mcp", "/other"), token, LISTING),
        "406": httpx2.post(
            server.url, json=LISTING, headers={"authorization": f"Bearer {token}", "accept": "text/html"}
        ),
        "413": call(server.url, token, b"x" * (2 * 1024 * 1024)),
        "405": httpx2.put(server.url, headers={"authorization": f"Bearer {token}"}),
        "loopback origin": call(server.url, token, LISTING, origin=f"http://127.0.0.1:{port}"),
    }
    codes = {where: response.status_code for where, response in answers.items()}
    assert codes == {
        "200": 200,
        "tool result": 200,
        "401 none": 401,
        "401 unknown": 401,
        "403 origin": 403,
        "400 parse": 400,
        "404": 404,
        "406": 406,
        "413": 413,
        "405": 405,
        "loopback origin": 200,
    }
    for where, response in answers.items():
        assert_guarded(response, where)
        kind = response.headers.get("content-type", "").split(";")[0]
        assert kind in ("application/json", "text/plain", ""), (where, kind)  # never HTML


def test_a_cookie_never_stands_in_for_the_token(server: Served, token: str) -> None:
    # Nothing a browser sends by itself (a cookie, basic auth) opens the server, so a cross-site
    # form posting to it carries no credential: the CSRF check of a bearer-token API.
    cookie = call(server.url, None, LISTING, cookie=f"token={token}; session={token}")
    assert cookie.status_code == 401
    basic = httpx2.post(server.url, json=LISTING, auth=("security", token))
    assert basic.status_code == 401
    lowercase = call(server.url, None, LISTING, authorization=f"bearer {token}")
    assert lowercase.status_code == 200, "the scheme is case-insensitive, as RFC 7235 says"


TRAVERSALS = [
    "/mcp/../canary.json",
    "/mcp/..%2fcanary.json",
    "/mcp/%2e%2e/%2e%2e/canary.json",
    "/mcp/..%5ccanary.json",
    "/../../canary.json",
    "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/mcp%00",
    "/mcp%00/../canary.json",
    "/instance/canary.json",
    "/canary.json",
    "/etc/passwd",
    "//etc/passwd",
    "/mcp/%c0%ae%c0%ae/canary.json",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_no_address_reaches_a_file(server: Served, token: str, path: str) -> None:
    answer = raw_request(server, f"POST {path} HTTP/1.1", token)
    status = int(answer.split(b" ", 2)[1])
    assert status in (400, 404), answer[:300]
    assert CANARY.encode() not in answer and b"root:x:0:0" not in answer
    assert b"cache-control: no-store" in answer.lower()


def test_a_tool_whose_storage_fails_says_so_without_the_statement(tmp_path: Path) -> None:
    database = tmp_path / "memory.db"
    served = _serve(tmp_path, f"sqlite:///{database}", "claw_")
    try:
        token = served.token("broken-storage")
        stored = call(served.url, token, tool_call("remember", {"key": "k", "value": "alice-secret-text"}))
        assert stored.status_code == 200 and not stored.json()["result"]["isError"]
        with sqlite3.connect(database) as connection:  # another program drops the table under it
            (table,) = connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%memory'"
            ).fetchone()
            connection.execute(f'DROP TABLE "{table}"')
        for name, arguments in [
            ("get", {"key": "k"}),
            ("remember", {"key": "k2", "value": "bob-secret-text"}),
            ("recall", {"message": "alice-secret-text"}),
            ("search", {"query": "alice"}),
        ]:
            answer = call(served.url, token, tool_call(name, arguments))
            assert answer.status_code == 200, name
            result = answer.json()["result"]
            text = result["content"][0]["text"]
            assert result["isError"] and "failed" in text, (name, text)
            for leak in (*LEAKS, "bob-secret-text", "WHERE"):
                assert leak not in text, (name, leak, text)
            assert_guarded(answer, name)
    finally:
        _stop(served)


def test_a_token_store_that_cannot_be_read_is_a_one_line_503(tmp_path: Path) -> None:
    served = _serve(tmp_path, f"sqlite:///{tmp_path / 'memory.db'}", "claw_")
    try:
        token = served.token("before-the-fault")
        assert call(served.url, token, LISTING).status_code == 200
        accounts = Path(store.accounts_url(served.instance).removeprefix("sqlite:///"))
        with sqlite3.connect(accounts) as connection:
            connection.execute("ALTER TABLE dashboard_mcp_tokens RENAME TO moved_away")
        answer = call(served.url, token, LISTING)
        assert answer.status_code == 503
        assert answer.json() == {"error": "the access tokens cannot be checked right now; try again later"}
        assert_guarded(answer, "503")
        with sqlite3.connect(accounts) as connection:
            connection.execute("ALTER TABLE moved_away RENAME TO dashboard_mcp_tokens")
        assert call(served.url, token, LISTING).status_code == 200, "served again once the store is back"
    finally:
        _stop(served)
    log = " ".join((tmp_path / "server.log").read_text().split())
    assert "the token store could not be read" in log and "no such table" in log
    assert TRACEBACK not in log and "[parameters:" not in log
    assert not re.search(r"[0-9a-f]{64}", log), "the token's hash stays out of the log"


def test_a_get_is_refused_at_once_not_held_open_as_a_stream(server: Served, token: str) -> None:
    # The server sends nothing unasked, so it offers no event stream: the streamable HTTP
    # transport's answer is 405, at once, instead of an idle stream held until the client gives up.
    for accept in ("text/event-stream", "application/json, text/event-stream"):
        answer = httpx2.get(
            server.url, headers={"authorization": f"Bearer {token}", "accept": accept}, timeout=10
        )
        assert answer.status_code == 405, accept
        assert answer.headers["allow"] == "POST"
        assert "POST" in answer.json()["error"]
        assert answer.headers.get("content-type") == "application/json"
        assert_guarded(answer, f"GET {accept}")
    assert httpx2.get(server.url, timeout=10).status_code == 401  # and nothing before the token


def test_a_trailing_slash_is_served_without_a_redirect_built_from_host(server: Served, token: str) -> None:
    port = int(server.url.split(":")[2].split("/")[0])
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    head = (
        f"POST /mcp/ HTTP/1.1\r\nHost: attacker.example\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head.encode("latin-1") + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    assert status == 200, answer[:300]
    assert b"attacker.example" not in answer
    assert b"\r\nlocation:" not in answer.lower()
    assert b'"tools"' in answer  # the same answer as /mcp
