"""Switching sites from the header in a real Chromium: the page stays, the data changes.

The demo shop is the first site (``shop``, the commands' own prefix); ``blog`` holds a few
conversations and entries of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Flask
from playwright.sync_api import expect

from clawmem.clock import FakeClock
from clawmem.providers.echo import EchoProvider
from clawmem.sql.schema import create_tables
from clawmem.turn.pipeline import Claw
from dashboard import state
from tests.browser.test_dashboard_browser import _shot, browser, page, server  # noqa: F401 (fixtures)
from tests.dashboard_helpers import ADMIN, PASSWORD

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

BLOG = "quillfeather"  # in every text of the blog site, and in nothing of the shop's


@pytest.fixture
def app(make_app: Callable[..., Flask], prefix: str, clock: FakeClock) -> Flask:
    """The dashboard over two sites: ``shop`` (the demo, loaded by the ``demo`` fixture) and ``blog``."""
    built = make_app(SITES=f"shop={prefix},blog={prefix}b_")
    with built.app_context():
        blog = state.sites_of(built)["blog"]
        create_tables(blog.engine, blog.prefix)
        blog.memory.set(f"{BLOG}_policy", f"{BLOG} posts go out on fridays")
        claw = Claw.from_settings(blog.settings, EchoProvider(), clock)
        for topic in ("drafts", "comments", "feeds"):
            claw.send(f"{BLOG} question about {topic}", user_id=f"{BLOG}-reader")
            clock.advance(60)
    return built


def _header(tab: Any) -> Any:
    return tab.locator("header nav.sites")


def test_switching_sites_from_the_header_keeps_the_page(page: Any, server: str) -> None:
    page.goto(f"{server}/conversations/")
    expect(_header(page).locator("strong")).to_have_text("shop")
    expect(page.locator("#conversation-results")).not_to_contain_text(BLOG)
    shop_rows = page.locator("#conversation-results tbody tr").count()

    _header(page).locator("a", has_text="blog").click()
    page.wait_for_url(f"{server}/conversations/?site=blog")
    expect(_header(page).locator("strong")).to_have_text("blog")
    expect(page.locator("h1")).to_have_text("Conversations")
    expect(page.locator("#conversation-results tbody tr")).to_have_count(3)
    assert page.locator("#conversation-results tbody tr").count() != shop_rows
    _shot(page, "sites-blog-conversations", full_page=False)

    # Search in place (htmx): the pushed address and the results stay on the blog.
    page.evaluate("window.stillTheSamePage = true")
    page.fill("input[name=q]", "comments")
    expect(page.locator("#conversation-results tbody tr")).to_have_count(1)
    expect(page.locator("#conversation-results")).to_contain_text(f"{BLOG} question about comments")
    assert page.evaluate("window.stillTheSamePage") is True
    query = parse_qs(urlsplit(page.url).query)
    assert query["site"] == ["blog"] and query["q"] == ["comments"], page.url

    # A boosted section link stays on the blog; switching back keeps the section.
    page.click("nav[aria-label=Sections] >> text=Memory")
    page.wait_for_url(f"{server}/memory/?site=blog")
    page.click("text=default")
    page.wait_for_url(f"{server}/memory/default/?site=blog")
    expect(page.locator("#memory-results")).to_contain_text(f"{BLOG}_policy")
    expect(page.locator("#memory-results")).not_to_contain_text("shipping_policy")
    _header(page).locator("a", has_text="shop").click()
    page.wait_for_url(f"{server}/memory/default/")
    expect(_header(page).locator("strong")).to_have_text("shop")
    expect(page.locator("#memory-results")).to_contain_text("shipping_policy")
    expect(page.locator("#memory-results")).not_to_contain_text(BLOG)


def _signed_in_at(browser: Any, server: str, path: str, **options: Any) -> tuple[Any, Any]:
    """Open ``path`` in a new context with ``options``, sign in on the page it is sent to, and
    return the context and the tab, back on ``path``."""
    context = browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **options})
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    tab.goto(f"{server}{path}")
    tab.fill("input[name=username]", ADMIN)
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{server}{path}")
    return context, tab


def test_the_site_survives_forms_without_javascript(browser: Any, server: str) -> None:
    context, tab = _signed_in_at(browser, server, "/memory/?site=blog", java_script_enabled=False)
    tab.click("nav[aria-label=Sections] >> text=Conversations")
    tab.wait_for_url(f"{server}/conversations/?site=blog")
    tab.fill("input[name=q]", "feeds")
    tab.press("input[name=q]", "Enter")
    tab.wait_for_url("**/conversations/?*q=feeds*")
    assert "site=blog" in tab.url
    expect(tab.locator("#conversation-results tbody tr")).to_have_count(1)
    expect(_header(tab).locator("strong")).to_have_text("blog")
    context.close()


def test_the_site_switcher_fits_a_phone(browser: Any, server: str) -> None:
    context, tab = _signed_in_at(
        browser, server, "/conversations/?site=blog", viewport={"width": 375, "height": 800}
    )
    switch = _header(tab).locator("a", has_text="shop")
    expect(switch).to_be_visible()
    assert tab.evaluate("document.documentElement.scrollWidth") <= 375
    _shot(tab, "sites-blog-conversations-375", full_page=False)
    switch.click()
    tab.wait_for_url(f"{server}/conversations/")
    expect(_header(tab).locator("strong")).to_have_text("shop")
    context.close()
