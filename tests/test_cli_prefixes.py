"""The three tables of a prefix: ``stats``, ``uninstall``, and multi-site. With two sites in one
install, like ``wp_`` and ``wp_2_``, every data command run on one site leaves the other site's
data byte-identical: its three tables, and on the file and Redis drivers its directory and keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from clawmem.clock import FakeClock, utc_datetime
from clawmem.memory.file import FileMemory, site_directory
from clawmem.memory.sql import SqlMemory
from clawmem.sql.schema import create_tables, drop_tables
from tests.test_cli_basics import (
    KV_DRIVERS,
    add_conversation,
    audit_lines,
    build_app,
    build_driver_app,
    claw,
    counts,
    dump,
    url_of,
)


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
    memory.set("carol", "prefers email", "crm")
    return conversation_ids


@pytest.fixture
def site(engine: sa.engine.Engine, prefix: str, second_site: str, clock: FakeClock, tmp_path: Path) -> Flask:
    return build_app(url_of(engine), prefix, clock, tmp_path / "instance")


def test_every_command_on_one_prefix_leaves_the_other_byte_identical(
    site: Flask, engine: sa.engine.Engine, prefix: str, second_site: str, clock: FakeClock
) -> None:
    own = _stock(engine, prefix, clock)
    others = _stock(engine, second_site, clock)
    clock.advance(10)
    untouched = dump(engine, second_site)
    runs = [
        ["forget", "--conversation", others[0], "--yes"],  # the other site's id is nothing here
        ["export", "--user-id", "alice"],
        ["sweep", "--yes"],
        ["prune", "--older-than", "300d", "--yes"],
        ["prune", "--older-than", "1d", "--by", "updated_at", "--yes"],
        ["erase", "--match", "tea", "--mentions", "--yes"],
        ["forget", "bob", "--namespace", "crm", "--yes"],
        ["forget", "--conversation", own[2], "--yes"],
        ["flush", "--namespace", "crm", "--yes"],
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
    assert changed == [False, False, True, True, True, True, True, True, True, False]
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
    FileMemory(directory, clock=clock, site=prefix).set("k", "v", "a:b")
    add_conversation(engine, prefix, utc_datetime(clock), messages=2)

    preview = claw(app, "uninstall", "--files", "--dry-run", "-v")
    # The change log (derived from the memory table) goes with the three.
    assert "would drop 4 tables holding 3 rows and remove 2 files" in preview.output
    result = claw(app, "uninstall", "--files", "--yes")

    assert result.exit_code == 0, result.output
    assert not set(sa.inspect(engine).get_table_names()) & {
        f"{prefix}phpclaw_{n}" for n in ("conversations", "messages", "memory")
    }
    assert not directory.exists()
    assert not sa.inspect(engine).has_table(f"{prefix}clawmem_changes")
    assert audit_lines(app)[-1]["counts"] == {"tables": 4, "rows": 3, "files": 2}
    assert "0 tables" in claw(app, "uninstall", "--yes").output


def test_uninstall_names_only_the_tables_that_exist_and_init_db_names_all_three(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance")
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {prefix}phpclaw_memory"))
    result = claw(app, "uninstall", "--yes")
    assert result.exit_code == 0, result.output
    dropped = f"{prefix}phpclaw_conversations, {prefix}phpclaw_messages, {prefix}clawmem_changes"
    assert f"dropped 3 tables: {dropped}\n" in result.output
    ready = claw(app, "init-db").output
    names = ", ".join(f"{prefix}phpclaw_{n}" for n in ("conversations", "messages", "memory"))
    derived = f"{prefix}clawmem_vectors, {prefix}clawmem_changes"
    assert ready == f"tables ready: {names}, {derived}\n"
    # The vectors table and the change log, derived from the memory table, go with the three.
    assert "would drop 5 tables holding 0 rows" in claw(app, "uninstall", "--dry-run").output
    assert f"dropped 5 tables: {names}, {derived}\n" in claw(app, "uninstall", "--yes").output


def test_uninstall_refuses_a_site_directory_holding_foreign_files(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    directory = tmp_path / "files"
    FileMemory(directory, clock=clock, site=prefix).set("k", "v")
    mine = site_directory(directory, prefix) / "notes.txt"
    mine.write_text("mine")
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance", FILE_DIR=str(directory))
    result = claw(app, "uninstall", "--files", "--yes")
    assert result.exit_code == 1 and "notes.txt" in result.output
    assert mine.read_text() == "mine"
    assert FileMemory(directory, clock=clock, site=prefix).get("k") == "v"  # nothing was removed
    assert f"{prefix}phpclaw_memory" in sa.inspect(engine).get_table_names()


def test_uninstall_files_leaves_whatever_else_is_in_the_file_directory(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    directory = tmp_path / "files"
    FileMemory(directory, clock=clock, site=prefix).set("k", "v")
    (directory / "notes.txt").write_text("mine")
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance", FILE_DIR=str(directory))
    result = claw(app, "uninstall", "--files", "--yes")
    assert result.exit_code == 0, result.output
    assert not site_directory(directory, prefix).exists()
    assert [path.name for path in directory.iterdir()] == ["notes.txt"]
    assert (directory / "notes.txt").read_text() == "mine"


# -- two sites on every key/value driver --------------------------------------------------------

TTL = 3600  # long enough that the real Redis never expires an entry while a test runs


def _site_state(engine: sa.engine.Engine, app: Flask) -> tuple[Any, Any, Any]:
    """Return everything a site has stored, as stored: its three tables' rows (``None`` once they
    are dropped), its file directory's bytes and mtimes, and its Redis keys (DUMP and absolute
    expiry)."""
    from dashboard import state

    site = state.site_of(app)
    rows = (
        dump(engine, site.prefix)
        if f"{site.prefix}phpclaw_memory" in sa.inspect(engine).get_table_names()
        else None
    )
    directory = site_directory(site.settings.file_dir, site.prefix)
    files = (
        {
            str(path.relative_to(directory)): (path.read_bytes(), path.stat().st_mtime_ns)
            for path in sorted(directory.rglob("*"))
        }
        if directory.exists()
        else None
    )
    keys = None
    if site.settings.memory_driver == "redis":
        client = site.driver.client
        names = sorted(client.scan_iter(match=f"{site.prefix}phpclaw:*", count=1000))
        keys = {name: (client.dump(name), client.expiretime(name)) for name in names}
    return rows, files, keys


def _stock_site(app: Flask, engine: sa.engine.Engine, clock: FakeClock) -> str:
    """Give a site conversations (old and new, of cust-42 and of others) and entries (the
    subject's namespace, mentions, one expiring); values name the site. Return the id of a
    recent conversation of nobody in particular."""
    from dashboard import state

    site = state.site_of(app)
    now = utc_datetime(clock)
    for user_id in ("cust-42", "cust-7"):
        add_conversation(engine, site.prefix, now - timedelta(days=400), user_id=user_id, messages=3)
        add_conversation(engine, site.prefix, now, user_id=user_id, messages=1)
    recent = add_conversation(engine, site.prefix, now, messages=2)
    memory = site.memory
    memory.set("name", {"site": site.prefix}, "user:cust-42")
    memory.set("ticket:cust-42", site.prefix, "crm")
    memory.set("plan", {"site": site.prefix, "tier": "gold"}, "crm")
    memory.set("soon", site.prefix, "default", ttl=TTL)
    memory.set("keep", [site.prefix, 1.0], "default")
    return recent


@pytest.mark.parametrize("acting", ["shorter", "longer"])
@pytest.mark.parametrize(("sql_backend", "kv_driver"), KV_DRIVERS)
def test_erase_prune_and_uninstall_of_one_site_leave_the_other_site_byte_identical(
    request: pytest.FixtureRequest,
    engine: sa.engine.Engine,
    prefix: str,
    second_site: str,
    clock: FakeClock,
    tmp_path: Path,
    kv_driver: str,
    acting: str,
) -> None:
    # One database, one CLAW_FILE_DIR, one Redis database; wp_ and wp_2_ are string prefixes.
    shorter, longer = (
        build_driver_app(request, url_of(engine), site, clock, tmp_path, kv_driver)
        for site in (prefix, second_site)
    )
    app, other = (shorter, longer) if acting == "shorter" else (longer, shorter)
    own_recent = _stock_site(app, engine, clock)
    others_recent = _stock_site(other, engine, clock)
    clock.advance(2 * TTL)  # "soon" is expired on both sites
    other_export = claw(other, "export", "--user-id", "cust-42").stdout
    untouched = _site_state(engine, other)
    rows, files, keys = untouched
    conversations, messages, memory = rows.values()
    assert conversations and messages and bool(memory) == (kv_driver == "sql")
    assert (files is not None) == (kv_driver == "file") and (keys is not None) == (kv_driver == "redis")
    assert files or keys or memory, "the other site has key/value data to lose"

    runs = [
        (
            ["erase", "--user-id", "cust-42", "--mentions", "--yes"],
            "deleted 2 conversations, 4 messages and 2 memory entries",
        ),
        (["sweep", "--yes"], "deleted 1 expired entry"),
        (["forget", "--conversation", others_recent, "--yes"], "nothing to delete"),  # not this site's
        (["forget", "--conversation", own_recent, "--yes"], "and its 2 messages"),
        (["flush", "--namespace", "crm", "--yes"], "deleted 1 entry of namespace 'crm'"),
        (["prune", "--older-than", "30d", "--yes"], "deleted 1 conversation and 3 messages"),
        (["uninstall", "--files", "--yes"], "dropped 4 tables"),
    ]
    changed = []
    for args, said in runs:
        before = _site_state(engine, app)
        result = claw(app, *args)
        assert result.exit_code == 0 and said in result.output, (args, result.output)
        assert _site_state(engine, other) == untouched, args
        changed.append(_site_state(engine, app) != before)
    # Each run but the foreign forget did change its own site, so the checks above mean something.
    assert changed == [True, True, False, True, True, True, True]
    rows, files, _ = _site_state(engine, app)
    assert rows is None and files is None
    assert claw(other, "export", "--user-id", "cust-42").stdout == other_export
