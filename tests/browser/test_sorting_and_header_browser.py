"""In a real Chromium at 1280 and 375 px, with and without JavaScript: every list sorts both
ways from a visible control and pages on in that order, with hostile keys that must stay text;
and the header keeps its sections on one line at 1280 px, with and without the site switcher."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import expect

from clawmem.clock import FakeClock
from clawmem.turn.conversations import Message
from dashboard import state
from tests.browser.test_dashboard_browser import ARTIFACTS, browser, server  # noqa: F401 (fixtures)
from tests.browser.test_sites_browser import _signed_in_at

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

PHONE, DESKTOP = 375, 1280
XSS = "<img src=x onerror=\"document.title='pwned'\">"
NAMESPACE = "sorting"
KEYS = 60  # more than a page (50), so "load more" continues each order
SECTIONS = "nav[aria-label=Sections] a"


@pytest.fixture
def app(request: pytest.FixtureRequest, make_app: Callable[..., Flask], prefix: str) -> Flask:
    """One site, or with ``indirect`` "two sites" a second one beside it (the header then has a
    site switcher)."""
    if getattr(request, "param", None) == "two sites":
        return make_app(SITES=f"shop={prefix},blog={prefix}b_")
    return make_app()


@pytest.fixture
def keys(app: Flask, demo: None, clock: FakeClock) -> list[str]:
    """``KEYS`` entries in one namespace, written a second apart in reverse key order, each key
    holding markup; returns the keys in key order."""
    names = [f"k{number:02}-{XSS}" for number in range(KEYS)]
    with app.app_context():
        memory = state.memory()
        for name in reversed(names):
            memory.set(name, f"value {XSS}", NAMESPACE)
            clock.advance(1)
        log = state.conversations()
        log.append(
            "c-order",
            [Message("user" if n % 2 == 0 else "assistant", f"turn {n:03} {XSS}") for n in range(130)],
            user_id="cust-order",
            title=f"Order {XSS}",
        )
    return names


def _tab(browser: Any, server: str, width: int, path: str, **options: Any) -> Any:
    _, tab = _signed_in_at(browser, server, path, viewport={"width": width, "height": 900}, **options)
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.problems = problems
    return tab


def _close(tab: Any, width: int) -> None:
    assert tab.evaluate("document.documentElement.scrollWidth") <= width, tab.url
    assert tab.problems == [], tab.problems
    assert tab.title() != "pwned"
    tab.context.close()


def _listed_keys(tab: Any) -> list[str]:
    return [
        text.strip()
        for text in tab.locator("#memory-results tbody tr:not(.more) td:first-child code").all_inner_texts()
    ]


ROWS = "tbody tr:not(.more), ol.messages > li.message"


def _every_page(tab: Any, more: str, read: Callable[[Any], list[str]], javascript: bool) -> list[str]:
    """Return what ``read`` finds on this page and each one "load more" leads to: appended in
    place with JavaScript, or a page of its own without."""
    found: list[str] = []
    while True:
        if not javascript:
            found += read(tab)
        if not tab.locator(f"{more} a").count():
            return read(tab) if javascript else found
        if javascript:
            rows = tab.locator(ROWS).count()
            tab.locator(f"{more} a").click()
            expect(tab.locator(ROWS)).not_to_have_count(rows)
        else:
            url = tab.url
            tab.locator(f"{more} a").click()
            tab.wait_for_url(lambda now, url=url: now != url)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_a_namespaces_keys_sort_both_ways_by_each_column(
    browser: Any, server: str, keys: list[str], width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, f"/memory/{NAMESPACE}/", java_script_enabled=javascript)
    key_header = tab.locator("#memory-results th", has_text="Key")
    expect(key_header).to_have_attribute("aria-sort", "ascending")
    expect(key_header).to_be_visible()
    listed = _every_page(tab, "#memory-more", _listed_keys, javascript)
    assert listed == keys, "A to Z, each key once, markup shown as text"
    key_header.locator("a").click()
    tab.wait_for_url("**sort=-key")
    expect(tab.locator("#memory-results th[aria-sort=descending]")).to_contain_text("Key")
    assert _every_page(tab, "#memory-more", _listed_keys, javascript) == keys[::-1], "Z to A, on each page"
    # Updated: newest first on the first click (the last written is k00), then oldest first.
    tab.goto(tab.url.split("?")[0] + "?sort=-key")
    tab.locator("#memory-results th a", has_text="Updated").click()
    tab.wait_for_url("**sort=-updated")
    assert _listed_keys(tab)[:2] == keys[:2]
    download = tab.locator("a[download]", has_text="CSV").get_attribute("href")
    assert download.endswith("sort=-updated"), "the download keeps the order"
    tab.locator("#memory-results th[aria-sort=descending] a", has_text="Updated").click()
    tab.wait_for_url("**sort=updated")
    expect(tab.locator("#memory-results th[aria-sort=ascending]")).to_contain_text("Updated")
    assert _listed_keys(tab)[:2] == [keys[-1], keys[-2]]
    # The search box keeps the order it filters.
    tab.fill("input[name=q]", "k5")
    tab.press("input[name=q]", "Enter")
    tab.wait_for_url("**q=k5**")
    expect(tab.locator("#memory-results tbody tr:not(.more)")).to_have_count(10)
    assert _listed_keys(tab) == [key for key in keys if key.startswith("k5")][::-1]
    if javascript:
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / f"keys-by-update-{width}.png"), full_page=True)
    _close(tab, width)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_conversations_sort_both_ways_by_each_column(
    browser: Any, server: str, keys: list[str], width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, "/conversations/", java_script_enabled=javascript)
    results = tab.locator("#conversation-results")
    for label, word in (
        ("Messages", "messages"),
        ("Tokens", "tokens"),
        ("Started", "created"),
        ("Last activity", "updated"),
    ):
        results.locator("th a", has_text=label).click()
        tab.wait_for_url(f"**sort=-{word}")
        expect(results.locator("th[aria-sort=descending]")).to_contain_text(label)
        results.locator("th[aria-sort=descending] a").click()
        tab.wait_for_url(f"**sort={word}")
        expect(results.locator("th[aria-sort=ascending]")).to_contain_text(label)
    results.locator("th a", has_text="Messages").click()
    tab.wait_for_url("**sort=-messages")
    # The most messages first: the 130-message conversation with markup in its title.
    expect(results.locator("tbody tr").first).to_contain_text(f"Order {XSS}")
    results.locator("th a", has_text="Title").click()
    tab.wait_for_url("**sort=title")
    results.locator("th[aria-sort=ascending] a", has_text="Title").click()
    tab.wait_for_url("**sort=-title")
    cells = results.locator("tbody tr:not(.more) td:first-child > a")
    titles = [text.strip() for text in cells.all_inner_texts()]
    titled = [title for title in titles if title != "(untitled)"]
    assert titled == sorted(titled, reverse=True)
    _close(tab, width)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_a_conversations_messages_read_oldest_or_newest_first(
    browser: Any, server: str, keys: list[str], width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, "/conversations/c-order", java_script_enabled=javascript)
    order = tab.locator("#message-order")
    expect(order.locator("a[aria-current]")).to_have_text("oldest first")
    contents = tab.locator("ol.messages > li.message .content")
    expect(contents.first).to_have_text(f"turn 000 {XSS}")
    order.locator("a", has_text="newest first").click()
    tab.wait_for_url("**sort=-created")
    expect(order.locator("a[aria-current]")).to_have_text("newest first")
    expect(contents.first).to_have_text(f"turn 129 {XSS}")

    def turns(tab: Any) -> list[str]:
        texts = tab.locator("ol.messages > li.message .content").all_inner_texts()
        return [text.split()[1] for text in texts]

    shown = _every_page(tab, "#messages-more", turns, javascript)
    assert shown == [f"{n:03}" for n in reversed(range(130))], "every message once, newest first"
    # Each message keeps its number in the conversation.
    tab.goto(tab.url.split("?")[0] + "?sort=-created")
    expect(tab.locator("ol.messages > li.message .position").first).to_have_text("#130")
    _close(tab, width)


def _boxes(tab: Any) -> list[dict[str, float]]:
    return tab.locator(SECTIONS).evaluate_all("links => links.map(a => a.getBoundingClientRect().toJSON())")


@pytest.mark.parametrize("path", ["/", "/conversations/", "/settings"])
def test_the_header_keeps_its_sections_on_one_line_at_1280_px(browser: Any, server: str, path: str) -> None:
    tab = _tab(browser, server, DESKTOP, path)
    boxes = _boxes(tab)
    assert len(boxes) == 10 and tab.locator(SECTIONS).last.inner_text() == "Settings"
    tops = {round(box["top"]) for box in boxes}
    assert len(tops) == 1, f"the sections wrap onto {len(tops)} lines: {boxes}"
    _first_line_holds_the_rest(tab)
    _close(tab, DESKTOP)


def _first_line_holds_the_rest(tab: Any) -> None:
    """The brand, the site and the sign-out button share one line above the sections, none
    cut off: each sits inside the header and ends above the sections' line."""
    header = tab.locator("header.top").bounding_box()
    sections = tab.locator("nav[aria-label=Sections]").bounding_box()
    width = tab.viewport_size["width"]
    for selector in (".brand", ".site-current", "form.signout button"):
        box = tab.locator(f"header.top {selector}").bounding_box()
        assert box["y"] >= header["y"] and box["y"] + box["height"] <= sections["y"] + 1, selector
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, selector


@pytest.mark.parametrize("app", ["two sites"], indirect=True)
def test_with_the_site_switcher_the_header_stays_usable(browser: Any, server: str) -> None:
    tab = _tab(browser, server, DESKTOP, "/")
    expect(tab.locator("header.top .site-others a", has_text="blog")).to_be_visible()
    tops = {round(box["top"]) for box in _boxes(tab)}
    assert len(tops) == 1, "the sections stay on one line with the site switcher shown"
    _first_line_holds_the_rest(tab)
    tab.set_viewport_size({"width": PHONE, "height": 800})
    _first_line_holds_the_rest(tab)
    assert tab.evaluate("document.documentElement.scrollWidth") <= PHONE
    for link in tab.locator(SECTIONS).all():
        box = link.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE and box["height"] >= 18, box
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"header-two-sites-{PHONE}.png"))
    tab.set_viewport_size({"width": DESKTOP, "height": 800})
    tab.screenshot(path=str(ARTIFACTS / f"header-two-sites-{DESKTOP}.png"))
    _close(tab, DESKTOP)
