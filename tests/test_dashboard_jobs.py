"""The Jobs page and the Overview's retention card: read from ``phpclaw_jobs`` and the audit log."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Flask

from clawmem.clock import FakeClock
from clawmem.jobs.records import JobBook, JobRecord
from dashboard import accounts, state
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

HOSTILE = '<script>alert("x")</script>&amp;'
START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()


def _client(app: Flask) -> Any:
    client = app.test_client()
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    sign_in(client)
    return client


def _records(app: Flask, clock: FakeClock) -> None:
    with app.app_context():
        book = JobBook(state.driver(), 3600, clock)
        book.put(
            JobRecord(
                "01JOBDONE",
                status="done",
                conversation_id="conv-1",
                attempts=1,
                queued_at=clock() - 30,
                finished_at=clock() - 20,
                run_id="run-1",
            )
        )
        book.put(
            JobRecord(
                "01JOBFAIL",
                status="failed",
                conversation_id="conv-2",
                attempts=3,
                queued_at=clock() - 10,
                finished_at=clock() - 5,
                error_class="ProviderError",
                reason=f"provider said {HOSTILE}",
            )
        )
        book.put(
            JobRecord(
                "retention",
                kind="retention",
                status="done",
                finished_at=clock() - 3600,
                tick=clock() - 3600,
                counts={"conversations": 4, "messages": 9, "expired": 2},
            ),
            ttl=86400,
        )


def test_the_jobs_page_shows_the_schedule_its_runs_and_recent_turns(
    make_app: Callable[..., Flask], clock: FakeClock, tmp_path: Path
) -> None:
    clock.now = START
    app = make_app(RETENTION_SCHEDULE="0 3 * * *", RETENTION_DAYS=90)
    _records(app, clock)
    audit = tmp_path / "instance" / "audit.log"
    audit.write_text(
        json.dumps(
            {
                "time": "2026-12-01T03:00:01+00:00",
                "command": "prune",
                "arguments": {},
                "dry_run": False,
                "counts": {"conversations": 4, "messages": 9},
                "outcome": "ok",
            }
        )
        + "\n"
    )
    body = page_text(_client(app).get("/jobs"))
    assert "<code>0 3 * * *</code>" in body and "At 03:00 every day" in body
    # The next run is tomorrow 03:00 UTC on the app's clock.
    assert 'datetime="2026-12-02T03:00:00Z"' in body
    assert "deleted 4 conversations, 9 messages, 2 expired" in body
    assert re.search(r"<code>prune</code>.*?ok.*?4 conversations, 9 messages", body, re.S)
    assert "01JOBDONE" in body and "01JOBFAIL" in body and "1 of 3" in body and "3 of 3" in body
    assert 'href="/conversations/conv-1"' in body
    assert HOSTILE not in body and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;amp;" in body
    assert "<code>ProviderError</code>" in body


def test_a_bad_schedule_is_shown_not_run(make_app: Callable[..., Flask]) -> None:
    app = make_app(RETENTION_SCHEDULE="every night", RETENTION_DAYS=90)
    client = _client(app)
    assert "Not running:" in page_text(client.get("/jobs"))
    card = re.search(r'<p id="retention-schedule">(.*?)</p>', page_text(client.get("/")), re.S).group(1)
    assert "Scheduled retention cannot run" in card and "is not a cron expression" in card


def test_the_overview_says_whether_retention_is_scheduled_and_when_it_last_ran(
    make_app: Callable[..., Flask], clock: FakeClock
) -> None:
    clock.now = START
    app = make_app(RETENTION_SCHEDULE="30 2 * * 1", RETENTION_DAYS=30)
    _records(app, clock)
    client = _client(app)
    card = re.search(r'<p id="retention-schedule">(.*?)</p>', page_text(client.get("/")), re.S).group(1)
    assert "Retention is <strong>scheduled</strong>" in card and "<code>30 2 * * 1</code>" in card
    assert "Last scheduled run" in card and "deleted 4 conversations, 9 messages, 2 expired" in card


def test_the_overview_says_when_retention_is_not_scheduled(app: Flask) -> None:
    body = page_text(_client(app).get("/"))
    card = re.search(r'<p id="retention-schedule">(.*?)</p>', body, re.S).group(1)
    assert "Retention is <strong>not scheduled</strong>" in card and "Last scheduled run" not in card


def test_no_jobs_says_how_to_queue_one_and_creates_no_queue(app: Flask, tmp_path: Path) -> None:
    body = page_text(_client(app).get("/jobs"))
    assert "No background turn" in body and "worker --workers 2" in body
    assert "Not scheduled" in body
    assert not (tmp_path / "instance" / "queue.db").exists()
