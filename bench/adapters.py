"""What the LangGraph and LangChain adapters cost on top of the core calls they make.

For each backend (the in-process array driver and SQLite in a temporary file), times each
adapter operation and the core calls it makes, interleaved in rounds so that a loaded machine
slows both alike, and prints the median per call and the adapter's overhead in microseconds:

- LangGraph ``ClawStore.put`` against ``memory.get`` + ``memory.set`` (a put reads the item
  to keep its ``created_at``), ``ClawStore.get`` (no TTL) against ``memory.get``;
- LangChain ``ClawStore.mset([pair])`` against ``memory.set``, ``mget([key])`` against
  ``memory.get``.

Never part of the test suite.

    .venv/bin/python -m bench.adapters [--rounds 20] [--calls 200] [--backends array,sqlite]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clawmem.integrations import langchain, langgraph
from clawmem.integrations.stored_items import encode_namespace
from clawmem.memory.array import ArrayMemory
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables

VALUE = {"text": "the customer prefers e-mail over phone calls", "score": 3, "tags": ["contact", "pref"]}


def open_backend(name: str, directory: Path) -> Any:
    """Return an empty memory of backend ``name``."""
    if name == "array":
        return ArrayMemory()
    if name == "sqlite":
        engine = create_engine(f"sqlite:///{directory / 'bench.db'}")
        create_tables(engine, "")
        return SqlMemory(engine)
    raise SystemExit(f"unknown backend {name!r}: use array or sqlite")


def per_call(function: Callable[[int], Any], calls: int) -> float:
    """Return the mean seconds of one ``function(i)`` over ``calls`` calls."""
    start = time.perf_counter()
    for number in range(calls):
        function(number)
    return (time.perf_counter() - start) / calls


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

    return {
        "LangGraph put": (lambda i: graph_store.put(("bench",), f"k{i}", VALUE), core_put),
        "LangGraph get": (
            lambda i: graph_store.get(("bench",), f"k{i}"),
            lambda i: memory.get(f"k{i}", namespace),
        ),
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
    parser.add_argument("--backends", default="array,sqlite")
    args = parser.parse_args(argv)
    print(f"{'backend':8} {'operation':16} {'adapter µs':>11} {'core µs':>9} {'overhead µs':>12}")
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as directory:
            memory = open_backend(backend, Path(directory))
            langgraph.ClawStore(memory).put(("bench",), "k0", VALUE)  # an envelope for the core put
            for operation, (adapter, core) in pairs(memory).items():
                adapter_times, core_times = [], []
                for _ in range(args.rounds):
                    adapter_times.append(per_call(adapter, args.calls))
                    core_times.append(per_call(core, args.calls))
                a, c = statistics.median(adapter_times) * 1e6, statistics.median(core_times) * 1e6
                print(f"{backend:8} {operation:16} {a:11.1f} {c:9.1f} {a - c:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
