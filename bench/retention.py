"""Retention at scale: ``prune`` over 1,000,000 messages in 50,000 conversations.

Backends: SQLite (a temporary file), MariaDB/MySQL (``CLAW_BENCH_MYSQL_URL``, default
``mysql+pymysql://root@127.0.0.1:3306/test``) and PostgreSQL (``CLAW_BENCH_POSTGRES_URL``, default
``postgresql+psycopg://postgres@127.0.0.1:5432/test``), each under a table prefix of its own
whose tables are dropped afterwards. The rows are bulk-loaded with executemany, then 99 % of the
conversations (all but the youngest) are pruned with the same batched deletion the CLI uses.

Prints rows deleted per second, the longest single transaction (the slowest batch) and the peak
Python heap during the prune (tracemalloc), which stays flat because ids are streamed one batch
at a time: compare ``--scale 0.1`` with ``--scale 1``. Never part of the test suite.

    .venv/bin/python -m bench.retention [--scale 1.0] [--batch-size 1000] [--backends sqlite,mysql]
                                        [--no-trace]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from clawmem.ids import new_id
from clawmem.sql.engine import create_engine
from clawmem.sql.retention import Counts, count_conversations, delete_in_batches, older_than
from clawmem.sql.schema import create_tables, drop_tables, tables

URLS = {
    "mysql": ("CLAW_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "postgres": ("CLAW_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
}
FULL_CONVERSATIONS = 50_000
MESSAGES_PER_CONVERSATION = 20
LOAD_CHUNK = 10_000
NOW = datetime(2025, 1, 1)
CONTENT = "Customer asked about the delivery window and the refund policy for order #{n}. " * 2


@dataclass(frozen=True)
class Result:
    """What one backend measured."""

    backend: str
    conversations: int
    messages: int
    load_seconds: float
    prune_seconds: float
    deleted: Counts
    batches: int
    longest_batch: float
    mean_batch: float
    peak_bytes: int | None


@contextmanager
def _database(backend: str) -> Iterator[tuple[sa.engine.Engine, str]]:
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    with tempfile.TemporaryDirectory() as directory:
        if backend == "sqlite":
            url = f"sqlite:///{directory}/bench.db"
        else:
            variable, default = URLS[backend]
            url = os.environ.get(variable, default)
        engine = create_engine(url)
        create_tables(engine, prefix)
        try:
            yield engine, prefix
        finally:
            drop_tables(engine, prefix)
            engine.dispose()


def _load(engine: sa.engine.Engine, prefix: str, conversations: int) -> None:
    """Insert the conversations, oldest first, and their messages, in chunks of executemany."""
    schema = tables(prefix)
    pending_conversations: list[dict[str, Any]] = []
    pending_messages: list[dict[str, Any]] = []

    def flush() -> None:
        with engine.begin() as conn:
            if pending_conversations:
                conn.execute(sa.insert(schema.conversations), pending_conversations)
            if pending_messages:
                conn.execute(sa.insert(schema.messages), pending_messages)
        pending_conversations.clear()
        pending_messages.clear()

    for n in range(conversations):
        created = NOW - timedelta(days=400) + timedelta(minutes=10 * n)
        conversation_id = new_id()
        pending_conversations.append(
            {
                "id": conversation_id,
                "namespace": "default",
                "user_id": f"user{n % 997}",
                "title": f"Order {n}",
                "metadata": None,
                "created_at": created,
                "updated_at": created,
            }
        )
        for k in range(MESSAGES_PER_CONVERSATION):
            pending_messages.append(
                {
                    "id": new_id(),
                    "conversation_id": conversation_id,
                    "role": "user" if k % 2 == 0 else "assistant",
                    "content": CONTENT.format(n=n),
                    "tool_name": None,
                    "tool_input": None,
                    "created_at": created + timedelta(seconds=k),
                }
            )
        if len(pending_messages) >= LOAD_CHUNK:
            flush()
    flush()


def run(backend: str, conversations: int, batch_size: int, trace: bool) -> Result:
    """Load, prune every conversation but the youngest 1 %, check the result, and measure."""
    with _database(backend) as (engine, prefix):
        started = time.perf_counter()
        _load(engine, prefix, conversations)
        load_seconds = time.perf_counter() - started
        # Conversations are ten minutes apart: the cutoff keeps the youngest 1 %.
        keep = max(1, conversations // 100)
        cutoff = NOW - timedelta(days=400) + timedelta(minutes=10 * (conversations - keep))
        where = older_than(prefix, "created_at", cutoff)
        with engine.connect() as conn:
            expected = count_conversations(conn, prefix, where)
        if trace:
            tracemalloc.start()
        started = time.perf_counter()
        durations: list[float] = []
        deleted_conversations = deleted_messages = 0
        for batch in delete_in_batches(engine, prefix, where, batch_size=batch_size):
            durations.append(batch.seconds)
            deleted_conversations += batch.conversations
            deleted_messages += batch.messages
        prune_seconds = time.perf_counter() - started
        peak = None
        if trace:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        deleted = Counts(deleted_conversations, deleted_messages)
        if deleted != expected:
            raise SystemExit(f"{backend}: pruned {deleted}, expected {expected}")
        with engine.connect() as conn:
            left = count_conversations(conn, prefix, sa.true())
        if left != Counts(keep, keep * MESSAGES_PER_CONVERSATION):
            raise SystemExit(f"{backend}: {left} left, expected {keep} conversations with their messages")
    return Result(
        backend,
        conversations,
        conversations * MESSAGES_PER_CONVERSATION,
        load_seconds,
        prune_seconds,
        deleted,
        len(durations),
        max(durations),
        sum(durations) / len(durations),
        peak,
    )


COLUMNS = [
    "backend",
    "conversations",
    "messages",
    "load s",
    "prune s",
    "rows deleted/s",
    "batches",
    "longest batch s",
    "mean batch s",
    "peak heap MiB",
]


def report(results: list[Result], batch_size: int) -> str:
    """Return the results as a Markdown table."""
    per_batch = batch_size * MESSAGES_PER_CONVERSATION
    lines = [
        f"batch size {batch_size} conversations ({per_batch} messages) per transaction",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---" + "|---:" * (len(COLUMNS) - 1) + "|",
    ]
    for r in results:
        rows = r.deleted.conversations + r.deleted.messages
        cells = [
            r.backend,
            f"{r.conversations:,}",
            f"{r.messages:,}",
            f"{r.load_seconds:.1f}",
            f"{r.prune_seconds:.1f}",
            f"{rows / r.prune_seconds:,.0f}",
            str(r.batches),
            f"{r.longest_batch:.3f}",
            f"{r.mean_batch:.3f}",
            "n/a" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="fraction of 50,000 conversations (default 1)"
    )
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--backends", default="sqlite,mysql", help="comma-separated: sqlite, mysql, postgres")
    parser.add_argument("--no-trace", action="store_true", help="time without tracemalloc's overhead")
    options = parser.parse_args()
    conversations = max(100, int(FULL_CONVERSATIONS * options.scale))
    results = []
    for backend in options.backends.split(","):
        print(f"{backend}: loading {conversations:,} conversations ...", flush=True)
        results.append(run(backend.strip(), conversations, options.batch_size, not options.no_trace))
    print(report(results, options.batch_size))


if __name__ == "__main__":
    main()
