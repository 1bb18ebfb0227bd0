"""The MCP server over streamable HTTP, each request in the scope of its bearer token.

:func:`asgi_app` returns an ASGI app (run it under uvicorn, or gunicorn with uvicorn workers;
``clawmem mcp --http`` does the first). In front of the MCP SDK's transport it checks, in this
order: the ``Origin`` header (an origin not allowed gets 403, against DNS rebinding), the client
address's failed attempts (too many get 429), and the ``Authorization: Bearer`` token (none, an
unknown, a revoked or an expired one gets 401 with ``WWW-Authenticate`` saying why, and a bad
one counts as a failed attempt); the check reads the accounts database on the async path
(:mod:`clawmem.integrations.aio`: over asyncpg or asyncmy on the loop when it is on PostgreSQL
or MariaDB/MySQL, in a worker thread when it is SQLite). A tool call then runs in the token's
scope, checked on the server: a namespace outside it, or ``remember`` on a read-only token, is a
tool error and nothing is read or written. The transport answers a malformed JSON-RPC body with
a JSON-RPC error, and a body over the limit with 413 before reading it whole. Sessions are
stateless, so any worker serves any request, and only ``POST /mcp`` is served: a GET gets 405
(no server-initiated event stream is offered), ``/mcp/`` is answered as ``/mcp`` (never
redirected) and any other address 404. Every answer carries ``Cache-Control: no-store``,
``nosniff`` and headers that forbid framing; a token store that cannot be read gets 503 in one
line, never a traceback.

After the first recall of each token scope (which builds its namespace's recall index), the
process collects once and freezes what it holds (``gc.freeze``), so the collector's full passes
no longer walk the index while requests wait.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from clawmem import Claw, EchoProvider, Settings
from clawmem.clock import Clock
from clawmem.integrations import aio
from clawmem.integrations.mcp import CALL_TOOLS, build_server, memory_tools
from clawmem.integrations.mcp.tools import MemoryTools
from clawmem.sql import tokens as store
from clawmem.sql.engine import describe_error, engine_for

__all__ = [
    "LOOPBACK_ORIGINS",
    "MAX_BODY_BYTES",
    "RESPONSE_HEADERS",
    "TOKEN_SCOPE",
    "asgi_app",
    "environment_app",
]

_log = logging.getLogger(__name__)
TOKEN_SCOPE = "clawmem.token"  # the ASGI scope key that carries the request's token record
MAX_BODY_BYTES = 1024 * 1024
MCP_PATH = "/mcp"  # the one address served
LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
# On every answer: nothing here is a page to frame, sniff into HTML or keep in a cache (tool
# results carry customer text), and no link leaves with the address it came from.
RESPONSE_HEADERS = (
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)
_SCOPE_TEXT = (
    "Each request is served in the scope of its access token: a namespace, a subject and "
    "read-only are the token's, checked on the server."
)


def _origin_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    for pattern in allowed:
        if pattern.endswith(":*"):
            base = pattern[:-2]
            if origin == base or (origin.startswith(base + ":") and origin[len(base) + 1 :].isdigit()):
                return True
        elif origin == pattern:
            return True
    return False


async def _plain(send: Any, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((name.encode(), value.encode()) for name, value in headers),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _challenge(error: str, description: str) -> tuple[str, str]:
    quoted = description.replace("\\", "\\\\").replace('"', '\\"')
    return ("www-authenticate", f'Bearer realm="clawmem", error="{error}", error_description="{quoted}"')


class _Scopes:
    """The tools of each token scope, made on first use and kept (a few per deployment)."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self._claws: dict[str | None, Claw] = {}
        self._tools: dict[tuple[str | None, str | None, bool], MemoryTools] = {}
        self._lock = threading.Lock()

    def tools(self, record: store.TokenRecord) -> MemoryTools:
        key = (record.namespace, record.subject, record.read_only)
        found = self._tools.get(key)
        if found is not None:
            return found
        with self._lock:
            if key not in self._tools:
                claw = self._claws.get(record.namespace)
                if claw is None:
                    settings = self.settings
                    if record.namespace is not None:
                        settings = settings.replace(recall_namespace=record.namespace)
                    claw = self._claws[record.namespace] = Claw.from_settings(
                        settings, EchoProvider(), self.clock
                    )
                tools = memory_tools(
                    self.settings,
                    namespace=record.namespace,
                    subject=record.subject,
                    read_only=record.read_only,
                    clock=self.clock,
                    claw=claw,
                )
                _settle_after_first_recall(tools)
                self._tools[key] = tools
            return self._tools[key]


def _settle_after_first_recall(tools: MemoryTools) -> None:
    """After the first recall of ``tools`` (the one that builds its namespace's recall index),
    collect once and freeze what the process then holds (``gc.freeze``): the index's objects
    live as long as the server, and every full pass of the collector over them (about 100 ms at
    100,000 entries) stalled every request in flight on the worker, the tail of its latency."""
    recall = tools.recall

    def first_recall(*args: Any) -> Any:
        found = recall(*args)
        tools.recall = recall  # type: ignore[method-assign]  # later calls go straight to it
        gc.collect()
        gc.freeze()
        return found

    tools.recall = first_recall  # type: ignore[method-assign]


class TokenGate:
    """ASGI middleware: Origin, rate limit and bearer token, then the MCP transport."""

    def __init__(self, inner: Any, accounts: Any, clock: Clock, allowed_origins: tuple[str, ...]) -> None:
        self.inner = inner
        self.accounts = accounts
        self.clock = clock
        self.allowed_origins = allowed_origins
        # An accounts database on PostgreSQL or MariaDB is checked on the loop over its asyncio
        # driver; SQLite's is checked in a worker thread (clawmem.integrations.aio).
        self.on_loop = aio.engine_on_loop(accounts)

    def _admit(self, address: str, token: str, now: float) -> tuple[float, store.TokenRecord | None]:
        """The address's wait and the token's record, in one call of the async path."""
        return store.admit(self.accounts, address, token, now)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return

        async def send_guarded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                given = {name.lower() for name, _ in message.get("headers", ())}
                extra = [(name, value) for name, value in RESPONSE_HEADERS if name not in given]
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self._gate(scope, receive, send_guarded)

    async def _gate(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
        }
        origin = headers.get("origin")
        if origin is not None and not _origin_allowed(origin, self.allowed_origins):
            await _plain(send, 403, f"origin {origin!r} is not allowed (clawmem mcp --allow-origin)")
            return
        address = (scope.get("client") or ("unknown", 0))[0]
        now = self.clock()
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        try:
            wait, record = await aio.run(self.on_loop, self._admit, address, token, now)
        except sa.exc.SQLAlchemyError as exc:
            # Said in one line, without the statement or the token's hash the driver would quote.
            _log.error("the token store could not be read: %s", describe_error(exc))
            await _plain(send, 503, "the access tokens cannot be checked right now; try again later")
            return
        if wait > 0:
            await _plain(
                send,
                429,
                "too many failed token attempts from this address; try again later",
                [("retry-after", str(int(wait) + 1))],
            )
            return
        if not token:
            message = "an access token is needed: send Authorization: Bearer <token> (clawmem tokens create)"
            await _plain(send, 401, message, [("www-authenticate", 'Bearer realm="clawmem"')])
            return
        if record is None:
            await aio.run(self.on_loop, store.record_failure, self.accounts, address, now)
            message = "the access token is not one this server knows"
            await _plain(send, 401, message, [_challenge("invalid_token", message)])
            return
        state = record.state(now)
        if state != "active":
            message = f"the access token {record.name!r} was revoked"
            if state == "expired":
                moment = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.expires_at or 0))
                message = f"the access token {record.name!r} expired at {moment}"
            await _plain(send, 401, message, [_challenge("invalid_token", message)])
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path == MCP_PATH + "/":
            # Served here as /mcp: the transport would answer it with a redirect to an address
            # built from the Host header, which a client does not control and an attacker may.
            scope = {**scope, "path": root + MCP_PATH, "raw_path": (root + MCP_PATH).encode()}
        elif path != MCP_PATH:
            await _plain(send, 404, f"there is nothing at this address; the MCP endpoint is {MCP_PATH}")
            return
        if scope.get("method") != "POST":
            # The streamable HTTP transport's answer for a server that offers no stream of its
            # own: its sessions are stateless and it never sends a message unasked, so a GET
            # would hold an idle stream open for as long as the client waits.
            await _plain(
                send,
                405,
                f"{scope.get('method')} is not served here: send each JSON-RPC message with POST "
                "(this server opens no event stream)",
                [("allow", "POST")],
            )
            return
        scope[TOKEN_SCOPE] = record
        await self.inner(scope, receive, send)


def asgi_app(
    settings: Settings,
    *,
    clock: Clock = time.time,
    allowed_origins: Iterable[str] = (),
    accounts_url: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Any:
    """Return the ASGI app of the MCP server over ``settings``' memory at path ``/mcp``.

    Browsers' ``Origin`` must be a loopback one or one of ``allowed_origins`` (``http://host:*``
    allows any port); tokens are read from ``accounts_url`` (default: the dashboard's accounts
    database in the instance folder). Raises ``ValueError`` for a bad setting.
    """
    accounts = engine_for(accounts_url or store.accounts_url(settings.instance_path))
    store.create_tables(accounts)
    scopes = _Scopes(settings, clock)

    def tools_of(context: Any) -> MemoryTools:
        request = getattr(getattr(context, "request_context", None), "request", None)
        record = getattr(request, "scope", {}).get(TOKEN_SCOPE)
        if not isinstance(record, store.TokenRecord):
            raise ToolError("this request carries no access token, so no tool runs")
        return scopes.tools(record)

    app = build_server(CALL_TOOLS.get, _SCOPE_TEXT)
    app.tools_of = tools_of
    inner = app.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        max_request_body_size=max_body_bytes,
        # Origin is checked by TokenGate; Host may be any name the operator serves under.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return TokenGate(inner, accounts, clock, tuple(LOOPBACK_ORIGINS) + tuple(allowed_origins))


def environment_app() -> Any:
    """Return :func:`asgi_app` for the site of the ``CLAW_*`` environment (the instance folder
    ``CLAW_INSTANCE_PATH`` or ``./instance``), for a process manager:
    ``gunicorn -k uvicorn.workers.UvicornWorker 'clawmem.integrations.mcp.http:environment_app()'``."""
    instance = os.environ.get("CLAW_INSTANCE_PATH") or "instance"
    return asgi_app(Settings.from_env(instance_path=instance))
