"""The Jobs page in a real headless Chromium at 1280 and 375 px: the schedule, the last and next
run, recent background turns with hostile text shown as text, and no sideways scrolling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import expect

from clawmem.clock import FakeClock
from clawmem.jobs.records import JobBook, JobRecord
from dashboard import state
from tests.browser.test_dashboard_browser import ARTIFACTS, browser, server  # noqa: F401 (fixtures)
from tests.browser.test_overview_and_phones import WIDER_THAN_THE_SCREEN
from tests.browser.test_sites_browser import _signed_in_at

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
LONG_REASON = "provider said " + "x" * 300


@pytest.fixture
def app(make_app: Callable[..., Flask], clock: FakeClock) -> Flask:
    """The dashboard with retention scheduled and a few background turns on record."""
    built = make_app(RETENTION_SCHEDULE="0 3 * * *", RETENTION_DAYS=90)
    with built.app_context():
        state.conversations().append("c-long", [{"role": "user", "content": "Where is my parcel?"}])
        book = JobBook(state.driver(), 3600, clock)
        book.put(
            JobRecord(
                "01JOBDONE0000000000000000A",
                status="done",
                conversation_id="c-long",
                attempts=1,
                queued_at=clock() - 30,
                finished_at=clock() - 20,
            )
        )
        book.put(
            JobRecord(
                "01JOBFAIL0000000000000000B",
                status="failed",
                conversation_id="c-" + "9" * 24,
                attempts=3,
                queued_at=clock() - 10,
                finished_at=clock() - 5,
                error_class="ProviderError",
                reason=HOSTILE,
            )
        )
        book.put(
            JobRecord(
                "01JOBWAIT0000000000000000C",
                status="queued",
                conversation_id="c-3",
                queued_at=clock() - 1,
                reason=LONG_REASON,
            )
        )
        book.put(
            JobRecord(
                "retention",
                kind="retention",
                status="done",
                finished_at=clock() - 600,
                tick=clock() - 600,
                counts={"conversations": 4, "messages": 9, "expired": 2},
            ),
            ttl=86400,
        )
    return built


@pytest.mark.parametrize("width", [1280, 375])
def test_the_jobs_page_at_desktop_and_phone_width(browser: Any, server: str, width: int) -> None:
    context, tab = _signed_in_at(browser, server, "/jobs", viewport={"width": width, "height": 900})
    problems: list[str] = []
    tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.reload()
    expect(tab.locator("h1")).to_have_text("Jobs")
    tasks = tab.locator("#scheduled-tasks")
    expect(tasks).to_contain_text("0 3 * * *")
    expect(tasks).to_contain_text("At 03:00 every day")
    expect(tasks).to_contain_text("deleted 4 conversations, 9 messages, 2 expired")
    turns = tab.locator("#background-turns tbody tr")
    expect(turns).to_have_count(3)
    failed = turns.filter(has_text="01JOBFAIL")
    expect(failed).to_contain_text(HOSTILE)  # shown as text, never run
    expect(failed).to_contain_text("3 of 3")
    assert tab.title() != "pwned" and tab.locator("#background-turns img").count() == 0
    turns.filter(has_text="01JOBDONE").locator("a").click()
    tab.wait_for_url(f"{server}/conversations/c-long")
    tab.go_back()
    tab.wait_for_url(f"{server}/jobs")
    assert tab.evaluate(WIDER_THAN_THE_SCREEN) == []
    assert tab.evaluate("document.documentElement.scrollWidth") <= width
    nav = tab.locator("nav[aria-label=Sections] a[aria-current=page]")
    expect(nav).to_have_text("Jobs")
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"jobs-{width}.png"), full_page=True)
    context.close()
    assert [p for p in problems if "404" not in p] == [], problems
