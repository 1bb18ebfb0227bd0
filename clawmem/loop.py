"""Whether a call runs on the async path, and holding a lock there without stopping the loop.

The flag is set by :func:`clawmem.integrations.aio.run` while the core's code runs in a greenlet on an
event loop; this module imports nothing of clawmem, so the packages below the adapters (``sql``,
``recall``, ``memory``) can all ask it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.util
import threading
import time
from collections.abc import Iterator

from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

ASYNC_PATH: contextvars.ContextVar[bool] = contextvars.ContextVar("clawmem_async_path", default=False)


def on_async_path() -> bool:
    """Return whether the caller runs on the async path (inside :func:`clawmem.integrations.aio.run`, on
    the loop)."""
    return ASYNC_PATH.get() and in_greenlet()


def pause(seconds: float) -> None:
    """Wait ``seconds``: on the async path letting the loop run the other tasks meanwhile, else
    sleeping the thread."""
    if on_async_path():
        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


@contextlib.contextmanager
def holding(lock: threading.Lock) -> Iterator[None]:
    """Hold ``lock`` for the block. On the async path a task whose lock another task of the same
    loop holds (across an awaited read) lets the loop run until it is free, instead of blocking
    the thread, which would stop the task that holds it."""
    if not on_async_path():
        with lock:
            yield
        return
    while not lock.acquire(blocking=False):
        await_only(asyncio.sleep(0.0005))
    try:
        yield
    finally:
        lock.release()


def installed(driver: str) -> bool:
    """Return whether the asyncio driver module ``driver`` and greenlet can be imported."""
    return all(importlib.util.find_spec(module) is not None for module in (driver, "greenlet"))
