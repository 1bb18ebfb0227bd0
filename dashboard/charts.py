"""The Overview's charts as plain data: bar heights, line points and bar shares for the templates.

Charts are SVG drawn by ``templates/overview/_charts.html`` from these numbers, styled by
``app.css``: no chart library, no inline script or style, so the strict Content-Security-Policy
holds, and every chart's numbers also go to a table for screen readers and text browsers.
Geometry is in a 0..100 box stretched to the chart's size; words stay in HTML, never in the SVG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from itertools import accumulate

BOX = 100.0


@dataclass(frozen=True)
class Bar:
    """One bar of a column chart: its label, value and rectangle in the 0..100 box."""

    label: str
    value: int
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Share:
    """One segment of a horizontal bar: its state, count and extent in percent of the widest row."""

    state: str
    words: str
    value: int
    start: float
    width: float


def _scale(values: Sequence[int]) -> int:
    return max(max(values, default=0), 1)


def columns(labels: Sequence[str], values: Sequence[int], gap: float = 0.2) -> list[Bar]:
    """Return one :class:`Bar` per value, side by side, heights relative to the largest value."""
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    top = _scale(values)
    step = BOX / max(len(values), 1)
    bars = []
    for number, (label, value) in enumerate(zip(labels, values, strict=True)):
        height = round(BOX * max(value, 0) / top, 2)
        bars.append(
            Bar(
                label,
                value,
                round(number * step + step * gap / 2, 2),
                round(BOX - height, 2),
                round(step * (1 - gap), 2),
                height,
            )
        )
    return bars


def line_points(values: Sequence[int]) -> str:
    """Return an SVG ``points`` list drawing ``values`` left to right, scaled to the largest."""
    if not values:
        return ""
    top = _scale(values)
    step = BOX / max(len(values) - 1, 1)
    return " ".join(
        f"{round(number * step, 2)},{round(BOX - BOX * max(value, 0) / top, 2)}"
        for number, value in enumerate(values)
    )


def totals_over_time(total_now: int, added_per_day: Sequence[int]) -> list[int]:
    """Return the rows there were at the end of each day, from today's ``total_now`` and how
    many of today's rows were added on each day (oldest first): rows since deleted are not seen."""
    added_after = list(accumulate(reversed(added_per_day)))[::-1][1:] + [0]
    return [max(total_now - later, 0) for later in added_after]


def shares(parts: Sequence[tuple[str, str, int]], widest: int) -> list[Share]:
    """Return the segments of one stacked bar of ``(state, words, count)`` parts, in percent of
    ``widest`` (the largest row's total), leaving out empty parts."""
    scale = max(widest, 1)
    found, start = [], 0.0
    for state, words, value in parts:
        if value <= 0:
            continue
        width = round(BOX * value / scale, 2)
        found.append(Share(state, words, value, round(start, 2), width))
        start += width
    return found


def day_label(day: date) -> str:
    """Return a short label for a chart's day: ``1 Dec``."""
    return f"{day.day} {day:%b}"
