"""The Overview's tokens: the total billed over every stored conversation and a chart of the
tokens billed per day, both from the providers' reported usage and checked against the tables;
a provider that reports none reads "not reported", never 0."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock, utc_datetime
from clawmem.crypto import generate_key, is_sealed
from clawmem.ids import new_id
from clawmem.sql.schema import tables
from clawmem.turn.conversations import Message
from clawmem.turn.pipeline import billed_tokens
from dashboard import accounts, state
from tests.conftest import SQL_BACKENDS
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]


def _from_tables(app: Flask) -> tuple[int | None, dict[str, int]]:
    """The total of ``total_tokens`` and the usage of the assistant rows per UTC day, read
    straight from the tables."""
    with app.app_context():
        schema = tables(state.settings().table_prefix)
        with state.engine().connect() as conn:
            total = conn.execute(sa.select(sa.func.sum(schema.conversations.c.total_tokens))).scalar()
            rows = conn.execute(
                sa.select(schema.messages.c.created_at, schema.messages.c.metadata).where(
                    schema.messages.c.role == "assistant"
                )
            ).all()
    per_day: dict[str, int] = {}
    for created_at, metadata in rows:
        tokens = billed_tokens(json.loads(metadata).get("usage")) if metadata else None
        if tokens is not None:
            label = f"{created_at.day} {created_at:%b}"
            per_day[label] = per_day.get(label, 0) + tokens
    return (None if total is None else int(total)), per_day


def _page(client: FlaskClient) -> str:
    response = client.get("/")
    assert response.status_code == 200
    return " ".join(page_text(response).split())


def _chart_rows(body: str) -> dict[str, str]:
    chart = body.split('id="tokens-chart-title"', 1)[1].split("</figure>", 1)[0]
    return dict(re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">([^<]+)</td></tr>", chart))


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_the_overview_shows_the_tables_token_total_and_each_days_tokens(
    app: Flask, demo: None, signed_in: FlaskClient
) -> None:
    body = _page(signed_in)
    total, per_day = _from_tables(app)
    assert total and per_day
    assert f"Tokens billed, over every stored conversation: <strong>{total}</strong>" in body
    assert 'href="/conversations/?sort=-tokens"' in body  # the costliest first
    rows = _chart_rows(body)
    assert len(rows) == 30
    reported = {day: int(value) for day, value in rows.items() if value != "not reported"}
    assert reported == {day: tokens for day, tokens in per_day.items() if day in rows}
    # A day without a reporting turn says so, never 0.
    assert "0" not in rows.values()
    assert f"up to {max(reported.values())} tokens a day" in body


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_no_reported_usage_reads_not_reported_never_zero(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    with app.app_context():
        log = state.conversations()
        log.append(new_id(), [Message("user", "hello"), Message("assistant", "hi")], user_id="cust-1")
    body = _page(signed_in)
    assert "Tokens billed, over every stored conversation: <strong>not reported</strong>" in body
    assert "No provider reported token usage for a turn in these 30 days." in body
    assert "<strong>0</strong>" not in body.split("tokens-chart-title", 1)[1].split("</section>", 1)[0]


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_usage_outside_the_window_or_unreadable_counts_in_no_day(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    with app.app_context():
        log = state.conversations()
        conversation = new_id()
        log.append(
            conversation,
            [Message("user", "hi"), Message("assistant", "a", metadata={"usage": {"total_tokens": 40}})],
            tokens=40,
        )
        clock.advance(3600)
        log.append(
            conversation,
            [Message("user", "again"), Message("assistant", "b", metadata={"usage": {"prompt_tokens": 2}})],
            tokens=2,
        )
        schema = tables(state.settings().table_prefix)
        with state.engine().begin() as conn:
            # Another program's row: metadata that is not JSON is no usage.
            conn.execute(
                schema.messages.insert().values(
                    id="01J00000000000000000000000",
                    conversation_id=conversation,
                    role="assistant",
                    content="c",
                    metadata="{not json",
                    created_at=utc_datetime(clock),
                )
            )
            # And one from before the chart's 30 days.
            conn.execute(
                schema.messages.insert().values(
                    id="01J00000000000000000000001",
                    conversation_id=conversation,
                    role="assistant",
                    content="d",
                    metadata=json.dumps({"usage": {"total_tokens": 1000}}),
                    created_at=utc_datetime(clock) - timedelta(days=40),
                )
            )
    body = _page(signed_in)
    rows = _chart_rows(body)
    today = utc_datetime(clock)
    assert rows[f"{today.day} {today:%b}"] == "42"
    assert sum(1 for value in rows.values() if value != "not reported") == 1
    assert "Tokens billed, over every stored conversation: <strong>42</strong>" in body


@contextmanager
def _statements(app: Flask) -> Iterator[list[str]]:
    seen: list[str] = []

    def before(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    with app.app_context():
        engine = state.engine()
    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


def test_the_tokens_cost_the_overview_one_query(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    signed_in.get("/")  # the table counts are kept for a minute: count the page as most see it
    with _statements(app) as seen:
        assert signed_in.get("/").status_code == 200
    with app.app_context():
        messages = tables(state.settings().table_prefix).messages.name
    on_usage = [s for s in seen if messages in s and "metadata IS NOT NULL" in s]
    assert len(on_usage) == 1, on_usage
    print(f"the Overview ran {len(seen)} statements")


@pytest.mark.parametrize("dashboard_backend", SQL_BACKENDS, indirect=True)
def test_an_encrypted_sites_tokens_per_day_are_read_from_its_opened_metadata(
    make_app: Callable[..., Flask], clock: FakeClock
) -> None:
    app = make_app(ENCRYPTION_KEYS=generate_key("k1"))
    usage = {"usage": {"total_tokens": 40}, "memory_writing_tokens": 12}
    with app.app_context():
        state.conversations().append(
            new_id(), [Message("user", "hi"), Message("assistant", "a", metadata=usage)], tokens=52
        )
        schema = tables(state.settings().table_prefix)
        with state.engine().connect() as conn:
            stored = conn.execute(
                sa.select(schema.messages.c.metadata).where(schema.messages.c.role == "assistant")
            ).scalar_one()
        assert is_sealed(stored)  # sealed at rest: the chart must open it to count it
        accounts.create_admin(ADMIN, PASSWORD, clock())
    client = app.test_client()
    assert sign_in(client).status_code == 302
    body = _page(client)
    today = utc_datetime(clock)
    assert _chart_rows(body)[f"{today.day} {today:%b}"] == "52"
    writing = body.split('class="tokens-writing"', 1)[1].split("</p>", 1)[0]
    assert "memory writing" in writing and "<strong>12</strong>" in writing
    # Under a key that cannot open it, the row reports nothing and the page still renders.
    wrong = make_app(ENCRYPTION_KEYS=generate_key("k1")).test_client()
    assert sign_in(wrong).status_code == 302
    assert "No provider reported token usage for a turn in these 30 days." in _page(wrong)
