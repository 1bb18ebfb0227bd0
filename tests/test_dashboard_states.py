"""The Overview's charts and the pages' empty and broken states: no tables, an empty database,
an empty namespace, compaction off, and TTLs that only Redis knows."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.sql import activity, kv
from clawmem.sql.activity import day_edges
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables, tables
from dashboard import accounts, charts, state
from tests.conftest import backend_url, sql_url
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in
from tests.hostile import signed_in_client

pytest_plugins = ["tests.dashboard_fixtures"]

EVERY_PAGE = [
    "/",
    "/conversations/",
    "/conversations/c1",
    "/conversations/c1/turns/01HZZZZZZZZZZZZZZZZZZZZZZZ",
    "/memory/",
    "/memory/default/",
    "/memory/default/entry?key=k",
    "/preview?message=where+is+my+order",
    "/preview/unmatched?message=order",
    "/cold",
]


def _admin_client(app: Flask) -> FlaskClient:
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    return signed_in_client(app)


def _chart_rows(body: str, chart_id: str) -> list[tuple[str, int]]:
    figure = body.split(f'aria-labelledby="{chart_id}-title"', 1)[1].split("</figure>", 1)[0]
    cells = re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">(\d+)</td></tr>", figure)
    return [(day, int(value)) for day, value in cells]


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "mysql", "postgres"], indirect=True)
def test_messages_per_day_counts_each_utc_day_on_the_injected_clock(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    # The clock starts at 2023-11-14 22:13:20 UTC.
    with app.app_context():
        log = state.conversations()
        log.append("c-old", [{"role": "user", "content": "first"}])
        clock.advance(2 * 3600)  # past midnight: 2023-11-15
        log.append("c-new", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
        log.append("c-old", [{"role": "user", "content": "again"}])
    body = page_text(signed_in.get("/"))
    messages = _chart_rows(body, "messages-chart")
    assert len(messages) == 30
    assert messages[-2:] == [("14 Nov", 1), ("15 Nov", 3)]
    assert sum(value for _, value in messages) == 4
    assert _chart_rows(body, "conversations-chart")[-3:] == [("13 Nov", 0), ("14 Nov", 1), ("15 Nov", 2)]
    assert re.search(r"Messages per day</strong>\s*<span class=\"muted\">up to 3 messages a day", body)
    assert 'role="img"' in body and '<rect class="bar"' in body


@pytest.mark.parametrize("dashboard_backend", ["sqlite", "mysql", "postgres"], indirect=True)
def test_memory_rows_over_time_and_ttl_states_per_namespace(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("kept", "forever", "shop")
        clock.advance(86400)
        memory.set("soon", "goes", "shop", ttl=7200)
        memory.set("gone", "went", "shop", ttl=60)
        memory.set("other", "x", "scratch", ttl=60)
    clock.advance(120)
    assert sign_in(signed_in).status_code == 302  # the session of a day ago has ended
    body = page_text(signed_in.get("/"))
    assert _chart_rows(body, "memory-chart")[-3:] == [("13 Nov", 0), ("14 Nov", 1), ("15 Nov", 4)]
    ttl = body.split('aria-labelledby="ttl-chart-title"', 1)[1].split("</figure>", 1)[0]
    shop = re.search(r"<code>shop</code></a></th>.*?</tr>", ttl, re.S)
    assert shop
    counts = re.findall(r'data-label="([^"]+)">(\d+)</td>', shop.group(0))
    assert counts == [("Never expire", "1"), ("Expiring", "1"), ("Expired, not yet swept", "1")]
    # The largest namespace first, with a bar segment per state it has.
    assert ttl.index("<code>shop</code>") < ttl.index("<code>scratch</code>")
    assert len(re.findall(r'<rect class="seg ', shop.group(0))) == 3


def test_the_injected_keys_chart_ranks_keys_and_links_to_cold_memory(
    app: Flask, signed_in: FlaskClient
) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("refund_policy", "refund within 30 days")
        memory.set("store_hours", "open nine to five")
        state.conversations().append(
            "c1",
            [
                {"role": "user", "content": "how do I get a refund"},
                {"role": "user", "content": "refund please"},
            ],
        )
    body = html.unescape(page_text(signed_in.get("/")))
    chart = body.split('aria-labelledby="injected-chart-title"', 1)[1].split("</figure>", 1)[0]
    assert "<strong>1</strong> of 2 live entries were never injected" in chart
    most, least = chart.split("Injected least often")
    assert re.search(r"<code>refund_policy</code>.*?data-label=\"Messages\">2</td>", most, re.S)
    assert re.search(r"<code>store_hours</code>.*?never", least, re.S)
    assert 'href="/cold?namespace=default&n=50"' in chart


def test_charts_on_an_empty_database_say_there_is_nothing_yet(signed_in: FlaskClient) -> None:
    body = page_text(signed_in.get("/"))
    assert "No memory entries are stored yet." in body
    assert "There are no live entries in <code>default</code> to inject." in body
    assert _chart_rows(body, "messages-chart")[-1][1] == 0


def test_every_page_without_tables_gives_the_command_that_creates_them(
    app: Flask, signed_in: FlaskClient, prefix: str
) -> None:
    with app.app_context():
        drop_tables(state.engine(), prefix)
    for path in EVERY_PAGE:
        response = signed_in.get(path)
        body = page_text(response)
        assert response.status_code == 503, path
        assert "tables do not exist yet" in body, path
        assert re.search(r"<code>[^<]* claw init-db</code>", body), path
        links = set(re.findall(r'href="([^"]+)"', body.split("<main>", 1)[1]))
        # Reload this page once the tables exist, or open the settings; never another 503.
        assert links == {html.escape(path.split("?")[0]), "/settings"}, path
    settings = signed_in.get("/settings")
    assert settings.status_code == 200, "the page the 503 links to opens without the tables"
    json = signed_in.get("/", headers={"Accept": "application/json"}).get_json()
    assert json["command"].endswith(" claw init-db") and "CLAW_DATABASE_URL=" in json["command"]


def test_a_new_database_says_there_are_no_conversations_yet(signed_in: FlaskClient) -> None:
    body = page_text(signed_in.get("/conversations/"))
    assert "No conversations are stored yet." in body
    assert "No conversations match." not in body
    filtered = page_text(signed_in.get("/conversations/?q=parcel"))
    assert "No conversations match." in filtered


def test_cold_memory_on_an_empty_namespace_does_not_claim_every_entry_was_injected(
    signed_in: FlaskClient,
) -> None:
    body = page_text(signed_in.get("/cold?namespace=nothing-here"))
    assert "Every entry was injected at least once." not in body
    assert "There are no live entries in <code>nothing-here</code>, so nothing is cold." in body


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({}, "Compaction is <strong>off</strong>: both thresholds are 0"),
        ({"COMPACT_MAX_MESSAGES": 40}, "<strong>40</strong> messages; the token threshold is off."),
        ({"COMPACT_MAX_TOKENS": 900}, "<strong>900</strong> estimated tokens (UTF-8 bytes ÷ 4); the message"),
    ],
)
def test_settings_never_say_a_threshold_of_off_messages(
    make_app: Callable[..., Flask], config: dict[str, int], said: str
) -> None:
    body = page_text(_admin_client(make_app(**config)).get("/settings"))
    assert said in body
    assert "<strong>off</strong> messages" not in body and "<strong>off</strong> estimated" not in body


def test_redis_entries_show_the_ttl_redis_holds_even_when_another_program_wrote_them(
    make_app: Callable[..., Flask], prefix: str
) -> None:
    app = make_app(MEMORY_DRIVER="redis", REDIS_URL=backend_url("redis"))
    with app.app_context():
        driver = state.driver()
        client = driver.client  # type: ignore[attr-defined]
        state.memory().set("ours", "v", "ttl", ttl=600)
        # Another program's write: no expiry in the stored form, only a Redis TTL.
        client.set(driver.entry_key("theirs", "ttl"), '[null,"w"]', ex=600)  # type: ignore[attr-defined]
        client.zadd(driver.index_key("ttl"), {"theirs": float("inf")})  # type: ignore[attr-defined]
    try:
        body = page_text(_admin_client(app).get("/memory/ttl/"))
        for key in ("ours", "theirs"):
            shown = rf'<code>{key}</code></a></td>\s*<td[^>]*><span class="tag expiring">expires in 10 min<'
            assert re.search(shown, body), key
    finally:
        with app.app_context():
            for key in list(client.scan_iter(match=f"{prefix}phpclaw:*")):
                client.delete(key)


def test_chart_geometry() -> None:
    bars = charts.columns(["a", "b"], [2, 4])
    assert [(bar.height, bar.y) for bar in bars] == [(50.0, 50.0), (100.0, 0.0)]
    assert charts.line_points([0, 5, 10]) == "0.0,100.0 50.0,50.0 100.0,0.0"
    assert charts.totals_over_time(10, [1, 2, 3]) == [5, 7, 10]
    segments = charts.shares([("a", "", 1), ("b", "", 0), ("c", "", 3)], 8)
    assert [(s.state, s.start, s.width) for s in segments] == [("a", 0.0, 12.5), ("c", 12.5, 37.5)]
    with pytest.raises(ValueError, match="2 labels for 1 values"):
        charts.columns(["a", "b"], [1])


def test_the_charts_counts_per_day_equal_a_range_count_of_each_day(
    engine: sa.engine.Engine, prefix: str
) -> None:
    # Rows on a midnight, a microsecond before one, before the window and after today: each
    # server's count by day (messages, conversations, memory rows) agrees with counting each
    # day's range, as SQLite does.
    now = datetime(2024, 5, 10, 13, 5)
    edges = day_edges(now, 7)
    schema = tables(prefix)
    moments = [
        edges[0] - timedelta(microseconds=1),
        edges[0],
        edges[1] - timedelta(microseconds=1),
        edges[1],
        edges[3] + timedelta(hours=23, minutes=59, seconds=59),
        edges[6],
        edges[7],
    ]
    with engine.begin() as conn:
        for number, moment in enumerate(moments):
            conn.execute(
                sa.insert(schema.conversations).values(
                    id=f"c{number}",
                    namespace="default",
                    user_id="",
                    title=None,
                    metadata=None,
                    created_at=moment,
                    updated_at=moment + timedelta(minutes=5),
                    total_tokens=number or None,
                )
            )
            for position in range(number + 1):
                conn.execute(
                    sa.insert(schema.messages).values(
                        id=f"m{number}-{position}",
                        conversation_id=f"c{number}",
                        role="user",
                        content="x",
                        tool_name=None,
                        tool_input=None,
                        metadata=None,
                        created_at=moment,
                    )
                )
                conn.execute(
                    sa.insert(schema.memory).values(
                        id=f"r{number}-{position}",
                        namespace="default",
                        lookup_key=f"k{number}-{position}",
                        value="v",
                        metadata=None,
                        expires_at=None,
                        created_at=moment,
                        updated_at=moment,
                    )
                )
    with engine.connect() as conn:
        found = activity.activity(conn, prefix, now, 7)
        assert found.messages == activity.messages_per_day(conn, prefix, edges) == [5, 4, 0, 5, 0, 0, 6]
        per_day = activity.conversations_per_day(conn, prefix, edges)
        assert found.conversations == per_day == [2, 1, 0, 1, 0, 0, 1]
        memory_rows = activity.memory_rows_per_day(conn, prefix, edges)
        ranges = activity.counts_between(conn, schema.memory.c.created_at, edges)
        assert memory_rows == ranges == found.messages
    with engine.begin() as conn:  # namespaces in another case and order, one row expired, one expiring
        for number, (namespace, expires_at) in enumerate([("Zed", 1), ("alpha", 2**40), ("Zed", None)]):
            conn.execute(
                sa.insert(schema.memory).values(
                    id=f"n{number}",
                    namespace=namespace,
                    lookup_key=f"n{number}",
                    value="v",
                    metadata=None,
                    expires_at=expires_at,
                    created_at=edges[2],
                    updated_at=edges[2],
                )
            )
    with engine.connect() as conn:
        seconds = int(now.timestamp())
        together = activity.memory_counts_and_rows_per_day(conn, prefix, seconds, edges)
        counts = kv.namespace_counts(conn, prefix, seconds)
        apart = (counts, activity.memory_rows_per_day(conn, prefix, edges))
    assert together == (apart if engine.dialect.name != "sqlite" else None)
    assert [count.namespace for count in apart[0]] == sorted(["Zed", "alpha", "default"])
    assert apart[1] == [5, 4, 3, 5, 0, 0, 6]
    assert (found.conversations_now, found.total_tokens) == (7, 21)
    assert (found.oldest, found.newest) == (moments[0], moments[-1] + timedelta(minutes=5))


def test_day_edges_are_utc_midnights_ending_tomorrow() -> None:
    edges = day_edges(datetime(2024, 5, 1, 13, 5), 3)
    assert edges == [datetime(2024, 4, 29), datetime(2024, 4, 30), datetime(2024, 5, 1), datetime(2024, 5, 2)]
    for bad in (0, 367, True, "3"):
        with pytest.raises(ValueError, match="days must be a whole number from 1 to 366"):
            day_edges(datetime(2024, 5, 1), bad)  # type: ignore[arg-type]


def _message_rows(body: str, prefix: str) -> int:
    found = re.search(rf'<code>{prefix}phpclaw_messages</code></td>\s*<td class="num"[^>]*>(\d+)</td>', body)
    assert found, "the Tables section lists the messages table"
    return int(found.group(1))


def test_table_counts_are_taken_at_most_once_a_minute_and_say_when(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, prefix: str
) -> None:
    assert _message_rows(page_text(signed_in.get("/")), prefix) == 0
    with app.app_context():
        state.conversations().append("c1", [{"role": "user", "content": "hello"}])
    clock.advance(59)
    body = page_text(signed_in.get("/"))
    assert _message_rows(body, prefix) == 0, "counted less than a minute ago: the same counts"
    assert "Rows and sizes counted 2023-11-14 22:13:20 UTC; counted again at most once every 1 min." in body
    assert _chart_rows(body, "messages-chart")[-1] == ("14 Nov", 1), "the charts are never behind"
    assert _chart_rows(body, "conversations-chart")[-1] == ("14 Nov", 1)
    clock.advance(1)
    body = page_text(signed_in.get("/"))
    assert _message_rows(body, prefix) == 1
    assert "Rows and sizes counted 2023-11-14 22:14:20 UTC" in body


@pytest.mark.parametrize("memory_driver", ["array", "file"])
def test_a_driver_without_write_times_says_so_instead_of_a_memory_chart(
    make_app: Callable[..., Flask], memory_driver: str
) -> None:
    app = make_app(MEMORY_DRIVER=memory_driver)
    with app.app_context():
        state.memory().set("kept", "v", "shop", ttl=600)
    body = page_text(_admin_client(app).get("/"))
    assert f"The <code>{memory_driver}</code> driver keeps no write times" in body
    assert 'aria-labelledby="memory-chart-title"' not in body
    assert re.search(r'<code>shop</code>.*?data-label="Expiring">1</td>', body, re.S)


def test_init_db_adds_the_chart_indexes_and_every_per_day_count_uses_one(tmp_path: Any, prefix: str) -> None:
    engine = engine_for(sql_url("sqlite", tmp_path))
    schema = tables(prefix)
    create_tables(engine, prefix)
    wanted = {f"{prefix}phpclaw_msg_created": schema.messages, f"{prefix}phpclaw_mem_created": schema.memory}
    with engine.begin() as conn:
        for name, table in wanted.items():  # tables an earlier version made
            next(index for index in table.indexes if index.name == name).drop(conn)
    create_tables(engine, prefix)
    inspector = sa.inspect(engine)
    for name, table in wanted.items():
        assert name in {index["name"] for index in inspector.get_indexes(table.name)}
    created = (schema.messages.c.created_at, schema.conversations.c.created_at, schema.memory.c.created_at)
    for column in created:
        compiled = activity._interval_counts(column, 30).compile(dialect=engine.dialect)
        # The plan does not depend on the bounds' values, only on the statement.
        with engine.connect() as conn:
            plan = [
                row[-1]
                for row in conn.exec_driver_sql(
                    f"EXPLAIN QUERY PLAN {compiled}", tuple(None for _ in compiled.positiontup or ())
                )
            ]
        scans = [step for step in plan if step.startswith("SCAN") and step != "SCAN CONSTANT ROW"]
        assert scans == [] and len([step for step in plan if "USING COVERING INDEX" in step]) == 30, plan
    engine.dispose()
