"""A Redis client for the async path: the synchronous client's calls, awaited on the loop.

On the async path (:mod:`clawmem.integrations.aio`) :class:`clawmem.memory.redis.RedisMemory` sends its
commands through :func:`client_on_loop`: a client with the synchronous client's methods whose
calls go to a ``redis.asyncio`` client on the same server, one per client and event loop, each
reply awaited in the caller's greenlet. So the driver's code (pipelines, ``WATCH`` transactions,
sealing) is the same on both paths, and the loop serves other tasks while a reply is on the wire.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
from sqlalchemy.util import await_only

# The connection settings a redis.asyncio connection takes as the synchronous one does.
_KEPT = {
    "host",
    "port",
    "path",
    "db",
    "username",
    "password",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "client_name",
    "encoding",
    "encoding_errors",
    "decode_responses",
    "retry_on_timeout",
}
_CLASSES = {
    redis.connection.Connection: redis.asyncio.connection.Connection,
    redis.connection.SSLConnection: redis.asyncio.connection.SSLConnection,
    redis.connection.UnixDomainSocketConnection: redis.asyncio.connection.UnixDomainSocketConnection,
}
# Per running loop (gone with it), each synchronous client's twin on redis.asyncio.
_TWINS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, tuple[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)


def can_await(client: Any) -> bool:
    """Return whether ``client`` (a synchronous ``redis.Redis``) has a twin on ``redis.asyncio``."""
    pool = getattr(client, "connection_pool", None)
    return isinstance(client, redis.Redis) and getattr(pool, "connection_class", None) in _CLASSES


def client_on_loop(client: redis.Redis) -> Any:
    """Return the client whose calls are ``client``'s, run on the running loop's twin of it."""
    loop = asyncio.get_running_loop()
    twins = _TWINS.get(loop)
    if twins is None:
        twins = _TWINS[loop] = {}
    found = twins.get(id(client))
    if found is None or found[0] is not client:
        if found is not None:  # a client gone, whose id a new one took: its twin goes too
            await_only(found[1].connection_pool.disconnect())
        pool = client.connection_pool
        kwargs = {
            name: value
            for name, value in pool.connection_kwargs.items()
            if name in _KEPT or name.startswith("ssl_")
        }
        twin_pool = redis.asyncio.ConnectionPool(
            connection_class=_CLASSES[pool.connection_class], max_connections=pool.max_connections, **kwargs
        )
        found = twins[id(client)] = (client, redis.asyncio.Redis(connection_pool=twin_pool))
    return _Awaited(found[1])


async def close_clients() -> None:
    """Close the connections of the running loop's twins."""
    for _client, twin in _TWINS.pop(asyncio.get_running_loop(), {}).values():
        await twin.aclose()
        await twin.connection_pool.disconnect()  # a pool given to a client is not closed with it


def _awaited(value: Any) -> Any:
    return await_only(value) if inspect.isawaitable(value) else value


class _Awaited:
    """The methods of a ``redis.asyncio`` client or pipeline, each reply awaited in place."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._inner, name)

        def call(*args: Any, **options: Any) -> Any:
            found = _awaited(method(*args, **options))
            if found is self._inner:  # a queued pipeline command returns the pipeline
                return self
            return _Awaited(found) if isinstance(found, redis.asyncio.client.Pipeline) else found

        return call

    def transaction(self, func: Callable[[Any], Any], *watches: Any, **options: Any) -> Any:
        """Run ``func(pipe)`` with ``watches`` watched and execute it, again after a ``WatchError``
        (another client changed a watched key): the synchronous client's ``transaction``."""
        while True:
            pipe = self.pipeline(True)
            try:
                if watches:
                    pipe.watch(*watches)
                func(pipe)
                return pipe.execute()
            except redis.WatchError:
                continue
            finally:
                pipe.reset()
