"""The Overview's charts, every page on a 375 px phone, the page shown without tables, and a
screenshot of every page at 1280 and 375 px in ``tests/artifacts/`` (named page-width.png)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from playwright.sync_api import expect

from clawmem.sql.schema import drop_tables
from dashboard import state
from tests.browser.test_dashboard_browser import ARTIFACTS, browser, page, server  # noqa: F401 (fixtures)
from tests.browser.test_sites_browser import _signed_in_at

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

PHONE, DESKTOP = 375, 1280
# Keys, namespaces, titles and messages with no place to break a line, and markup that must stay text.
LONG_KEY = "refund_" + "x" * 150 + "<b>"
LONG_NAMESPACE = "tenant-" + "n" * 90
LONG_WORD = "parcel" + "9" * 400
# Names the innermost elements that reach past the right edge, for the failure message.
WIDER_THAN_THE_SCREEN = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .filter(e => ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth + 1))
  .slice(0, 5).map(e => e.tagName + '.' + e.className)"""


@pytest.fixture
def hostile(app: Flask) -> dict[str, str]:
    """Demo data plus rows with long unbreakable keys, namespaces, titles and message words."""
    with app.app_context():
        memory = state.memory()
        memory.set(LONG_KEY, {"note": LONG_WORD, "where": "parcel desk"})
        memory.set(LONG_KEY, LONG_WORD, LONG_NAMESPACE, ttl=600)
        log = state.conversations()
        log.append(
            "c-long",
            [
                {"role": "user", "content": f"my parcel {LONG_WORD} is late"},
                {"role": "assistant", "content": LONG_WORD},
            ],
            user_id="u" * 150,
            title="T" * 200,
        )
        message = next(m for m in log.messages("c-long").items if m.role == "user")
    return {
        "overview": "/",
        "conversations": "/conversations/",
        "conversation": "/conversations/c-long",
        "turn": f"/conversations/c-long/turns/{message.id}",
        "subjects": "/subjects/",
        "subject": "/subjects/cust-1001",
        "long-subject": f"/subjects/{'u' * 150}",
        "by-tokens": "/conversations/?sort=-tokens",
        "memory": "/memory/",
        "memory-search": "/memory/?q=refund_",
        "namespace": "/memory/default/",
        "long-namespace": f"/memory/{LONG_NAMESPACE}/",
        "entry": f"/memory/default/entry?key={quote(LONG_KEY)}",
        "preview": f"/preview?message=my+parcel+{LONG_WORD}",
        "cold": "/cold",
        "sites": "/sites/",
        "settings": "/settings",
        "not-found": "/no-such-page",
    }


def _tab(browser: Any, server: str, width: int, **options: Any) -> Any:
    """A tab ``width`` px wide, signed in, on the Overview."""
    return _signed_in_at(browser, server, "/", viewport={"width": width, "height": 800}, **options)[1]


@pytest.fixture
def phone(browser: Any, server: str) -> Iterator[Any]:
    """A signed-in tab 375 px wide; fails the test on a CSP violation or a JS error."""
    tab = _tab(browser, server, PHONE)
    problems: list[str] = []
    tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    yield tab
    tab.context.close()
    assert [p for p in problems if "404" not in p] == [], problems


def test_the_overview_draws_its_charts_with_a_table_behind_each(page: Any) -> None:
    charts = page.locator("figure.chart")
    expect(charts.filter(has_text="Messages per day").locator("svg.plot rect.bar")).to_have_count(30)
    for title in ("Conversations stored", "Memory rows stored"):
        expect(charts.filter(has_text=title).locator("svg.plot polyline.line")).to_have_count(1)
    messages = charts.filter(has_text="Messages per day")
    table = messages.locator("details.chart-data table")
    expect(table).to_be_hidden()
    messages.locator("summary", has_text="As a table").click()
    expect(table).to_be_visible()
    expect(table.locator("tbody tr")).to_have_count(30)
    # The tallest bar is the busiest day of the table.
    values = [int(v) for v in table.locator("td.num").all_inner_texts()]
    heights = [
        float(h)
        for h in messages.locator("rect.bar").evaluate_all(
            "bars => bars.map(bar => bar.getAttribute('height'))"
        )
    ]
    assert values.index(max(values)) == heights.index(max(heights)) and max(heights) == 100
    box = messages.locator("svg.plot").bounding_box()
    assert box["width"] > 200 and box["height"] > 100, box
    ttl = charts.filter(has_text="TTL states per namespace")
    default = ttl.locator("tr", has=page.locator("code", has_text="default"))
    expect(default.locator("rect.seg.expired")).to_have_count(1)
    assert default.locator("td.num").all_inner_texts() == ["8", "2", "2"]
    injected = charts.filter(has_text="Most and least injected keys")
    expect(injected.locator("table.bars").first.locator("rect.seg.injected").first).to_be_visible()
    injected.locator("a", has_text="cold memory").click()
    expect(page.locator("h1")).to_have_text("Cold memory")


def test_the_charts_say_everything_without_javascript(browser: Any, server: str) -> None:
    tab = _tab(browser, server, DESKTOP, java_script_enabled=False)
    tab.locator("summary", has_text="As a table").first.click()
    expect(tab.locator("details.chart-data").first.locator("tbody tr")).to_have_count(30)
    labels = tab.locator("svg.plot[role=img]").evaluate_all(
        "svgs => svgs.map(svg => svg.getAttribute('aria-label'))"
    )
    # Messages, conversations, memory rows and the tokens billed (the demo's providers report usage).
    assert len(labels) == 4 and all("the table below has every day" in label for label in labels)
    tab.context.close()


def test_no_page_scrolls_sideways_on_a_phone(phone: Any, server: str, hostile: dict[str, str]) -> None:
    for name, path in hostile.items():
        phone.goto(f"{server}{path}")
        width = phone.evaluate("document.documentElement.scrollWidth")
        wide = phone.evaluate(WIDER_THAN_THE_SCREEN)
        assert width <= PHONE, f"{name} ({path[:60]}) is {width} px wide on a {PHONE} px phone: {wide}"
    phone.goto(f"{server}/memory/default/")
    # A list is a card per row there, not a table pushed into three-character columns.
    key = phone.locator("td:first-child", has=phone.locator("code", has_text="refund_xxx"))
    assert key.bounding_box()["width"] > 250
    assert "<b>" in key.inner_text(), "markup in a key stays text"


def test_without_tables_every_page_says_which_command_creates_them(
    app: Flask, browser: Any, server: str, prefix: str
) -> None:
    tab = _tab(browser, server, DESKTOP)
    with app.app_context():
        drop_tables(state.engine(), prefix)
    for path in ("/", "/conversations/", "/memory/", "/cold"):
        response = tab.goto(f"{server}{path}")
        assert response.status == 503
        expect(tab.locator("h1")).to_have_text("503 Service Unavailable")
        expect(tab.locator("pre.command")).to_have_text(re.compile(r" claw init-db$"))
        expect(tab.locator("main")).to_contain_text("tables do not exist yet")
    tab.click("text=Check the settings")
    expect(tab.locator("h1")).to_have_text("Settings")
    tab.goto(f"{server}/")
    _save(tab, "no-tables", DESKTOP)
    tab.set_viewport_size({"width": PHONE, "height": 800})
    assert tab.evaluate("document.documentElement.scrollWidth") <= PHONE
    _save(tab, "no-tables", PHONE)
    tab.context.close()


def _save(tab: Any, name: str, width: int) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [DESKTOP, PHONE])
def test_a_screenshot_of_every_page(
    browser: Any, server: str, hostile: dict[str, str], width: int, scheme: str
) -> None:
    tab = _tab(browser, server, width, color_scheme=scheme)
    suffix = "" if scheme == "light" else "-dark"
    for name, path in hostile.items():
        tab.goto(f"{server}{path}")
        expect(tab.locator("h1")).to_be_visible()
        _save(tab, f"{name}{suffix}", width)
        # Unbreakable keys, titles and words wrap at either width, never widening the page.
        wide = tab.evaluate(WIDER_THAN_THE_SCREEN)
        assert tab.evaluate("document.documentElement.scrollWidth") <= width, (name, wide)
    background = tab.evaluate("getComputedStyle(document.body).backgroundColor")
    assert (background == "rgb(255, 255, 255)") == (scheme == "light"), background
    tab.context.close()
    saved = {path.name for path in ARTIFACTS.glob(f"*-{width}.png")}
    assert {f"{name}{suffix}-{width}.png" for name in hostile} <= saved


def _mention(app: Flask) -> None:
    with app.app_context():
        state.memory().set("callback-note", "ring cust-1001 back about the refund", "default")


def test_the_subject_page_lists_its_mentions_after_the_page_by_itself(
    app: Flask, page: Any, server: str
) -> None:
    _mention(app)
    page.goto(f"{server}/subjects/cust-1001")
    mentions = page.locator("#subject-mentions")
    expect(mentions.locator("code", has_text="callback-note")).to_be_visible()
    expect(mentions).to_contain_text("1 entry elsewhere mentions this id.")
    assert "mentions=1" not in page.url, "the section is filled in on the page itself"


def test_without_javascript_the_mentions_link_shows_the_page_with_them(
    app: Flask, browser: Any, server: str
) -> None:
    _mention(app)
    context, tab = _signed_in_at(browser, server, "/subjects/cust-1001", java_script_enabled=False)
    assert "callback-note" not in tab.inner_text("#subject-mentions")
    tab.click("#subject-mentions a")
    tab.wait_for_url(f"{server}/subjects/cust-1001?mentions=1#mentions-heading")
    expect(tab.locator("#subject-mentions code", has_text="callback-note")).to_be_visible()
    expect(tab.locator("h1")).to_contain_text("cust-1001")
    context.close()
