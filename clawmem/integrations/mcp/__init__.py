"""A Model Context Protocol server over clawmem memory: recall, remember and read, never delete.

:func:`server` returns the configured ``mcp.server.mcpserver.MCPServer`` (the official ``mcp``
SDK, extra ``clawmem[mcp]``); ``clawmem mcp`` serves it on stdio. Its tools are ``recall``,
``remember``, ``get``, ``list_namespaces``, ``list_keys`` and ``search``. None of them forgets,
flushes or erases anything: deletion stays in the CLI, where it is confirmed and audited.

Every tool call runs in its own :func:`clawmem.run_context`, so its events carry a run id, which
the result reports too. A call runs on the async path (:mod:`clawmem.integrations.aio`): on the server's
event loop over asyncio drivers when every driver behind the memory is on PostgreSQL,
MariaDB/MySQL or Redis, else in a worker thread. Bad input, a namespace outside the server's
scope and a storage failure are tool errors (``isError``) of one line; nothing is written then,
and the server goes on.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from clawmem.integrations import require

require("mcp", "mcp")

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError  # noqa: E402
from mcp.types import ToolAnnotations  # noqa: E402
from pydantic import Field, ValidationError  # noqa: E402

from clawmem import Claw, EchoProvider, Settings, __version__, subject_namespace  # noqa: E402
from clawmem.clock import Clock  # noqa: E402
from clawmem.errors import StorageError, redact  # noqa: E402
from clawmem.ids import new_id  # noqa: E402
from clawmem.integrations import aio  # noqa: E402
from clawmem.integrations.mcp.results import (  # noqa: E402
    Found,
    KeysPage,
    Namespaces,
    Recalled,
    Remembered,
    Searched,
)
from clawmem.integrations.mcp.tools import MemoryTools, Scope  # noqa: E402

__all__ = ["INSTRUCTIONS", "Scope", "asgi_app", "server"]

SERVER_NAME = "clawmem"
MAX_SEARCH_HITS = 50

INSTRUCTIONS = (
    "clawmem is this agent's long-term memory: key/value facts in namespaces, each with an "
    "optional time to live. Call `recall` with the user's message to get the memory lines a turn "
    "would be given, and why each candidate was or was not chosen. Call `remember` to store a "
    "fact (a key, a JSON value, a TTL in seconds if it should expire); `get`, `search`, "
    "`list_namespaces` and `list_keys` read. Nothing can be deleted through this server: "
    "forgetting, flushing and erasing stay in the clawmem command line (`clawmem forget`, "
    "`clawmem flush`, `clawmem erase`), run by an operator, who also sees every fact stored here "
    "on the clawmem dashboard."
)

# Failures a caller can act on: bad input (ValueError and its kin InvalidKey, InvalidNamespace,
# ValueTooLarge, ConfigError), a value JSON cannot hold (TypeError), and a backend that failed.
_EXPECTED = (ValueError, TypeError, StorageError, NotImplementedError)

F = TypeVar("F", bound=Callable[..., Any])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0] if text else type(exc).__name__)


def _in_run(function: F, current: Callable[[], MemoryTools]) -> F:
    """Make a tool body a coroutine that runs it in a run context of its own, on the async path
    of ``current()``'s memory; expected failures become a one-line ToolError."""

    @functools.wraps(function)
    async def call(*args: Any, **kwargs: Any) -> Any:
        run_id = new_id()

        def body() -> Any:
            try:
                return function(run_id, *args, **kwargs)
            except _EXPECTED as exc:
                raise ToolError(_one_line(exc)) from exc

        return await aio.run(aio.every_driver_on_loop(current().memory), body, run_id=run_id)

    # The tool's arguments are the body's without the run id, which the call supplies.
    signature = inspect.signature(function, eval_str=True)
    arguments = list(signature.parameters.values())[1:]
    call.__signature__ = signature.replace(parameters=arguments)  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


# The tools of the call being served, when the server's scope is the request's (over HTTP).
CALL_TOOLS: contextvars.ContextVar[MemoryTools] = contextvars.ContextVar("clawmem_mcp_call_tools")


class ClawMCPServer(MCPServer):
    """An MCPServer whose argument errors are one line each, like every other tool error.

    ``tools_of``, when set, returns the tools of a call's request context (raising
    ``ToolError`` when the request may not call tools); the call runs with them in
    :data:`CALL_TOOLS`.
    """

    tools_of: Callable[[Any], MemoryTools] | None = None

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        reset = CALL_TOOLS.set(self.tools_of(context)) if self.tools_of is not None else None
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
                for error in cause.errors()
            )
            raise ToolError(f"Error executing tool {name}: {problems}") from cause
        finally:
            if reset is not None:
                CALL_TOOLS.reset(reset)


_READ = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
# remember replaces the value of a key that exists, so it is not purely additive.
_WRITE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)

Key = Annotated[str, Field(description="The entry's key: 1-191 characters, no control characters.")]
OptionalNamespace = Annotated[
    str | None,
    Field(description="A namespace (1-100 of A-Z a-z 0-9 _ - . :); omitted: the server's own."),
]


def server(
    settings: Settings,
    *,
    namespace: str | None = None,
    subject: str | None = None,
    read_only: bool = False,
    clock: Clock = time.time,
) -> MCPServer:
    """Return the MCP server over the memory of ``settings``' site, its tools registered.

    ``namespace`` limits reads and writes to that namespace (it is also the one recall reads),
    plus ``subject``'s own namespace; ``subject`` binds recall and remember to that subject;
    ``read_only`` leaves ``remember`` out. Raises ``ValueError`` (``InvalidNamespace``,
    ``ConfigError``) for a bad namespace, subject or setting.
    """
    tools = memory_tools(settings, namespace=namespace, subject=subject, read_only=read_only, clock=clock)
    return build_server(lambda: tools, tools.scope.describe(), read_only=read_only)


def memory_tools(
    settings: Settings,
    *,
    namespace: str | None = None,
    subject: str | None = None,
    read_only: bool = False,
    clock: Clock = time.time,
    claw: Claw | None = None,
) -> MemoryTools:
    """Return the tools' logic over ``settings``' memory within one scope (see :func:`server`);
    ``claw``, when given, is the one whose recall namespace is ``namespace``'s. Raises
    ``ValueError`` for a bad namespace, subject or setting."""
    if claw is None:
        if namespace is not None:
            settings = settings.replace(recall_namespace=namespace)
        claw = Claw.from_settings(settings, EchoProvider(), clock)  # recall exactly as a turn makes it
    scope = Scope(
        namespace=claw.augmenter.namespace,
        subject=subject_namespace(subject, claw.subject_template) if subject is not None else None,
        limited=namespace is not None or subject is not None,
        read_only=read_only,
    )
    return MemoryTools(claw, scope)


def build_server(
    current: Callable[[], MemoryTools], scope_text: str, *, read_only: bool = False
) -> ClawMCPServer:
    """Return the server whose tools run on ``current()``, the tools of the caller's scope
    (fixed on stdio, the token's over HTTP); ``scope_text`` ends its instructions, and
    ``read_only`` leaves ``remember`` out."""
    in_run = functools.partial(_in_run, current=current)
    app = ClawMCPServer(
        SERVER_NAME,
        title="clawmem memory",
        instructions=f"{INSTRUCTIONS} {scope_text}",
        version=__version__,
        log_level="WARNING",
    )

    @in_run
    def recall(
        run_id: str,
        message: Annotated[str, Field(description="The user's message, as a turn would receive it.")],
        subject: Annotated[
            str | None, Field(description="A user id: also read that subject's own namespace.")
        ] = None,
    ) -> Recalled:
        """Return the memory a turn would be given for MESSAGE: the exact augmented text and its
        lines, and for each candidate its namespace, key, score, matched words and status."""
        return current().recall(run_id, message, subject)

    @in_run
    def remember(
        run_id: str,
        key: Key,
        value: Annotated[Any, Field(description="Any JSON value.")],
        namespace: OptionalNamespace = None,
        ttl_seconds: Annotated[
            int | None, Field(strict=True, gt=0, description="Seconds until it expires; omitted: never.")
        ] = None,
    ) -> Remembered:
        """Store VALUE under KEY (replacing what the key held), through the privacy switch: it is
        refused, with the reason, when message storage is off."""
        return current().remember(run_id, key, value, namespace, ttl_seconds)

    @in_run
    def get(run_id: str, key: Key, namespace: OptionalNamespace = None) -> Found:
        """Return the live value of KEY, or found=false when it is missing or expired."""
        return current().get(run_id, key, namespace)

    @in_run
    def list_namespaces(run_id: str) -> Namespaces:
        """Return the namespaces that hold entries (those in this server's scope)."""
        return current().list_namespaces(run_id)

    @in_run
    def list_keys(
        run_id: str,
        namespace: Annotated[str, Field(description="The namespace to list.")],
        cursor: Annotated[str | None, Field(description="next_cursor of the previous page.")] = None,
    ) -> KeysPage:
        """Return one page of a namespace's live keys, in key order, with their expiry; pass
        next_cursor back as cursor for the next page."""
        return current().list_keys(run_id, namespace, cursor)

    @in_run
    def search(
        run_id: str,
        query: Annotated[str, Field(description="Words to look for in keys and values.")],
        namespace: OptionalNamespace = None,
        limit: Annotated[int, Field(strict=True, ge=1, le=MAX_SEARCH_HITS)] = 5,
    ) -> Searched:
        """Return the entries of a namespace that share the most words with QUERY, best first."""
        return current().search(run_id, query, namespace, limit)

    for function, title in (
        (recall, "Recall memory for a message"),
        (get, "Get one entry"),
        (list_namespaces, "List namespaces"),
        (list_keys, "List keys"),
        (search, "Search entries"),
    ):
        app.add_tool(function, title=title, annotations=_READ)
    if not read_only:
        app.add_tool(remember, title="Remember a fact", annotations=_WRITE)
    return app


def asgi_app(settings: Settings, **options: Any) -> Any:
    """Return the ASGI app serving this memory over streamable HTTP, each request in its
    token's scope: see :func:`clawmem.integrations.mcp.http.asgi_app`."""
    from clawmem.integrations.mcp.http import asgi_app as build

    return build(settings, **options)
