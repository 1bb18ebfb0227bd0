"""Both colour schemes of the stylesheet: the dark one follows ``prefers-color-scheme``, and every
text colour meets WCAG AA contrast (4.5:1) on every background it is drawn on, in both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSS = (Path(__file__).resolve().parent.parent / "static" / "app.css").read_text()

# (text, background) pairs the stylesheet draws.
PAIRS = [
    *((text, back) for text in ("ink", "muted", "accent", "ok", "warn", "bad") for back in ("bg", "panel")),
    *(("ink", back) for back in ("notice-bg", "alert-bg", "mark", "summarised-bg")),
    ("muted", "notice-bg"),
    ("warn", "notice-bg"),
    ("bad", "alert-bg"),
    ("accent", "notice-bg"),
    ("on-accent", "accent"),
    *((text, "head") for text in ("head-ink", "head-muted", "head-link")),
]


def _variables(block: str) -> dict[str, str]:
    return dict(re.findall(r"--([a-z-]+):\s*(#[0-9a-fA-F]{6})\s*;", block))


def _schemes() -> dict[str, dict[str, str]]:
    light = _variables(CSS.split("@media (prefers-color-scheme: dark)")[0])
    dark_block = re.search(r"@media \(prefers-color-scheme: dark\)\s*\{\s*:root\s*\{(.*?)\}", CSS, re.S)
    assert dark_block, "a dark scheme follows prefers-color-scheme"
    return {"light": light, "dark": {**light, **_variables(dark_block.group(1))}}


def _luminance(colour: str) -> float:
    def channel(hex_pair: str) -> float:
        value = int(hex_pair, 16) / 255
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    red, green, blue = (channel(colour[index : index + 2]) for index in (1, 3, 5))
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def contrast(first: str, second: str) -> float:
    """Return the WCAG contrast ratio of two ``#rrggbb`` colours."""
    high, low = sorted((_luminance(first), _luminance(second)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_text_colour_meets_aa_contrast_on_its_backgrounds(scheme: str) -> None:
    colours = _schemes()[scheme]
    weak = {
        f"{text} on {back}": round(contrast(colours[text], colours[back]), 2)
        for text, back in PAIRS
        if contrast(colours[text], colours[back]) < 4.5
    }
    assert not weak, weak


def test_the_dark_scheme_changes_every_colour_and_no_rule_hard_codes_one() -> None:
    schemes = _schemes()
    assert set(schemes["dark"]) == set(schemes["light"])
    kept = {name for name, value in schemes["light"].items() if schemes["dark"][name] == value}
    assert kept <= {"head-ink"}, kept
    rules = re.sub(r"--[a-z-]+:\s*#[0-9a-fA-F]{6};", "", CSS)
    assert not re.findall(r"#[0-9a-fA-F]{3,6}\b", rules), "colours come from the variables"
    assert "color-scheme: light dark" in CSS
