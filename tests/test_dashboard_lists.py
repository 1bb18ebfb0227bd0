"""Lists that help: totals, sortable columns that keep paging, relative times, subjects that
filter, marked search snippets, and the exact command that forgets a key."""

from __future__ import annotations

import html
import re
from datetime import datetime
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.turn.conversations import Message
from dashboard import state
from dashboard.views.conversations import PAGE_SIZE
from tests.conftest import SQL_BACKENDS
from tests.dashboard_helpers import claw_words, page_text
from tests.test_sorted_lists import TITLES, expected_order, insert_conversations

pytest_plugins = ["tests.dashboard_fixtures"]

CONVERSATION_LINK = re.compile(r'<a href="/conversations/([0-9A-Z]{26})">')
KEY_LINK = re.compile(r'<a href="/memory/[^/]+/entry\?key=[^"]*"><code>(.*?)</code></a>')


def _more(body: str, target: str) -> str | None:
    found = re.search(rf'id="{target}".*?href="([^"]+)"', body, re.S)
    return html.unescape(found.group(1)) if found else None


def _walk(client: FlaskClient, url: str, target: str, pattern: re.Pattern[str]) -> list[str]:
    """Return what ``pattern`` finds on page one and every "load more" page after it."""
    body = page_text(client.get(url))
    found, more = pattern.findall(body), _more(body, target)
    while more:
        fragment = page_text(client.get(more, headers={"HX-Request": "true", "HX-Target": target}))
        assert "<html" not in fragment and 'class="count"' not in fragment, "more rows come alone"
        found += pattern.findall(fragment)
        more = _more(fragment, target)
    return found


def _conversations(app: Flask, count: int) -> list[dict[str, Any]]:
    with app.app_context():
        return insert_conversations(state.engine(), state.settings().table_prefix, count)


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_each_column_order_pages_every_conversation_once(app: Flask, signed_in: FlaskClient) -> None:
    rows = _conversations(app, 120)
    # sort=name lists smallest first, sort=-name largest first; each pages every row once.
    for sort in ("updated", "created", "title", "tokens", "messages"):
        for word, descending in ((sort, False), (f"-{sort}", True)):
            listed = _walk(signed_in, f"/conversations/?sort={word}", "conversations-more", CONVERSATION_LINK)
            assert listed == expected_order(rows, sort, descending), word
    by_default = _walk(signed_in, "/conversations/", "conversations-more", CONVERSATION_LINK)
    assert by_default == expected_order(rows, "updated")


def test_column_headers_link_to_each_order_and_say_which_is_current(
    app: Flask, signed_in: FlaskClient
) -> None:
    _conversations(app, 3)
    body = page_text(signed_in.get("/conversations/?user_id=cust-1&sort=title"))
    header = r'<th(?: class="num")?(?: aria-sort="(\w+)")?>\s*<a href="([^"]+)"'
    headers = {url: aria for aria, url in re.findall(header, body)}
    # A column not sorted by leads to its usual direction first (newest, most); the current one
    # turns around.
    assert set(headers) == {
        "/conversations/?user_id=cust-1&amp;sort=-title",
        "/conversations/?user_id=cust-1&amp;sort=-created",
        "/conversations/?user_id=cust-1&amp;sort=-updated",
        "/conversations/?user_id=cust-1&amp;sort=-messages",
        "/conversations/?user_id=cust-1&amp;sort=-tokens",
    }
    assert headers["/conversations/?user_id=cust-1&amp;sort=-title"] == "ascending"
    turned = page_text(signed_in.get("/conversations/?user_id=cust-1&sort=-title"))
    assert re.search(r'<th aria-sort="descending">\s*<a href="[^"]*sort=title">Title', turned)
    assert '<input type="hidden" name="sort" value="-title">' in turned, "filtering keeps the order"
    old = signed_in.get("/conversations/?sort=title&order=desc")
    assert old.status_code == 400 and "sort=-tokens" in page_text(old), "an old link is refused, not misread"
    assert body.count("aria-sort=") == 1
    assert '<input type="hidden" name="sort" value="title">' in body, "filtering keeps the order"
    default = page_text(signed_in.get("/conversations/"))
    current = r'<th aria-sort="descending">\s*<a href="[^"]*sort=updated">Last activity'
    assert re.search(current, default)


def test_a_cursor_of_another_order_or_an_unknown_order_is_a_400(app: Flask, signed_in: FlaskClient) -> None:
    _conversations(app, 60)
    more = _more(page_text(signed_in.get("/conversations/?sort=title")), "conversations-more")
    assert more and "sort=title" in more
    for other in ("created", "-title"):  # another column, or the same one the other way round
        response = signed_in.get(more.replace("sort=title", f"sort={other}"))
        assert response.status_code == 400
        assert "start again from the first page" in page_text(response)
    for unknown in ("size", "--title", "-"):
        response = signed_in.get(f"/conversations/?sort={unknown}")
        assert response.status_code == 400
        assert "sort must be one of updated, -updated, created, -created, title, -title" in page_text(
            response
        )
    with app.app_context():
        state.memory().set("a", 1, "prefs")
    assert signed_in.get("/memory/prefs/?sort=size").status_code == 400


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "postgres"], indirect=True)
def test_every_list_says_how_many_match(app: Flask, signed_in: FlaskClient) -> None:
    _conversations(app, 120)
    assert "<strong>120</strong> conversations <span" in page_text(signed_in.get("/conversations/"))
    matching = page_text(signed_in.get("/conversations/?user_id=cust-2&q=alp"))
    expected = sum(1 for n in range(120) if n % 3 == 2 and TITLES[n % len(TITLES)] == "alpha")
    assert f"<strong>{expected}</strong> conversations match</p>" in matching
    with app.app_context():
        memory = state.memory()
        for number in range(70):
            memory.set(
                f"key-{number:02}",
                {"note": "tea" if number % 7 else "coffee"},
                "drinks",
                ttl=60 if number % 2 else None,
            )
        memory.set("other", 1, "elsewhere")
    assert "<strong>70</strong> entries</p>" in page_text(signed_in.get("/memory/drinks/"))
    found = page_text(signed_in.get("/memory/drinks/?q=coffee&state=permanent"))
    assert "<strong>5</strong> entries match, of 70 in this namespace</p>" in found
    index = page_text(signed_in.get("/memory/"))
    assert "<strong>2</strong> namespaces hold <strong>71</strong> entries: 71 live, 0 expired" in index


WHOLE_TOTAL = re.compile(
    r"<strong>(\d+)</strong> conversations? <span class=\"muted\">\(counted ([^;]+); "
    r"counted again at most once every 1 min\)</span></p>"
)


def test_the_whole_lists_total_is_counted_once_a_minute_and_says_when(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    _conversations(app, 3)  # a first page that holds every conversation counts them itself
    assert "<strong>3</strong> conversations</p>" in page_text(signed_in.get("/conversations/"))
    _conversations(app, PAGE_SIZE)
    first = WHOLE_TOTAL.search(page_text(signed_in.get("/conversations/")))
    assert first and first.group(1) == str(PAGE_SIZE + 3)
    _conversations(app, 2)
    clock.advance(30)
    again = page_text(signed_in.get("/conversations/"))
    assert WHOLE_TOTAL.search(again).groups() == first.groups(), "the same count, and when it was taken"
    # A filtered list counts exactly, on every request.
    filtered = page_text(signed_in.get("/conversations/?since=2000-01-01"))
    assert f"<strong>{PAGE_SIZE + 5}</strong> conversations match</p>" in filtered
    clock.advance(31)
    recounted = WHOLE_TOTAL.search(page_text(signed_in.get("/conversations/")))
    assert recounted and recounted.group(1) == str(PAGE_SIZE + 5) and recounted.group(2) != first.group(2)


def test_a_search_stops_counting_at_a_thousand(app: Flask, signed_in: FlaskClient) -> None:
    rows = _conversations(app, 4100)  # a quarter are titled "alpha"
    assert sum(1 for row in rows if row["title"] == "alpha") > 1000
    body = page_text(signed_in.get("/conversations/?q=alpha"))
    assert "<strong>1000</strong> or more conversations match</p>" in body
    assert "<strong>4100</strong> conversations <span" in page_text(signed_in.get("/conversations/")), "exact"


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_keys_page_by_key_update_and_expiry(app: Flask, signed_in: FlaskClient, clock: FakeClock) -> None:
    with app.app_context():
        memory = state.memory()
        for number in range(60):
            memory.set(f"k{number:02}", number, "many", ttl=[None, 600, 60][number % 3])
            if number % 4 == 3:
                clock.advance(1)  # four keys share each write time
    clock.advance(120)
    by_key = _walk(signed_in, "/memory/many/", "memory-more", KEY_LINK)
    assert by_key == [f"k{n:02}" for n in range(60)]
    assert _walk(signed_in, "/memory/many/?sort=-key", "memory-more", KEY_LINK) == by_key[::-1]
    newest = _walk(signed_in, "/memory/many/?sort=-updated", "memory-more", KEY_LINK)
    assert newest == sorted(by_key, key=lambda key: (int(key[1:]) // 4, key), reverse=True)
    assert _walk(signed_in, "/memory/many/?sort=updated", "memory-more", KEY_LINK) == newest[::-1]
    soonest = _walk(signed_in, "/memory/many/?sort=expires", "memory-more", KEY_LINK)
    expiry = {n: (n // 4 + [None, 600, 60][n % 3]) if n % 3 else None for n in range(60)}
    timed = sorted((n for n in expiry if expiry[n] is not None), key=lambda n: (expiry[n], n))
    never = [f"k{n:02}" for n in range(60) if expiry[n] is None]
    assert soonest == [f"k{n:02}" for n in timed] + never
    # Latest expiry first: what never expires still comes last, in the same direction by key.
    latest = _walk(signed_in, "/memory/many/?sort=-expires", "memory-more", KEY_LINK)
    assert latest == [f"k{n:02}" for n in reversed(timed)] + never[::-1]
    body = page_text(signed_in.get("/memory/many/?sort=-updated"))
    assert re.search(r'<th aria-sort="descending">\s*<a href="[^"]*sort=updated">Updated', body)
    assert 'href="/memory/many/?sort=-key"' not in body and 'href="/memory/many/?sort=key"' in body
    assert 'href="/memory/many/export.csv?sort=-updated"' in body, "the download keeps the order"


def test_times_are_relative_to_the_clock_with_the_utc_time_beside_them(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    ago = 3 * 3600 + 120
    clock.advance(-ago)  # written three hours ago (the session, made now, stays valid)
    with app.app_context():
        state.conversations().append("c-1", [Message("user", "hello")], user_id="cust-1", title="Hi")
        state.memory().set("later", 1, "prefs", ttl=ago + 600)
    clock.advance(ago)
    row = page_text(signed_in.get("/conversations/"))
    stamp = re.search(
        r'<time datetime="([0-9T:-]+)Z">3 h ago</time> <span class="absolute">\(([^)]+) UTC', row
    )
    assert stamp, row
    assert stamp.group(2) == stamp.group(1).replace("T", " ")
    assert datetime.fromisoformat(stamp.group(1)).timestamp() == pytest.approx(clock() - ago, abs=1)
    entry = page_text(signed_in.get("/memory/prefs/entry?key=later"))
    assert re.search(r"<dt>Updated</dt><dd><time [^>]+>3 h ago</time>", entry)
    assert re.search(
        r'<dt>Expires</dt><dd><time datetime="[^"]+">in 10 min</time> <span class="absolute">', entry
    )


def test_the_subject_links_to_its_conversations(app: Flask, signed_in: FlaskClient) -> None:
    with app.app_context():
        log = state.conversations()
        log.append("c-a", [Message("user", "one")], user_id="cust 7&x", title="A")
        log.append("c-b", [Message("user", "two")], user_id="cust-8", title="B")
        log.append("c-c", [Message("user", "three")], title="Anonymous")
        state.memory().set("likes", "tea", "user:cust-8")
    body = page_text(signed_in.get("/conversations/"))
    link = re.search(r'<a href="([^"]+)" title="[^"]+"><bdi>cust 7&amp;x</bdi>', body)
    assert link and html.unescape(link.group(1)) == "/subjects/cust%207&x"
    assert '<td data-label="Subject"><bdi>anonymous</bdi></td>' in body, "no subject to filter by"
    only = page_text(signed_in.get(html.unescape(link.group(1))))
    assert re.findall(r'<a href="/conversations/([^"/?]+)">', only) == ["c-a"]
    for page in ("/memory/", "/memory/user:cust-8/", "/memory/user:cust-8/entry?key=likes"):
        assert 'href="/subjects/cust-8"' in page_text(signed_in.get(page)), page


def test_search_results_show_the_match_marked_in_a_snippet(app: Flask, signed_in: FlaskClient) -> None:
    long_text = "word " * 100 + "the parcel arrived DAMAGED at the door " + "more " * 100
    with app.app_context():
        said = [Message("user", "hello"), Message("user", long_text)]
        state.conversations().append("c-1", said, title="Parcel")
        state.memory().set("damage_policy", {"text": "Refund damaged goods within 30 days"}, "policies")
    body = page_text(signed_in.get("/conversations/?q=damaged"))
    snippet = re.search(r'<p class="snippet"><bdi>(.*?)</bdi></p>', body, re.S)
    assert snippet, body
    assert "the parcel arrived <mark>DAMAGED</mark> at the door" in snippet.group(1)
    assert snippet.group(1).startswith("…") and snippet.group(1).endswith("…")
    assert len(html.unescape(re.sub("<[^>]+>", "", snippet.group(1)))) <= 162
    title = page_text(signed_in.get("/conversations/?q=parc"))
    assert "<bdi><mark>Parc</mark>el</bdi>" in title
    keys = page_text(signed_in.get("/memory/policies/?q=damage"))
    assert "<code><mark>damage</mark>_policy</code>" in keys
    assert "Refund <mark>damage</mark>d goods" in keys


def test_hostile_text_in_a_search_and_its_match_stays_text(app: Flask, signed_in: FlaskClient) -> None:
    script = "<script>alert(1)</script>"
    with app.app_context():
        state.conversations().append("c-1", [Message("user", f"before {script} after & so on")], title="T")
        state.memory().set("note", {"text": f"a {script} b"}, "hostile")
    for url in (f"/conversations/?q={quote(script)}", f"/memory/hostile/?q={quote(script)}"):
        body = page_text(signed_in.get(url))
        assert "<script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body, url
    split = page_text(signed_in.get(f"/conversations/?q={quote('<')}"))
    assert "<script>" not in split
    assert "<mark>&lt;</mark>script&gt;alert(1)<mark>&lt;</mark>/script&gt;" in split
    marked = page_text(signed_in.get(f"/conversations/?q={quote(script)}"))
    assert "before <mark>&lt;script&gt;alert(1)&lt;/script&gt;</mark> after &amp; so on" in marked
    amp = page_text(signed_in.get("/conversations/?q=%26"))
    assert "after <mark>&amp;</mark> so on" in amp


@pytest.mark.parametrize("key", ["simple", "-looks like an option", 'it\'s "quoted" $HOME; rm -rf /'])
def test_a_key_page_shows_the_command_that_forgets_it_and_the_command_works(
    app: Flask, signed_in: FlaskClient, key: str
) -> None:
    with app.app_context():
        state.memory().set(key, "to go", "user:cust-9")
        state.memory().set("stays", "kept", "user:cust-9")
    body = page_text(signed_in.get(f"/memory/user:cust-9/entry?key={quote(key)}"))
    preview, shown = re.findall(r'<pre class="command"><code>(.*?)</code></pre>', body, re.S)
    assert "--dry-run" in claw_words(preview)[1], "the preview is offered first"
    _, words = claw_words(shown)
    assert words[0] == "forget" and "--yes" in words
    result = app.test_cli_runner().invoke(args=["claw", *words])
    assert result.exit_code == 0, result.output
    with app.app_context():
        assert state.driver().entry("user:cust-9", key) is None
        assert state.driver().entry("user:cust-9", "stays") is not None
    assert signed_in.get(f"/memory/user:cust-9/entry?key={quote(key)}").status_code == 404
