"""``flask claw demo`` loads realistic data through the real drivers, and the htmx fetch step."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from clawmem.clock import FakeClock, now_seconds
from clawmem.recall.words import text_of
from clawmem.rules import ttl_state
from clawmem.turn.conversations import Message
from clawmem.turn.guards import scan
from dashboard import accounts, state, vendor
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]


def test_demo_has_namespaces_in_every_ttl_state(app: Flask, demo: None, clock: FakeClock) -> None:
    with app.app_context():
        memory = state.driver()
        namespaces = memory.namespace_counts()
        rows = [row for n in namespaces for row in memory.entries(n.namespace, limit=500).items]
    assert len(namespaces) >= 3
    states = Counter(ttl_state(row.expires_at, now_seconds(clock))[0] for row in rows)
    assert states["permanent"] >= 5 and states["expiring"] >= 2 and states["expired"] >= 2
    assert sum(n.expired for n in namespaces) == states["expired"]
    emails = [row.key for row in rows if any(f.pattern == "email" for f in scan(text_of(row.value)))]
    assert emails == ["escalation_contact"]


def test_demo_keeps_each_customers_facts_in_their_subject_namespace(app: Flask, demo: None) -> None:
    with app.app_context():
        memory = state.memory()
        assert memory.get("profile", "user:cust-1001")["name"] == "Alice Moreau"
        assert memory.get("profile", "user:cust-2002")["name"] == "Bob Okafor"
        assert memory.get("profile", "default") is None
        assert "conversations" not in state.driver().namespaces()
        accounts.create_admin(ADMIN, PASSWORD, 0)
    client = app.test_client()
    sign_in(client)
    index = page_text(client.get("/memory/"))
    assert re.search(
        r'<a href="/memory/user:cust-1001/"><code>user:cust-1001</code></a>\s*'
        r'<span class="subject">subject <a href="/subjects/cust-1001"[^>]*>'
        r"<bdi>cust-1001</bdi></a></span>",
        index,
    )
    assert '<a href="/subjects/cust-2002"' in index
    assert "<code>default</code></a></td>" in index, "a namespace that is no subject's names none"
    listing = page_text(client.get("/memory/user:cust-1001/"))
    assert re.search(
        r'The own facts of subject <a href="/subjects/cust-1001"[^>]*>'
        r"<code>cust-1001</code></a>",
        listing,
    )
    assert "Alice Moreau" in listing


def test_demo_follows_a_configured_subject_namespace(make_app: Callable[..., Flask]) -> None:
    app = make_app(SUBJECT_NAMESPACE="customers.{user_id}")
    assert app.test_cli_runner().invoke(args=["claw", "demo"]).exit_code == 0
    with app.app_context():
        assert state.memory().get("profile", "customers.cust-1001")["name"] == "Alice Moreau"
        assert "user:cust-1001" not in state.driver().namespaces()
        accounts.create_admin(ADMIN, PASSWORD, 0)
    client = app.test_client()
    sign_in(client)
    assert '<a href="/subjects/cust-1001"' in page_text(client.get("/memory/"))


def test_demo_has_thirty_conversations_with_tool_rows_and_two_subjects(app: Flask, demo: None) -> None:
    with app.app_context():
        conversations = state.conversations()
        listed = conversations.list(limit=100).items
        messages = [m for c in listed for m in conversations.messages(c.id, limit=1000).items]
        alice = conversations.list(user_id="cust-1001", limit=100).items
        bob = conversations.list(user_id="cust-2002", limit=100).items
        alice_text = [m.content or "" for c in alice for m in conversations.messages(c.id).items]
    assert len(listed) == 30
    assert {m.role for m in messages} == {"system", "user", "assistant", "tool", "recall"}
    users = [m for m in messages if m.role == "user"]
    recalls = [m for m in messages if m.role == "recall"]
    assert len(recalls) == len(users), "every user turn has its recall record"
    assert any(m.tool_input for m in messages if m.role == "assistant")
    assert len(alice) >= 4 and len(bob) >= 4
    assert any("Alice Moreau" in text for text in alice_text)
    created = sorted(c.created_at for c in listed)
    assert (created[-1] - created[0]).days >= 14, "conversations spread over weeks"
    first = conversations.messages(listed[0].id).items
    assert len({m.created_at for m in first}) > 1, "messages were saved turn by turn"


def test_demo_if_new_loads_only_into_a_new_database(make_app: Callable[..., Flask], tmp_path: Path) -> None:
    fresh = make_app()
    runner = fresh.test_cli_runner()
    # make_app created the tables: the database is not new, so nothing is loaded.
    skipped = runner.invoke(args=["claw", "demo", "--if-new"])
    assert skipped.exit_code == 0 and "not loaded" in skipped.output
    with fresh.app_context():
        assert state.conversations().counts()["conversations"] == 0


def test_demo_if_new_loads_into_an_empty_database(make_app: Callable[..., Flask], tmp_path: Path) -> None:
    app = make_app(DATABASE_URL=f"sqlite:///{tmp_path / 'new.db'}")
    with app.app_context():
        from clawmem.sql.schema import drop_tables

        drop_tables(state.engine(), state.settings().table_prefix)
    result = app.test_cli_runner().invoke(args=["claw", "demo", "--if-new"])
    assert result.exit_code == 0 and "loaded demo data" in result.output


def test_demo_reset_replaces_only_demo_data(app: Flask, demo: None) -> None:
    with app.app_context():
        state.memory().set("operator_fact", "kept", "default")
        state.memory().set("profile", {"name": "Carol"}, "user:cust-3003")
        state.conversations().append(
            "01OWNCONVERSATION00000000",
            [Message("user", "a real question")],
            user_id="cust-3003",
            title="real",
        )
    runner = app.test_cli_runner()
    refused = runner.invoke(args=["claw", "demo", "--reset"])
    assert refused.exit_code == 1 and "--yes" in refused.output
    result = runner.invoke(args=["claw", "demo", "--reset", "--yes"])
    assert result.exit_code == 0, result.output
    assert "removed demo data: 30 conversations" in result.output
    with app.app_context():
        conversations, memory = state.conversations(), state.driver()
        assert conversations.counts()["conversations"] == 31
        assert memory.entry("default", "operator_fact") is not None
        assert memory.entry("user:cust-3003", "profile") is not None
        assert memory.entry("user:cust-1001", "profile") is not None, "the demo was loaded again"
        assert conversations.get("01OWNCONVERSATION00000000") is not None
    audit = [json.loads(line) for line in Path(app.instance_path, "audit.log").read_text().splitlines()]
    assert audit[-1]["command"] == "demo" and audit[-1]["counts"]["conversations"] == 30


def test_demo_refuses_when_the_privacy_switch_is_off(make_app: Callable[..., Flask]) -> None:
    app = make_app(STORE_MESSAGES=False)
    result = app.test_cli_runner().invoke(args=["claw", "demo"])
    assert result.exit_code == 1 and "CLAW_STORE_MESSAGES is false" in result.output


# -- htmx ------------------------------------------------------------------------------------


def test_fetch_without_npm_fails_clearly_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "vendor" / "htmx.min.js"
    with pytest.raises(vendor.FetchError, match="npm is not installed"):
        vendor.fetch_htmx(target, npm="npm-that-does-not-exist")
    assert not target.exists()


def test_a_file_with_other_content_is_not_taken_for_htmx(tmp_path: Path) -> None:
    target = tmp_path / "htmx.min.js"
    target.write_text("alert('not htmx')")
    assert not vendor.is_current(target)


def test_the_fetch_step_warns_but_succeeds_unless_strict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(vendor, "DESTINATION", tmp_path / "htmx.min.js")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vendor.main([]) == 0
    assert "works without JavaScript" in capsys.readouterr().err
    assert vendor.main(["--strict"]) == 1


def test_demo_turns_show_what_they_were_given_with_one_entry_changed_and_one_expired_since(
    app: Flask, demo: None, signed_in: Any
) -> None:
    with app.app_context():
        conversations = state.conversations()
        listed = conversations.list(limit=100).items
        records = [
            m for c in listed for m in conversations.messages(c.id, limit=1000).items if m.role == "recall"
        ]
    given = {entry["key"] for record in records for entry in json.loads(record.content)}
    assert {"last_order", "warehouse_backlog"} <= given
    states: dict[str, set[str]] = {}
    for conversation in listed:
        body = signed_in.get(f"/conversations/{conversation.id}").get_data(as_text=True)
        for now_state, key in re.findall(
            r'<li class="now-(\w+)">(?:<a href="[^"]+">)?<code>([^<]+)</code>', body
        ):
            states.setdefault(key, set()).add(now_state)
    assert states["last_order"] == {"changed"}
    assert states["warehouse_backlog"] == {"expired"}
