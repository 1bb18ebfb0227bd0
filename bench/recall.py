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
written over time is. Each backend runs these cases (``--cases``), the spaced ones on one load in
turn, the bulk-stamped one on a load of its own:

- ``quiet``: nothing is written between turns;
- ``churn``: one entry is written through the driver before each timed turn;
- ``foreign``: one entry is written by a second driver with a connection of its own (another
  worker or process) before each timed turn;
- ``bulk``: every row carries one ``updated_at``, as an import writes them, and one entry is
  written through the driver before each timed turn (SQL backends only);
- ``stamped``: another program stamps every row of the namespace with one plain-SQL ``UPDATE``
  (all the same fresh ``updated_at``) before the warm-up, then changes one row's value and stamp
  with plain SQL before each timed turn (SQL backends only).

``trips`` is the median, and ``most`` the largest, number of requests an indexed turn sent to the
server and waited for: on PostgreSQL counted from libpq's own trace (``BEGIN``, ``ROLLBACK`` and
a pool's pre-ping included), on MariaDB from PyMySQL's commands (``COM_PING`` included), on Redis
from redis-py's sends (one per pipeline). A shared server's other traffic can add some on
PostgreSQL, whose snapshot every commit on the server moves.
Nothing is left behind: each SQL run has a table prefix of its own, dropped afterwards, and each
Redis run a key prefix of its own, deleted afterwards. Never part of the test suite.

    .venv/bin/python -m bench.recall [--sizes 10000,100000] [--backends array,sqlite,mysql,postgres,redis]
        [--vocabularies uniform,zipf] [--cases quiet,churn,foreign,bulk] [--turns 50] [--scan-turns 10]
        [--spacing 60]
    .venv/bin/python -m bench.recall --sizes 1000000 --backends array,sqlite --cases quiet  # about 10 min

At 1M entries a scanned turn takes seconds, so at most ``--scan-turns-1m`` (default 3) are scanned.
Servers: ``CLAW_BENCH_MYSQL_URL`` (default ``mysql+pymysql://root@127.0.0.1:3306/test``),
``CLAW_BENCH_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``) and
``CLAW_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``).
"""

from __future__ import annotations

import argparse
import ctypes
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
from clawmem.recall.feeds import fresh_index
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
                conn.execute(sa.text(f"ANALYZE {prefix}clawmem_changes"))  # the load's change log
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


# -- round trips ---------------------------------------------------------------------------------


class RoundTrips:
    """Counts the requests each backend's client sends and waits for, as the wire sees them:
    PostgreSQL's from libpq's own trace (one ``ReadyForQuery`` ends each, so ``BEGIN``,
    ``ROLLBACK`` and the pool's pre-ping count too), MariaDB's from PyMySQL's command calls
    (``COM_PING`` included), Redis's from redis-py's sends (one for a whole pipeline)."""

    def __init__(self) -> None:
        self.count = 0
        self._traces: list[Any] = []

    def install(self) -> None:
        import pymysql
        import redis
        import sqlalchemy as sa

        counter = self

        send = redis.connection.AbstractConnection.send_packed_command

        def counted_send(connection: Any, command: Any, check_health: bool = True) -> None:
            counter.count += 1
            send(connection, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
        execute = pymysql.connections.Connection._execute_command

        def counted_execute(connection: Any, command: int, sql: Any) -> None:
            counter.count += 1
            execute(connection, command, sql)

        pymysql.connections.Connection._execute_command = counted_execute  # type: ignore[method-assign]

        @sa.event.listens_for(sa.pool.Pool, "connect")
        def trace(dbapi_connection: Any, _record: Any) -> None:
            pgconn = getattr(dbapi_connection, "pgconn", None)
            if pgconn is None:
                return
            from psycopg import pq

            trace_file = tempfile.TemporaryFile()  # noqa: SIM115  # kept open for the run
            pgconn.trace(trace_file.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            self._traces.append([trace_file, 0])

    def total(self) -> int:
        """Return the requests sent so far."""
        if self._traces:
            ctypes.CDLL(None).fflush(None)  # libpq writes its trace through stdio buffers
            for entry in self._traces:
                trace_file, offset = entry
                trace_file.seek(offset)
                text = trace_file.read()
                entry[1] = offset + len(text)
                self.count += text.count(b"\tReadyForQuery")
        return self.count


ROUND_TRIPS = RoundTrips()


# -- timing ------------------------------------------------------------------------------------------

# What happens before each timed turn: nothing; a write through the driver; a write by another
# driver on its own connection (another worker or process); and, on a namespace whose rows all
# carry one updated_at (as an import writes them), a write through the driver.
CASES = {
    "quiet": "nothing written between turns",
    "churn": "one entry written through the driver before each turn",
    "foreign": "one entry written by another driver, on its own connection, before each turn",
    "bulk": "every row stamped alike (an import), one entry written through the driver before each turn",
    "stamped": "every row stamped by one UPDATE of another program, then one row changed by it each turn",
}
SQL_ONLY = ("bulk", "stamped")


@dataclass(frozen=True)
class Result:
    backend: str
    entries: int
    kind: str
    case: str
    load_s: float
    warm_up_ms: float
    median_ms: float
    p95_ms: float
    scan_ms: float
    scanned: int
    same: bool
    hits: float
    round_trips: float | None
    most_round_trips: int | None
    index_bytes: int
    rss_bytes: int

    @property
    def ratio(self) -> float:
        return self.scan_ms / self.median_ms if self.median_ms else float("inf")


def report_of(result: AugmentResult) -> tuple[Any, ...]:
    """What index and scan must agree on: the text, the planned decisions, the counts."""
    decisions = list(result.decisions[: result.top_k])
    return result.text, decisions, len(result.decisions), result.zero_overlap, result.error


def timed(augmenter: MessageAugmenter, message: str) -> tuple[float, int, AugmentResult]:
    trips = ROUND_TRIPS.total()
    started = time.perf_counter()
    result = augmenter.augment(message)
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed, ROUND_TRIPS.total() - trips, result


def measure(
    backend: str, memory: Any, other: Any, data: Data, case: str, load_s: float, turns: int, scan_turns: int
) -> Result:
    indexed = MessageAugmenter(memory, namespace=NAMESPACE, announce=False)
    scanning = MessageAugmenter(memory, namespace=NAMESPACE, announce=False, ranker=scan_ranking)
    if case == "stamped":
        stamp_all(other)
    gc.collect()
    before = rss_bytes()
    warm_up, _, _ = timed(indexed, data.messages[0])  # builds the namespace's index, or catches up
    grown = rss_bytes() - before
    timings, trips, scans, hits, same = [], [], [], [], True
    for number, message in enumerate(data.messages[1 : turns + 1]):
        if case in ("churn", "bulk"):
            memory.set(f"{case}{number:05d}", "written between turns", NAMESPACE)
        elif case == "foreign":
            other.set(f"{case}{number:05d}", "written between turns", NAMESPACE)
        elif case == "stamped":
            stamp_one(other, data.keys[number * 7 % len(data.keys)], number)
        elapsed, sent, result = timed(indexed, message)
        timings.append(elapsed)
        trips.append(sent)
        hits.append(len(result.decisions))
        if number < scan_turns:
            elapsed, _, scanned = timed(scanning, message)
            scans.append(elapsed)
            same = same and report_of(scanned) == report_of(result)
    index_bytes = fresh_index(memory, NAMESPACE).nbytes()
    p95 = statistics.quantiles(timings, n=20)[-1] if len(timings) > 1 else timings[0]
    counted = backend in ("mysql", "postgres", "redis")
    return Result(
        backend, len(data.keys), data.kind, case, load_s, warm_up, statistics.median(timings), p95,
        statistics.median(scans) if scans else float("nan"), len(scans), same, statistics.mean(hits),
        statistics.median(trips) if counted else None, max(trips) if counted else None, index_bytes, grown,
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
                    # The spaced cases share one load, in order; the bulk-stamped case has its own.
                    spaced = [case for case in args.cases if case != "bulk"]
                    if backend not in SQL_BACKENDS:
                        spaced = [case for case in spaced if case not in SQL_ONLY]
                    loads = [(args.spacing, spaced)] if spaced else []
                    if "bulk" in args.cases and backend in SQL_BACKENDS:
                        loads.append((0.0, ["bulk"]))
                    for spacing, cases in loads:
                        started = time.perf_counter()
                        with loaded(backend, data, clock, directory, spacing) as memory:
                            load_s = time.perf_counter() - started
                            other = another_driver(memory)
                            for case in cases:
                                result = measure(
                                    backend, memory, other, data, case, load_s, args.turns, scan_turns
                                )
                                results.append(result)
                                print(row(result), file=sys.stderr, flush=True)
                            del memory, other
                        gc.collect()
    return results


SQL_BACKENDS = ("sqlite", "mysql", "postgres")


def stamp_all(other: Any) -> None:
    """Stamp every row of the namespace alike with one plain-SQL UPDATE, as another program."""
    import sqlalchemy as sa

    from clawmem.sql.schema import tables

    table = tables(other.prefix).memory
    with other.engine.begin() as conn:
        where = table.c.namespace == NAMESPACE
        conn.execute(sa.update(table).where(where).values(updated_at=utc_datetime(other.clock)))


def stamp_one(other: Any, key: str, number: int) -> None:
    """Change one row's value and stamp with plain SQL, as another program."""
    import sqlalchemy as sa

    from clawmem.sql.schema import tables

    table = tables(other.prefix).memory
    with other.engine.begin() as conn:
        conn.execute(
            sa.update(table)
            .where(table.c.namespace == NAMESPACE, table.c.lookup_key == key)
            .values(
                value=json.dumps(f"rewritten {number} by another program"),
                updated_at=utc_datetime(other.clock),
            )
        )


def another_driver(memory: Any) -> Any:
    """Return a second driver on the same backend with a connection of its own, as another
    worker or process has (the same driver for the in-memory one, which has no other)."""
    if isinstance(memory, ArrayMemory):
        return memory
    from clawmem.memory.redis import RedisMemory
    from clawmem.memory.sql import SqlMemory
    from clawmem.sql.engine import create_engine

    if isinstance(memory, RedisMemory):
        import redis

        options = memory.client.connection_pool.connection_kwargs
        client = redis.Redis(connection_pool=redis.ConnectionPool(**options))
        return RedisMemory(client=client, prefix=memory.prefix, clock=memory.clock)
    assert isinstance(memory, SqlMemory)
    engine = create_engine(memory.engine.url)
    return SqlMemory(engine, prefix=memory.prefix, clock=memory.clock)


HEADER = (
    f"{'backend':<9}{'entries':>8} {'vocab':<8}{'case':<8}{'load s':>7}{'warm-up ms':>11}{'median ms':>10}"
    f"{'p95 ms':>8}{'scan ms':>9}{'x faster':>9}{'trips':>6}{'most':>5}{'same':>5}{'hits':>7}"
    f"{'index MB':>9}{'RSS +MB':>8}"
)


def row(result: Result) -> str:
    same = ("yes" if result.same else "NO") if result.scanned else "-"
    trips = "-" if result.round_trips is None else f"{result.round_trips:g}"
    most = "-" if result.most_round_trips is None else str(result.most_round_trips)
    return (
        f"{result.backend:<9}{result.entries:>8} {result.kind:<8}{result.case:<8}{result.load_s:>7.1f}"
        f"{result.warm_up_ms:>11.0f}{result.median_ms:>10.2f}{result.p95_ms:>8.2f}{result.scan_ms:>9.0f}"
        f"{result.ratio:>9.0f}{trips:>6}{most:>5}{same:>5}{result.hits:>7.0f}"
        f"{result.index_bytes / 2**20:>9.1f}{result.rss_bytes / 2**20:>8.0f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="entry counts, comma-separated")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--vocabularies", default="uniform,zipf")
    parser.add_argument("--cases", default=",".join(CASES), help="what happens between turns: " + "; ".join(
        f"{name}: {meaning}" for name, meaning in CASES.items()))  # fmt: skip
    parser.add_argument("--turns", type=int, default=50, help="indexed turns timed after the warm-up")
    parser.add_argument("--scan-turns", type=int, default=10, help="of those, how many are also scanned")
    parser.add_argument("--scan-turns-1m", type=int, default=3, help="the same, at 1M entries and more")
    parser.add_argument("--spacing", type=float, default=60.0, help="seconds between rows' updated_at")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    args.backends = [name.strip() for name in args.backends.split(",")]
    args.vocabularies = [name.strip() for name in args.vocabularies.split(",")]
    args.cases = [name.strip() for name in args.cases.split(",")]
    unknown = (
        set(args.backends) - set(BACKENDS)
        or set(args.vocabularies) - {"uniform", "zipf"}
        or set(args.cases) - set(CASES)
    )
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    ROUND_TRIPS.install()
    print(HEADER, file=sys.stderr)
    results = run(args)
    print(
        f"augment() per turn: top_k=3, {WORDS_PER_ENTRY} words per entry, {WORDS_PER_MESSAGE} per message, "
        f"{VOCABULARY_SIZE} words (zipf s={ZIPF_S}); {args.turns} indexed turns after the warm-up; "
        "'x faster' is the scan's median over the index's; 'trips' and 'most' are the median and "
        "largest round trips of an indexed turn; 'same' compares text and report"
    )
    for name, meaning in CASES.items():
        print(f"  {name}: {meaning}")
    print(HEADER)
    for result in results:
        print(row(result))


if __name__ == "__main__":
    main()
