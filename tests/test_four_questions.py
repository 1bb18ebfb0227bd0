"""The operator's four questions, each answered on one page by the demo data (``flask claw
demo``), every number on the page checked against the tables themselves."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.sql.schema import create_tables, tables
from dashboard import accounts, state
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]


def _text(response: object) -> str:
    assert response.status_code == 200  # type: ignore[attr-defined]
    return " ".join(page_text(response).split())  # type: ignore[arg-type]


def _scalar(app: Flask, select: sa.Select) -> int:
    with app.app_context(), state.engine().connect() as conn:
        return int(conn.execute(select).scalar() or 0)


def _schema(app: Flask) -> Any:
    with app.app_context():
        return tables(state.settings().table_prefix)


def test_what_do_we_hold_about_cust_1001(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    schema = _schema(app)
    conversations, messages, memory = schema.conversations, schema.messages, schema.memory
    theirs = sa.select(conversations.c.id).where(conversations.c.user_id == "cust-1001")
    said = _scalar(
        app,
        sa.select(sa.func.count()).where(
            messages.c.conversation_id.in_(theirs), messages.c.role.not_in(("recall", "summary"))
        ),
    )
    recall = _scalar(
        app,
        sa.select(sa.func.count()).where(messages.c.conversation_id.in_(theirs), messages.c.role == "recall"),
    )
    count = _scalar(app, sa.select(sa.func.count()).select_from(theirs.subquery()))
    tokens = _scalar(
        app,
        sa.select(sa.func.sum(conversations.c.total_tokens)).where(conversations.c.user_id == "cust-1001"),
    )
    entries = _scalar(app, sa.select(sa.func.count()).where(memory.c.namespace == "user:cust-1001"))
    body = _text(signed_in.get("/subjects/cust-1001"))
    assert said > 0 and recall > 0 and entries > 0 and tokens > 0
    assert f"<dt>Conversations</dt><dd><strong>{count}</strong></dd>" in body
    assert f"<dt>Messages</dt><dd><strong>{said}</strong> said" in body
    assert f"{recall} recall records" in body
    assert str(tokens) in body
    assert len(re.findall(r'href="/memory/user:cust-1001/entry\?key=', body)) == entries
    assert "claw export --user-id cust-1001" in html.unescape(body)


def test_storage_switched_off_what_about_earlier_rows(make_app: Callable[..., Flask], demo: None) -> None:
    off = make_app(STORE_MESSAGES=False)
    schema = _schema(off)
    with off.app_context():
        accounts.create_admin("operator", PASSWORD, 0)
    client = off.test_client()
    assert sign_in(client, "operator", PASSWORD).status_code == 302
    body = _text(client.get("/"))
    stored = _scalar(off, sa.select(sa.func.count()).select_from(schema.conversations))
    messages = _scalar(off, sa.select(sa.func.count()).select_from(schema.messages))
    rows = _scalar(off, sa.select(sa.func.count()).select_from(schema.memory))
    assert "Message storage is off, but earlier data is still here" in body
    assert f"<strong>{stored}</strong> conversations and <strong>{messages}</strong> messages" in body
    assert f"<strong>{rows}</strong> memory rows" in body
    assert "holds your own content" in body and "--dry-run" in body


def test_who_pays_for_long_conversations(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    conversations = _schema(app).conversations
    with app.app_context(), state.engine().connect() as conn:
        costliest = conn.execute(
            sa.select(conversations.c.id, conversations.c.user_id, conversations.c.total_tokens)
            .where(conversations.c.total_tokens.is_not(None))
            .order_by(conversations.c.total_tokens.desc(), conversations.c.id.desc())
            .limit(1)
        ).one()
    total = _scalar(app, sa.select(sa.func.sum(conversations.c.total_tokens)))
    overview = _text(signed_in.get("/"))
    assert f"Tokens billed, over every stored conversation: <strong>{total}</strong>" in overview
    body = _text(signed_in.get("/conversations/?sort=-tokens"))
    first = body.split("<tbody>", 1)[1].split("</tr>", 1)[0]
    assert f'href="/conversations/{costliest.id}"' in first
    assert f'data-label="Tokens">{costliest.total_tokens}</td>' in first
    assert f">{costliest.user_id}</bdi>" in first  # who: the subject, linked to their page
    unreported = _scalar(app, sa.select(sa.func.count()).where(conversations.c.total_tokens.is_(None)))
    assert unreported > 0  # the demo has a provider that reports none: never shown as 0
    assert 'data-label="Tokens">0</td>' not in body


def test_does_one_site_see_another_sites_memory(
    make_app: Callable[..., Flask], demo: None, prefix: str, clock: FakeClock
) -> None:
    sites = make_app(SITES=f"site2={prefix},site4={prefix}s4_")
    with sites.app_context():
        four = state.sites_of(sites)["site4"]
        create_tables(four.engine, four.prefix)
        four.memory.set("returns", "site four takes returns for 14 days")
        accounts.create_admin(ADMIN, PASSWORD, clock())
    client = sites.test_client()
    assert sign_in(client).status_code == 302
    body = _text(client.get("/sites/?site=site4"))
    schema = _schema(sites)
    with sites.app_context():
        two = state.sites_of(sites)["site2"]
        looked_up = sum(
            len(two.driver.entries(namespace, limit=25).items)
            for namespace in sorted(two.driver.namespaces())[:20]
        )
    conversations = min(50, _scalar(sites, sa.select(sa.func.count()).select_from(schema.conversations)))
    assert "Site: <strong>site4</strong>" in body
    text = html.unescape(body)
    assert "a store opened for one site never reads, writes, sweeps or deletes another site" in text
    assert "No: this site's stores saw none of the other sites' entries or conversations." in text
    row = body.split("<tbody>", 1)[1].split("</tr>", 1)[0]
    assert "site2" in row and "apart" in row
    assert f'data-label="Entries looked up">{looked_up}</td>' in row
    assert f'data-label="Conversations looked up">{conversations}</td>' in row
