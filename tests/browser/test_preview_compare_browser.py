"""The preview's two scorings side by side in a real Chromium: chosen with htmx or by a plain
form without JS, at a desktop and a phone width, with hostile keys and values."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from playwright.sync_api import expect

from dashboard import state
from tests.browser.test_dashboard_browser import ARTIFACTS, browser, server  # noqa: F401 (fixtures)
from tests.browser.test_overview_and_phones import LONG_WORD
from tests.browser.test_sites_browser import _signed_in_at

pytest_plugins = ["tests.dashboard_fixtures"]
pytestmark = pytest.mark.browser

ASKED = "glimmer vortal zelda quarzburg"  # words no demo entry holds
HOSTILE_KEY = "<img src=x onerror=alert(1)>" + "k" * 120


@pytest.fixture
def notes(app: Flask) -> None:
    with app.app_context():
        memory = state.memory()
        for key, value in {
            "team": "glimmer vortal team",
            "cat": "glimmer vortal cat",
            "dog": "glimmer vortal dog",
            "move": "zelda moved to quarzburg",
            HOSTILE_KEY: f"<script>alert(2)</script> {LONG_WORD} zelda quarzburg",
        }.items():
            memory.set(key, value)


@pytest.mark.parametrize("width", [1280, 375])
@pytest.mark.parametrize("javascript", [True, False])
def test_two_scorings_side_by_side(
    browser: Any, server: str, notes: None, width: int, javascript: bool
) -> None:
    context, tab = _signed_in_at(
        browser,
        server,
        f"/preview?message={quote(ASKED)}",
        viewport={"width": width, "height": 900},
        java_script_enabled=javascript,
    )
    dialogs: list[str] = []
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(str(error)))
    expect(tab.locator("section.comparison")).to_have_count(0)
    tab.select_option("select[name=compare]", "weighted")
    if not javascript:
        tab.click("form.preview button[type=submit]")
    sides = tab.locator("section.comparison .side")
    expect(sides).to_have_count(2)
    expect(sides.nth(0).locator("h3")).to_have_text("clawmem (configured)")
    expect(sides.nth(1).locator("h3")).to_have_text("weighted")
    # overlap: two words each, by key; weighted: zelda and quarzburg are rarer than the others
    first = sides.nth(0).locator("ol.injected > li > a > code")
    second = sides.nth(1).locator("ol.injected > li > a > code")
    expect(first).to_have_text([HOSTILE_KEY, "cat", "dog"])
    expect(second).to_have_text([HOSTILE_KEY, "move", "cat"])
    expect(tab.locator(".changes .gained")).to_contain_text("move")
    expect(tab.locator(".changes .lost")).to_contain_text("dog")
    assert sides.nth(1).locator(".signals").first.inner_text().startswith("words: zelda ")
    expect(sides.nth(0).locator("code", has_text="onerror")).to_have_count(1)  # the key shown as text
    assert tab.locator("section.comparison img").count() == 0
    boxes = [sides.nth(n).bounding_box() for n in range(2)]
    if width == 1280:
        assert boxes[0]["y"] == boxes[1]["y"] and boxes[0]["x"] < boxes[1]["x"], "side by side"
    else:
        assert boxes[1]["y"] > boxes[0]["y"], "one above the other on a phone"
    right = tab.locator("section.comparison").evaluate(
        "section => Math.max(...[section, ...section.querySelectorAll('*')]"
        ".map(e => e.getBoundingClientRect().right))"
    )
    assert right <= width, f"the comparison reaches {right} px at {width}"
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(
        path=str(ARTIFACTS / f"preview-compare-{width}{'' if javascript else '-nojs'}.png"), full_page=True
    )
    context.close()
    assert dialogs == [] and problems == []
