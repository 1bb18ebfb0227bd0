"""Server time of the dashboard's lists in every order they offer, with their totals, on the data
set of :mod:`bench.dashboard` (1,000,000 messages in 50,000 conversations, 100,000 memory
entries; ``--scale`` shrinks it). Never part of the test suite.

Times page one and a page ``--depth`` pages deep of the conversation list by last activity, by
start and by title; a search with its marked snippets; and a namespace's keys by key, last write
and expiry. Prints the median and p95 milliseconds of each.

    .venv/bin/python -m bench.lists [--backends sqlite,mysql,postgres] [--scale 1.0] [--runs 20]

MariaDB/MySQL: ``CLAW_BENCH_MYSQL_URL`` (default ``mysql+pymysql://root@127.0.0.1:3306/test``);
PostgreSQL: ``CLAW_BENCH_POSTGRES_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import html
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from flask.testing import FlaskClient

from bench.dashboard import _database, _signed_in, _time, load
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables, tables
from dashboard import create_app

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PAGES = {
    "conversations by last activity": "/conversations/?sort=updated",
    "conversations by start": "/conversations/?sort=created",
    "conversations by title": "/conversations/?sort=title",
    "search 'refund' with snippets": "/conversations/?q=refund",
    "keys by key": "/memory/default/?sort=key",
    "keys by last write": "/memory/default/?sort=updated",
    "keys by expiry": "/memory/default/?sort=expires",
}
MORE = re.compile(r'id="(?:conversations|memory)-more".*?href="([^"]+)"', re.S)


@contextmanager
def _url(backend: str) -> Iterator[str]:
    if backend == "postgres":
        yield os.environ.get("CLAW_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    else:
        with _database(backend) as url:
            yield url


def _deep(client: FlaskClient, url: str, depth: int) -> str | None:
    """Return the URL of page ``depth + 1`` of the list at ``url``, following "load more"."""
    for _ in range(depth):
        found = MORE.search(client.get(url).get_data(as_text=True))
        if not found:
            return None
        url = html.unescape(found.group(1))
    return url


def run(backend: str, scale: float, runs: int, depth: int) -> None:
    """Load the data set on ``backend`` and print one table row per list page."""
    prefix = f"bench{uuid.uuid4().hex[:6]}_"
    with _url(backend) as url, tempfile.TemporaryDirectory() as instance:
        engine = engine_for(url)
        create_tables(engine, prefix)
        try:
            started = time.perf_counter()
            now = datetime.now().replace(microsecond=0)
            conversations, messages, entries = load(engine, prefix, scale, now)
            if backend == "postgres":  # what autovacuum does after a bulk load, before the planner trusts it
                with engine.begin() as conn:
                    for table in tables(prefix)[1:]:
                        conn.exec_driver_sql(f"ANALYZE {table.name}")
            print(f"{backend}: loaded {conversations:,} conversations, {messages:,} messages, "
                  f"{entries:,} memory entries in {time.perf_counter() - started:.0f} s")
            app = create_app({"DATABASE_URL": url, "TABLE_PREFIX": prefix}, instance_path=instance)
            client = _signed_in(app)
            for name, page in PAGES.items():
                median, p95 = _time(client, page, runs)
                print(f"| {backend} | {name}, page 1 | {median:.1f} | {p95:.1f} |")
                deep = _deep(client, page, depth)
                if deep is not None:
                    median, p95 = _time(client, deep, runs)
                    print(f"| {backend} | {name}, page {depth + 1} | {median:.1f} | {p95:.1f} |")
        finally:
            drop_tables(engine, prefix)
            engine.dispose()


def main() -> None:
    """Parse the options and run every backend asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,mysql,postgres")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full data set to load")
    parser.add_argument("--runs", type=int, default=20, help="timed requests per page")
    parser.add_argument("--depth", type=int, default=20, help="'load more' pages followed for the deep page")
    options = parser.parse_args()
    print("| backend | page | median ms | p95 ms |\n|---|---|---|---|")
    for backend in options.backends.split(","):
        run(backend.strip(), options.scale, options.runs, options.depth)


if __name__ == "__main__":
    main()
