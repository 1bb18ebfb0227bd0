"""The dashboard in a real headless Chromium, with htmx fetched the way ``make run`` fetches it.

Debian's ``chromium`` runs through Playwright's ``executable_path``. Without it (or without npm
for htmx) these tests skip locally with the reason, and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from playwright.sync_api import expect, sync_playwright
from werkzeug.serving import make_server

from clawmem.ids import new_id
from clawmem.sql.schema import tables
from dashboard import state, vendor
from dashboard.devserver import closing_bodies
from tests.conftest import IN_CI
from tests.dashboard_helpers import ADMIN, PASSWORD

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Debian Chromium driven by Playwright (never a downloaded browser)."""
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"{CHROMIUM} is missing: apt-get install chromium")
    try:
        vendor.fetch_htmx()
    except vendor.FetchError as exc:
        _unavailable(f"htmx could not be fetched for the browser tests: {exc}")

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def server(app: Flask, demo: None, admin: tuple[str, str]) -> Iterator[str]:
    """The app with demo data, served by a real HTTP server on a free port; yields its base URL."""
    http = make_server("127.0.0.1", 0, closing_bodies(app), threaded=True)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.port}"
    http.shutdown()
    thread.join(timeout=10)
    http.server_close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    """A signed-in browser tab; fails the test if the page reports a CSP violation or a JS error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    problems: list[str] = []
    tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.goto(f"{server}/")
    assert tab.url.startswith(f"{server}/login")
    tab.fill("input[name=username]", ADMIN)
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{server}/")
    assert tab.evaluate("typeof htmx") == "object", "htmx must be served from static/vendor"
    yield tab
    context.close()
    assert problems == [], problems


def _shot(tab: Any, name: str, full_page: bool = True) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


def test_overview_and_memory_render(page: Any, server: str) -> None:
    assert page.inner_text("h1") == "Overview"
    assert "expired but not yet swept" in page.inner_text("main")
    _shot(page, "overview")
    page.click("nav >> text=Memory")
    page.wait_for_url(f"{server}/memory/")
    page.click("a[href='/memory/default/']")  # not the header's 'Site: default'
    page.wait_for_url(f"{server}/memory/default/")
    assert page.locator("span.tag.expired").count() >= 2
    assert page.locator("span.tag.expiring").count() >= 2
    assert page.locator("span.tag.permanent").first.inner_text() == "never expires"
    _shot(page, "memory")
    page.evaluate("window.stillTheSamePage = true")
    page.select_option("select[name=state]", "live")
    expect(page.locator("#memory-results span.tag.expired")).to_have_count(0)
    assert page.locator("#memory-results span.tag.permanent").count() >= 5
    assert page.locator("#memory-results span.tag.expiring").count() >= 2
    page.select_option("select[name=state]", "permanent")
    expect(page.locator("#memory-results span.tag.expiring")).to_have_count(0)
    assert page.locator("#memory-results span.tag.permanent").count() >= 5
    assert page.evaluate("window.stillTheSamePage") is True, "the filter applies without a page load"
    assert "state=permanent" in page.url


def test_memory_index_names_the_subject_of_a_subject_namespace(page: Any, server: str) -> None:
    page.goto(f"{server}/memory/")
    row = page.locator("tr", has=page.locator("code", has_text="user:cust-1001"))
    expect(row.locator("span.subject")).to_have_text("subject cust-1001")
    expect(row.locator("span.subject a")).to_have_attribute("href", "/subjects/cust-1001")
    row.locator("a").first.click()
    page.wait_for_url(f"{server}/memory/user:cust-1001/")
    assert "Alice Moreau" in page.inner_text("#memory-results")


def test_open_a_conversation_with_its_compaction_analysis(page: Any, server: str) -> None:
    page.click("nav >> text=Conversations")
    page.wait_for_url(f"{server}/conversations/")
    page.fill("input[name=q]", "large office order")
    page.wait_for_selector("text=Planning a large office order")
    page.click("text=Planning a large office order")
    page.wait_for_selector("ol.messages")
    page.fill("input[name=max_messages]", "10")
    page.click("text=Analyse")
    page.wait_for_selector("li.message.summarised")
    assert page.locator("li.message.summarised").count() > 0
    assert page.locator("li.message.kept").count() > 0
    _shot(page, "conversation", full_page=False)


def test_preview_updates_while_typing(page: Any, server: str) -> None:
    page.goto(f"{server}/preview")
    page.evaluate("window.stillTheSamePage = true")
    page.click("#preview-message")
    page.keyboard.type("my parcel arrived damaged, who handles delivery complaints?", delay=15)
    # Locator waits, not wait_for_function: the CSP rightly blocks the eval that one needs.
    expect(page.locator("#preview-result pre.augmented")).to_contain_text("escalation_contact")
    assert page.evaluate("window.stillTheSamePage") is True, "the result must arrive without a page load"
    assert "The PII guard would block this turn." in page.inner_text("#preview-result")
    assert "message=" not in page.url, "typing never puts the customer's text in the address bar or history"
    _shot(page, "preview")
    page.fill("#preview-message", "")
    page.keyboard.type("gift wrapping", delay=15)
    augmented = page.locator("#preview-result pre.augmented")
    expect(augmented).not_to_contain_text("escalation_contact")
    expect(augmented).to_contain_text("gift_wrapping")


def _older_conversations(app: Flask, count: int, title: Callable[[int], str]) -> None:
    """Insert ``count`` conversations older than the demo's, a minute apart, titled ``title(n)``."""
    start = datetime(2023, 1, 1)
    rows = [
        {
            "id": new_id(),
            "namespace": "support",
            "user_id": "cust-9",
            "title": title(n),
            "created_at": start + timedelta(minutes=n),
            "updated_at": start + timedelta(minutes=n),
        }
        for n in range(count)
    ]
    with app.app_context(), state.engine().begin() as conn:
        conn.execute(sa.insert(tables(state.settings().table_prefix).conversations), rows)


def test_load_more_appends_conversations_in_place(app: Flask, page: Any, server: str) -> None:
    _older_conversations(app, 100, lambda n: f"Older #{n}")
    page.goto(f"{server}/conversations/")
    page.evaluate("window.stillTheSamePage = true")
    body_rows = "#conversation-results tbody tr:not(.more)"
    assert page.locator(body_rows).count() == 50
    page.click("#conversations-more a")
    expect(page.locator(body_rows)).to_have_count(100)
    page.click("#conversations-more a")
    expect(page.locator(body_rows)).to_have_count(130)
    expect(page.locator("#conversations-more")).to_have_count(0)
    assert page.evaluate("window.stillTheSamePage") is True
    titles = page.locator(f"{body_rows} td:first-child").all_inner_texts()
    assert len(set(titles[30:])) == 100 and titles[30] == "Older #99" and titles[-1] == "Older #0"


def test_a_turn_shows_what_it_was_given_and_its_preview_opens_in_place(page: Any, server: str) -> None:
    page.click("nav >> text=Conversations")
    page.wait_for_url(f"{server}/conversations/")
    page.fill("input[name=user_id]", "cust-1001")
    page.fill("input[name=q]", "Where is my order")
    page.wait_for_selector("text=Where is my order?")
    page.click("text=Where is my order?")
    page.wait_for_selector("ol.messages")
    given = page.locator(
        "li.message.role-recall ul.given li", has=page.locator("code", has_text="last_order")
    )
    expect(given.first.locator("span.tag")).to_have_text("changed since")
    page.evaluate("window.stillTheSamePage = true")
    first_user = page.locator("li.message.role-user").first
    first_user.locator("p.turn-preview a").click()
    expect(first_user.locator("div.turn-result")).to_contain_text("Given now")
    assert page.evaluate("window.stillTheSamePage") is True, "the preview opens without a page load"
    _shot(page, "conversation-turn-preview")


def test_the_preview_lists_the_entries_sharing_no_word_in_place(page: Any, server: str) -> None:
    page.goto(f"{server}/preview")
    page.evaluate("window.stillTheSamePage = true")
    page.click("#preview-message")
    page.keyboard.type("my parcel arrived damaged", delay=15)
    expect(page.locator("#preview-result a.unmatched-link")).to_be_visible()
    shown = int(page.inner_text("#preview-result span.zero-overlap"))
    assert shown > 0
    page.click("#preview-result a.unmatched-link")
    expect(page.locator("#unmatched span.unmatched-count")).to_have_text(str(shown))
    expect(page.locator("#unmatched tr.unmatched-entry")).to_have_count(min(shown, 50))
    assert page.evaluate("window.stillTheSamePage") is True, "the list opens without a page load"
    assert "message=" not in page.url, "listing never puts the customer's text in the address bar or history"
    # Without JavaScript the same link is a page of its own.
    href = page.get_attribute("#preview-result a.unmatched-link", "href")
    page.goto(f"{server}{href}")
    expect(page.locator("h1")).to_have_text("Entries sharing no word with the message")
    expect(page.locator("tr.unmatched-entry")).to_have_count(min(shown, 50))


SORTED_ROWS = "#conversation-results tbody tr:not(.more)"


def _titles(tab: Any) -> list[str]:
    return [title.strip() for title in tab.locator(f"{SORTED_ROWS} td:first-child > a").all_inner_texts()]


def _links(tab: Any) -> list[str]:
    return [link.get_attribute("href") for link in tab.locator(f"{SORTED_ROWS} td:first-child > a").all()]


def test_a_column_header_sorts_and_load_more_keeps_the_order(app: Flask, page: Any, server: str) -> None:
    _older_conversations(app, 80, lambda n: f"zz sorted {99 - n:02}")  # titles run against time
    page.goto(f"{server}/conversations/")
    expect(page.locator("th[aria-sort=descending]")).to_contain_text("Last activity")
    newest_first = _titles(page)
    page.click("th >> text=Title")
    page.wait_for_url("**sort=title**")
    expect(page.locator("th[aria-sort=ascending]")).to_contain_text("Title")
    assert page.locator("th[aria-sort]").count() == 1
    first_page = _titles(page)
    _shot(page, "conversations-by-title", full_page=False)
    assert first_page != newest_first, "the order changed"
    assert len(first_page) == 50
    page.evaluate("window.stillTheSamePage = true")
    page.click("#conversations-more a")
    expect(page.locator(SORTED_ROWS)).to_have_count(100)
    titles = _titles(page)
    assert titles[:50] == first_page, "the next page is appended, not a new list"
    titled = [title for title in titles if title != "(untitled)"]
    assert titled == sorted(titled), "the second page continues in title order"
    assert len(set(_links(page))) == 100, "each conversation once"
    assert page.evaluate("window.stillTheSamePage") is True
    page.click("th >> text=Started")
    page.wait_for_url("**sort=-created**")
    expect(page.locator("th[aria-sort=descending]")).to_contain_text("Started")
    assert _titles(page)[0] != first_page[0]
