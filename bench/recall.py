"""Per-turn cost of recall: ``MessageAugmenter.augment()`` over 1k, 10k and 100k entries.

Backends: ArrayMemory, SqlMemory on SQLite (a temporary file) and SqlMemory on MariaDB/MySQL
(``CLAW_BENCH_MYSQL_URL``, default ``mysql+pymysql://root@127.0.0.1:3306/test``), each SQL run
under a table prefix of its own whose tables are dropped afterwards. Prints the median and p95
milliseconds per turn. Never part of the test suite.

    .venv/bin/python -m bench.recall [--sizes 1000,10000,100000] [--turns 30] [--backends array,sqlite,mysql]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.array import ArrayMemory
from clawmem.memory.rules import encode_value
from clawmem.memory.sql import SqlMemory
from clawmem.recall import MessageAugmenter
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables

DEFAULT_MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
NAMESPACE = "default"
BATCH = 5000

TOPICS = [
    "shipping",
    "refund",
    "invoice",
    "password",
    "delivery",
    "warranty",
    "discount",
    "subscription",
    "address",
    "allergy",
    "language",
    "newsletter",
]
FACTS = [
    "prefers {topic} updates by email in the morning",
    "asked about {topic} twice last month and was satisfied",
    "has an open {topic} ticket waiting for the warehouse team",
    "is a gold member; {topic} questions go to the priority queue",
    "mentioned that {topic} in Lyon is usually late on Fridays",
    "wants {topic} details in French, short answers only",
]
QUERIES = [
    "Where is my delivery? It has been a week.",
    "Can I get a refund for the broken kettle?",
    "I forgot my password again, help please",
    "Do you ship to Lyon on Fridays?",
    "Please send the invoice for my last order",
    "Is the warranty still valid after two years?",
    "How do I cancel my subscription?",
    "Change my address to the new flat",
    "Any discount for gold members this month?",
    "Tell me about allergy information for the cake",
]


def entries(count: int, seed: int = 7) -> Iterator[tuple[str, Any]]:
    """Yield ``count`` realistic (key, value) pairs: customer facts, some as JSON objects."""
    rng = random.Random(seed)
    for index in range(count):
        topic = rng.choice(TOPICS)
        fact = rng.choice(FACTS).format(topic=topic)
        key = f"customer_{index:06d}_{topic}"
        if index % 4 == 0:
            yield key, {"note": fact, "topic": topic, "score": rng.randint(1, 5)}
        else:
            yield key, fact


def load_array(count: int, clock: FakeClock) -> ArrayMemory:
    memory = ArrayMemory(clock=clock)
    for key, value in entries(count):
        memory.set(key, value, NAMESPACE)
    return memory


def bulk_insert_sql(engine: Any, prefix: str, count: int, clock: FakeClock) -> None:
    # set() per entry would take minutes at 100k; rows go straight into the one table definition.
    table = tables(prefix).memory
    stamp = utc_datetime(clock)
    rows: list[dict[str, Any]] = []
    with engine.begin() as conn:
        for key, value in entries(count):
            rows.append(
                {
                    "id": new_id(),
                    "namespace": NAMESPACE,
                    "lookup_key": key,
                    "value": encode_value(key, value),
                    "metadata": None,
                    "expires_at": None,
                    "created_at": stamp,
                    "updated_at": stamp,
                }
            )
            if len(rows) == BATCH:
                conn.execute(table.insert(), rows)
                rows = []
        if rows:
            conn.execute(table.insert(), rows)


@contextmanager
def sql_memory(url: str, count: int, clock: FakeClock) -> Iterator[SqlMemory]:
    engine = create_engine(url)
    prefix = f"bench{uuid.uuid4().hex[:6]}_"
    create_tables(engine, prefix)
    try:
        bulk_insert_sql(engine, prefix, count, clock)
        yield SqlMemory(engine, prefix=prefix, clock=clock)
    finally:
        drop_tables(engine, prefix)
        engine.dispose()


def measure(memory: Any, turns: int) -> tuple[float, float, int]:
    """Return (median ms, p95 ms, injected entries on the last turn) over ``turns`` augments."""
    augmenter = MessageAugmenter(memory, namespace=NAMESPACE)
    augmenter.augment(QUERIES[0])  # warm caches and connection pools
    timings: list[float] = []
    injected = 0
    for turn in range(turns):
        started = time.perf_counter()
        result = augmenter.augment(QUERIES[turn % len(QUERIES)])
        timings.append((time.perf_counter() - started) * 1000)
        injected = len(result.injected_keys)
    p95 = statistics.quantiles(timings, n=20)[-1] if len(timings) > 1 else timings[0]
    return statistics.median(timings), p95, injected


def run(backends: list[str], sizes: list[int], turns: int) -> list[tuple[str, int, float, float, int]]:
    clock = FakeClock(time.time())
    mysql_url = os.environ.get("CLAW_BENCH_MYSQL_URL", DEFAULT_MYSQL_URL)
    results = []
    with tempfile.TemporaryDirectory() as directory:
        factories: dict[str, Callable[[int], Any]] = {
            "array": lambda n: nullcontext(load_array(n, clock)),
            "sqlite": lambda n: sql_memory(f"sqlite:///{directory}/bench-{n}.db", n, clock),
            "mysql": lambda n: sql_memory(mysql_url, n, clock),
        }
        for backend in backends:
            for size in sizes:
                with factories[backend](size) as memory:
                    median, p95, injected = measure(memory, turns)
                results.append((backend, size, median, p95, injected))
                print(f"  {backend:<7} {size:>7} entries: median {median:9.1f} ms", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--backends", default="array,sqlite,mysql")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    backends = [name.strip() for name in args.backends.split(",")]
    results = run(backends, sizes, args.turns)
    print(f"augment() per turn, {args.turns} turns, top_k=3, namespace {NAMESPACE!r}")
    print(f"{'backend':<10}{'entries':>10}{'median ms':>12}{'p95 ms':>10}{'injected':>10}")
    for backend, size, median, p95, injected in results:
        print(f"{backend:<10}{size:>10}{median:>12.1f}{p95:>10.1f}{injected:>10}")


if __name__ == "__main__":
    main()
