"""Per-turn cost of indexed recall against a full scan, at 10k, 100k and 1M entries.

For each backend (ArrayMemory, SqlMemory on SQLite, MariaDB and PostgreSQL, RedisMemory) and each
vocabulary (uniform, and Zipf with s=1.1, both over 50,000 words), it loads N entries of 12 words
into one namespace with bulk writes, then times ``MessageAugmenter.augment()`` on messages of 8
words drawn from the same vocabulary:

- warm-up: the first turn of a fresh driver, which builds the namespace's word index;
- median and p95 of the following turns, answered from the index (the default ranker);
- the median of turns ranked by a full scan (``ranker=scan_ranking``) in the same run, on the
  first messages, and whether index and scan gave the same text and report for each of them;
- the index's arrays (``WordIndex.nbytes()``) and the growth of the process's resident memory
  (VmRSS) over the warm-up, which also counts the Python objects the index keeps (its keys and
  words) and what the allocator keeps of the build. Later runs in one process reuse memory the
  earlier ones freed, so read it on the largest size, or run one backend and size at a time.

SQL rows are stamped ``--spacing`` seconds apart (default 60), the newest now, as a namespace
written over time is. After a commit it has not seen (always on MariaDB, which cannot tell),
SqlMemory reads the key, stamp and version of the rows stamped within its overlap window (five
minutes) of the newest, on MariaDB only when the window's digest changed; ``--spacing 1`` puts
300 rows there, and ``--spacing 0`` all of them, as after a bulk import with one stamp.
With ``--churn`` one entry is written through the driver before each timed turn, so every turn
finds a commit it has not seen (no "nothing changed" shortcut).
Nothing is left behind: each SQL run has a table prefix of its own, dropped afterwards, and each
Redis run a key prefix of its own, deleted afterwards. Never part of the test suite.

    .venv/bin/python -m bench.recall [--sizes 10000,100000] [--backends array,sqlite,mysql,postgres,redis]
        [--vocabularies uniform,zipf] [--turns 50] [--scan-turns 10] [--spacing 60] [--churn]
    .venv/bin/python -m bench.recall --sizes 1000000 --backends array,sqlite   # about 10 minutes

At 1M entries a scanned turn takes seconds, so at most ``--scan-turns-1m`` (default 3) are scanned.
Servers: ``CLAW_BENCH_MYSQL_URL`` (default ``mysql+pymysql://root@127.0.0.1:3306/test``),
``CLAW_BENCH_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``) and
``CLAW_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.array import ArrayMemory
from clawmem.recall import AugmentResult, MessageAugmenter
from clawmem.recall.rankings import scan_ranking

DEFAULT_URLS = {
    "mysql": ("CLAW_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "postgres": ("CLAW_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "redis": ("CLAW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15"),
}
BACKENDS = ["array", "sqlite", "mysql", "postgres", "redis"]
NAMESPACE = "bench"
VOCABULARY_SIZE = 50_000
ZIPF_S = 1.1
WORDS_PER_ENTRY = 12
WORDS_PER_MESSAGE = 8
BATCH = 5_000
ONE_MILLION = 1_000_000


def vocabulary() -> list[str]:
    """Return 50,000 distinct words the tokeniser keeps whole: ``w`` and four letters."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for number in range(VOCABULARY_SIZE):
        word = ""
        while True:
            number, digit = divmod(number, 26)
            word += letters[digit]
            if not number:
                break
        words.append("w" + word.ljust(4, "a")[::-1])
    return words


def word_numbers(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Return word numbers drawn uniformly, or by Zipf's law (rank r has weight r^-s)."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.integers(0, VOCABULARY_SIZE, size=shape)
    weights = 1.0 / np.arange(1, VOCABULARY_SIZE + 1) ** ZIPF_S
    cumulative = np.cumsum(weights / weights.sum())
    return np.minimum(np.searchsorted(cumulative, rng.random(shape)), VOCABULARY_SIZE - 1)


@dataclass(frozen=True)
class Data:
    """The entries (key, value text) and messages of one size and vocabulary."""

    kind: str
    keys: list[str]
    values: list[str]
    messages: list[str]


def make_data(kind: str, count: int, messages: int) -> Data:
    words = vocabulary()

    def texts(numbers: np.ndarray) -> list[str]:
        return [" ".join(map(words.__getitem__, row.tolist())) for row in numbers]

    values = texts(word_numbers(kind, (count, WORDS_PER_ENTRY), seed=count))
    sent = texts(word_numbers(kind, (messages, WORDS_PER_MESSAGE), seed=count + 1))
    return Data(kind, [f"e{n:07d}" for n in range(count)], values, sent)


def rss_bytes() -> int:
    """Return the process's resident memory (VmRSS of /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# -- loading, by backend ---------------------------------------------------------------------------


@contextmanager
def array_memory(data: Data, clock: FakeClock, spacing: float) -> Iterator[ArrayMemory]:
    memory = ArrayMemory(clock=clock)
    # The driver's own store, filled directly: set() per entry would only time validation.
    memory._store[NAMESPACE] = {
        key: (json.dumps(value, ensure_ascii=False), None)
        for key, value in zip(data.keys, data.values, strict=True)
    }
    yield memory


@contextmanager
def sql_memory(url: str, data: Data, clock: FakeClock, spacing: float) -> Iterator[Any]:
    import sqlalchemy as sa

    from clawmem.memory.sql import SqlMemory
    from clawmem.sql.engine import create_engine
    from clawmem.sql.schema import create_tables, drop_tables, tables

    engine = create_engine(url)
    prefix = f"bench{uuid.uuid4().hex[:6]}_"
    create_tables(engine, prefix)
    table = tables(prefix).memory
    newest = utc_datetime(clock)
    count = len(data.keys)
    try:
        with engine.begin() as conn:
            for start in range(0, count, BATCH):
                rows = []
                for number in range(start, min(start + BATCH, count)):
                    stamp = newest - timedelta(seconds=spacing * (count - 1 - number))
                    rows.append(
                        {
                            "id": new_id(),
                            "namespace": NAMESPACE,
                            "lookup_key": data.keys[number],
                            "value": json.dumps(data.values[number], ensure_ascii=False),
                            "metadata": None,
                            "expires_at": None,
                            "created_at": stamp,
                            "updated_at": stamp,
                        }
                    )
                conn.execute(sa.insert(table), rows)
        if engine.dialect.name == "postgresql":
            # What autovacuum does to a table after a bulk load: statistics, and the visibility
            # map that lets count(*) read the index alone.
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text(f"VACUUM ANALYZE {table.name}"))
        yield SqlMemory(engine, prefix=prefix, clock=clock)
    finally:
        drop_tables(engine, prefix)
        engine.dispose()


@contextmanager
def redis_memory(url: str, data: Data, clock: FakeClock, spacing: float) -> Iterator[Any]:
    import redis

    from clawmem.memory.redis import RedisMemory, encode_entry

    client = redis.Redis.from_url(url)
    memory = RedisMemory(client=client, prefix=f"bench{uuid.uuid4().hex[:6]}:", clock=clock)
    try:
        # The driver's layout written directly, in pipelines: an entry key per entry plus the
        # namespace's sorted set (set() per entry would also append to the change log).
        for start in range(0, len(data.keys), BATCH):
            pipe = client.pipeline(transaction=False)
            batch = range(start, min(start + BATCH, len(data.keys)))
            for number in batch:
                encoded = json.dumps(data.values[number], ensure_ascii=False)
                pipe.set(memory.entry_key(data.keys[number], NAMESPACE), encode_entry(encoded, None))
            pipe.zadd(memory.index_key(NAMESPACE), {data.keys[number]: float("inf") for number in batch})
            pipe.execute()
        client.sadd(memory.namespaces_key, NAMESPACE)
        yield memory
    finally:
        names = list(client.scan_iter(match=f"{memory.prefix}*", count=10_000))
        for start in range(0, len(names), BATCH):
            client.unlink(*names[start : start + BATCH])
        client.close()


def loaded(backend: str, data: Data, clock: FakeClock, directory: str, spacing: float) -> Any:
    if backend == "array":
        return array_memory(data, clock, spacing)
    if backend == "sqlite":
        return sql_memory(f"sqlite:///{directory}/bench-{uuid.uuid4().hex[:6]}.db", data, clock, spacing)
    variable, default = DEFAULT_URLS[backend]
    url = os.environ.get(variable, default)
    if backend == "redis":
        return redis_memory(url, data, clock, spacing)
    return sql_memory(url, data, clock, spacing)


# -- timing ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    backend: str
    entries: int
    kind: str
    load_s: float
    warm_up_ms: float
    median_ms: float
    p95_ms: float
    scan_ms: float
    scanned: int
    same: bool
    hits: float
    index_bytes: int
    rss_bytes: int

    @property
    def ratio(self) -> float:
        return self.scan_ms / self.median_ms if self.median_ms else float("inf")


def report_of(result: AugmentResult) -> tuple[Any, ...]:
    """What index and scan must agree on: the text, the planned decisions, the counts."""
    decisions = list(result.decisions[: result.top_k])
    return result.text, decisions, len(result.decisions), result.zero_overlap, result.error


def timed(augmenter: MessageAugmenter, message: str) -> tuple[float, AugmentResult]:
    started = time.perf_counter()
    result = augmenter.augment(message)
    return (time.perf_counter() - started) * 1000, result


def measure(
    backend: str, memory: Any, data: Data, load_s: float, turns: int, scan_turns: int, churn: bool
) -> Result:
    indexed = MessageAugmenter(memory, namespace=NAMESPACE, announce=False)
    scanning = MessageAugmenter(memory, namespace=NAMESPACE, announce=False, ranker=scan_ranking)
    gc.collect()
    before = rss_bytes()
    warm_up, _ = timed(indexed, data.messages[0])  # builds the namespace's index
    grown = rss_bytes() - before
    timings, scans, hits, same = [], [], [], True
    for number, message in enumerate(data.messages[1 : turns + 1]):
        if churn:  # another write committed before each turn, as in a busy deployment
            memory.set(f"churn{number:05d}", "written between turns", NAMESPACE)
        elapsed, result = timed(indexed, message)
        timings.append(elapsed)
        hits.append(len(result.decisions))
        if number < scan_turns:
            elapsed, scanned = timed(scanning, message)
            scans.append(elapsed)
            same = same and report_of(scanned) == report_of(result)
    index_bytes = memory.word_index(NAMESPACE).nbytes()
    p95 = statistics.quantiles(timings, n=20)[-1] if len(timings) > 1 else timings[0]
    return Result(
        backend, len(data.keys), data.kind, load_s, warm_up, statistics.median(timings), p95,
        statistics.median(scans) if scans else float("nan"), len(scans), same, statistics.mean(hits),
        index_bytes, grown,
    )  # fmt: skip


def run(args: argparse.Namespace) -> list[Result]:
    clock = FakeClock(time.time())
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for size in args.sizes:
            for kind in args.vocabularies:
                data = make_data(kind, size, args.turns + 1)
                for backend in args.backends:
                    scan_turns = (
                        min(args.scan_turns, args.scan_turns_1m) if size >= ONE_MILLION else args.scan_turns
                    )
                    started = time.perf_counter()
                    with loaded(backend, data, clock, directory, args.spacing) as memory:
                        load_s = time.perf_counter() - started
                        result = measure(backend, memory, data, load_s, args.turns, scan_turns, args.churn)
                        del memory
                    gc.collect()
                    results.append(result)
                    print(row(result), file=sys.stderr, flush=True)
    return results


HEADER = (
    f"{'backend':<9}{'entries':>9} {'vocab':<8}{'load s':>8}{'warm-up ms':>12}{'median ms':>11}{'p95 ms':>9}"
    f"{'scan ms':>10}{'x faster':>10}{'same':>6}{'hits':>9}{'index MB':>10}{'RSS +MB':>9}"
)


def row(result: Result) -> str:
    same = ("yes" if result.same else "NO") if result.scanned else "-"
    return (
        f"{result.backend:<9}{result.entries:>9} {result.kind:<8}{result.load_s:>8.1f}"
        f"{result.warm_up_ms:>12.0f}{result.median_ms:>11.2f}{result.p95_ms:>9.2f}{result.scan_ms:>10.0f}{result.ratio:>10.0f}{same:>6}"
        f"{result.hits:>9.0f}{result.index_bytes / 2**20:>10.1f}{result.rss_bytes / 2**20:>9.0f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="entry counts, comma-separated")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--vocabularies", default="uniform,zipf")
    parser.add_argument("--turns", type=int, default=50, help="indexed turns timed after the warm-up")
    parser.add_argument("--scan-turns", type=int, default=10, help="of those, how many are also scanned")
    parser.add_argument("--scan-turns-1m", type=int, default=3, help="the same, at 1M entries and more")
    parser.add_argument("--spacing", type=float, default=60.0, help="seconds between rows' updated_at")
    parser.add_argument(
        "--churn", action="store_true", help="write one entry through the driver before each timed turn"
    )
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    args.backends = [name.strip() for name in args.backends.split(",")]
    args.vocabularies = [name.strip() for name in args.vocabularies.split(",")]
    unknown = set(args.backends) - set(BACKENDS) or set(args.vocabularies) - {"uniform", "zipf"}
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    print(HEADER, file=sys.stderr)
    results = run(args)
    print(
        f"augment() per turn: top_k=3, {WORDS_PER_ENTRY} words per entry, {WORDS_PER_MESSAGE} per message, "
        f"{VOCABULARY_SIZE} words (zipf s={ZIPF_S}); {args.turns} indexed turns after the warm-up; "
        "'x faster' is the scan's median over the index's; 'same' compares text and report"
    )
    print(HEADER)
    for result in results:
        print(row(result))


if __name__ == "__main__":
    main()
