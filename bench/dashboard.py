"""Server time of the dashboard's busiest pages on a large install. Never part of the test suite.

Loads 1,000,000 messages in 50,000 conversations and 100,000 memory entries (``--scale`` shrinks
all three) with bulk inserts into the three tables of a prefix of its own, then times, with the
Flask test client and a signed-in session: the conversations list (first page and a page deep
in the keyset; sorted by tokens both ways and by messages), one conversation, a namespace's
memory list, the injection preview, and the subject page of a subject with 1,000 conversations
and 100,000 messages with, apart, the request that lists its mentions elsewhere
(``--pages subject,subject-mentions,tokens`` for just those). Prints
the median and p95 milliseconds of each, and of one conversation of 500 turns that carry
recall records. Memory entries spread over 20 namespaces, so the
preview's namespace (``default``) holds a twentieth of them.

    .venv/bin/python -m bench.dashboard [--backends sqlite,mysql,postgres] [--scale 1.0] [--runs 30]

``--against DIR`` times the same pages on another checkout too (for example a worktree of an
older commit: ``git worktree add /tmp/old COMMIT --detach``, its ``.venv`` a link to this one's),
each in a process of its own on its own copy of the data set, taking turns, and prints the ratio.

MariaDB/MySQL: ``CLAW_BENCH_MYSQL_URL`` (default ``mysql+pymysql://root@127.0.0.1:3306/test``);
PostgreSQL: ``CLAW_BENCH_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.ids import new_id

try:
    from clawmem.rules import encode_value
except ImportError:  # a checkout timed by --against from before the rules moved out of memory/
    from clawmem.memory.rules import encode_value  # type: ignore[no-redef]
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables, tables
from dashboard import accounts, create_app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
CONVERSATIONS, MESSAGES_PER_CONVERSATION, ENTRIES = 50_000, 20, 100_000
NAMESPACES = 20
LONG_TURNS = 500
BATCH = 10_000
PASSWORD = "bench password long enough"
PREVIEW_MESSAGE = "my+parcel+is+late+where+is+my+refund"
WORDS = [
    "order",
    "parcel",
    "refund",
    "invoice",
    "delivery",
    "warranty",
    "discount",
    "address",
    "courier",
    "jacket",
    "chair",
    "kettle",
    "weekend",
    "tracking",
    "payment",
    "voucher",
    "express",
    "return",
    "damaged",
    "colour",
    "size",
    "leeds",
    "warehouse",
]


def _sentence(chooser: random.Random, words: int) -> str:
    return " ".join(chooser.choice(WORDS) for _ in range(words)).capitalize() + "."


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def load(engine: sa.engine.Engine, prefix: str, scale: float, now: datetime) -> tuple[int, int, int]:
    """Bulk-insert the data set; return (conversations, messages, memory entries)."""
    schema = tables(prefix)
    chooser = random.Random(11)
    conversations = max(1, int(CONVERSATIONS * scale))
    entries = max(NAMESPACES, int(ENTRIES * scale))
    start = now - timedelta(days=365)

    def conversation_rows() -> Iterator[dict[str, Any]]:
        for number in range(conversations):
            created = start + timedelta(seconds=number * 600 + chooser.randint(0, 300))
            # Every seventh provider reports no usage: the NULLs the tokens order lists last.
            tokens = None if number % 7 == 0 else chooser.randint(200, 90_000)
            yield {
                "id": new_id(),
                "namespace": "default",
                "user_id": f"cust-{number % 4000}",
                "title": _sentence(chooser, 4),
                "metadata": None,
                "created_at": created,
                "updated_at": created + timedelta(minutes=30),
                "total_tokens": tokens,
            }

    ids: list[tuple[str, datetime]] = []
    with engine.begin() as conn:
        for batch in _batches(conversation_rows()):
            conn.execute(sa.insert(schema.conversations), batch)
            ids += [(row["id"], row["created_at"]) for row in batch]

    def message_rows() -> Iterator[dict[str, Any]]:
        for conversation_id, created in ids:
            for position in range(MESSAGES_PER_CONVERSATION):
                role = ("user", "assistant", "tool", "assistant")[position % 4]
                yield {
                    "id": new_id(),
                    "conversation_id": conversation_id,
                    "role": role,
                    "content": _sentence(chooser, chooser.randint(8, 40)),
                    "tool_name": "lookup_order" if role == "tool" else None,
                    "tool_input": '{"order_id": "A-1"}' if role == "tool" else None,
                    "created_at": created + timedelta(seconds=position * 20),
                }

    with engine.begin() as conn:
        for batch in _batches(message_rows()):
            conn.execute(sa.insert(schema.messages), batch)

    def memory_rows() -> Iterator[dict[str, Any]]:
        expiry = int(now.timestamp())
        for number in range(entries):
            namespace = "default" if number % NAMESPACES == 0 else f"ns{number % NAMESPACES:02}"
            key = f"fact_{number:07}"
            value = _sentence(chooser, chooser.randint(6, 20))
            expires_at = None if number % 3 else expiry + chooser.randint(-86400, 86400)
            yield {
                "id": new_id(),
                "namespace": namespace,
                "lookup_key": key,
                "value": encode_value(key, value),
                "metadata": None,
                "expires_at": expires_at,
                "created_at": now,
                "updated_at": now,
            }

    with engine.begin() as conn:
        for batch in _batches(memory_rows()):
            conn.execute(sa.insert(schema.memory), batch)
    return conversations, conversations * MESSAGES_PER_CONVERSATION, entries


def load_long_conversation(engine: sa.engine.Engine, prefix: str, turns: int, now: datetime) -> str:
    """Insert one conversation of ``turns`` turns (a recall record, the user message and the reply
    each, as Claw.send stores them); return its id."""
    schema = tables(prefix)
    chooser = random.Random(5)
    conversation_id, created = new_id(), now - timedelta(days=2)
    rows = []
    for turn in range(turns):
        moment = created + timedelta(seconds=turn * 60)
        given = [
            {
                "namespace": "default",
                "key": f"fact_{chooser.randrange(0, 1000) * NAMESPACES:07}",
                "score": 2,
                "bytes": 80,
                "status": "injected",
            }
            for _ in range(3)
        ]
        for role, content in (
            ("recall", json.dumps(given)),
            ("user", _sentence(chooser, 12)),
            ("assistant", _sentence(chooser, 30)),
        ):
            rows.append(
                {
                    "id": new_id(),
                    "conversation_id": conversation_id,
                    "role": role,
                    "content": content,
                    "tool_name": None,
                    "tool_input": None,
                    "created_at": moment,
                }
            )
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.conversations).values(
                id=conversation_id,
                namespace="default",
                user_id="cust-long",
                title="A long conversation",
                metadata=None,
                created_at=created,
                updated_at=created,
            )
        )
        for batch in _batches(iter(rows)):
            conn.execute(sa.insert(schema.messages), batch)
    return conversation_id


SUBJECT, SUBJECT_CONVERSATIONS, SUBJECT_MESSAGES = "cust-bench", 1000, 100


def load_subject(engine: sa.engine.Engine, prefix: str, now: datetime) -> None:
    """Insert one subject with 1,000 conversations of 100 messages each (100,000 messages, a
    recall record before each user message as Claw.send stores them) and a namespace of theirs."""
    schema = tables(prefix)
    chooser = random.Random(23)
    start = now - timedelta(days=200)
    conversations = [
        {
            "id": new_id(),
            "namespace": "default",
            "user_id": SUBJECT,
            "title": _sentence(chooser, 4),
            "metadata": None,
            "created_at": start + timedelta(hours=number * 4),
            "updated_at": start + timedelta(hours=number * 4, minutes=40),
            "total_tokens": None if number % 9 == 0 else chooser.randint(500, 40_000),
        }
        for number in range(SUBJECT_CONVERSATIONS)
    ]

    def message_rows() -> Iterator[dict[str, Any]]:
        for conversation in conversations:
            for position in range(SUBJECT_MESSAGES):
                role = ("recall", "user", "assistant", "assistant")[position % 4]
                content = "[]" if role == "recall" else _sentence(chooser, chooser.randint(8, 30))
                yield {
                    "id": new_id(),
                    "conversation_id": conversation["id"],
                    "role": role,
                    "content": content,
                    "tool_name": None,
                    "tool_input": None,
                    "created_at": conversation["created_at"] + timedelta(seconds=position * 20),
                }

    facts = [
        {
            "id": new_id(),
            "namespace": f"user:{SUBJECT}",
            "lookup_key": f"fact_{number:03}",
            "value": encode_value(f"fact_{number:03}", _sentence(chooser, 8)),
            "metadata": None,
            "expires_at": None,
            "created_at": now,
            "updated_at": now,
        }
        for number in range(40)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.conversations), conversations)
        for batch in _batches(message_rows()):
            conn.execute(sa.insert(schema.messages), batch)
        conn.execute(sa.insert(schema.memory), facts)


def _signed_in(app: Flask) -> FlaskClient:
    client = app.test_client()
    with app.app_context():
        accounts.create_admin("bench", PASSWORD, time.time())
    login = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', login)
    assert token
    form = {"csrf_token": token.group(1), "username": "bench", "password": PASSWORD}
    response = client.post("/login", data=form)
    assert response.status_code == 302, "bench sign-in failed"
    return client


MORE = re.compile(r'id="(?:conversations|memory)-more".*?href="([^"]+)"', re.S)


def follow_more(client: FlaskClient, url: str, depth: int) -> tuple[str, int]:
    """Follow a list's "load more" from ``url`` up to ``depth`` times; return the page reached
    and how many were followed (fewer when the list ends first)."""
    for followed in range(depth):
        found = MORE.search(client.get(url).get_data(as_text=True))
        if not found:
            return url, followed
        url = html.unescape(found.group(1))
    return url, depth


def _time(client: FlaskClient, url: str, runs: int) -> tuple[float, float]:
    client.get(url)  # warm caches and the connection pool
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(round(0.95 * (len(samples) - 1))))]


@contextmanager
def _database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield f"sqlite:///{directory}/bench.db"
    elif backend == "postgres":
        yield os.environ.get("CLAW_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    else:
        yield os.environ.get("CLAW_BENCH_MYSQL_URL", DEFAULT_MYSQL_URL)


@dataclass
class Loaded:
    """The data set of :func:`load` on one backend, with a signed-in client of a dashboard on it."""

    url: str
    engine: sa.engine.Engine
    prefix: str
    now: datetime
    client: FlaskClient


@contextmanager
def loaded(backend: str, scale: float, report: Callable[[str], None]) -> Iterator[Loaded]:
    """Load the data set on ``backend`` under a prefix of its own, sign in to a dashboard on it,
    and drop the tables afterwards."""
    prefix = f"bench{uuid.uuid4().hex[:6]}_"
    with _database(backend) as url, tempfile.TemporaryDirectory() as instance:
        engine = engine_for(url)
        create_tables(engine, prefix)
        try:
            started = time.perf_counter()
            now = datetime.now().replace(microsecond=0)
            conversations, messages, entries = load(engine, prefix, scale, now)
            # What autovacuum (PostgreSQL) and InnoDB's statistics thread (MariaDB, once a tenth
            # of a table changed) do after a bulk load, before the planner trusts the tables.
            if backend in ("postgres", "mysql"):
                with engine.begin() as conn:
                    for table in tables(prefix)[1:]:
                        conn.exec_driver_sql(f"ANALYZE {'TABLE ' if backend == 'mysql' else ''}{table.name}")
            report(
                f"{backend}: loaded {conversations:,} conversations, {messages:,} messages, "
                f"{entries:,} memory entries in {time.perf_counter() - started:.0f} s"
            )
            app = create_app({"DATABASE_URL": url, "TABLE_PREFIX": prefix}, instance_path=instance)
            yield Loaded(url, engine, prefix, now, _signed_in(app))
        finally:
            drop_tables(engine, prefix)
            engine.dispose()


PAGE_NAMES = (
    "overview",
    "list",
    "deep",
    "conversation",
    "long",
    "long-compacting",
    "memory",
    "preview",
    "cold",
    "unmatched",
    "tokens",
    "tokens-asc",
    "tokens-deep",
    "messages-sort",
    "subject",
    "subject-mentions",
    "sites",
)
COLD_NAMESPACE, COLD_MESSAGES = "coldbench", 1000


def load_cold_namespace(engine: sa.engine.Engine, prefix: str, entries: int, now: datetime) -> None:
    """Insert ``entries`` memory entries into a namespace of their own, for the cold-memory page."""
    chooser = random.Random(17)

    def rows() -> Iterator[dict[str, Any]]:
        for number in range(entries):
            key, value = f"cold_{number:07}", _sentence(chooser, chooser.randint(6, 20))
            yield {
                "id": new_id(),
                "namespace": COLD_NAMESPACE,
                "lookup_key": key,
                "value": encode_value(key, value),
                "metadata": None,
                "expires_at": None,
                "created_at": now,
                "updated_at": now,
            }

    with engine.begin() as conn:
        for batch in _batches(rows()):
            conn.execute(sa.insert(tables(prefix).memory), batch)


def _pages(site: Loaded, only: tuple[str, ...], depth: int, cold_entries: int) -> dict[str, tuple[str, str]]:
    """Load what the pages in ``only`` need besides the data set; return each one's
    ``(label, url)`` by name."""
    client, engine, prefix, now = site.client, site.engine, site.prefix, site.now
    listing = client.get("/conversations/").get_data(as_text=True)
    first_conversation = re.search(r'href="(/conversations/[0-9A-Z]{26})"', listing)
    assert first_conversation
    deep = follow_more(client, "/conversations/", depth if "deep" in only else 0)[0]
    long_id = load_long_conversation(engine, prefix, LONG_TURNS, now)
    if {"subject", "subject-mentions"} & set(only):
        load_subject(engine, prefix, now)
    by_tokens = "/conversations/?sort=-tokens"
    tokens_deep = follow_more(client, by_tokens, depth if "tokens-deep" in only else 0)[0]
    if {"cold", "unmatched"} & set(only):
        load_cold_namespace(engine, prefix, cold_entries, now)
    pages = {
        "overview": ("overview, with its charts", "/"),
        "list": ("conversations, first page", "/conversations/"),
        "deep": (f"conversations, page {depth + 1} (keyset)", deep),
        "conversation": ("one conversation (20 messages)", first_conversation.group(1)),
        "long": (f"one conversation ({LONG_TURNS} turns with recall records)", f"/conversations/{long_id}"),
        "long-compacting": (
            f"the same, its analysis summarising {LONG_TURNS} messages",
            f"/conversations/{long_id}?max_messages=40",
        ),
        "memory": ("memory list, namespace default", "/memory/default/"),
        "preview": ("injection preview, namespace default", f"/preview?message={PREVIEW_MESSAGE}"),
        "cold": (
            f"cold memory, last {COLD_MESSAGES:,} user messages over {cold_entries:,} entries",
            f"/cold?n={COLD_MESSAGES}&namespace={COLD_NAMESPACE}",
        ),
        "unmatched": (
            f"entries sharing no word with the preview's message, of {cold_entries:,}",
            f"/preview/unmatched?message={PREVIEW_MESSAGE}&namespace={COLD_NAMESPACE}",
        ),
        "tokens": ("conversations sorted by tokens, most first", by_tokens),
        "tokens-asc": ("conversations sorted by tokens, fewest first", "/conversations/?sort=tokens"),
        "tokens-deep": (f"conversations by tokens, page {depth + 1} (keyset)", tokens_deep),
        "messages-sort": ("conversations by messages, most first", "/conversations/?sort=-messages"),
        "subject": (
            f"subject page, {SUBJECT_CONVERSATIONS:,} conversations, "
            f"{SUBJECT_CONVERSATIONS * SUBJECT_MESSAGES:,} messages",
            f"/subjects/{SUBJECT}",
        ),
        "subject-mentions": (
            "the same with its mentions elsewhere listed (every other entry read)",
            f"/subjects/{SUBJECT}?mentions=1",
        ),
        "sites": ("sites page (one site: prefixes and drivers)", "/sites/"),
    }
    return {name: pages[name] for name in only}


def run(
    backend: str,
    scale: float,
    runs: int,
    depth: int,
    report: Callable[[str], None],
    only: tuple[str, ...] = PAGE_NAMES,
    cold_entries: int = 100_000,
) -> None:
    """Load the data set on ``backend``, time the pages named in ``only`` (of :data:`PAGE_NAMES`)
    and print one table row per page."""
    with loaded(backend, scale, report) as site:
        for name, page in _pages(site, only, depth, cold_entries).values():
            median, p95 = _time(site.client, page, runs)
            report(f"| {backend} | {name} | {median:.1f} | {p95:.1f} |")


def serve_timings(backend: str, scale: float, depth: int, only: tuple[str, ...], cold_entries: int) -> None:
    """The other end of :func:`compare`: load the data set, say ``ready``, then for each line
    ``NAME RUNS`` on stdin time that page and answer its samples (milliseconds) as JSON."""
    with loaded(backend, scale, lambda line: print(line, file=sys.stderr)) as site:
        pages = _pages(site, only, depth, cold_entries)
        for _, url in pages.values():
            site.client.get(url)  # warm caches, the connection pool and the recall index
        print("ready", flush=True)
        for line in sys.stdin:
            name, runs = line.split()
            url = pages[name][1]
            samples = []
            for _ in range(int(runs)):
                started = time.perf_counter()
                response = site.client.get(url)
                samples.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (url, response.status_code)
            print(json.dumps(samples), flush=True)


def compare(
    backend: str,
    checkouts: dict[str, str],
    scale: float,
    runs: int,
    depth: int,
    only: tuple[str, ...],
    report: Callable[[str], None],
) -> None:
    """Time the pages of ``only`` on each checkout (label: directory) in a process of its own on
    its own copy of the data set, one request each in turn, so a change of load on the machine
    falls on every checkout alike; report each page's median per checkout and the ratio of the
    first checkout's to the last one's."""
    here = os.path.abspath(__file__)
    children = {}
    for label, directory in checkouts.items():
        # The checkout's own clawmem and dashboard, under this very timing loop.
        start = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        child = [
            "-c",
            start,
            here,
            "--serve",
            "--backends",
            backend,
            "--scale",
            str(scale),
            "--depth",
            str(depth),
            "--pages",
            ",".join(only),
        ]
        children[label] = subprocess.Popen(
            [sys.executable, *child],
            cwd=directory,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": directory},
        )
    try:
        for label, child in children.items():
            assert child.stdout is not None and child.stdout.readline().strip() == "ready", label
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(runs):
            for name in only:
                for label, child in children.items():
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write(f"{name} 1\n")
                    child.stdin.flush()
                    samples.setdefault((label, name), []).extend(json.loads(child.stdout.readline()))
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
            child.wait()
    first, last = list(checkouts)[0], list(checkouts)[-1]
    for name in only:
        medians = {label: statistics.median(samples[(label, name)]) for label in checkouts}
        cells = " | ".join(f"{medians[label]:.1f}" for label in checkouts)
        report(f"| {backend} | {name} | {cells} | {medians[first] / medians[last]:.2f} |")


def main() -> None:
    """Parse the options and run every backend asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,mysql")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full data set to load")
    parser.add_argument("--runs", type=int, default=30, help="timed requests per page")
    parser.add_argument("--depth", type=int, default=100, help="cursor pages followed for the deep page")
    parser.add_argument(
        "--pages",
        default=",".join(PAGE_NAMES),
        help=f"pages to time, comma-separated, of: {', '.join(PAGE_NAMES)}",
    )
    parser.add_argument(
        "--cold-entries",
        type=int,
        default=100_000,
        help="entries of the namespace the cold-memory page reports on",
    )
    parser.add_argument(
        "--against",
        metavar="DIRECTORY",
        help="another checkout (a git worktree of an older commit) to time beside this one",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    only = tuple(name.strip() for name in options.pages.split(","))
    unknown = [name for name in only if name not in PAGE_NAMES]
    if unknown:
        parser.error(f"--pages: unknown {', '.join(unknown)}; choose from {', '.join(PAGE_NAMES)}")
    backends = [backend.strip() for backend in options.backends.split(",")]
    if options.serve:
        serve_timings(backends[0], options.scale, options.depth, only, options.cold_entries)
        return
    if options.against:
        other = os.path.basename(os.path.abspath(options.against))
        checkouts = {"this checkout": ROOT, other: options.against}
        print(f"| backend | page | {' | '.join(checkouts)} (median ms) | ratio |\n|---|---|---|---|---|")
        for backend in backends:
            compare(backend, checkouts, options.scale, options.runs, options.depth, only, print)
        return
    print("| backend | page | median ms | p95 ms |\n|---|---|---|---|")
    for backend in backends:
        run(backend, options.scale, options.runs, options.depth, print, only, options.cold_entries)


if __name__ == "__main__":
    main()
