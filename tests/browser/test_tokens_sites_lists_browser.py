"""In a real Chromium at 1280 and 375 px, with and without JavaScript: the Overview's tokens,
the Sites page over two sites, the list downloads, sorting by tokens both ways and the search
across namespaces, with hostile text that must stay text."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from playwright.sync_api import expect

from clawmem.clock import FakeClock
from clawmem.providers.echo import EchoProvider
from clawmem.sql.schema import create_tables, tables
from clawmem.turn.conversations import Message
from clawmem.turn.pipeline import Claw
from dashboard import state
from tests.browser.test_dashboard_browser import ARTIFACTS, browser, server  # noqa: F401 (fixtures)
from tests.browser.test_sites_browser import _signed_in_at

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

PHONE, DESKTOP = 375, 1280
XSS = "<img src=x onerror=\"document.title='pwned'\">"
FORMULA_TITLE = '=HYPERLINK("http://evil.example","refund")'
BLOG = "quillfeather"


@pytest.fixture
def app(make_app: Callable[..., Flask], prefix: str, clock: FakeClock) -> Flask:
    """Two sites, ``shop`` (the demo, loaded by the ``demo`` fixture, plus hostile rows) and
    ``blog`` with a few rows of its own."""
    built = make_app(SITES=f"shop={prefix},blog={prefix}b_")
    with built.app_context():
        blog = state.sites_of(built)["blog"]
        create_tables(blog.engine, blog.prefix)
        blog.memory.set(f"{BLOG}_policy", f"{BLOG} posts go out on fridays")
        claw = Claw.from_settings(blog.settings, EchoProvider(), clock)
        claw.send(f"{BLOG} question about drafts", user_id=f"{BLOG}-reader")
    return built


@pytest.fixture
def hostile_rows(app: Flask, demo: None, clock: FakeClock) -> None:
    with app.app_context():
        log = state.conversations()
        usage = {"prompt_tokens": 900_000, "completion_tokens": 1, "total_tokens": 900_001}
        log.append(
            "c-hostile",
            [Message("user", f"refund {XSS}"), Message("assistant", "ok", metadata={"usage": usage})],
            user_id=f"cust-{XSS}",
            title=FORMULA_TITLE,
            tokens=900_001,
        )
        state.memory().set(f"parcel-{XSS}", f"parcel {XSS}", "user:cust-77")


def _tab(browser: Any, server: str, width: int, path: str = "/", **options: Any) -> Any:
    context, tab = _signed_in_at(browser, server, path, viewport={"width": width, "height": 900}, **options)
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.problems = problems
    return tab


def _close(tab: Any) -> None:
    assert tab.problems == [], tab.problems
    assert tab.title() != "pwned"
    tab.context.close()


def _fits(tab: Any, width: int) -> None:
    if tab.evaluate("document.documentElement.scrollWidth") > width:
        _save(tab, "too-wide", width)
    assert tab.evaluate("document.documentElement.scrollWidth") <= width, tab.url


def _save(tab: Any, name: str, width: int) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)


def _tokens(app: Flask) -> int:
    with app.app_context():
        schema = tables(state.settings().table_prefix)
        with state.engine().connect() as conn:
            return int(conn.execute(sa.select(sa.func.sum(schema.conversations.c.total_tokens))).scalar())


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_the_overview_shows_tokens_billed_and_a_chart_of_them(
    app: Flask, browser: Any, server: str, hostile_rows: None, width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, java_script_enabled=javascript)
    total = tab.locator("p.tokens-total")
    expect(total).to_contain_text(f"Tokens billed, over every stored conversation: {_tokens(app)}")
    chart = tab.locator("figure.chart", has_text="Tokens billed per day")
    expect(chart.locator("svg.plot rect.bar")).to_have_count(30)
    chart.locator("summary", has_text="As a table").click()
    cells = chart.locator("tbody td.num").all_inner_texts()
    assert len(cells) == 30 and "0" not in cells and "not reported" in cells
    assert int(cells[-1]) >= 900_001  # today's turn of the hostile row
    _fits(tab, width)
    # The caption lines of the four charts start their plots at one height.
    tops = tab.locator("figure.chart svg.plot").evaluate_all(
        "svgs => svgs.map(s => s.getBoundingClientRect().top)"
    )
    if width == DESKTOP:
        assert len(set(round(top) for top in tops[:2])) == 1, tops
    total.locator("a", has_text="conversations by tokens").click()
    expect(tab.locator("h1")).to_have_text("Conversations")
    expect(tab.locator("th[aria-sort=descending]")).to_contain_text("Tokens")
    first = tab.locator("table.list tbody tr").first
    expect(first).to_contain_text("900001")
    if javascript and width == DESKTOP:
        _save(tab, "by-tokens-hostile", width)
    _close(tab)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_sorting_by_tokens_turns_around_and_keeps_the_site(
    browser: Any, server: str, hostile_rows: None, width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, "/conversations/?sort=-tokens", java_script_enabled=javascript)

    def shown() -> list[int | None]:
        cells = tab.locator("table.list tbody tr:not(.more) td.num[data-label=Tokens]").all_inner_texts()
        return [
            int(text.split()[0]) if text.split()[0].isdigit() else None
            for text in (cell.replace("Tokens:", "").strip() for cell in cells)
        ]

    most = shown()
    reported = [value for value in most if value is not None]
    assert reported == sorted(reported, reverse=True) and reported[0] == 900_001
    tab.locator("th[aria-sort=descending] a", has_text="Tokens").click()
    tab.wait_for_url("**sort=tokens")
    expect(tab.locator("th[aria-sort=ascending]")).to_contain_text("Tokens")
    fewest = [value for value in shown() if value is not None]
    assert fewest == sorted(fewest) and fewest[0] <= reported[-1]
    _fits(tab, width)
    _close(tab)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_the_sites_page_answers_whether_one_site_sees_another(
    browser: Any, server: str, prefix: str, width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, "/sites/", java_script_enabled=javascript)
    expect(tab.locator("header nav.sites")).to_contain_text("Site: shop")
    rule = "never reads, writes, sweeps or deletes another site's data"
    expect(tab.locator("p.rule")).to_contain_text(rule)
    check = tab.locator("section", has=tab.locator("#check-heading"))
    expect(check).to_contain_text("No: this site's stores saw none of the other sites' entries")
    row = check.locator("tbody tr", has_text="blog")
    expect(row).to_contain_text("apart")
    expect(row.locator("td[data-label='Entries looked up']")).to_contain_text("1")
    expect(row.locator("td[data-label='Conversations looked up']")).to_contain_text("1")
    prefixes = tab.locator("section", has=tab.locator("#prefixes-heading"))
    expect(prefixes.locator("tr", has_text=f"{prefix}b_")).to_contain_text("yes, as blog")
    _fits(tab, width)
    # The labels of the stacked rows stay beside their numbers on a phone.
    if width == PHONE:
        label = row.locator("td[data-label='Entries looked up']").evaluate(
            "cell => getComputedStyle(cell, '::before').content"
        )
        assert "Entries looked up" in label
    _save(tab, f"sites{'' if javascript else '-nojs'}", width)
    tab.locator("header nav.sites a", has_text="blog").click()
    tab.wait_for_url("**/sites/?site=blog")
    other = tab.locator("section", has=tab.locator("#check-heading")).locator("tbody tr")
    expect(other).to_contain_text("shop")
    _close(tab)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_a_filtered_list_downloads_as_csv_and_json_safe_for_spreadsheets(
    browser: Any, server: str, hostile_rows: None, width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, "/conversations/", java_script_enabled=javascript)
    tab.fill("input[name=user_id]", f"cust-{XSS}")
    tab.press("input[name=user_id]", "Enter")
    expect(tab.locator("p.count")).to_contain_text("1 conversation match")
    _fits(tab, width)
    with tab.expect_download() as started:
        tab.locator("p.downloads a", has_text="CSV").click()
    text = Path(started.value.path()).read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert [(row["title"], row["user_id"], row["total_tokens"]) for row in rows] == [
        ("'" + FORMULA_TITLE, f"cust-{XSS}", "900001")
    ]
    with tab.expect_download() as started:
        tab.locator("p.downloads a", has_text="JSON").click()
    document = json.loads(Path(started.value.path()).read_text(encoding="utf-8"))
    assert [row["title"] for row in document["rows"]] == [FORMULA_TITLE] and document["truncated"] is False
    expect(tab.locator("p.downloads")).to_contain_text("at most 10000 rows")
    _close(tab)


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("javascript", [True, False])
def test_one_search_spans_every_namespace(
    browser: Any, server: str, hostile_rows: None, width: int, javascript: bool
) -> None:
    tab = _tab(browser, server, width, "/memory/", java_script_enabled=javascript)
    tab.fill("input[name=q]", "parcel")
    tab.press("input[name=q]", "Enter")
    tab.wait_for_url("**/memory/?*q=parcel*")
    results = tab.locator("section", has=tab.locator("#search-heading"))
    expect(results).to_contain_text("Entries holding")
    namespaces = set(results.locator("tbody tr td:first-child code").all_inner_texts())
    assert "user:cust-77" in namespaces, namespaces
    key = results.locator("tr", has_text="user:cust-77").locator("td[data-label=Key] code")
    expect(key).to_contain_text("<img src=x")  # markup stays text
    assert tab.locator("img[src=x]").count() == 0
    _fits(tab, width)
    _save(tab, f"memory-search{'' if javascript else '-nojs'}", width)
    key.click()
    expect(tab.locator("h1")).to_contain_text("parcel-")
    _close(tab)
