"""The async path: the synchronous core run on an event loop over asyncio database drivers.

:func:`run` calls a function of the core (a :class:`clawmem.ConversationLog` read, a memory
driver's ``set``, a recall) from a coroutine. On PostgreSQL and MariaDB/MySQL it runs in a
greenlet on the loop's own thread, not in a worker thread: every :func:`clawmem.sql.engine.connect`
and :func:`~clawmem.sql.engine.write_transaction` in it takes the engine's twin on the asyncio
driver (asyncpg, asyncmy; see :func:`clawmem.sql.engine.current`), whose I/O is awaited, so the
loop serves other tasks while a statement is on the wire. The statements are the ones the
synchronous path builds, compiled for the same dialect, and everything around them (validation,
sealing at rest with per-subject keys, events) is the same code.

Redis memory takes the same path through :class:`clawmem.memory.redis.RedisMemory`'s client on
``redis.asyncio``. SQLite, the file driver and anything else without an asyncio driver run in a
worker thread, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy.util import greenlet_spawn

from clawmem import events
from clawmem.ids import new_id
from clawmem.loop import ASYNC_PATH, installed
from clawmem.sql.engine import _TWINS

_T = TypeVar("_T")
ASYNC_DRIVER = "async driver"
THREAD_HOP = "thread hop"
# Set by thread_hop(): calls in its block run in a worker thread whatever the driver.
_THREAD_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("clawmem_thread_only", default=False)


async def run(on_loop: bool, function: Callable[..., _T], *args: Any, run_id: str | None = None) -> _T:
    """Return ``function(*args)`` run in a run context (``run_id``, the caller's, or a new one):
    on the loop over the asyncio drivers when ``on_loop`` (see :func:`path_of`), else in a worker
    thread."""
    run_id = run_id or events.current_run_id() or new_id()

    def call() -> _T:
        with events.run_context(run_id):
            return function(*args)

    if not on_loop or _THREAD_ONLY.get():
        return await asyncio.to_thread(call)
    token = ASYNC_PATH.set(True)
    try:
        return await greenlet_spawn(call)
    finally:
        ASYNC_PATH.reset(token)


@contextlib.contextmanager
def thread_hop() -> Iterator[None]:
    """Within this block (and the tasks started in it), every :func:`run` takes a worker thread,
    as SQLite's calls do: the path the benchmarks and the tests compare the async path with."""
    token = _THREAD_ONLY.set(True)
    try:
        yield
    finally:
        _THREAD_ONLY.reset(token)


def hopping() -> bool:
    """Return whether the caller is in a :func:`thread_hop` block."""
    return _THREAD_ONLY.get()


async def close_engines() -> None:
    """Close the connections the running loop's twin engines and Redis clients hold. Call it
    before the loop ends (an app's shutdown): asyncio drivers' connections belong to one loop."""
    import sys

    if "clawmem.memory.redis_loop" in sys.modules:  # a Redis driver made twins on this loop
        await sys.modules["clawmem.memory.redis_loop"].close_clients()
    twins = _TWINS.pop(asyncio.get_running_loop(), {})
    for (_engine, reading), twin in twins.items():
        if not reading:  # a reading twin shares its twin's pool
            await greenlet_spawn(twin.dispose)


def engine_on_loop(engine: Any) -> bool:
    """Return whether calls on ``engine`` take the async path: a PostgreSQL or MariaDB/MySQL
    engine whose asyncio driver is installed (the ``postgres`` and ``mysql`` extras bring them;
    SQLite has none here, and keeps the worker thread, as does a server without its driver)."""
    from sqlalchemy.engine import Engine

    from clawmem.sql.engine import async_url

    if not isinstance(engine, Engine):
        return False
    url = async_url(engine.url)
    return url is not None and installed(url.get_driver_name())


@functools.cache
def driver_on_loop(driver: Any) -> bool:
    """Return whether a memory driver's calls take the async path: a SQL driver on a server
    database, or Redis (see :func:`clawmem.memory.redis.RedisMemory`)."""
    if getattr(driver, "async_ready", False):
        return True
    return engine_on_loop(getattr(driver, "engine", None))


def every_driver_on_loop(memory: Any) -> bool:
    """Return whether every driver behind ``memory`` (through its wrappers and a router's
    routes) takes the async path: for a caller that may reach any namespace (a LangGraph batch,
    the MCP tools)."""
    while True:
        routes = getattr(memory, "drivers", None)
        if callable(routes) and hasattr(memory, "routes"):
            return all(every_driver_on_loop(driver) for driver in routes())
        if not callable(getattr(memory, "serving", None)):
            return driver_on_loop(memory)
        memory = memory.serving("default")[0]


def memory_on_loop(memory: Any, namespaces: Iterable[str]) -> bool:
    """Return whether every driver that serves ``namespaces`` of ``memory`` (behind any
    wrappers) takes the async path: a call that reaches one in a worker thread's place would
    block the loop."""
    return all(driver_on_loop(_serving(memory, namespace)) for namespace in namespaces)


def _serving(memory: Any, namespace: str) -> Any:
    # The driver behind any wrappers that serves ``namespace`` (what
    # clawmem.recall.sources.serving_driver finds; the sql package does not import recall).
    while callable(getattr(memory, "serving", None)):
        memory = memory.serving(namespace)[0]
    return memory


def path_name(on_loop: bool) -> str:
    """Return how a call runs, as the README and the benchmarks name it."""
    return ASYNC_DRIVER if on_loop else THREAD_HOP
