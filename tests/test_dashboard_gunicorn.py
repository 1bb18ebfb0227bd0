"""The dashboard behind two gunicorn workers on MariaDB and PostgreSQL, fetched concurrently."""

from __future__ import annotations

import http.cookiejar
import os
import queue
import re
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clawmem.sql.engine import engine_for
from clawmem.sql.schema import drop_tables
from dashboard import create_app
from tests.conftest import backend_url

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse battery staple"
REQUESTS = 48


def _read_lines(stream: object, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        lines.put(line)


@pytest.fixture(params=["mysql", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[str]:
    """Demo data and an admin on a remote database, served by gunicorn with 2 workers; yields the base URL."""
    url = backend_url(request.param)
    instance = tmp_path / "instance"
    config = {"DATABASE_URL": url, "TABLE_PREFIX": prefix, "ARGON2_PROFILE": "CHEAPEST"}
    app = create_app(config, instance_path=str(instance))
    runner = app.test_cli_runner()
    for args in (["claw", "demo"], ["claw", "create-admin", "admin"]):
        result = runner.invoke(args=args, input=f"{PASSWORD}\n{PASSWORD}\n")
        assert result.exit_code == 0, result.output
    environment = {**os.environ, **{f"CLAW_{name}": value for name, value in config.items()}}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--workers",
            "2",
            "--bind",
            "127.0.0.1:0",
            "--log-level",
            "info",
            f"dashboard:create_app(instance_path={str(instance)!r})",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stderr, lines), daemon=True)
    reader.start()
    try:
        address, workers = None, 0
        while address is None or workers < 2:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                pytest.fail("gunicorn did not start two workers within 60 s")
            found = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", line)
            address = found.group(1) if found else address
            workers += "Booting worker" in line
        yield address
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=30)
        process.stderr.close()  # type: ignore[union-attr]
        engine = engine_for(url)
        drop_tables(engine, prefix)
        engine.dispose()


def _browser() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def test_two_workers_serve_pages_concurrently_with_one_session(served: str) -> None:
    browser = _browser()
    with browser.open(f"{served}/login", timeout=30) as response:
        token = re.search(r'name="csrf_token" value="([^"]+)"', response.read().decode())
    assert token
    form = urllib.parse.urlencode({"csrf_token": token.group(1), "username": "admin", "password": PASSWORD})
    with browser.open(f"{served}/login", data=form.encode(), timeout=30) as overview:
        assert overview.status == 200 and overview.url == f"{served}/"
    with browser.open(f"{served}/conversations/", timeout=30) as response:
        listing = response.read().decode()
    conversation = re.search(r'href="(/conversations/[0-9A-Z]{26})"', listing)
    assert conversation
    pages = [
        "/",
        "/conversations/",
        conversation.group(1),
        "/memory/",
        "/memory/default/",
        "/memory/user:cust-1001/",
        "/preview?message=where+is+my+parcel",
        "/cold",
        "/settings",
    ]

    def fetch(number: int) -> tuple[str, int, str]:
        path = pages[number % len(pages)]
        with browser.open(f"{served}{path}", timeout=60) as response:
            return path, response.status, response.read().decode()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(fetch, range(REQUESTS)))
    assert [status for _, status, _ in results] == [200] * REQUESTS
    assert all("Sign out" in body and "Sign in to see" not in body for _, _, body in results)
    with urllib.request.urlopen(f"{served}/healthz", timeout=30) as health:
        assert health.status == 200
