"""The three tables of a prefix: ``stats``, ``uninstall``, and multi-site. With two prefixes in
one database, like ``wp_`` and ``wp_2_``, every data command run with one prefix leaves the other
prefix's three tables byte-identical."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from clawmem.clock import FakeClock, utc_datetime
from clawmem.memory.file import FileMemory
from clawmem.memory.sql import SqlMemory
from clawmem.sql.schema import create_tables, drop_tables
from tests.test_cli_basics import add_conversation, audit_lines, build_app, claw, counts, dump, url_of


@pytest.fixture
def second_site(engine: sa.engine.Engine, prefix: str) -> Iterator[str]:
    """A second prefix whose table names start with the first prefix (``wp_`` / ``wp_2_``)."""
    other = f"{prefix}2_"
    create_tables(engine, other)
    yield other
    drop_tables(engine, other)


def _stock(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> list[str]:
    now = utc_datetime(clock)
    conversation_ids = [
        add_conversation(
            engine, prefix, now - timedelta(days=400), user_id="alice", title="tea order", messages=3
        ),
        add_conversation(
            engine,
            prefix,
            now - timedelta(days=200),
            updated_at=now - timedelta(days=100),
            user_id="bob",
            messages=2,
        ),
        add_conversation(engine, prefix, now, user_id="alice", messages=1),
    ]
    memory = SqlMemory(engine, prefix, clock=clock)
    memory.set("user:alice", "likes tea")
    memory.set("bob", {"likes": "coffee"}, "crm")
    memory.set("soon", 1, "crm", ttl=5)
    return conversation_ids


@pytest.fixture
def site(engine: sa.engine.Engine, prefix: str, second_site: str, clock: FakeClock, tmp_path: Path) -> Flask:
    return build_app(url_of(engine), prefix, clock, tmp_path / "instance")


def test_every_command_on_one_prefix_leaves_the_other_byte_identical(
    site: Flask, engine: sa.engine.Engine, prefix: str, second_site: str, clock: FakeClock
) -> None:
    _stock(engine, prefix, clock)
    others = _stock(engine, second_site, clock)
    clock.advance(10)
    untouched = dump(engine, second_site)
    runs = [
        ["forget", others[0], "--namespace", "conversations", "--yes"],
        ["export", "--user-id", "alice"],
        ["sweep", "--yes"],
        ["prune", "--older-than", "300d", "--yes"],
        ["prune", "--older-than", "1d", "--by", "updated_at", "--yes"],
        ["erase", "--match", "tea", "--yes"],
        ["forget", "bob", "--namespace", "crm", "--yes"],
        ["flush", "--namespace", "conversations", "--yes"],
        ["stats", "--json"],
        ["uninstall", "--yes"],
    ]
    changed = []
    for args in runs:
        before = counts(engine, prefix) if args[0] != "uninstall" else None
        result = claw(site, *args)
        assert result.exit_code == 0, (args, result.output)
        assert dump(engine, second_site) == untouched, args
        if before is not None:
            changed.append(counts(engine, prefix) != before)
        if args[0] == "stats":
            names = [table["table"] for table in json.loads(result.output)["tables"]]
            assert not any(name.startswith(second_site) for name in names)
        if args[0] == "export":
            exported = json.loads(result.stdout)
            assert len(exported["conversations"]) == 2 and not set(others) & {
                c["id"] for c in exported["conversations"]
            }
    # Each deleting run did delete something from its own prefix, so the check above means something.
    assert changed == [False, False, True, True, True, True, True, True, False]
    assert f"{prefix}phpclaw_memory" not in sa.inspect(engine).get_table_names()
    assert f"{second_site}phpclaw_memory" in sa.inspect(engine).get_table_names()


# -- stats and uninstall ----------------------------------------------------------------------


def test_stats_reports_the_three_tables_with_their_rows(
    site: Flask, engine: sa.engine.Engine, prefix: str, second_site: str, clock: FakeClock
) -> None:
    for _ in range(3):
        add_conversation(engine, prefix, utc_datetime(clock), messages=4)
    SqlMemory(engine, prefix, clock=clock).set("k", "v" * 5000)

    _stock(engine, second_site, clock)  # the other site's rows are not counted

    result = claw(site, "stats", "--json")

    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert [(t["table"], t["rows"]) for t in document["tables"]] == [
        (f"{prefix}phpclaw_conversations", 3),
        (f"{prefix}phpclaw_messages", 12),
        (f"{prefix}phpclaw_memory", 1),
    ]
    assert all(t["exists"] and t["bytes"] and t["bytes"] >= 4096 for t in document["tables"])
    table = claw(site, "stats").output
    assert f"{prefix}phpclaw_messages" in table and " 12 " in table and "KiB" in table


def test_uninstall_drops_the_prefix_tables_and_the_file_directory(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    directory = tmp_path / "files"
    app = build_app(
        url_of(engine), prefix, clock, tmp_path / "instance", MEMORY_DRIVER="file", FILE_DIR=str(directory)
    )
    FileMemory(directory, clock=clock).set("k", "v", "a:b")
    add_conversation(engine, prefix, utc_datetime(clock), messages=2)

    preview = claw(app, "uninstall", "--files", "--dry-run", "-v")
    assert "would drop 3 tables holding 3 rows and remove 2 files" in preview.output
    result = claw(app, "uninstall", "--files", "--yes")

    assert result.exit_code == 0, result.output
    assert not set(sa.inspect(engine).get_table_names()) & {
        f"{prefix}phpclaw_{n}" for n in ("conversations", "messages", "memory")
    }
    assert not directory.exists()
    assert audit_lines(app)[-1]["counts"] == {"tables": 3, "rows": 3, "files": 2}
    assert "0 tables" in claw(app, "uninstall", "--yes").output


def test_uninstall_names_only_the_tables_that_exist_and_init_db_names_all_three(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance")
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {prefix}phpclaw_memory"))
    result = claw(app, "uninstall", "--yes")
    assert result.exit_code == 0, result.output
    assert f"dropped 2 tables: {prefix}phpclaw_conversations, {prefix}phpclaw_messages\n" in result.output
    ready = claw(app, "init-db").output
    names = ", ".join(f"{prefix}phpclaw_{n}" for n in ("conversations", "messages", "memory"))
    assert ready == f"tables ready: {names}\n"
    assert "would drop 3 tables holding 0 rows" in claw(app, "uninstall", "--dry-run").output


def test_uninstall_refuses_a_file_directory_holding_foreign_files(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    directory = tmp_path / "files"
    directory.mkdir()
    (directory / "notes.txt").write_text("mine")
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance", FILE_DIR=str(directory))
    result = claw(app, "uninstall", "--files", "--yes")
    assert result.exit_code == 1 and "notes.txt" in result.output
    assert (directory / "notes.txt").exists()
    assert f"{prefix}phpclaw_memory" in sa.inspect(engine).get_table_names()
