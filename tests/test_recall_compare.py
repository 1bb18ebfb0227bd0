"""Two scorings side by side on one message: recall's comparison, and the preview that shows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from clawmem.memory.array import ArrayMemory
from clawmem.recall.compare import compare
from clawmem.settings import Settings
from dashboard import state
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

NOTES = {
    "team": "Ann went out with the team",
    "cat": "Ann went after the cat",
    "move": "Ann moved to Toronto",
}
ASKED = "Where did Ann go when she went to Toronto?"


def _settings(tmp_path: Path, **environ: str) -> Settings:
    return Settings.from_env({"CLAW_MEMORY_DRIVER": "array", **environ}, tmp_path)


def test_what_each_scoring_injects_and_what_one_gains_or_loses(tmp_path: Path) -> None:
    memory = ArrayMemory()
    for key, value in NOTES.items():
        memory.set(key, value)
    settings = _settings(tmp_path, CLAW_RECALL_TOP_K="1")
    found = compare(memory, settings, ASKED, ["clawmem", "weighted"])
    # overlap: every note shares two words, so the first key wins; weighted: Toronto is rare (and
    # the words the question is built with, where, did, when, she, count for nothing)
    assert [d.key for d in found.first.injected] == ["cat"]
    assert [d.key for d in found.second.injected] == ["move"]
    assert [d.key for d in found.gained] == ["move"] and [d.key for d in found.lost] == ["cat"]
    assert found.kept == () and not found.same
    assert dict(found.second.injected[0].signals)["words"].startswith("ann ")
    same = compare(memory, settings, ASKED, ["weighted", "weighted"])
    assert same.same and same.gained == same.lost == () and [d.key for d in same.kept] == ["move"]


def test_the_floor_applies_to_the_configured_scoring_only(tmp_path: Path) -> None:
    memory = ArrayMemory()
    for key, value in NOTES.items():
        memory.set(key, value)
    settings = _settings(tmp_path, CLAW_RECALL_SCORING="weighted", CLAW_RECALL_MIN_SCORE="0.8")
    found = compare(memory, settings, ASKED, ["weighted", "clawmem"])
    assert [d.key for d in found.first.injected] == ["move"]  # 1.11; the others 0.60
    assert [d.key for d in found.second.injected] == ["cat", "move", "team"]  # 2 words each


@pytest.mark.parametrize("scorings", [["clawmem", "fuzzy"], ["clawmem"]])
def test_a_bad_pair_of_scorings_is_refused(tmp_path: Path, scorings: list[str]) -> None:
    with pytest.raises(ValueError, match="fuzzy|exactly two"):
        compare(ArrayMemory(), _settings(tmp_path), ASKED, scorings)


INJECTED = re.compile(r'<li><a href="[^"]+"><code>([^<]+)</code>')
CHANGE = re.compile(r'<li class="(gained|lost)">[^<]*<code>weighted</code>: <a href="[^"]+"><code>([^<]+)')
SIDE = re.compile(r'<div class="side side-(\d)">\s*<h3><code>([^<]+)</code>.*?</div>', re.S)


def test_the_preview_shows_both_scorings_side_by_side(app: Flask, signed_in: FlaskClient) -> None:
    with app.app_context():
        for key, value in {**NOTES, "dog": "Ann went after the dog"}.items():
            state.memory().set(key, value)
        state.memory().set("<b>bold</b>", "Ann <script>alert(1)</script> to Toronto")
    plain = page_text(signed_in.get("/preview", query_string={"message": ASKED}))
    assert 'class="comparison"' not in plain and '<option value="weighted">weighted</option>' in plain
    body = page_text(signed_in.get("/preview", query_string={"message": ASKED, "compare": "weighted"}))
    sides = {m.group(1): (m.group(2), m.group(0)) for m in SIDE.finditer(body)}
    assert sides["1"][0] == "clawmem" and sides["2"][0] == "weighted"
    injected = {n: INJECTED.findall(block) for n, (_, block) in sides.items()}
    bold = "&lt;b&gt;bold&lt;/b&gt;"
    assert injected == {"1": [bold, "cat", "dog"], "2": [bold, "move", "cat"]}
    assert CHANGE.findall(body) == [("gained", "move"), ("lost", "dog")]
    assert re.search(r"words: ann \d\.\d{3}, toronto \d\.\d{3}<", sides["2"][1])  # each word's weight
    assert "<script>alert(1)</script>" not in body
    assert '<option value="weighted" selected>weighted</option>' in body


def test_an_unknown_scoring_to_compare_with_is_named_in_the_page(signed_in: FlaskClient) -> None:
    response = signed_in.get("/preview", query_string={"message": ASKED, "compare": "<i>fuzzy</i>"})
    assert response.status_code == 200
    body = page_text(response)
    assert "There is no scoring &#39;&lt;i&gt;fuzzy&lt;/i&gt;&#39;" in body
    assert 'class="comparison"' not in body
