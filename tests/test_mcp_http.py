"""``clawmem mcp --http`` as remote agents reach it: a real uvicorn process on loopback, driven
by the MCP SDK's own streamable HTTP client and by plain HTTP requests, on SQLite, MariaDB and
PostgreSQL. Tokens are made and revoked with the CLI, as an operator does; each request is held
to its token's scope on the server, and every bad request is refused with a clear answer while
nothing is read or written."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import LATEST_MODERN_VERSION

from clawmem.integrations import aio
from clawmem.integrations.mcp.http import LOOPBACK_ORIGINS, TOKEN_SCOPE, TokenGate
from clawmem.sql import tokens as store
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import drop_tables
from tests.conftest import SQL_BACKENDS, backend_url, sql_url

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-c", "from clawmem.cli import main; main()"]
TOOLS = {"recall", "remember", "get", "list_namespaces", "list_keys", "search"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Served:
    """One running ``clawmem mcp --http`` and the site it serves."""

    url: str
    env: dict[str, str]
    instance: Path
    process: subprocess.Popen[bytes]

    def clawmem(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a clawmem command on the same site, as the operator would."""
        return subprocess.run(
            [*COMMAND, *args], env=self.env, capture_output=True, text=True, timeout=120, check=False
        )

    def token(self, name: str, *flags: str) -> str:
        """Make a token with ``clawmem tokens create`` and return the one line it prints."""
        made = self.clawmem("tokens", "create", "--name", name, *flags)
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()


def _serve(tmp: Path, database_url: str, prefix: str, extra: dict[str, str] | None = None) -> Served:
    instance = tmp / "instance"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "CLAW_DATABASE_URL": database_url,
        "CLAW_TABLE_PREFIX": prefix,
        "CLAW_INSTANCE_PATH": str(instance),
        **(extra or {}),
    }
    port = _free_port()
    with (tmp / "server.log").open("ab") as log:
        process = subprocess.Popen(
            [*COMMAND, "mcp", "--http", f"127.0.0.1:{port}"], env=env, stdout=log, stderr=log, cwd=tmp
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError((tmp / "server.log").read_text())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)  # waiting for a process to listen, not for time to pass
    else:
        process.kill()
        raise AssertionError("the server did not listen within 60 s")
    return Served(f"http://127.0.0.1:{port}/mcp", env, instance, process)


def _stop(served: Served) -> None:
    served.process.terminate()
    try:
        served.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()


@pytest.fixture(scope="module", params=SQL_BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A running server per SQL backend, on tables of its own."""
    tmp = tmp_path_factory.mktemp(f"mcp_http_{request.param}")
    url, prefix = sql_url(request.param, tmp), f"t{uuid.uuid4().hex[:8]}_"
    server = _serve(tmp, url, prefix)
    yield server
    _stop(server)
    drop_tables(engine_for(url), prefix)


def call(url: str, token: str | None, body: Any, **headers: str) -> httpx2.Response:
    """POST one JSON-RPC ``body`` as an MCP client would."""
    sent = {"accept": "application/json, text/event-stream", "content-type": "application/json", **headers}
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx2.post(url, content=content, headers=sent, timeout=30)


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


def in_client(served: Served, token: str, body: Any) -> Any:
    """Run ``body(client)`` in a session of the SDK's streamable HTTP client sending ``token``."""

    async def main() -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(served.url, http_client=http)) as client,
        ):
            return await body(client)

    return anyio.run(main)


def test_the_sdk_client_remembers_and_recalls_within_its_tokens_namespace(served: Served) -> None:
    writer = served.token("writer", "--namespace", "shop")
    reader = served.token("reader", "--namespace", "shop", "--read-only")

    async def remember(client: Client) -> Any:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        stored = await client.call_tool(
            "remember", {"key": "delivery_days", "value": "We deliver on Tuesdays"}
        )
        outside = await client.call_tool("remember", {"key": "x", "value": "leaked", "namespace": "other"})
        peek = await client.call_tool("get", {"key": "x", "namespace": "other"})
        return tools, stored, outside, peek

    tools, stored, outside, peek = in_client(served, writer, remember)
    assert tools == TOOLS  # nothing that deletes
    assert not stored.is_error and stored.structured_content["namespace"] == "shop"
    assert outside.is_error and "outside this server's scope" in outside.content[0].text
    assert peek.is_error and "outside this server's scope" in peek.content[0].text

    async def recall(client: Client) -> Any:
        recalled = await client.call_tool("recall", {"message": "Which days do you deliver?"})
        refused = await client.call_tool("remember", {"key": "delivery_days", "value": "Never"})
        again = await client.call_tool("get", {"key": "delivery_days"})
        return recalled, refused, again

    recalled, refused, again = in_client(served, reader, recall)
    assert recalled.structured_content["lines"] == ["- delivery_days: We deliver on Tuesdays"]
    assert refused.is_error and "read-only" in refused.content[0].text
    assert again.structured_content["value"] == "We deliver on Tuesdays"  # nothing was written

    anywhere = served.token("operator")

    async def look(client: Client) -> Any:
        return await client.call_tool("get", {"key": "x", "namespace": "other"})

    assert in_client(served, anywhere, look).structured_content["found"] is False  # the refused write


def test_a_subject_token_binds_remember_and_recall_to_that_subject(served: Served) -> None:
    token = served.token("alice-agent", "--subject", "alice@example.com")

    async def body(client: Client) -> Any:
        stored = await client.call_tool("remember", {"key": "allergy", "value": "peanuts"})
        other = await client.call_tool("recall", {"message": "allergy?", "subject": "bob@example.com"})
        recalled = await client.call_tool("recall", {"message": "any allergy?"})
        return stored, other, recalled

    stored, other, recalled = in_client(served, token, body)
    assert stored.structured_content["namespace"].startswith("user:")
    assert other.is_error
    assert recalled.structured_content["lines"] == ["- allergy: peanuts"]


def test_no_token_or_a_bad_one_gets_401_with_www_authenticate(served: Served) -> None:
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    missing = call(served.url, None, listing)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    bad = call(served.url, "clawmem_not-a-token", listing)
    assert bad.status_code == 401
    assert 'error="invalid_token"' in bad.headers["www-authenticate"]
    assert "not one this server knows" in bad.json()["error"]


def test_a_revoked_token_is_refused_at_its_next_request(served: Served) -> None:
    token = served.token("short-lived")
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert call(served.url, token, listing).status_code == 200
    revoked = served.clawmem("tokens", "revoke", "short-lived")
    assert revoked.returncode == 0, revoked.stderr
    refused = call(served.url, token, tool_call("get", {"key": "k"}))
    assert refused.status_code == 401
    assert "revoked" in refused.json()["error"]
    audit = [json.loads(line) for line in (served.instance / "audit.log").read_text().splitlines()]
    finished = [line for line in audit if line["command"] == "tokens revoke" and line["phase"] == "finished"]
    assert finished[-1]["counts"] == {"tokens": 1} and finished[-1]["outcome"] == "ok"


def test_an_expired_token_gets_401_saying_it_expired(served: Served) -> None:
    now = time.time()
    accounts = engine_for(store.accounts_url(served.instance))
    token = store.create_token(accounts, "last-month", now - 40 * 86400, expires_at=now - 10 * 86400)
    refused = call(served.url, token, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 401
    assert "expired at" in refused.json()["error"]
    assert "expired at" in refused.headers["www-authenticate"]


def test_a_malformed_json_rpc_body_gets_a_json_rpc_error(served: Served) -> None:
    token = served.token("malformed")
    broken = call(served.url, token, b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == -32700  # parse error
    not_a_request = call(served.url, token, {"hello": "world"})
    assert not_a_request.status_code == 400 and "error" in not_a_request.json()


def modern(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Return ``body`` in the per-request envelope of the modern (stateless) protocol revision,
    and its headers, as the MCP SDK's own client sends a call after ``server/discover``."""
    params = body.get("params", {})
    meta = {PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION, CLIENT_CAPABILITIES_META_KEY: {}}
    headers = {"mcp-protocol-version": LATEST_MODERN_VERSION, "mcp-method": body["method"]}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    return {**body, "params": {**params, "_meta": meta}}, headers


def test_a_malformed_body_on_the_modern_protocol_gets_a_json_rpc_error(served: Served) -> None:
    token = served.token("malformed-modern")
    _, headers = modern(tool_call("get", {"key": "k"}))
    broken = call(served.url, token, b'{"jsonrpc": "2.0", "id": 1, "method": ', **headers)
    assert broken.json()["error"]["code"] == -32700  # parse error
    bare = call(served.url, token, tool_call("get", {"key": "k"}), **headers)  # no envelope
    assert "_meta" in bare.json()["error"]["message"]


@pytest.mark.parametrize("protocol", ["legacy", "modern"])
def test_a_plain_http_call_is_held_to_its_tokens_scope_on_either_protocol(
    served: Served, protocol: str
) -> None:
    token = served.token(f"shop-reader-{protocol}", "--namespace", "shop", "--read-only")

    def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body, headers = tool_call(name, arguments), {}
        if protocol == "modern":
            body, headers = modern(body)
        answer = call(served.url, token, body, **headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["result"]

    written = tool("remember", {"key": f"note-{protocol}", "value": "leaked"})
    assert written["isError"] and "read-only" in written["content"][0]["text"]
    outside = tool("get", {"key": "k", "namespace": "other"})
    assert outside["isError"] and "outside this server's scope" in outside["content"][0]["text"]
    assert tool("get", {"key": f"note-{protocol}"})["structuredContent"]["found"] is False


def test_an_oversized_body_gets_413_before_it_is_read_whole(served: Served) -> None:
    token = served.token("big")
    huge = json.dumps(tool_call("remember", {"key": "big", "value": "x" * (2 * 1024 * 1024)})).encode()
    declared = call(served.url, token, huge)
    assert declared.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused once the limit is passed
        for _ in range(64):
            yield b"x" * 65536

    streamed = httpx2.post(
        served.url,
        content=chunks(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        timeout=30,
    )
    assert streamed.status_code == 413


def test_a_foreign_origin_is_refused_and_a_loopback_one_served(served: Served) -> None:
    token = served.token("browser")
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    foreign = call(served.url, token, listing, origin="http://rebound.example")
    assert foreign.status_code == 403
    local = call(
        served.url, token, listing, origin=f"http://127.0.0.1:{served.url.split(':')[2].split('/')[0]}"
    )
    assert local.status_code == 200


def test_tokens_list_shows_scopes_and_never_a_token(served: Served) -> None:
    token = served.token("listed", "--namespace", "shop", "--read-only", "--expires", "30d")
    listed = served.clawmem("tokens", "list")
    assert listed.returncode == 0
    line = next(line for line in listed.stdout.splitlines() if line.startswith("listed "))
    assert "namespace shop, read-only" in line and "active" in line and "expires 20" in line
    assert token not in listed.stdout
    stored = engine_for(store.accounts_url(served.instance))
    with stored.connect() as conn:
        hashes = conn.execute(sa.select(store.tokens_table.c.token_hash)).scalars().all()
    assert token not in hashes and all(len(value) == 64 for value in hashes)


def test_a_bad_namespace_scope_cannot_be_made(served: Served) -> None:
    made = served.clawmem("tokens", "create", "--name", "bad-scope", "--namespace", "no spaces here")
    assert made.returncode == 1
    assert made.stderr.strip().count("\n") == 0 and "namespace" in made.stderr
    assert "bad-scope" not in served.clawmem("tokens", "list").stdout


def test_failed_token_attempts_are_rate_limited_per_address(tmp_path: Path) -> None:
    server = _serve(tmp_path, f"sqlite:///{tmp_path / 'memory.db'}", "claw_")
    try:
        good = server.token("good")
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        for _ in range(store.MAX_FAILURES_PER_ADDRESS):
            assert call(server.url, "clawmem_guess", listing).status_code == 401
        blocked = call(server.url, good, listing)  # even a good token waits out the window
        assert blocked.status_code == 429
        assert int(blocked.headers["retry-after"]) > 0
    finally:
        _stop(server)


def test_another_address_needs_allow_remote(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CLAW_INSTANCE_PATH": str(tmp_path / "i")}
    refused = subprocess.run(
        [*COMMAND, "mcp", "--http", "0.0.0.0:8765"], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "--allow-remote" in refused.stderr and "TLS" in refused.stderr
    scoped = subprocess.run(
        [*COMMAND, "mcp", "--http", "127.0.0.1:8765", "--read-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert scoped.returncode == 2 and "token" in scoped.stderr
    assert not os.path.exists(tmp_path / "i")  # refused before anything was made


@pytest.fixture(params=["mysql", "postgres"])
def accounts_database(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A server database as the dashboard's accounts database, and a unique token name on it
    (the token tables have no prefix; this test's rows are deleted at the end)."""
    url, name, started = backend_url(request.param), f"t-{uuid.uuid4().hex[:12]}", time.time()
    accounts = engine_for(url)
    store.create_tables(accounts)
    yield url, name
    with accounts.begin() as conn:
        conn.execute(sa.delete(store.tokens_table).where(store.tokens_table.c.name == name))
        failures = store.failures_table  # the server's one bad attempt, from loopback
        conn.execute(
            sa.delete(failures).where(failures.c.address == "127.0.0.1", failures.c.failed_at >= started - 1)
        )


def test_tokens_kept_in_a_server_accounts_database_admit_and_are_revoked(
    tmp_path: Path, accounts_database: tuple[str, str]
) -> None:
    url, name = accounts_database
    server = _serve(
        tmp_path, f"sqlite:///{tmp_path / 'memory.db'}", "claw_", {store.ACCOUNTS_URL_VARIABLE: url}
    )
    try:
        token = server.token(name)
        assert not (server.instance / "dashboard.db").exists()  # kept where the dashboard's admins are
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert call(server.url, token, listing).status_code == 200
        assert call(server.url, "clawmem_not-a-token", listing).status_code == 401
        assert server.clawmem("tokens", "revoke", name).returncode == 0
        refused = call(server.url, token, listing)
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]
    finally:
        _stop(server)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_the_token_check_runs_on_the_loop_where_the_accounts_database_has_an_async_driver(
    tmp_path: Path, backend: str
) -> None:
    url = sql_url(backend, tmp_path)
    accounts = engine_for(url)
    store.create_tables(accounts)
    name, made = f"t-{uuid.uuid4().hex[:12]}", time.time()
    token = store.create_token(accounts, name, made, namespace="shop")
    stored = store.find_token(accounts, name)
    assert stored is not None and abs(stored.created_at - made) < 0.01  # times kept to the second
    admitted: list[Any] = []
    statements: list[int] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        admitted.append(scope[TOKEN_SCOPE])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if store.tokens_table.name in statement or store.failures_table.name in statement:
            statements.append(threading.get_ident())

    async def requests() -> tuple[int, list[int]]:
        gate = TokenGate(inner, accounts, time.time, LOOPBACK_ORIGINS)
        transport = httpx2.ASGITransport(app=gate, client=(f"test-{name}", 1))
        async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            codes = [
                (await client.post("/mcp", headers={"authorization": f"Bearer {value}"})).status_code
                for value in (token, "clawmem_not-a-token")
            ]
            for _ in range(store.MAX_FAILURES_PER_ADDRESS - 1):
                await aio.run(gate.on_loop, store.record_failure, accounts, f"test-{name}", time.time())
            blocked = await client.post("/mcp", headers={"authorization": f"Bearer {token}"})
            codes.append(blocked.status_code)  # even the good token waits out the window
        await aio.close_engines()
        return threading.get_ident(), codes

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        loop_thread, codes = asyncio.run(requests())
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
        with accounts.begin() as conn:
            conn.execute(sa.delete(store.tokens_table).where(store.tokens_table.c.name == name))
            failures = store.failures_table
            conn.execute(sa.delete(failures).where(failures.c.address == f"test-{name}"))
    assert codes == [204, 401, 429]
    assert [record.name for record in admitted] == [name] and admitted[0].namespace == "shop"
    assert statements  # the hash lookup, the rate limit, the failure recorded
    assert all((thread == loop_thread) is (backend != "sqlite") for thread in statements)
