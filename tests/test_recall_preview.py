"""The dashboard's preview of a turn, built on the word index: the words each entry matched and
the count of entries sharing none, as a scan of the backend gives them."""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.sql.schema import tables
from tests.conformance.worlds import KEYS, VOCABULARY, Turn, expected_turn
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

DECISION_ROW = re.compile(
    r'<tr class="decision (\w+)">\s*<td><a href="[^"]+"><code>([^<]*)</code></a></td>\s*'
    r'<td class="num">(\d+)</td>\s*<td class="matched">([^<]*)</td>'
)
ZERO_OVERLAP = re.compile(r'<span class="zero-overlap">(\d+)</span>')
AUGMENTED = re.compile(r'<pre class="augmented">(.*?)</pre>', re.S)
MORE = re.compile(r'id="decisions-more".*?href="([^"]+)"', re.S)


@dataclass(frozen=True)
class Preview:
    """What one preview page shows: the text, its decision rows (key, score, matched words)
    and the zero-overlap count."""

    text: str
    rows: list[tuple[str, int, str]]
    zero_overlap: int
    more: str | None


def read_preview(body: str) -> Preview:
    text = AUGMENTED.search(body)
    zero = ZERO_OVERLAP.search(body)
    more = MORE.search(body)
    assert text and zero, body[:2000]
    rows = [
        (html.unescape(key), int(score), html.unescape(words))
        for _, key, score, words in DECISION_ROW.findall(body)
    ]
    return Preview(
        html.unescape(text.group(1)), rows, int(zero.group(1)), html.unescape(more.group(1)) if more else None
    )


def expected_rows(turn: Turn) -> list[tuple[str, int, str]]:
    return [(d.key, d.score, ", ".join(d.matched)) for d in turn.decisions]


def test_the_preview_shows_the_tokenisers_matched_words_and_zero_overlap_count(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, prefix: str
) -> None:
    import random

    from dashboard import state

    rng = random.Random(10)
    with app.app_context():
        driver = state.driver()
        engine = state.engine()
        for number in range(160):
            chosen = rng.sample(VOCABULARY, rng.randint(0, 4))
            value: Any = " ".join(chosen) if number % 3 else {rng.choice(VOCABULARY): chosen, "n": number}
            key = f"{rng.choice(KEYS)}-{number}"
            driver.set(key, value, "default", rng.choice([None, None, 60, 600]))
        # Rows another program wrote, in its own JSON.
        table = tables(prefix).memory
        stamp = utc_datetime(clock)
        with engine.begin() as conn:
            for number in range(20):
                value = {"Tea": ["CAFÉ", "straße"], "n": number} if number % 2 else "Don’t STRASSE well-known"
                conn.execute(
                    sa.insert(table).values(
                        id=new_id(),
                        namespace="default",
                        lookup_key=f"program-{number}",
                        value=json.dumps(value),
                        expires_at=None,
                        created_at=stamp,
                        updated_at=stamp,
                    )
                )
    signed_in.get("/preview", query_string={"message": "warm the index up"})
    clock.advance(61)  # some entries expired since the index was built
    message = "Tea? Don't forget the CAFÉ, strasse and well-known 123 refunds: user_123 ox"
    with app.app_context():
        rows = {row.key: (row.value, row.expires_at) for row in state.driver().records()}
    expected = expected_turn([("default", rows)], message, 3, 4096, math.floor(clock()))
    assert len(expected.decisions) > 50 and expected.zero_overlap > 0  # two pages, and some share none
    shown = read_preview(page_text(signed_in.get("/preview", query_string={"message": message})))
    assert shown.text == expected.text
    assert shown.zero_overlap == expected.zero_overlap
    pages = shown.rows
    more = shown.more
    while more:
        page = read_preview(page_text(signed_in.get(more)))
        pages += page.rows
        more = page.more
    assert pages == expected_rows(expected)
