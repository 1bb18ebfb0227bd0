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

from bench.dashboard import _time, follow_more, loaded

PAGES = {
    "conversations by last activity": "/conversations/?sort=updated",
    "conversations by start": "/conversations/?sort=created",
    "conversations by title": "/conversations/?sort=title",
    "search 'refund' with snippets": "/conversations/?q=refund",
    "keys by key": "/memory/default/?sort=key",
    "keys by last write": "/memory/default/?sort=updated",
    "keys by expiry": "/memory/default/?sort=expires",
}


def run(backend: str, scale: float, runs: int, depth: int) -> None:
    """Load the data set on ``backend`` and print one table row per list page."""
    with loaded(backend, scale, print) as site:
        for name, page in PAGES.items():
            median, p95 = _time(site.client, page, runs)
            print(f"| {backend} | {name}, page 1 | {median:.1f} | {p95:.1f} |")
            deep, followed = follow_more(site.client, page, depth)
            if followed == depth:
                median, p95 = _time(site.client, deep, runs)
                print(f"| {backend} | {name}, page {depth + 1} | {median:.1f} | {p95:.1f} |")


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
