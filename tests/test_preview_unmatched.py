"""The preview's list of entries that share no word with the message (the indexed-recall issue,
deliverable 2): exactly the live entries a reference scores 0 with the tokeniser, keyset-paged
by key, with the count the preview shows, on SQLite and PostgreSQL."""

from __future__ import annotations

import html
import json
import random
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.recall.injection import line_bytes
from clawmem.recall.phpclaw import phpclaw_keywords, phpclaw_text
from clawmem.recall.words import keywords, text_of
from clawmem.sql.schema import tables
from dashboard import accounts, state
from dashboard.views import recall as view
from dashboard.views.rendering import format_bytes, format_duration
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

VOCABULARY = [
    "tea",
    "Tea",
    "green",
    "coffee",
    "café",
    "CAFÉ",
    "don't",
    "don’t",
    "well-known",
    "user_123",
    "漢字テスト",
    "ox",
    "shipping",
    "policy",
    "straße",
    "STRASSE",
    "refund",
    "parcel",
    "null",
    "true",
]
KEYS = ["tea", "Zeta", "green_tea", "café", "ärger", "a", "order-7", "shipping policy", "zz", "Ω"]
MESSAGE = "Tea? Don't forget the CAFÉ, strasse and well-known refunds: user_123 ox"
ZERO_OVERLAP = re.compile(r'<span class="zero-overlap">(\d+)</span>')
LINK = re.compile(r'<a class="unmatched-link" href="([^"]+)"')
COUNT = re.compile(r'<span class="unmatched-count">(\d+)</span>')
ROW = re.compile(
    r'<tr class="unmatched-entry"><td><a href="[^"]+"><code>([^<]*)</code></a></td>'
    r'<td class="num">([^<]*)</td><td>([^<]*)</td></tr>'
)
MORE = re.compile(r'id="unmatched-more".*?href="([^"]+)"', re.S)


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 7 entries, so that a few hundred entries make several."""
    monkeypatch.setattr(view, "UNMATCHED_PAGE_SIZE", 7)


def _fill(clock: FakeClock, prefix: str) -> None:
    """Store 200 entries (some with a TTL, some as another program writes them), then let some
    expire."""
    chooser = random.Random(4)
    driver = state.driver()
    for number in range(180):
        chosen = chooser.sample(VOCABULARY, chooser.randint(0, 3))
        value: Any = " ".join(chosen) if number % 3 else {"n": number, "words": chosen}
        ttl = chooser.choice([None, None, 60, 600])
        driver.set(f"{chooser.choice(KEYS)}-{number}", value, "default", ttl)
    stamp = utc_datetime(clock)
    with state.engine().begin() as conn:
        for number in range(20):
            value = {"Tea": ["CAFÉ"], "n": number} if number % 2 else f"plain note {number}"
            conn.execute(
                sa.insert(tables(prefix).memory).values(
                    id=new_id(),
                    namespace="default",
                    lookup_key=f"program-{number}",
                    value=json.dumps(value),
                    expires_at=None,
                    created_at=stamp,
                    updated_at=stamp,
                )
            )


def _reference(
    now: int, wanted: set[str] | None = None, words_of: Callable[[str, Any], set[str]] | None = None
) -> list[tuple[str, str, str]]:
    """The live entries sharing none of ``wanted`` (MESSAGE's words), in key order, with the size
    and expiry a page should show: scored here with the tokeniser over key and value (or ``words_of``)."""
    wanted = set(keywords(MESSAGE)) if wanted is None else wanted
    words_of = words_of or (lambda key, value: set(keywords(f"{key} {text_of(value)}")))
    return sorted(
        (row.key, format_bytes(line_bytes(row.key, text_of(row.value))), ttl_words(row.expires_at, now))
        for row in state.driver().records()
        if (row.expires_at is None or now < row.expires_at) and not wanted & words_of(row.key, row.value)
    )


def _phpclaw_words(key: str, value: Any) -> set[str]:
    return set(phpclaw_keywords(phpclaw_text(value)))


def ttl_words(expires_at: int | None, now: int) -> str:
    return "never expires" if expires_at is None else f"expires in {format_duration(expires_at - now)}"


def _listed(client: FlaskClient, url: str | None, shown_count: int) -> list[tuple[str, ...]]:
    """Follow the list's pages from ``url``; return every row (key, size, expiry)."""
    listed: list[tuple[str, ...]] = []
    while url:
        body = page_text(client.get(url))
        assert int(COUNT.search(body).group(1)) == shown_count
        assert 0 < len(ROW.findall(body)) <= 7
        listed += [tuple(html.unescape(cell) for cell in row) for row in ROW.findall(body)]
        more = MORE.search(body)
        url = html.unescape(more.group(1)) if more else None
    return listed


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "postgres"], indirect=True)
def test_the_preview_lists_every_entry_sharing_no_word_a_page_at_a_time(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, prefix: str
) -> None:
    with app.app_context():
        _fill(clock, prefix)
    signed_in.get("/preview", query_string={"message": "warm the index up"})
    clock.advance(61)  # entries with a 60-second TTL expired since the index was built
    with app.app_context():
        expected = _reference(int(clock()))
    assert len(expected) > 7 * 3  # several pages
    preview = page_text(signed_in.get("/preview", query_string={"message": MESSAGE}))
    shown_count = int(ZERO_OVERLAP.search(preview).group(1))
    link = LINK.search(preview)
    assert shown_count == len(expected) and link
    assert _listed(signed_in, html.unescape(link.group(1)), shown_count) == expected


def test_htmx_gets_the_list_in_place_and_its_next_rows_only(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, prefix: str
) -> None:
    with app.app_context():
        _fill(clock, prefix)
        expected = _reference(int(clock()))
    preview = page_text(signed_in.get("/preview", query_string={"message": MESSAGE}))
    link = html.unescape(LINK.search(preview).group(1))
    assert re.search(r'hx-get="[^"]+" hx-target="#unmatched"', preview) and '<div id="unmatched">' in preview
    fragment = page_text(signed_in.get(link, headers={"HX-Request": "true", "HX-Target": "unmatched"}))
    assert fragment.lstrip().startswith('<section id="unmatched"') and "<html" not in fragment
    assert [row[0] for row in ROW.findall(fragment)] == [key for key, _, _ in expected[:7]]
    more = html.unescape(MORE.search(fragment).group(1))
    rows = page_text(signed_in.get(more, headers={"HX-Request": "true", "HX-Target": "unmatched-more"}))
    assert rows.lstrip().startswith('<tr class="unmatched-entry">')
    assert [row[0] for row in ROW.findall(rows)] == [key for key, _, _ in expected[7:14]]


def test_with_phpclaws_scoring_the_list_is_of_the_entries_whose_value_shares_no_word(
    make_app: Callable[..., Flask], clock: FakeClock, prefix: str
) -> None:
    app = make_app(RECALL_SCORING="phpclaw")
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, clock())
        _fill(clock, prefix)
        # phpClaw scores the value only, with ASCII words of 3+ letters.
        wanted = set(phpclaw_keywords(MESSAGE))
        expected = _reference(int(clock()), wanted, _phpclaw_words)
        assert expected != _reference(int(clock()))
    client = app.test_client()
    assert sign_in(client).status_code == 302
    preview = page_text(client.get("/preview", query_string={"message": MESSAGE}))
    shown_count = int(ZERO_OVERLAP.search(preview).group(1))
    assert shown_count == len(expected)
    assert _listed(client, html.unescape(LINK.search(preview).group(1)), shown_count) == expected


def test_a_bad_cursor_is_refused_with_400(signed_in: FlaskClient) -> None:
    response = signed_in.get("/preview/unmatched", query_string={"message": "tea", "cursor": "not-a-cursor"})
    assert response.status_code == 400 and "cursor" in response.get_data(as_text=True)
