"""Two gunicorn workers on MariaDB see a write made elsewhere in their next preview."""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import utc_datetime
from clawmem.ids import new_id
from clawmem.memory.sql import SqlMemory
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from tests.conformance.worlds import Rows, Turn, expected_turn
from tests.conftest import backend_url
from tests.test_recall_preview import Preview, expected_rows, read_preview

PASSWORD = "correct horse battery staple"
FILLERS = 30

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)


@dataclass
class Served:
    """Gunicorn with two workers: its address and the pid that served each tagged request."""

    address: str
    access: queue.Queue[str]
    served_by: dict[str, str] = field(default_factory=dict)

    def worker_of(self, tag: str) -> str:
        while tag not in self.served_by:
            try:
                line = self.access.get(timeout=30)
            except queue.Empty:
                pytest.fail(f"gunicorn logged no access for request {tag}")
            pid, _, query = line.strip().partition(" ")
            found = urllib.parse.parse_qs(query).get("tag")
            if found:
                self.served_by[found[0]] = pid
        return self.served_by[tag]


@pytest.fixture
def mariadb_site(tmp_path: Path, prefix: str) -> Iterator[tuple[str, sa.engine.Engine]]:
    url = backend_url("mysql")
    engine = create_engine(url)
    create_tables(engine, prefix)
    yield url, engine
    drop_tables(engine, prefix)
    engine.dispose()


@pytest.fixture(params=["each worker builds its index", "preloaded: the workers share one"])
def served(
    mariadb_site: tuple[str, sa.engine.Engine], tmp_path: Path, prefix: str, request: pytest.FixtureRequest
) -> Iterator[Served]:
    from dashboard import create_app

    preload = ["-c", "python:dashboard.preload"] if request.param.startswith("preloaded") else []

    url, engine = mariadb_site
    writer = SqlMemory(engine, prefix=prefix)  # before the workers start: a preloaded master indexes them
    for number in range(FILLERS):
        writer.set(f"filler-{number:02d}", f"an unrelated note, number {number}")
    instance = tmp_path / "instance"
    config = {"DATABASE_URL": url, "TABLE_PREFIX": prefix, "ARGON2_PROFILE": "CHEAPEST"}
    runner = create_app(config, instance_path=str(instance)).test_cli_runner()
    result = runner.invoke(args=["claw", "create-admin", "admin"], input=f"{PASSWORD}\n{PASSWORD}\n")
    assert result.exit_code == 0, result.output
    environment = {**os.environ, **{f"CLAW_{name}": value for name, value in config.items()}}
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *preload, "--workers", "2", "--bind", "127.0.0.1:0",
         "--log-level", "info", "--access-logfile", "-", "--access-logformat", "%(p)s %(q)s",
         f"dashboard:create_app(instance_path={str(instance)!r})"],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    errors: queue.Queue[str] = queue.Queue()
    access: queue.Queue[str] = queue.Queue()
    readers = [
        threading.Thread(target=_read_lines, args=(process.stderr, errors), daemon=True),
        threading.Thread(target=_read_lines, args=(process.stdout, access), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        address, workers, built = None, 0, False
        while address is None or workers < 2:
            try:
                line = errors.get(timeout=60)
            except queue.Empty:
                pytest.fail("gunicorn did not start two workers within 60 s")
            found = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", line)
            address = found.group(1) if found else address
            workers += "Booting worker" in line
            built = built or f"recall indexes built before forking: {FILLERS} entries" in line
        assert built == bool(preload), "a preloaded master indexes the fillers before forking"
        yield Served(address, access)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for reader in readers:
            reader.join(timeout=30)
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]


def _signed_in(address: str) -> urllib.request.OpenerDirector:
    import http.cookiejar

    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with browser.open(f"{address}/login", timeout=30) as response:
        token = re.search(r'name="csrf_token" value="([^"]+)"', response.read().decode())
    assert token
    form = urllib.parse.urlencode({"csrf_token": token.group(1), "username": "admin", "password": PASSWORD})
    with browser.open(f"{address}/login", data=form.encode(), timeout=30) as response:
        assert response.status == 200 and response.url == f"{address}/"
    return browser


@pytest.mark.slow
def test_two_gunicorn_workers_preview_what_another_process_just_wrote(
    served: Served, mariadb_site: tuple[str, sa.engine.Engine], prefix: str
) -> None:
    _, engine = mariadb_site
    writer = SqlMemory(engine, prefix=prefix)  # another process: the CLI, a cron job, an agent
    table = tables(prefix).memory
    browser = _signed_in(served.address)
    message = "Has the quokka had its marmalade, or the zebra?"
    tags = itertools.count()

    def previews(phase: str) -> list[Preview]:
        """Preview ``message`` in rounds of concurrent requests until both workers answered."""
        shown: list[Preview] = []
        workers: set[str] = set()

        def fetch(tag: str) -> Preview:
            query = urllib.parse.urlencode({"message": message, "tag": tag})
            with browser.open(f"{served.address}/preview?{query}", timeout=60) as response:
                assert response.status == 200
                return read_preview(response.read().decode())

        deadline = time.monotonic() + 90  # a worker still booting on a loaded machine gets its turn
        with ThreadPoolExecutor(max_workers=6) as pool:
            while time.monotonic() < deadline:
                batch = [f"{phase}-{next(tags)}" for _ in range(6)]
                shown += pool.map(fetch, batch)
                workers |= {served.worker_of(tag) for tag in batch}
                if len(workers) == 2:
                    return shown
        pytest.fail(f"only worker {workers} answered the {phase} previews")

    def plain_sql(statement: Any) -> Callable[[], None]:
        def run() -> None:
            with engine.begin() as conn:
                conn.execute(statement)

        return run

    now = utc_datetime(time.time)  # the workers keep real time; nothing here expires
    zebra = {"id": new_id(), "namespace": "default", "lookup_key": "zebra", "expires_at": None}
    changes = [
        ("a write through SqlMemory", lambda: writer.set("quokka", "the quokka eats marmalade")),
        (
            "a row inserted with plain SQL",
            plain_sql(
                sa.insert(table).values(
                    {
                        **zebra,
                        "value": json.dumps("a zebra, with stripes"),
                        "created_at": now,
                        "updated_at": now,
                    }
                )
            ),
        ),
        (
            "a row updated with plain SQL",
            plain_sql(
                sa.update(table)
                .where(table.c.lookup_key == "quokka")
                .values(value=json.dumps("the quokka sleeps"), updated_at=now)
            ),
        ),
        ("a row deleted with plain SQL", plain_sql(sa.delete(table).where(table.c.lookup_key == "zebra"))),
        ("a forget through SqlMemory", lambda: writer.forget("quokka")),
    ]

    def rows() -> Rows:
        with engine.connect() as conn:
            found = conn.execute(sa.select(table.c.lookup_key, table.c.value, table.c.expires_at))
            return {key: (json.loads(value), expires_at) for key, value, expires_at in found}

    def expected() -> Turn:
        return expected_turn([("default", rows())], message, 3, 4096, 0)

    warm = previews("warm")  # both workers have built their index of the namespace
    assert {(p.text, tuple(p.rows), p.zero_overlap) for p in warm} == {(message, (), FILLERS)}

    for phase, (what, change) in enumerate(changes):
        change()
        turn = expected()
        for shown in previews(f"change{phase}"):
            assert (shown.text, shown.rows, shown.zero_overlap) == (
                turn.text,
                expected_rows(turn),
                turn.zero_overlap,
            ), what
    assert expected_rows(expected()) == [] and expected().zero_overlap == FILLERS
