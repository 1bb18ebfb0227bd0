"""The subject page: everything export covers for one person, its totals checked against the
tables, and a JSON download equal to the export command's output."""

from __future__ import annotations

import html
import json
import re

import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.sql.schema import tables
from clawmem.turn.conversations import Message
from dashboard import state
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]


def _counts(app: Flask, user_id: str) -> dict[str, int]:
    with app.app_context():
        schema = tables(state.settings().table_prefix)
        conversations, messages = schema.conversations, schema.messages
        theirs = sa.select(conversations.c.id).where(conversations.c.user_id == user_id)
        with state.engine().connect() as conn:
            rows = conn.execute(
                sa.select(messages.c.role, sa.func.count())
                .where(messages.c.conversation_id.in_(theirs))
                .group_by(messages.c.role)
            ).all()
            count = conn.execute(sa.select(sa.func.count()).select_from(theirs.subquery())).scalar()
    roles = dict(rows)
    said = sum(n for role, n in roles.items() if role not in ("recall", "summary"))
    return {
        "conversations": count,
        "said": said,
        "recall": roles.get("recall", 0),
        "summary": roles.get("summary", 0),
    }


def test_the_subject_page_answers_what_we_hold_with_the_tables_numbers(
    app: Flask, demo: None, signed_in: FlaskClient
) -> None:
    body = page_text(signed_in.get("/subjects/cust-1001"))
    counts = _counts(app, "cust-1001")
    assert counts["said"] > 0 and counts["recall"] > 0
    assert f"<dt>Conversations</dt><dd><strong>{counts['conversations']}</strong></dd>" in body
    assert f"<dt>Messages</dt><dd><strong>{counts['said']}</strong> said" in body
    assert f"<dd>{counts['recall']} recall records" in body
    # Their namespace's entries with TTL states, and the exact commands.
    assert "<code>user:cust-1001</code>" in body and 'class="tag permanent"' in body
    assert "claw erase --user-id cust-1001 --dry-run --verbose" in body
    assert "claw export --user-id cust-1001 --output subject.json" in body
    assert 'href="/subjects/cust-1001/export.json"' in body


def test_the_download_equals_the_export_command(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    download = signed_in.get("/subjects/cust-1001/export.json")
    assert download.status_code == 200 and download.mimetype == "application/json"
    assert "attachment" in download.headers["Content-Disposition"]
    result = app.test_cli_runner().invoke(args=["claw", "export", "--user-id", "cust-1001"])
    assert result.exit_code == 0, result.output
    assert download.get_data(as_text=True) == result.stdout
    assert json.loads(result.stdout)["counts"]["conversations"] == _counts(app, "cust-1001")["conversations"]


def test_mentions_elsewhere_are_listed_from_the_exports_own_query(app: Flask, signed_in: FlaskClient) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("owner-of-ticket-9", "cust-4242 asked for a refund", "default")
        memory.set("other", "cust-42420 is someone else", "default")
        memory.set("tone", "formal", "user:cust-4242")
    body = page_text(signed_in.get("/subjects/cust-4242"))
    # The page comes first; its mentions section asks for itself, and without JavaScript its
    # link shows the whole page with the mentions listed.
    pending = body.split('id="mentions-heading"')[1]
    assert "owner-of-ticket-9" not in pending
    link = re.search(r'<div id="subject-mentions" hx-get="([^"]+)" hx-trigger="load"', pending)
    assert link and f'<a href="{link.group(1)}#mentions-heading">' in pending
    assert '<dt>Mentioned elsewhere</dt><dd><a href="#mentions-heading">listed below</a></dd>' in body
    url = html.unescape(link.group(1))
    fragment = page_text(signed_in.get(url, headers={"HX-Request": "true", "HX-Target": "subject-mentions"}))
    assert fragment.lstrip().startswith('<div id="subject-mentions">') and "<h1>" not in fragment
    assert "owner-of-ticket-9" in fragment and "cust-42420 is" not in fragment
    assert "1 entry elsewhere mention" in fragment
    body = page_text(signed_in.get(url))
    mentions = body.split('id="mentions-heading"')[1]
    assert "owner-of-ticket-9" in mentions and "cust-42420 is" not in mentions and "hx-get" not in mentions
    assert "<dt>Mentioned elsewhere</dt><dd>1 entry</dd>" in body
    assert "<code>tone</code>" in body.split('id="namespace-heading"')[1].split('id="mentions-heading"')[0]
    assert "No conversation carries this user id." in body
    # No conversation, so nothing was billed: not "not reported", which speaks of turns.
    assert "<dt>Tokens billed</dt><dd>none: no conversation is stored</dd>" in body


def test_every_subject_link_leads_to_the_subject_page_and_the_search_box_finds_one(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    hostile = '<script>alert("x")</script> & /../"'
    with app.app_context():
        state.conversations().append("c-1", [Message("user", "hi")], user_id=hostile, title="t")
    listing = page_text(signed_in.get("/conversations/"))
    link = re.search(r'<td data-label="Subject"><a href="([^"]+)"', listing)
    assert link and html.unescape(link.group(1)).startswith("/subjects/")
    page = signed_in.get(html.unescape(link.group(1)))
    assert page.status_code == 200
    body = page_text(page)
    assert "<script>alert" not in body and "&lt;script&gt;" in body
    assert "<dt>Conversations</dt><dd><strong>1</strong></dd>" in body
    found = signed_in.get("/subjects/", query_string={"user_id": hostile})
    assert found.status_code == 302
    assert signed_in.get(found.headers["Location"]).get_data(as_text=True) == body
    assert "Show subject" in page_text(signed_in.get("/subjects/"))
    assert 'href="/subjects/"' in page_text(signed_in.get("/")), "the header links the subject search"
