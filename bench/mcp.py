"""The MCP server's ``recall`` at 100,000 entries in one namespace: inside the server, warm and first.

It loads N entries of 12 words (a Zipf vocabulary of 50,000 words, rows stamped a minute apart,
the newest an hour ago) into one namespace of a table prefix of its own, builds the server with
``clawmem.integrations.mcp.server(settings)`` and times, on messages of 8 words drawn from the
same vocabulary:

- first call: the first ``recall`` of a freshly built server, which builds the namespace's index;
- inside the server: the median and p95 of the following calls of ``MCPServer.call_tool`` (argument
  validation, the worker thread, recall, the typed result), with the index warm;
- through the SDK's in-process client (``mcp.Client(server)``), which adds the protocol dispatch;
- ``MessageAugmenter.augment`` alone on the same memory, the floor the tool stands on;
- over stdio (``--stdio``): ``clawmem mcp --read-only`` started as a process, the time from the
  start to the first recall's answer, and that first call alone.

The tables are dropped at the end. Never part of the test suite. The 5 ms target is for the median
inside the server.

    .venv/bin/python -m bench.mcp [--entries 100000] [--calls 200] [--database-url URL] [--stdio]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import sqlalchemy as sa

from bench import recall as recall_bench
from clawmem import MessageAugmenter, Settings, open_memory
from clawmem.ids import new_id
from clawmem.integrations.mcp import server
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "default"
WORDS_PER_ENTRY = 12
WORDS_PER_MESSAGE = 8
BATCH = 5_000


def texts(count: int, length: int, seed: int) -> list[str]:
    """Return ``count`` texts of ``length`` words drawn by Zipf's law, as bench.recall draws them."""
    vocabulary = recall_bench.vocabulary()
    numbers = recall_bench.word_numbers("zipf", (count, length), seed)
    return [" ".join(vocabulary[n] for n in row) for row in numbers.tolist()]


def load(engine: sa.engine.Engine, prefix: str, count: int) -> None:
    """Insert ``count`` entries into ``NAMESPACE`` in bulk, as an import would write them."""
    table = tables(prefix).memory
    values = texts(count, WORDS_PER_ENTRY, seed=count)
    newest = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1)
    with engine.begin() as conn:
        for start in range(0, count, BATCH):
            rows = []
            for number in range(start, min(start + BATCH, count)):
                stamp = newest - timedelta(minutes=count - 1 - number)
                rows.append(
                    {
                        "id": new_id(),
                        "namespace": NAMESPACE,
                        "lookup_key": f"e{number:07d}",
                        "value": json.dumps(values[number]),
                        "metadata": None,
                        "expires_at": None,
                        "created_at": stamp,
                        "updated_at": stamp,
                    }
                )
            conn.execute(sa.insert(table), rows)


def milliseconds(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def summary(timings: list[float]) -> str:
    p95 = statistics.quantiles(timings, n=20)[-1]
    return f"median {statistics.median(timings):7.2f} ms   p95 {p95:7.2f} ms"


async def in_process(settings: Settings, messages: list[str]) -> dict[str, Any]:
    """Time a fresh server's first recall, then warm calls inside it and through the client."""
    from mcp import Client

    started = time.perf_counter()
    app = server(settings)
    built = milliseconds(started)
    started = time.perf_counter()
    first = await app.call_tool("recall", {"message": messages[0]})
    first_ms = milliseconds(started)
    assert not first.is_error, first.content
    inside = []
    for message in messages[1:]:
        started = time.perf_counter()
        result = await app.call_tool("recall", {"message": message})
        inside.append(milliseconds(started))
        assert not result.is_error, result.content
    through = []
    async with Client(app) as client:
        for message in messages[1:]:
            started = time.perf_counter()
            await client.call_tool("recall", {"message": message})
            through.append(milliseconds(started))
    return {"built": built, "first": first_ms, "inside": inside, "client": through}


def bare(settings: Settings, messages: list[str]) -> list[float]:
    """Time ``MessageAugmenter.augment`` alone on a memory of its own (its index warmed first)."""
    augmenter = MessageAugmenter(open_memory(settings), settings.recall_top_k, NAMESPACE)
    augmenter.augment(messages[0])
    timings = []
    for message in messages[1:]:
        started = time.perf_counter()
        augmenter.augment(message)
        timings.append(milliseconds(started))
    return timings


def over_stdio(settings: Settings, directory: str, message: str) -> tuple[float, float]:
    """Start ``clawmem mcp --read-only`` and return (start to first answer, first call) in ms."""
    from mcp import Client, StdioServerParameters

    environment = {
        "CLAW_DATABASE_URL": settings.database_url,
        "CLAW_TABLE_PREFIX": settings.table_prefix,
        "CLAW_INSTANCE_PATH": directory,
        "PYTHONPATH": str(ROOT),
    }
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-c", "from clawmem.cli import main; main()", "mcp", "--read-only"],
        env=environment,
    )

    async def main() -> tuple[float, float]:
        started = time.perf_counter()
        async with Client(parameters) as client:
            called = time.perf_counter()
            result = await client.call_tool("recall", {"message": message})
            assert not result.is_error, result.content
            return milliseconds(started), milliseconds(called)

    return anyio.run(main)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=200, help="warm calls timed after the first")
    parser.add_argument("--database-url", default=None, help="default: a SQLite file of its own")
    parser.add_argument("--stdio", action="store_true", help="also time a real stdio server's start")
    args = parser.parse_args(argv)
    messages = texts(args.calls + 1, WORDS_PER_MESSAGE, seed=args.entries + 1)
    with tempfile.TemporaryDirectory() as directory:
        url = args.database_url or f"sqlite:///{directory}/bench.db"
        prefix = f"mcp{uuid.uuid4().hex[:6]}_"
        engine = create_engine(url)
        create_tables(engine, prefix)
        try:
            started = time.perf_counter()
            load(engine, prefix, args.entries)
            seconds = time.perf_counter() - started
            print(f"loaded {args.entries:,} entries in {seconds:.1f} s ({engine.dialect.name})")
            settings = Settings(instance_path=directory, database_url=url, table_prefix=prefix)
            timed = anyio.run(in_process, settings, messages)
            floor = bare(settings, messages)
            print(f"server built                   {timed['built']:8.1f} ms")
            print(f"first recall (builds the index) {timed['first']:8.1f} ms")
            print(f"recall inside the server        {summary(timed['inside'])}   ({args.calls} calls)")
            print(f"recall through mcp.Client       {summary(timed['client'])}")
            print(f"MessageAugmenter.augment alone  {summary(floor)}")
            ratio = statistics.median(timed["inside"]) / statistics.median(floor)
            print(f"inside the server / augment     {ratio:8.2f} x")
            if args.stdio:
                start_ms, first_ms = over_stdio(settings, directory, messages[0])
                print(f"stdio: start to first answer    {start_ms:8.1f} ms")
                print(f"stdio: that first recall call   {first_ms:8.1f} ms")
        finally:
            drop_tables(engine, prefix)
            engine.dispose()
    print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
