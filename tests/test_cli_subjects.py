"""Subject access and erasure: ``flask claw export`` and ``erase`` on every SQL backend and every
key/value driver, and the same through the installed ``clawmem`` console script.

For a user id, the export holds every conversation of exactly that id (messages in order, tool
rows included), their whole subject namespace, and entries elsewhere that mention the id as a
whole token, expired-but-unswept ones included; nothing of anyone else, not even of a subject
whose id extends theirs. After an erase a fresh export is empty and everyone else's data is
byte-identical where it is stored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.cli.audit import audit_key, subject_hash
from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.base import contains_text
from clawmem.memory.sql import SqlMemory
from clawmem.records import MemoryRow
from clawmem.rules import subject_namespace
from clawmem.sql.schema import tables
from clawmem.turn.conversations import ConversationLog
from tests.test_cli_basics import (
    KV_DRIVERS,
    ROOT,
    add_conversation,
    audit_lines,
    build_app,
    build_driver_app,
    build_file_app,
    claw,
    dump,
    stored_entries,
    url_of,
)

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
    # Their own namespaces (an e-mail address is not a plain id, so its name is encoded): taken
    # whole, whether or not an entry mentions them.
    memory.set("tea", "green", subject_namespace(ALICE))
    memory.set("tea", "black", subject_namespace(BOB))
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
    assert document["subject_namespace"] == subject_namespace(ALICE) != f"user:{ALICE}"
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
    assert [(e["namespace"], e["key"], e["value"]) for e in document["memory"]] == [
        (subject_namespace(ALICE), "tea", "green")
    ]
    # Mentions elsewhere are listed apart, each with the text that matched.
    entries = {(e["namespace"], e["key"]): e for e in document["mentions"]}
    assert set(entries) == {
        ("default", f"customer:{ALICE}:address"),
        ("crm", "prefs"),
        ("crm", f"visit:{ALICE}"),
    }
    assert document["mentions_searched"] is True
    assert entries[("crm", "prefs")]["value"] == {"contact": {"email": ALICE}, "tea": True}
    assert (
        entries[("crm", "prefs")]["matched_in"] == "value" and ALICE in entries[("crm", "prefs")]["matched"]
    )
    assert entries[("default", f"customer:{ALICE}:address")]["matched_in"] == "key"
    assert entries[("crm", f"visit:{ALICE}")]["expired"] is True
    assert entries[("crm", "prefs")]["expires_at"] is None and not entries[("crm", "prefs")]["expired"]
    assert document["counts"] == {"conversations": 2, "messages": 6, "memory": 1, "mentions": 3}
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
    kept = dump(engine, prefix)
    with_mentions = claw(app, "erase", "--user-id", ALICE, "--mentions", "--yes")
    again = claw(app, "erase", "--user-id", ALICE, "--mentions", "--yes")

    assert "would delete 2 conversations, 6 messages and 1 memory entry" in preview.output
    assert "3 mentions of the subject in other namespaces are kept; add --mentions" in preview.output
    assert (
        "  mention crm/prefs (value): " in preview.output
        and f"mention crm/visit:{ALICE} (key)" in preview.output
    )
    assert all(f"conversation {cid}" in preview.output for cid in people["alice"])
    assert "deleted 2 conversations, 6 messages and 1 memory entry; kept 3 mentions" in result.output
    # Without --mentions, nothing outside the subject's namespace went.
    assert {(row[1], row[2]) for row in kept[tables(prefix)[3].name]} == {
        (row[1], row[2]) for row in before[tables(prefix)[3].name]
    } - {(subject_namespace(ALICE), "tea")}
    assert "deleted 0 conversations, 0 messages and 3 memory entries" in with_mentions.output
    assert again.exit_code == 0 and "deleted 0 conversations, 0 messages and 0 memory entries" in again.output
    document = _export(app, "--user-id", ALICE)
    assert document["conversations"] == [] and document["memory"] == [] and document["mentions"] == []
    after = dump(engine, prefix)
    _, conversations, messages, memory = tables(prefix)
    assert after[conversations.name] == [
        row for row in before[conversations.name] if row[0].rstrip() in kept_ids
    ]
    assert after[messages.name] == [row for row in before[messages.name] if row[1].rstrip() in kept_ids]
    assert {(row[1], row[2]) for row in after[memory.name]} == {
        ("default", "bob"),
        ("default", "capitals"),
        (subject_namespace(BOB), "tea"),
    }
    lines = audit_lines(app)
    assert [(line["command"], line["dry_run"], line["counts"]["conversations"]) for line in lines] == [
        ("erase", True, 2),
        ("erase", False, 2),
        ("erase", False, 0),
        ("erase", False, 0),
        ("export", False, 0),
    ]
    assert [line["counts"]["mentions_kept"] for line in lines[:4]] == [3, 3, 0, 0]
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
    assert [e["key"] for e in _export(app, "--match", "ALICE@")["mentions"]] == ["capitals"]

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
    assert [e["key"] for e in document["mentions"]] == [f"summary:{conversation_id}"]
    assert missing.exit_code == 1 and "no conversation with id" in missing.output


def test_export_to_a_file_is_private_and_never_overwrites_by_accident(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    _people(engine, prefix, clock)
    target = tmp_path / "alice.json"

    written = claw(app, "export", "--user-id", ALICE, "--output", str(target))
    assert (
        written.exit_code == 0
        and f"wrote {target}: 2 conversations, 6 messages, 1 memory entry of the subject namespace "
        "and 3 mentions elsewhere"
        in written.output
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
    # One shape on every driver (SQL's created_at/updated_at are null here: files keep no times).
    assert {(e["namespace"], e["key"], e["expired"], e["created_at"]) for e in document["mentions"]} == {
        ("default", f"customer:{ALICE}", False, None),
        ("crm", "prefs", False, None),
    }
    preview = claw(app, "erase", "--user-id", ALICE, "--dry-run", "-v")
    listed = sorted(
        line.split(" (")[0].strip() for line in preview.output.splitlines() if line.startswith("  mention ")
    )
    assert listed == ["mention crm/prefs", f"mention default/customer:{ALICE}"]
    result = claw(app, "erase", "--user-id", ALICE, "--mentions", "--yes")
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
    assert {e["key"] for e in document["mentions"]} == {
        key for key in keys if contains_text(MemoryRow("default", key, {"note": key[::-1]}, None, 0), needle)
    }


# -- one subject in all three places, beside a subject whose id extends theirs ------------------

SUBJECT, NEIGHBOUR = "cust-42", "cust-420"  # the neighbour's id has the subject's as a prefix
TTL = 3600  # long enough that the real Redis never expires an entry while a test runs


@dataclass(frozen=True)
class Held:
    """What a subject was given: conversation ids (oldest first), their message counts, and the
    (namespace, key) of every key/value entry that concerns them."""

    conversations: list[str]
    messages: list[int]
    entries: set[tuple[str, str]]
    expired: set[tuple[str, str]]


def seed_subject(memory: Any, log: ConversationLog, clock: FakeClock, user_id: str, tag: str) -> Held:
    """Give ``user_id`` conversations, a subject namespace (one entry about to expire) and
    mentions elsewhere, in the key and in the value. ``tag`` keeps two subjects' keys apart."""
    order = [new_id(), new_id()]
    log.append(
        order[0],
        [
            {"role": "user", "content": "Where is my order?"},
            {"role": "assistant", "content": None, "tool_name": "orders", "tool_input": {"id": user_id}},
            {"role": "tool", "content": "shipped", "tool_name": "orders"},
        ],
        user_id=user_id,
        title="Order",
    )
    clock.advance(1)
    log.append(
        order[1],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        user_id=user_id,
    )
    own = subject_namespace(user_id)
    memory.set("name", "Ada", own)
    memory.set("plan", {"tier": "gold"}, own)  # mentions nobody: the namespace is theirs
    memory.set("visit", {"at": "shop"}, own, ttl=TTL)
    memory.set(f"ticket:{user_id}", "open", "crm")  # the key mentions them
    memory.set(f"note-{tag}", {"text": f"call {user_id} tomorrow"}, "default")  # the value does
    memory.set(f"ref-{tag}", f"order_{user_id}_2024", "crm")  # "_" is neither letter nor digit
    memory.set(f"callback:{user_id}", "9am", f"visits-{tag}", ttl=TTL)
    entries = {
        (own, "name"),
        (own, "plan"),
        (own, "visit"),
        ("crm", f"ticket:{user_id}"),
        ("default", f"note-{tag}"),
        ("crm", f"ref-{tag}"),
        (f"visits-{tag}", f"callback:{user_id}"),
    }
    expired = {(own, "visit"), (f"visits-{tag}", f"callback:{user_id}")}
    return Held(order, [3, 2], entries, expired)


def seed_lookalikes(memory: Any, log: ConversationLog) -> None:
    """Conversations and entries that look like cust-42 but are nobody's above."""
    for user_id in ("CUST-42", "cust-42 ", "cust-4", "xcust-42"):
        log.append(new_id(), [{"role": "user", "content": "cust-42"}], user_id=user_id)
    for key, value in {
        "decoy-1": "xcust-42y",
        "decoy-2": "cust-4200 and écust-42 and cust-42٣",
        "decoy-3": "CUST-42",
        "acct:cust-42a": "n/a",
    }.items():
        memory.set(key, value, "default")
    memory.set("x", 1, "user:CUST-42")  # another subject's namespace


def seed_both(memory: Any, log: ConversationLog, clock: FakeClock) -> tuple[Held, Held]:
    """Seed the subject, the neighbour and the lookalikes; then let the TTLs run out."""
    held = seed_subject(memory, log, clock, SUBJECT, "a"), seed_subject(memory, log, clock, NEIGHBOUR, "b")
    seed_lookalikes(memory, log)
    clock.advance(2 * TTL)  # the entries with a TTL are expired now, and nothing swept them
    return held


def check_export(document: dict[str, Any], held: Held) -> None:
    """Assert that an export by user id lists exactly what ``held`` says, and nothing else."""
    assert [c["id"] for c in document["conversations"]] == held.conversations
    assert [len(c["messages"]) for c in document["conversations"]] == held.messages
    assert _memory_pairs(document) == held.entries
    held_rows = document["memory"] + document["mentions"]
    assert {(e["namespace"], e["key"]) for e in held_rows if e["expired"]} == held.expired
    counts = document["counts"]
    assert (counts["conversations"], counts["messages"], counts["memory"] + counts["mentions"]) == (2, 5, 7)


def _memory_pairs(document: dict[str, Any]) -> set[tuple[str, str]]:
    """Return every entry an export holds: the subject namespace's and the mentions elsewhere."""
    return {(entry["namespace"], entry["key"]) for entry in document["memory"] + document["mentions"]}


def _rows_without(
    rows: dict[str, list[tuple[Any, ...]]], prefix: str, conversation_ids: set[str]
) -> dict[str, list[tuple[Any, ...]]]:
    conversations, messages = tables(prefix).conversations.name, tables(prefix).messages.name
    return {
        conversations: [row for row in rows[conversations] if row[0] not in conversation_ids],
        messages: [row for row in rows[messages] if row[1] not in conversation_ids],
    }


EVERY_DRIVER = [*KV_DRIVERS, pytest.param("sqlite", "array", id="array")]


@pytest.mark.parametrize(("sql_backend", "kv_driver"), EVERY_DRIVER)
def test_a_subject_in_all_three_places_is_exported_and_erased_exactly(
    request: pytest.FixtureRequest,
    engine: sa.engine.Engine,
    prefix: str,
    clock: FakeClock,
    tmp_path: Path,
    kv_driver: str,
) -> None:
    from dashboard import state

    app = build_driver_app(request, url_of(engine), prefix, clock, tmp_path, kv_driver)
    site = state.site_of(app)
    subject, neighbour = seed_both(site.memory, site.conversations, clock)

    check_export(_export(app, "--user-id", SUBJECT), subject)
    neighbour_export = _export(app, "--user-id", NEIGHBOUR)
    check_export(neighbour_export, neighbour)
    rows, entries = dump(engine, prefix), stored_entries(app)
    assert subject.entries | neighbour.entries <= set(entries)

    preview = claw(app, "erase", "--user-id", SUBJECT, "--mentions", "--dry-run", "-v")
    assert "would delete 2 conversations, 5 messages and 7 memory entries" in preview.output
    assert (dump(engine, prefix), stored_entries(app)) == (rows, entries)
    result = claw(app, "erase", "--user-id", SUBJECT, "--mentions", "--yes")
    assert result.exit_code == 0, result.output
    assert "deleted 2 conversations, 5 messages and 7 memory entries" in result.output

    after = _export(app, "--user-id", SUBJECT)
    assert (after["conversations"], after["memory"], after["mentions"]) == ([], [], [])
    assert _export(app, "--user-id", NEIGHBOUR) == neighbour_export
    # Everything else, the neighbour and the lookalikes, is byte-identical where it is stored.
    left = dump(engine, prefix)
    for name, kept in _rows_without(rows, prefix, set(subject.conversations)).items():
        assert left[name] == kept, name
    assert stored_entries(app) == {pair: raw for pair, raw in entries.items() if pair not in subject.entries}
    erased = [line for line in audit_lines(app) if line["command"] == "erase" and not line["dry_run"]]
    assert [line["counts"] for line in erased] == [
        {"conversations": 2, "messages": 5, "memory": 7, "mentions_kept": 0}
    ]


def test_the_subject_namespace_follows_the_configured_template(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    template = "people.{user_id}.facts"
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance", SUBJECT_NAMESPACE=template)
    memory = SqlMemory(engine, prefix, clock=clock)
    memory.set("name", "Ada", "people.cust-42.facts")
    memory.set("name", "Eve", "people.cust-420.facts")
    memory.set("name", "Bob", "user:cust-42")  # the default's namespace is an ordinary one here

    document = _export(app, "--user-id", SUBJECT)
    assert document["subject_namespace"] == "people.cust-42.facts"
    assert _memory_pairs(document) == {("people.cust-42.facts", "name")}
    assert claw(app, "erase", "--user-id", SUBJECT, "--yes").exit_code == 0
    assert memory.all("people.cust-42.facts") == {}
    assert (
        memory.get("name", "people.cust-420.facts") == "Eve" and memory.get("name", "user:cust-42") == "Bob"
    )


# -- the same through the installed ``clawmem`` console script -----------------------------------


def install_clawmem(tmp_path: Path) -> Path:
    """Install the working tree into a fresh virtualenv as `pip install .[mysql]` would; return
    the ``clawmem`` script. The tree is copied first, because building in place would leave
    ``build/`` and ``*.egg-info`` in the checkout."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "clawmem", source / "clawmem", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    # The venv gets no pip of its own (ensurepip is the slow part); this pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet"]
        + [f"{source}[mysql]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv / "bin" / "clawmem"


@pytest.mark.slow
@pytest.mark.parametrize("sql_backend", ["mysql"])
def test_the_console_script_exports_and_erases_a_subject_unattended(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path
) -> None:
    script = install_clawmem(tmp_path)
    python = script.parent / "python"
    # What is installed is the package alone: the copy in the venv, and no Flask.
    probe = "import importlib.util, clawmem; print(clawmem.__file__, importlib.util.find_spec('flask'))"
    found = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert found.stdout.startswith(str(tmp_path / "venv")) and found.stdout.endswith(" None\n"), found

    # The script runs on the real clock; seeding a day behind it leaves the TTLs run out.
    clock = FakeClock(time.time() - 86_400)
    memory, log = SqlMemory(engine, prefix, clock=clock), ConversationLog(engine, prefix, clock=clock)
    subject, neighbour = seed_both(memory, log, clock)
    instance = tmp_path / "instance"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CLAW_", "PYTHON"))}
    env.update(CLAW_DATABASE_URL=url_of(engine), CLAW_TABLE_PREFIX=prefix, CLAW_INSTANCE_PATH=str(instance))

    def clawmem(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *args],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,  # as under CI or cron: nobody to answer a question
            capture_output=True,
            text=True,
            timeout=120,
        )

    def export(user_id: str) -> dict[str, Any]:
        done = clawmem("export", "--user-id", user_id)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    usage = clawmem("--help")
    assert usage.returncode == 0 and "export" in usage.stdout, (
        "the installed clawmem script does not start; does it import a package that pyproject.toml "
        f"does not declare? {usage.stderr.strip().splitlines()[-1:]}"
    )
    check_export(export(SUBJECT), subject)
    neighbour_export = export(NEIGHBOUR)
    check_export(neighbour_export, neighbour)
    rows = dump(engine, prefix)

    refused = clawmem("erase", "--user-id", SUBJECT)
    assert refused.returncode == 1, refused
    assert (
        refused.stderr.startswith("Error: refusing to delete without --yes")
        and "Traceback" not in refused.stderr
    )
    assert dump(engine, prefix) == rows
    erased = clawmem("erase", "--user-id", SUBJECT, "--mentions", "--yes")
    assert erased.returncode == 0, erased.stderr
    assert "deleted 2 conversations, 5 messages and 7 memory entries" in erased.stdout

    after = export(SUBJECT)
    assert (after["conversations"], after["memory"], after["mentions"]) == ([], [], [])
    neighbour_after = export(NEIGHBOUR)
    assert neighbour_after.pop("generated_at") and neighbour_export.pop("generated_at")
    assert neighbour_after == neighbour_export
    left, memory_table = dump(engine, prefix), tables(prefix).memory.name
    for name, kept in _rows_without(rows, prefix, set(subject.conversations)).items():
        assert left[name] == kept, name
    assert left[memory_table] == [
        row for row in rows[memory_table] if (row[1], row[2]) not in subject.entries
    ]

    log_file = instance / "audit.log"
    assert log_file.stat().st_mode & 0o777 == 0o600
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    lines = [line for line in lines if line["phase"] == "finished"]
    # The first exports only read, so they made no instance folder to log in; the erase did.
    assert [(line["command"], line["outcome"]) for line in lines] == [
        ("erase", "refused"),
        ("erase", "ok"),
        ("export", "ok"),
        ("export", "ok"),
    ]
    hashed = subject_hash(SUBJECT, audit_key(instance))
    assert lines[1]["arguments"]["user_id"] == hashed == lines[2]["arguments"]["user_id"]
    assert lines[3]["arguments"]["user_id"] != hashed
    assert lines[1]["counts"] == {"conversations": 2, "messages": 5, "memory": 7, "mentions_kept": 0}
    assert SUBJECT not in log_file.read_text()
