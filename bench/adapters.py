"""What the LangGraph and LangChain adapters cost on top of the core calls they make.

For each backend (the in-process array driver, SQLite in a temporary file, and PostgreSQL,
MariaDB and Redis at ``--postgres``, ``--mysql`` and ``--redis``, on a table or key prefix of
their own), times each adapter operation and the core calls it makes, interleaved in rounds so
that a loaded machine slows both alike, and prints the median per call and the adapter's
overhead in microseconds:

- LangGraph ``ClawStore.put`` against ``memory.get`` + ``memory.set`` (a put reads the item
  to keep its ``created_at``), ``ClawStore.get`` (no TTL) against ``memory.get``;
- the same through ``aput`` and ``aget`` awaited on one event loop, on each path
  (:mod:`clawmem.integrations.aio`): ``async driver`` (a greenlet on the loop over asyncpg, asyncmy or
  redis.asyncio; SQLite and the file driver hop to a thread there too) and ``thread hop``;
- LangChain ``ClawStore.mset([pair])`` against ``memory.set``, ``mget([key])`` against
  ``memory.get``.

Never part of the test suite.

    .venv/bin/python -m bench.adapters [--rounds 20] [--calls 200]
        [--backends array,sqlite,postgres,mysql,redis]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from clawmem.integrations import aio, langchain, langgraph
from clawmem.integrations.stored_items import encode_namespace
from clawmem.memory.array import ArrayMemory
from clawmem.memory.redis import RedisMemory
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables

VALUE = {"text": "the customer prefers e-mail over phone calls", "score": 3, "tags": ["contact", "pref"]}


@contextlib.contextmanager
def open_backend(name: str, directory: Path, urls: dict[str, str]) -> Iterator[Any]:
    """Yield an empty memory of backend ``name`` (its tables or keys removed afterwards)."""
    prefix = f"bench_{uuid.uuid4().hex[:6]}_"
    if name == "array":
        yield ArrayMemory()
    elif name == "sqlite":
        engine = create_engine(f"sqlite:///{directory / 'bench.db'}")
        create_tables(engine, "")
        yield SqlMemory(engine)
    elif name in ("postgres", "mysql"):
        engine = create_engine(urls[name])
        create_tables(engine, prefix)
        try:
            yield SqlMemory(engine, prefix=prefix)
        finally:
            drop_tables(engine, prefix)
            engine.dispose()
    elif name == "redis":
        memory = RedisMemory(urls[name], prefix=prefix)
        try:
            yield memory
        finally:
            for namespace in memory.namespaces():
                memory.flush(namespace)
            memory.client.delete(memory.namespaces_key)
    else:
        raise SystemExit(f"unknown backend {name!r}: use array, sqlite, postgres, mysql or redis")


def per_call(function: Callable[[int], Any], calls: int, runner: asyncio.Runner) -> float:
    """Return the mean seconds of one ``function(i)`` over ``calls`` calls (awaited one after
    another on ``runner``'s loop when it is a coroutine function)."""
    if inspect.iscoroutinefunction(function):

        async def all_calls() -> float:
            start = time.perf_counter()
            for number in range(calls):
                await function(number)
            return (time.perf_counter() - start) / calls

        return runner.run(all_calls())
    start = time.perf_counter()
    for number in range(calls):
        function(number)
    return (time.perf_counter() - start) / calls


def on_path(path: str, call: Callable[[int], Any]) -> Callable[[int], Any]:
    """Return the coroutine function that awaits ``call(i)`` on ``path``."""

    async def awaited(number: int) -> Any:
        with aio.thread_hop() if path == aio.THREAD_HOP else contextlib.nullcontext():
            return await call(number)

    return awaited


def pairs(memory: Any) -> dict[str, tuple[Callable[[int], Any], Callable[[int], Any]]]:
    """Return, per operation, ``(adapter call, the core calls it makes)``."""
    graph_store = langgraph.ClawStore(memory)
    chain_store = langchain.ClawStore(memory, "bench-chain")
    namespace = encode_namespace(graph_store.prefix, ("bench",))
    envelope = memory.get("k0", namespace)
    chain_value = VALUE

    def core_put(i: int) -> None:
        memory.get(f"k{i}", namespace)
        memory.set(f"k{i}", envelope, namespace)

    def core_get(i: int) -> Any:
        return memory.get(f"k{i}", namespace)

    def aput(i: int) -> Any:
        return graph_store.aput(("bench",), f"k{i}", VALUE)

    def aget(i: int) -> Any:
        return graph_store.aget(("bench",), f"k{i}")

    return {
        "LangGraph put": (lambda i: graph_store.put(("bench",), f"k{i}", VALUE), core_put),
        "LangGraph get": (lambda i: graph_store.get(("bench",), f"k{i}"), core_get),
        **{f"aput {path}": (on_path(path, aput), core_put) for path in (aio.ASYNC_DRIVER, aio.THREAD_HOP)},
        **{f"aget {path}": (on_path(path, aget), core_get) for path in (aio.ASYNC_DRIVER, aio.THREAD_HOP)},
        "LangChain mset": (
            lambda i: chain_store.mset([(f"k{i}", chain_value)]),
            lambda i: memory.set(f"k{i}", chain_value, "bench-chain"),
        ),
        "LangChain mget": (
            lambda i: chain_store.mget([f"k{i}"]),
            lambda i: memory.get(f"k{i}", "bench-chain"),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--backends", default="array,sqlite,postgres,mysql,redis")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--mysql", default="mysql+pymysql://root@127.0.0.1:3306/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args(argv)
    urls = {"postgres": args.postgres, "mysql": args.mysql, "redis": args.redis}
    print(f"{'backend':8} {'operation':20} {'adapter µs':>11} {'core µs':>9} {'overhead µs':>12}")
    for backend in args.backends.split(","):
        with (
            tempfile.TemporaryDirectory() as directory,
            open_backend(backend, Path(directory), urls) as memory,
            asyncio.Runner() as runner,
        ):
            langgraph.ClawStore(memory).put(("bench",), "k0", VALUE)  # an envelope for the core put
            for operation, (adapter, core) in pairs(memory).items():
                adapter_times, core_times = [], []
                per_call(adapter, 5, runner)  # warm: the loop's connections open
                for _ in range(args.rounds):
                    adapter_times.append(per_call(adapter, args.calls, runner))
                    core_times.append(per_call(core, args.calls, runner))
                a, c = statistics.median(adapter_times) * 1e6, statistics.median(core_times) * 1e6
                print(f"{backend:8} {operation:20} {a:11.1f} {c:9.1f} {a - c:12.1f}")
            runner.run(aio.close_engines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
