"""Subject access and erasure: ``flask claw export`` and ``erase`` on every SQL backend.

For a subject, the export holds every one of their conversations (messages in order, tool rows
included) and every memory entry mentioning them, and nothing of anyone else; after an erase a
fresh export is empty and everyone else's rows are byte-identical.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.clock import FakeClock, utc_datetime
from clawmem.memory.sql import SqlMemory
from clawmem.sql.schema import tables
from clawmem.sql.subjects import entry_matches
from tests.test_cli_basics import add_conversation, audit_lines, build_app, build_file_app, claw, dump, url_of

ALICE, BOB = "alice@example.com", "bob@example.com"


@pytest.fixture
def app(engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path) -> Flask:
    return build_app(url_of(engine), prefix, clock, tmp_path / "instance")


def _people(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> dict[str, Any]:
    """Alice (two conversations, one with a tool call), Bob, and "Alice@example.com", who is
    someone else; memory entries about each, one of Alice's expired but not swept."""
    now = utc_datetime(clock)
    alice_tool_call = [
        {"role": "user", "content": "Where is my order?"},
        {
            "role": "assistant",
            "content": None,
            "tool_name": "orders",
            "tool_input": {"customer": ALICE, "n": 1},
        },
        {"role": "tool", "content": "shipped", "tool_name": "orders"},
        {"role": "assistant", "content": "It shipped yesterday."},
    ]
    people = {
        "alice": [
            add_conversation(
                engine,
                prefix,
                now - timedelta(days=5),
                user_id=ALICE,
                title="Order",
                messages=alice_tool_call,
            ),
            add_conversation(engine, prefix, now - timedelta(days=1), user_id=ALICE, messages=2),
        ],
        "bob": [
            add_conversation(
                engine,
                prefix,
                now - timedelta(days=2),
                user_id=BOB,
                title="Refund for Bob",
                messages=[{"role": "user", "content": "refund please, 100%_sure"}],
            ),
        ],
        "other": [add_conversation(engine, prefix, now, user_id="Alice@example.com", messages=1)],
    }
    memory = SqlMemory(engine, prefix, clock=clock)
    memory.set(f"customer:{ALICE}:address", "1 Main St")
    memory.set("prefs", {"contact": {"email": ALICE}, "tea": True}, "crm")
    memory.set(f"visit:{ALICE}", 1, "crm", ttl=1)
    memory.set("bob", f"{BOB} likes coffee")
    memory.set("capitals", "ALICE@EXAMPLE.COM shouts")
    clock.advance(5)
    return people


def _export(app: Flask, *args: str) -> dict[str, Any]:
    result = claw(app, "export", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_export_holds_everything_about_the_subject_and_nothing_else(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    people = _people(engine, prefix, clock)

    document = _export(app, "--user-id", ALICE)

    assert document["format"] == "clawmem-export/1" and document["subject"] == {"user_id": ALICE}
    assert document["generated_at"] == "2023-11-14T22:13:25.250000+00:00"
    assert [c["id"] for c in document["conversations"]] == people["alice"]  # oldest first
    first = document["conversations"][0]
    assert first["title"] == "Order" and first["user_id"] == ALICE
    assert [(m["role"], m["content"], m["tool_name"]) for m in first["messages"]] == [
        ("user", "Where is my order?", None),
        ("assistant", None, "orders"),
        ("tool", "shipped", "orders"),
        ("assistant", "It shipped yesterday.", None),
    ]
    assert first["messages"][1]["tool_input"] == {"customer": ALICE, "n": 1}
    assert first["messages"][0]["created_at"] < first["messages"][3]["created_at"]
    entries = {(e["namespace"], e["key"]): e for e in document["memory"]}
    assert set(entries) == {
        ("default", f"customer:{ALICE}:address"),
        ("crm", "prefs"),
        ("crm", f"visit:{ALICE}"),
    }
    assert entries[("crm", "prefs")]["value"] == {"contact": {"email": ALICE}, "tea": True}
    assert entries[("crm", f"visit:{ALICE}")]["expired"] is True
    assert entries[("crm", "prefs")]["expires_at"] is None and not entries[("crm", "prefs")]["expired"]
    assert document["counts"] == {"conversations": 2, "messages": 6, "memory": 3}
    text = json.dumps(document)
    assert "bob" not in text.lower() and "ALICE@EXAMPLE.COM" not in text and "Alice@example.com" not in text


def test_erase_leaves_nothing_to_export_and_everyone_else_intact(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    people = _people(engine, prefix, clock)
    before = dump(engine, prefix)
    kept_ids = set(people["bob"] + people["other"])

    preview = claw(app, "erase", "--user-id", ALICE, "--dry-run", "-v")
    assert dump(engine, prefix) == before
    result = claw(app, "erase", "--user-id", ALICE, "--yes", "--batch-size", "1")
    again = claw(app, "erase", "--user-id", ALICE, "--yes")

    assert "would delete 2 conversations, 6 messages and 3 memory entries" in preview.output
    assert all(f"conversation {cid}" in preview.output for cid in people["alice"])
    assert "deleted 2 conversations, 6 messages and 3 memory entries" in result.output
    assert again.exit_code == 0 and "deleted 0 conversations, 0 messages and 0 memory entries" in again.output
    document = _export(app, "--user-id", ALICE)
    assert document["conversations"] == [] and document["memory"] == []
    after = dump(engine, prefix)
    _, conversations, messages, memory = tables(prefix)
    assert after[conversations.name] == [
        row for row in before[conversations.name] if row[0].rstrip() in kept_ids
    ]
    assert after[messages.name] == [row for row in before[messages.name] if row[1].rstrip() in kept_ids]
    assert {row[2] for row in after[memory.name]} == {"bob", "capitals"}
    lines = audit_lines(app)
    assert [(line["command"], line["dry_run"], line["counts"]["conversations"]) for line in lines] == [
        ("erase", True, 2),
        ("erase", False, 2),
        ("erase", False, 0),
        ("export", False, 0),
    ]
    log = (Path(app.instance_path) / "audit.log").read_text()
    assert "alice" not in log.lower() and "order" not in log.lower()


def test_match_finds_text_in_titles_messages_and_tool_input_exactly(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    people = _people(engine, prefix, clock)
    by_title = _export(app, "--match", "Refund for")
    by_content = _export(app, "--match", "100%_sure")
    by_tool_input = _export(app, "--match", "customer")
    wildcard = _export(app, "--match", "100%sure")
    other_case = _export(app, "--match", "refund FOR")

    assert [c["id"] for c in by_title["conversations"]] == people["bob"]
    assert [c["id"] for c in by_content["conversations"]] == people["bob"]
    assert [c["id"] for c in by_tool_input["conversations"]] == people["alice"][:1]
    assert wildcard["conversations"] == [] and other_case["conversations"] == []
    assert [e["key"] for e in _export(app, "--match", "ALICE@")["memory"]] == ["capitals"]

    result = claw(app, "erase", "--match", "100%_sure", "--yes")
    assert "deleted 1 conversation, 1 message and 0 memory entries" in result.output
    assert _export(app, "--user-id", BOB)["conversations"] == []


def test_export_of_one_conversation_and_of_a_missing_one(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    people = _people(engine, prefix, clock)
    conversation_id = people["alice"][1]
    SqlMemory(engine, prefix, clock=clock).set(f"summary:{conversation_id}", "two messages")

    document = _export(app, "--conversation", conversation_id)
    missing = claw(app, "export", "--conversation", "01HZZZZZZZZZZZZZZZZZZZZZZZ")

    assert [c["id"] for c in document["conversations"]] == [conversation_id]
    assert len(document["conversations"][0]["messages"]) == 2
    assert [e["key"] for e in document["memory"]] == [f"summary:{conversation_id}"]
    assert missing.exit_code == 1 and "no conversation with id" in missing.output


def test_export_to_a_file_is_private_and_never_overwrites_by_accident(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    _people(engine, prefix, clock)
    target = tmp_path / "alice.json"

    written = claw(app, "export", "--user-id", ALICE, "--output", str(target))
    assert (
        written.exit_code == 0
        and f"wrote {target}: 2 conversations, 6 messages, 3 memory entries" in written.output
    )
    assert target.stat().st_mode & 0o777 == 0o600
    assert json.loads(target.read_text())["counts"]["conversations"] == 2

    target.write_text("keep me")
    refused = claw(app, "export", "--user-id", BOB, "--output", str(target))
    assert refused.exit_code == 1 and "--force" in refused.output and target.read_text() == "keep me"
    forced = claw(app, "export", "--user-id", BOB, "--output", str(target), "--force")
    assert forced.exit_code == 0 and json.loads(target.read_text())["subject"] == {"user_id": BOB}
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_subjects_on_the_file_driver_are_found_by_scanning_every_namespace(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    app, files = build_file_app(engine, prefix, clock, tmp_path)
    files.set(f"customer:{ALICE}", "1 Main St")
    files.set("prefs", {"email": ALICE}, "crm")
    files.set("bob", BOB, "crm")
    add_conversation(engine, prefix, utc_datetime(clock), user_id=ALICE, messages=1)

    document = _export(app, "--user-id", ALICE)
    assert {(e["namespace"], e["key"], e["driver"]) for e in document["memory"]} == {
        ("default", f"customer:{ALICE}", "file"),
        ("crm", "prefs", "file"),
    }
    preview = claw(app, "erase", "--user-id", ALICE, "--dry-run", "-v")
    listed = sorted(line.strip() for line in preview.output.splitlines() if line.startswith("  memory "))
    assert listed == ["memory crm/prefs", f"memory default/customer:{ALICE}"]
    result = claw(app, "erase", "--user-id", ALICE, "--yes")
    assert "deleted 1 conversation, 1 message and 2 memory entries" in result.output
    assert files.all("default") == {} and files.all("crm") == {"bob": BOB}


ALPHABET = "aAéE%_ \"\\'x"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    titles=st.lists(st.text(ALPHABET, max_size=6), min_size=1, max_size=5),
    keys=st.lists(st.text(ALPHABET, min_size=1, max_size=6), max_size=4, unique=True),
    needle=st.text(ALPHABET, min_size=1, max_size=3).filter(str.strip),
)
def test_match_is_an_exact_substring_test_on_every_database(
    app: Flask,
    engine: sa.engine.Engine,
    prefix: str,
    clock: FakeClock,
    titles: list[str],
    keys: list[str],
    needle: str,
) -> None:
    schema = tables(prefix)
    with engine.begin() as conn:
        for table in (schema.messages, schema.conversations, schema.memory):
            conn.execute(sa.delete(table))
    now = utc_datetime(clock)
    expected = set()
    for title in titles:
        conversation_id = add_conversation(
            engine,
            prefix,
            now,
            title=title[:3] or None,
            messages=[{"role": "user", "content": title[3:] or None}],
        )
        if needle in (title[:3] or "") or needle in title[3:]:
            expected.add(conversation_id)
    memory = SqlMemory(engine, prefix, clock=clock)
    for key in keys:
        memory.set(key, {"note": key[::-1]})
    document = _export(app, "--match", needle)
    assert {c["id"] for c in document["conversations"]} == expected
    # The SQL query and the scan that other drivers use apply one rule.
    assert {e["key"] for e in document["memory"]} == {
        key for key in keys if entry_matches(key, {"note": key[::-1]}, needle)
    }
