"""What the data pages show: complete keyset pagination, TTL states on the fake clock, the exact
injection report, cold-memory counts and the compaction analysis."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.ids import new_id
from clawmem.recall import MessageAugmenter
from clawmem.sql.schema import tables
from clawmem.turn.compaction import as_history, split_history
from clawmem.turn.conversations import Message
from dashboard import accounts, state
from tests.conftest import SQL_BACKENDS, backend_url
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

CONVERSATION_LINK = re.compile(r'<a href="/conversations/([0-9A-Z]{26})">')
HTMX = {"HX-Request": "true"}


def _more(body: str, target: str) -> str | None:
    found = re.search(rf'id="{target}".*?href="([^"]+)"', body, re.S)
    return html.unescape(found.group(1)) if found else None


def _insert_conversations(app: Flask, count: int, start: datetime) -> list[tuple[datetime, str]]:
    # Three conversations share each timestamp, so the id must break ties in the keyset.
    rows = [
        {
            "id": new_id(),
            "namespace": "web" if number % 4 else "support",
            "user_id": f"cust-{number % 5}",
            "title": f"{'refund' if number % 2 else 'delivery'} #{number}",
            "created_at": start + timedelta(seconds=number // 3),
            "updated_at": start + timedelta(seconds=number // 3),
        }
        for number in range(count)
    ]
    with app.app_context(), state.engine().begin() as conn:
        conn.execute(sa.insert(tables(state.settings().table_prefix).conversations), rows)
    return [(row["created_at"], row["id"]) for row in rows]


def _walk(client: FlaskClient, first_url: str) -> tuple[list[str], int]:
    body = page_text(client.get(first_url))
    ids, pages = CONVERSATION_LINK.findall(body), 1
    more = _more(body, "conversations-more")
    while more:
        fragment = page_text(client.get(more, headers={**HTMX, "HX-Target": "conversations-more"}))
        assert "<html" not in fragment
        ids += CONVERSATION_LINK.findall(fragment)
        more = _more(fragment, "conversations-more")
        pages += 1
    return ids, pages


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_250_conversations_page_without_duplicates_or_gaps(app: Flask, signed_in: FlaskClient) -> None:
    rows = _insert_conversations(app, 250, datetime(2024, 3, 1, 12, 0, 0))
    ids, pages = _walk(signed_in, "/conversations/")
    expected = [conversation_id for _, conversation_id in sorted(rows, reverse=True)]
    assert ids == expected
    assert pages == 5


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_filters_page_the_same_way(app: Flask, signed_in: FlaskClient) -> None:
    _insert_conversations(app, 250, datetime(2024, 3, 1, 12, 0, 0))
    refunds, _ = _walk(signed_in, "/conversations/?q=refund")
    assert len(refunds) == len(set(refunds)) == 125
    subject, _ = _walk(signed_in, "/conversations/?user_id=cust-3&namespace=web")
    assert len(subject) == len(set(subject)) == sum(1 for n in range(250) if n % 5 == 3 and n % 4)
    none, _ = _walk(signed_in, "/conversations/?since=2024-03-02")
    assert none == []
    day, _ = _walk(signed_in, "/conversations/?since=2024-03-01&until=2024-03-01")
    assert len(day) == 250


def test_a_forged_cursor_is_a_clear_400(signed_in: FlaskClient) -> None:
    response = signed_in.get("/conversations/?cursor=not-a-cursor")
    assert response.status_code == 400
    assert "start again from the first page" in page_text(response)


@pytest.mark.parametrize(
    "path",
    [
        "/conversations/?cursor=WyIxIl0",  # ["1"]: a cursor of another list's shape
        "/conversations/?cursor=WyJ4IiwgInkiXQ",  # ["x", "y"]: the right shape but no time
        "/memory/prefs/?cursor=WyJhIiwiYiJd",
        "/preview?message=order&cursor=WyItNTAiXQ",  # ["-50"]: a negative offset
        "/cold?cursor=WyJ0ZW4iXQ",  # ["ten"]
    ],
)
def test_every_list_answers_a_foreign_cursor_with_the_same_400(
    demo_signed_in: FlaskClient, path: str
) -> None:
    response = demo_signed_in.get(path)
    assert response.status_code == 400
    assert "this cursor did not come from this list; start again from the first page" in page_text(response)


# Every memory driver, with the app's conversations on SQLite unless the driver is SQL elsewhere.
DRIVER_CASES = [
    pytest.param("sqlite", "sql", id="sql-sqlite"),
    pytest.param("mysql", "sql", id="sql-mysql"),
    pytest.param("postgres", "sql", id="sql-postgres"),
    pytest.param("sqlite", "array", id="array"),
    pytest.param("sqlite", "file", id="file"),
    pytest.param("sqlite", "redis", id="redis"),
]
TTL_ROW = re.compile(r'<code>([^<]+)</code></a></td>\s*<td[^>]*><span class="tag (\w+)">([^<]+)</span>')


@pytest.fixture
def driver_app(make_app: Callable[..., Flask], memory_driver: str, prefix: str) -> Iterator[Flask]:
    """An app whose key/value memory is ``memory_driver``, with an admin; Redis keys are removed after."""
    config = {"MEMORY_DRIVER": memory_driver}
    if memory_driver == "redis":
        config["REDIS_URL"] = backend_url("redis")
    app = make_app(**config)
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    yield app
    if memory_driver == "redis":
        with app.app_context():
            client = state.driver().client  # type: ignore[attr-defined]
            for key in list(client.scan_iter(match=f"{prefix}phpclaw:*")):
                client.delete(key)


@pytest.fixture
def driver_client(driver_app: Flask) -> FlaskClient:
    client = driver_app.test_client()
    assert sign_in(client).status_code == 302
    return client


def _ttl_rows(body: str) -> dict[str, tuple[str, str]]:
    return {html.unescape(key): (tag, words) for key, tag, words in TTL_ROW.findall(body)}


def _three_states(app: Flask) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("forever", "kept", "ttl")
        memory.set("soon", "goes", "ttl", ttl=7200)
        memory.set("gone", "went", "ttl", ttl=60)


@pytest.mark.parametrize(("dashboard_backend", "memory_driver"), DRIVER_CASES, indirect=["dashboard_backend"])
def test_ttl_state_follows_the_fake_clock(
    driver_app: Flask, driver_client: FlaskClient, clock: FakeClock, memory_driver: str
) -> None:
    _three_states(driver_app)
    clock.advance(120)
    body = page_text(driver_client.get("/memory/ttl/"))
    assert _ttl_rows(body) == {
        "forever": ("permanent", "never expires"),
        "soon": ("expiring", "expires in 1 h 58 min"),
        "gone": ("expired", "expired 1 min ago (not yet swept)"),
    }
    assert "read through the memory contract" not in body and "Live entries only" not in body
    detail = page_text(driver_client.get("/memory/ttl/entry?key=soon"))
    assert '<span class="tag expiring">expires in 1 h 58 min</span>' in detail
    # floor(set time) + 7200, said relative to the fake clock, with the UTC time beside it
    expires = (
        '<time datetime="2023-11-15T00:13:20Z">in 2 h</time> '
        '<span class="absolute">(2023-11-15 00:13:20 UTC)</span>'
    )
    assert f"<dt>Expires</dt><dd>{expires}</dd>" in detail
    expired = driver_client.get("/memory/ttl/entry?key=gone")
    assert expired.status_code == 200, "an expired entry the driver still holds has a detail page"
    assert '<span class="tag expired">expired 1 min ago (not yet swept)</span>' in page_text(expired)
    # Only the SQL driver keeps write times; the others show none rather than an empty field.
    updated = (
        '<time datetime="2023-11-14T22:13:20Z">2 min ago</time> '
        '<span class="absolute">(2023-11-14 22:13:20 UTC)</span>'
    )
    assert (f"<dt>Updated</dt><dd>{updated}</dd>" in detail) == (memory_driver == "sql")
    assert ("<dt>Created</dt>" in detail) == (memory_driver == "sql")
    index = page_text(driver_client.get("/memory/"))
    assert re.search(
        r"<code>ttl</code></a></td>\s*<td class=\"num\"[^>]*>3</td>\s*<td class=\"num\"[^>]*>2</td>"
        r"\s*<td class=\"num\"[^>]*>1</td>",
        index,
    )
    assert "read through the memory contract" not in index
    clock.advance(7100)
    assert "expired 20 s ago (not yet swept)" in page_text(driver_client.get("/memory/ttl/entry?key=soon"))
    assert re.search(
        r"<code>ttl</code></a></td>\s*<td class=\"num\"[^>]*>3</td>\s*<td class=\"num\"[^>]*>1</td>"
        r"\s*<td class=\"num\"[^>]*>2</td>",
        page_text(driver_client.get("/memory/")),
    )


@pytest.mark.parametrize(("dashboard_backend", "memory_driver"), DRIVER_CASES, indirect=["dashboard_backend"])
def test_state_filters_tell_permanent_from_live(
    driver_app: Flask, driver_client: FlaskClient, clock: FakeClock
) -> None:
    _three_states(driver_app)
    clock.advance(120)

    def listed(state_filter: str) -> list[str]:
        response = driver_client.get(f"/memory/ttl/?state={state_filter}")
        assert response.status_code == 200
        return sorted(_ttl_rows(page_text(response)))

    assert listed("") == ["forever", "gone", "soon"]
    assert listed("live") == ["forever", "soon"], "live is every entry that is not expired"
    assert listed("permanent") == ["forever"], "permanent is only what never expires"
    assert listed("expiring") == ["soon"]
    assert listed("expired") == ["gone"]
    clock.advance(7100)
    assert listed("live") == ["forever"]
    assert listed("expired") == ["gone", "soon"]
    body = page_text(driver_client.get("/memory/ttl/?state=permanent"))
    assert '<option value="permanent" selected>never expires</option>' in body
    assert '<option value="live">live (not expired)</option>' in body
    bad = driver_client.get("/memory/ttl/?state=forever")
    assert bad.status_code == 400 and "live, permanent, expiring, expired" in page_text(bad)


@pytest.mark.parametrize(("dashboard_backend", "memory_driver"), DRIVER_CASES, indirect=["dashboard_backend"])
def test_memory_search_and_detail_on_every_driver(
    driver_app: Flask, driver_client: FlaskClient, clock: FakeClock
) -> None:
    with driver_app.app_context():
        state.memory().set("greeting", {"text": "hello"}, "notes")
        state.memory().set("brief", "short-lived", "notes", ttl=60)
    listing = page_text(driver_client.get("/memory/notes/?q=hello"))
    assert sorted(_ttl_rows(listing)) == ["greeting"]
    detail = page_text(driver_client.get("/memory/notes/entry?key=greeting"))
    assert "&#34;text&#34;: &#34;hello&#34;" in detail
    clock.advance(61)
    assert "expired 1 s ago (not yet swept)" in page_text(driver_client.get("/memory/notes/entry?key=brief"))
    assert driver_client.get("/memory/notes/entry?key=nothing").status_code == 404
    with driver_app.app_context():
        state.driver().sweep()
    assert driver_client.get("/memory/notes/entry?key=brief").status_code == 404, "swept is gone"


def test_preview_shows_exactly_what_augment_returns(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    message = "My parcel arrived damaged, who handles delivery complaints and returns?"
    with app.app_context():
        settings = state.settings()
        expected = MessageAugmenter(
            state.memory(), top_k=settings.recall_top_k, namespace=settings.recall_namespace
        ).augment(message)
    body = page_text(signed_in.get("/preview", query_string={"message": message}))
    shown = re.search(r'<pre class="augmented">(.*?)</pre>', body, re.S)
    assert shown and html.unescape(shown.group(1)) == expected.text
    rows = re.findall(
        r'<tr class="decision (\w+)">\s*<td><a href="[^"]+"><code>([^<]+)</code></a></td>\s*'
        r'<td class="num">(\d+)</td>\s*<td class="matched">([^<]*)</td>\s*'
        r'<td class="num">(\d+)</td>.*?<td>([^<]*)</td>\s*</tr>',
        body,
        re.S,
    )
    assert [
        (status, html.unescape(key), int(score), html.unescape(words), int(size), html.unescape(reason))
        for status, key, score, words, size, reason in rows
    ] == [(d.status, d.key, d.score, ", ".join(d.matched), d.bytes, d.reason) for d in expected.decisions]
    assert expected.decisions[0].matched  # the words that matched are shown
    assert f"<strong>{expected.bytes_used}</strong> of 4096 bytes" in body
    assert "top 3 entries, 4096-byte budget" in body
    assert "escalation_contact" in expected.injected_keys
    assert "The PII guard would block this turn." in body
    assert "email found in memory key escalation_contact" in body


def test_preview_fragment_is_the_result_alone(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    response = signed_in.get(
        "/preview?message=shipping+express", headers={**HTMX, "HX-Target": "preview-result"}
    )
    body = page_text(response)
    assert "<html" not in body and "<textarea" not in body
    assert "shipping_policy" in body and "PII guard" not in body


def test_preview_of_an_empty_message_injects_nothing(signed_in: FlaskClient) -> None:
    assert "Type a message to preview" in page_text(signed_in.get("/preview?message=+"))


@pytest.fixture
def small_memory(app: Flask) -> None:
    """Four entries and three user messages: apples and bananas are asked about, the rest never."""
    with app.app_context():
        memory = state.memory()
        for key, value in {
            "apples": "apples and pears",
            "bananas": "bananas, ripe",
            "cherries": "cherries",
            "dates": "dates from the market",
        }.items():
            memory.set(key, value, "default")
        state.conversations().append(
            new_id(),
            [
                Message("user", "Do you sell apples?"),
                Message("assistant", "Yes, cherries and dates too."),
            ],
            user_id="cust-1",
        )
    state_clock = app.extensions["clawmem.clock"]
    state_clock.advance(60)
    with app.app_context():
        state.conversations().append(
            new_id(), [{"role": "user", "content": "bananas please"}], user_id="cust-2"
        )


def _cold_keys(body: str) -> list[str]:
    return re.findall(r'<tr class="cold-entry"><td><a href="[^"]+"><code>([^<]+)</code>', body)


def test_cold_memory_counts_entries_no_recent_message_would_inject(
    small_memory: None, signed_in: FlaskClient
) -> None:
    body = page_text(signed_in.get("/cold"))
    assert '<strong class="cold-count">2</strong> of 4 live entries' in body
    assert '<strong class="cold-share">50.0%</strong>' in body
    assert _cold_keys(body) == ["cherries", "dates"], "assistant text never counts, only user messages"
    newest_only = page_text(signed_in.get("/cold?n=1"))
    assert '<strong class="cold-count">3</strong> of 4' in newest_only
    assert _cold_keys(newest_only) == ["apples", "cherries", "dates"]


def test_cold_memory_with_recall_off_is_all_cold(make_app: Callable[..., Flask], small_memory: None) -> None:
    off = make_app(RECALL_TOP_K=0)
    client = off.test_client()
    with off.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    sign_in(client)
    body = page_text(client.get("/cold"))
    assert '<strong class="cold-count">4</strong> of 4' in body and "Recall is off" in body


def _long_conversation(app: Flask) -> tuple[str, list[dict[str, object]]]:
    with app.app_context():
        store = state.conversations()
        summary = max(store.list(limit=100).items, key=lambda c: c.message_count)
        stored = store.messages(summary.id, limit=1000).items
    # The analysis reads what was said (recall records left out); the page numbers every message.
    said = [
        (position, m) for position, m in enumerate(stored, start=1) if m.role not in ("recall", "summary")
    ]
    POSITIONS[summary.id] = [position for position, _ in said]
    return summary.id, as_history([m for _, m in said])


POSITIONS: dict[str, list[int]] = {}  # per conversation, the page's number of each message said


def test_compaction_analysis_marks_what_the_compactor_would_summarise(
    app: Flask, demo: None, signed_in: FlaskClient
) -> None:
    conversation_id, history = _long_conversation(app)
    start, boundary = split_history(history)
    body = page_text(signed_in.get(f"/conversations/{conversation_id}?max_messages=10"))
    fates = re.findall(r'<li class="message role-\w+ (summarised|kept)"', body)
    assert fates == ["summarised"] * (boundary - start) + ["kept"] * (len(history) - boundary + start)
    assert f"{boundary - start} older messages" in body
    assert f"first be exceeded at message {POSITIONS[conversation_id][10]}" in body
    assert body.count("threshold first exceeded here") == 1


def test_compaction_analysis_by_tokens(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    conversation_id, history = _long_conversation(app)
    body = page_text(signed_in.get(f"/conversations/{conversation_id}?max_tokens=200"))
    assert "the token estimate threshold would first be exceeded at message" in body
    tokens = [int(t) for t in re.findall(r'<span class="tokens">~(\d+) tokens</span>', body)]
    # Every message said; recall records are never sent, so they show no estimate ("~0" misled).
    assert len(tokens) == len(POSITIONS[conversation_id])
    running, first = 0, None
    for position, message in zip(POSITIONS[conversation_id], history, strict=True):
        running += len((str(message["content"] or "")).encode())
        if first is None and running // 4 > 200:
            first = position
    assert f"first be exceeded at message {first}," in body


def test_compaction_off_by_default_says_so(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    conversation_id, _ = _long_conversation(app)
    body = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    did, what_if = body.split("<h3>What the agent did</h3>")[1].split("<h3>What if: the dashboard")
    assert "The agent has not compacted this conversation: no checkpoint is stored" in did
    assert "With compaction off, the next turn would send this whole history to the model." in what_if
    assert "summarised" not in body


def test_conversation_shows_roles_times_and_tool_calls(
    app: Flask, demo: None, signed_in: FlaskClient
) -> None:
    body = page_text(signed_in.get("/conversations/?q=Where+is+my+order"))
    conversation_id = CONVERSATION_LINK.findall(body)[0]
    detail = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    assert '<span class="role">tool</span>' in detail and '<span class="role">user</span>' in detail
    assert "<code>lookup_order</code>" in detail
    assert "&#34;order_id&#34;" in detail
    stamp = (
        r'<time datetime="[0-9T:-]+Z">[^<]+ ago</time> '
        r'<span class="absolute">\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)</span>'
    )
    assert re.search(stamp, detail), "each message's time, relative, with the UTC time beside it"


def test_demo_on_the_file_driver_fills_the_memory_index(make_app: Callable[..., Flask]) -> None:
    app = make_app(MEMORY_DRIVER="file")
    assert app.test_cli_runner().invoke(args=["claw", "demo"]).exit_code == 0
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
        counts = state.driver().namespace_counts()
        conversations = state.conversations().counts()["conversations"]
    client = app.test_client()
    sign_in(client)
    index = page_text(client.get("/memory/"))
    number = r'\s*<td class="num"[^>]*>(\d+)</td>'
    listed = re.findall(
        r'<code>([^<]+)</code></a>(?: <span class="subject">subject <a [^>]+><bdi>([^<]+)</bdi></a></span>)?'
        r"</td>" + number * 3,
        index,
    )
    assert [(name, int(total), int(live), int(expired)) for name, _, total, live, expired in listed] == [
        (n.namespace, n.total, n.live, n.expired) for n in counts
    ]
    assert {name for name, *_ in listed} == {"agent:scratch", "default", "user:cust-1001", "user:cust-2002"}
    assert {name: subject for name, subject, *_ in listed if subject} == {
        "user:cust-1001": "cust-1001",
        "user:cust-2002": "cust-2002",
    }
    assert sum(n.expired for n in counts) >= 2, "the file driver shows expired-but-unswept entries"
    assert conversations == 30 and "<code>conversations</code>" not in index


def test_values_above_the_default_limit_show_their_size_on_a_site_that_allows_them(
    make_app: Callable[..., Flask],
) -> None:
    app = make_app(MEMORY_DRIVER="array", MAX_VALUE_BYTES=32 * 1024 * 1024)
    big = "x" * (17 * 1024 * 1024)  # past the 16 MiB default, within this site's limit
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
        state.memory().set("archive", big, "notes")
    client = app.test_client()
    sign_in(client)
    listing = client.get("/memory/notes/")
    assert listing.status_code == 200 and "17.0 MiB" in page_text(listing)
    detail = client.get("/memory/notes/entry?key=archive")
    assert detail.status_code == 200 and "17.0 MiB" in page_text(detail)
