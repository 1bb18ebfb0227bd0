"""Retention and removal: ``prune``, ``sweep``, ``flush`` and ``forget`` on every SQL backend,
with a fake clock, plus crash safety of ``prune`` under SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.sql import SqlMemory
from clawmem.sql.schema import tables
from clawmem.turn.conversations import ConversationLog
from tests.test_cli_basics import (
    FLASK,
    add_conversation,
    audit_lines,
    build_app,
    build_file_app,
    claw,
    counts,
    dump,
    orphans,
    subprocess_env,
    url_of,
    write_app_module,
)


@pytest.fixture
def app(engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path) -> Flask:
    return build_app(url_of(engine), prefix, clock, tmp_path / "instance")


def _ids(engine: sa.engine.Engine, prefix: str) -> set[str]:
    table = tables(prefix).conversations
    with engine.connect() as conn:
        return {value.rstrip() for value in conn.execute(sa.select(table.c.id)).scalars()}


# -- prune ------------------------------------------------------------------------------------


def test_prune_deletes_exactly_the_conversations_older_than_the_window(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    now = utc_datetime(clock)
    old = [add_conversation(engine, prefix, now - timedelta(days=days), messages=3) for days in (400, 91)]
    just_over = add_conversation(engine, prefix, now - timedelta(days=90, seconds=1), messages=1)
    at_cutoff = add_conversation(engine, prefix, now - timedelta(days=90), messages=2)
    young = [add_conversation(engine, prefix, now - timedelta(days=days), messages=4) for days in (89, 0)]

    result = claw(app, "prune", "--older-than", "90d", "--yes")

    assert result.exit_code == 0, result.output
    assert "deleted 3 conversations and 7 messages in 1 batch" in result.output
    assert _ids(engine, prefix) == {at_cutoff, *young}
    assert just_over not in _ids(engine, prefix) and not set(old) & _ids(engine, prefix)
    assert counts(engine, prefix) == (3, 10, 0) and orphans(engine, prefix) == 0


def test_prune_by_updated_at_keeps_conversations_that_are_still_active(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    now = utc_datetime(clock)
    active = add_conversation(engine, prefix, now - timedelta(days=200), updated_at=now - timedelta(hours=2))
    idle = add_conversation(engine, prefix, now - timedelta(days=200), updated_at=now - timedelta(days=100))

    assert claw(app, "prune", "--older-than", "24h", "--by", "updated_at", "--yes").exit_code == 0
    assert _ids(engine, prefix) == {active}
    assert claw(app, "prune", "--older-than", "1h", "--by", "updated_at", "--yes").exit_code == 0
    assert _ids(engine, prefix) == set()
    assert idle and orphans(engine, prefix) == 0


def test_prune_dry_run_reports_what_the_real_run_then_deletes(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    now = utc_datetime(clock)
    for days in range(0, 300, 7):
        add_conversation(engine, prefix, now - timedelta(days=days), messages=days % 5)
    before = dump(engine, prefix)

    preview = claw(app, "prune", "--older-than", "30d", "--dry-run", "-v")
    assert preview.exit_code == 0
    assert dump(engine, prefix) == before
    listed = [line.split()[0] for line in preview.output.splitlines() if line.startswith("  ")]

    ids_before = _ids(engine, prefix)
    real = claw(app, "prune", "--older-than", "30d", "--yes", "--batch-size", "7")
    assert real.exit_code == 0
    assert set(listed) == ids_before - _ids(engine, prefix)
    dry, done = audit_lines(app)
    assert dry["dry_run"] and not done["dry_run"]
    assert dry["counts"] == done["counts"] == {"conversations": 38, "messages": 76}
    assert "batch 6: deleted 3 conversations" in real.output  # 38 in batches of 7


@pytest.mark.slow
def test_prune_racing_a_writer_that_appends_messages_leaves_no_orphans(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    # The agent's clock is 100 days behind, so whatever it writes is old enough to prune.
    conversations = ConversationLog(engine, prefix, clock=FakeClock(clock() - 100 * 86400))
    ids = [new_id() for _ in range(120)]
    for conversation_id in ids:
        conversations.append(conversation_id, [{"role": "user", "content": "0"}], user_id="u", title="t")
    stop, appended = threading.Event(), [0]

    def append() -> None:
        # A live agent saving turns into conversations that the prune is deleting meanwhile.
        n = 0
        while not stop.is_set() or n < 30:
            conversation_id = ids[(n * 7) % len(ids)]
            conversations.append(conversation_id, [{"role": "assistant", "content": str(n)}], user_id="u")
            appended[0] += 1
            n += 1

    thread = threading.Thread(target=append)
    thread.start()
    try:
        result = claw(app, "prune", "--older-than", "30d", "--batch-size", "5", "--yes")
    finally:
        stop.set()
        thread.join(timeout=120)
    assert result.exit_code == 0, result.output
    assert appended[0] >= 30 and orphans(engine, prefix) == 0
    # Whatever the writer saved after its conversation went is a whole conversation again.
    for conversation_id in _ids(engine, prefix):
        stored = conversations.load(conversation_id)
        assert stored is not None and stored.messages and stored.user_id == "u"
    assert claw(app, "prune", "--older-than", "30d", "--yes").exit_code == 0
    assert counts(engine, prefix)[:2] == (0, 0)


def test_prune_falls_back_to_the_configured_retention_days(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance", RETENTION_DAYS="10")
    now = utc_datetime(clock)
    keep = add_conversation(engine, prefix, now - timedelta(days=9))
    add_conversation(engine, prefix, now - timedelta(days=11))
    result = claw(app, "prune", "--yes")
    assert result.exit_code == 0 and "from CLAW_RETENTION_DAYS" in result.output
    assert _ids(engine, prefix) == {keep}
    assert audit_lines(app)[0]["arguments"]["older_than"] == "10d"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ages=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 2000), st.integers(0, 3)), max_size=12),
    window=st.integers(1, 1500),
    by=st.sampled_from(["created_at", "updated_at"]),
    batch=st.integers(1, 5),
)
def test_prune_matches_a_model_of_the_window(
    app: Flask,
    engine: sa.engine.Engine,
    prefix: str,
    clock: FakeClock,
    ages: list[tuple[int, int, int]],
    window: int,
    by: str,
    batch: int,
) -> None:
    with engine.begin() as conn:
        for table in (tables(prefix).messages, tables(prefix).conversations):
            conn.execute(sa.delete(table))
    now = utc_datetime(clock)
    model = {}
    for created_hours, idle_hours, messages in ages:
        created = now - timedelta(hours=created_hours)
        updated = min(now, created + timedelta(hours=idle_hours))
        conversation_id = add_conversation(engine, prefix, created, updated_at=updated, messages=messages)
        model[conversation_id] = created if by == "created_at" else updated
    cutoff = now - timedelta(hours=window)

    result = claw(app, "prune", "--older-than", f"{window}h", "--by", by, "--batch-size", str(batch), "--yes")

    assert result.exit_code == 0, result.output
    assert _ids(engine, prefix) == {cid for cid, moment in model.items() if moment >= cutoff}
    assert orphans(engine, prefix) == 0


@pytest.mark.slow
@pytest.mark.parametrize("sql_backend", ["mysql", "postgres"])
def test_prune_killed_mid_batch_leaves_no_orphans_and_a_second_run_finishes(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, sql_backend: str
) -> None:
    """SIGKILL while a batch's transaction is open: that batch rolls back whole, earlier
    batches stay committed, and the next run deletes the rest."""
    schema = tables(prefix)
    start = datetime(2000, 1, 1)
    old_ids = [new_id() for _ in range(3000)]
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.conversations),
            [
                {
                    "id": cid,
                    "namespace": "default",
                    "user_id": "",
                    "created_at": start + timedelta(seconds=n),
                    "updated_at": start + timedelta(seconds=n),
                }
                for n, cid in enumerate(old_ids)
            ],
        )
        conn.execute(
            sa.insert(schema.messages),
            [
                {
                    "id": new_id(),
                    "conversation_id": cid,
                    "role": "user",
                    "content": f"m{k}",
                    "created_at": start + timedelta(seconds=n),
                }
                for n, cid in enumerate(old_ids)
                for k in range(3)
            ],
        )
    recent = add_conversation(
        engine, prefix, datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1), messages=5
    )

    instance = tmp_path / "instance"
    write_app_module(tmp_path, instance)
    env = subprocess_env(tmp_path, DATABASE_URL=url_of(engine), TABLE_PREFIX=prefix)
    # Hold a lock on one message of the fourth batch (batches of 50, oldest first): the prune
    # commits three batches, then waits inside the fourth batch's transaction.
    blocker = engine.connect()
    process = None
    try:
        blocker.begin()
        blocker.execute(
            sa.select(schema.messages.c.id)
            .where(schema.messages.c.conversation_id == old_ids[170])
            .with_for_update()
        ).all()
        process = subprocess.Popen(
            [str(FLASK), "claw", "prune", "--older-than", "1d", "--batch-size", "50", "--yes"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        session = _wait_for_lock_wait(engine, sql_backend, schema.messages.name, process)
        process.send_signal(signal.SIGKILL)
        output = process.communicate(timeout=30)[0]
    finally:
        # Whatever failed, the lock goes: a held lock would hang the teardown's DROP TABLE.
        if process is not None and process.poll() is None:
            process.kill()
        blocker.rollback()
        blocker.close()
    assert process.returncode == -signal.SIGKILL
    assert "batch 3: deleted 50 conversations and 150 messages (150 of 3000)" in output
    assert "batch 4" not in output
    _wait_for_session_end(engine, sql_backend, session)

    assert _ids(engine, prefix) == {*old_ids[150:], recent}
    assert counts(engine, prefix)[:2] == (2851, 2850 * 3 + 5)
    assert orphans(engine, prefix) == 0
    killed = [json.loads(line) for line in (instance / "audit.log").read_text().splitlines()]
    # The killed run's plan and each batch it committed are on record; it never finished.
    assert [line["phase"] for line in killed] == ["started", "batch", "batch", "batch"]
    assert killed[0]["plan"] == {"conversations": 3000, "messages": 9000}
    assert killed[-1]["total"] == {"conversations": 150, "messages": 450}

    again = subprocess.run(
        [str(FLASK), "claw", "prune", "--older-than", "1d", "--batch-size", "500", "--yes"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert "deleted 2850 conversations and 8550 messages in 6 batches" in again.stdout
    assert _ids(engine, prefix) == {recent} and counts(engine, prefix)[:2] == (1, 5)
    assert "did not finish: it had committed 3 batches (150 conversations, 450 messages)" in again.stdout
    finished = json.loads((instance / "audit.log").read_text().splitlines()[-1])
    assert finished["phase"] == "finished" and finished["counts"] == {
        "conversations": 2850,
        "messages": 8550,
    }


def _wait_for_lock_wait(engine: sa.engine.Engine, backend: str, table: str, process: Any) -> Any:
    """Return the database session id of the prune once it waits for the test's lock."""
    if backend == "mysql":
        query = sa.text(
            "SELECT trx_mysql_thread_id FROM information_schema.innodb_trx "
            "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE :pattern"
        )
    else:
        query = sa.text(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :pattern"
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        with engine.connect() as conn:
            found = conn.execute(query, {"pattern": f"%{table}%"}).scalar()
        if found is not None:
            return found
        # Not shorter: InnoDB refreshes innodb_trx only when it was not read for 0.1 s.
        time.sleep(0.25)
    raise AssertionError("the prune never reached the locked batch")


def _wait_for_session_end(engine: sa.engine.Engine, backend: str, session: Any) -> None:
    """Wait until the server has noticed the killed client and rolled its transaction back."""
    if backend == "mysql":
        query = sa.text("SELECT COUNT(*) FROM information_schema.processlist WHERE id = :session")
    else:
        query = sa.text("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = :session")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if not conn.execute(query, {"session": session}).scalar():
                return
        time.sleep(0.05)
    raise AssertionError(f"database session {session} of the killed prune never ended")


# -- sweep ------------------------------------------------------------------------------------


def test_sweep_removes_only_expired_rows_in_every_namespace(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    memory = SqlMemory(engine, prefix, clock=clock)
    for namespace in ("default", "crm", "a:b"):
        memory.set("forever", 1, namespace)
        memory.set("later", 2, namespace, ttl=3600)
        memory.set("gone", 3, namespace, ttl=10)
    memory.set("gone-too", 4, "crm", ttl=60)
    clock.advance(60)  # "gone" expired 50 s ago, "gone-too" expires exactly now

    result = claw(app, "sweep", "--yes")

    assert result.exit_code == 0, result.output
    assert "a:b: deleted 1" in result.output and "crm: deleted 2" in result.output
    assert "deleted 4 expired entries" in result.output
    memory_table = tables(prefix).memory
    with engine.connect() as conn:
        left = set(conn.execute(sa.select(memory_table.c.namespace, memory_table.c.lookup_key)).all())
    assert left == {(ns, key) for ns in ("default", "crm", "a:b") for key in ("forever", "later")}
    assert audit_lines(app)[0]["counts"] == {"expired": 4}


def test_sweep_prunes_every_namespace_file_of_the_file_driver(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    app, files = build_file_app(engine, prefix, clock, tmp_path)
    for namespace in ("default", "crm", "A.b"):
        files.set("keep", "k", namespace)
        files.set("drop", "d", namespace, ttl=5)
    clock.advance(5)

    preview = claw(app, "sweep", "--dry-run")
    assert "would delete 3 expired entries" in preview.output
    assert all('"drop"' in path.read_text() for path in files.directory.glob("*.json"))
    result = claw(app, "sweep", "--yes")

    assert result.exit_code == 0 and "deleted 3 expired entries" in result.output
    stored = {path.name: json.loads(path.read_text()) for path in files.directory.glob("*.json")}
    assert len(stored) == 3 and all(set(entries) == {"keep"} for entries in stored.values())


@pytest.mark.slow
def test_a_writer_renewing_keys_during_a_sweep_loses_nothing(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    seeded = SqlMemory(engine, prefix, clock=clock)
    namespaces = [f"ns{n}" for n in range(4)]
    for namespace in namespaces:
        for n in range(150):
            seeded.set(f"k{n}", n, namespace, ttl=10)
    clock.advance(20)  # all 600 rows are expired now
    writer = SqlMemory(engine, prefix, clock=clock)
    written: list[tuple[str, str]] = []
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set() or n < 40:
            namespace, key = namespaces[n % 4], f"k{n % 150}" if n % 2 else f"fresh{n}"
            writer.set(key, "renewed", namespace, ttl=3600)
            written.append((namespace, key))
            n += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        result = claw(app, "sweep", "--yes")
    finally:
        stop.set()
        thread.join(timeout=120)
    assert result.exit_code == 0, result.output
    assert written
    for namespace, key in written:
        assert writer.get(key, namespace) == "renewed", (namespace, key)
    memory_table = tables(prefix).memory
    with engine.connect() as conn:
        left = set(conn.execute(sa.select(memory_table.c.namespace, memory_table.c.lookup_key)).all())
    assert left == set(written)  # and every other (expired) row is gone


# -- forget and flush -------------------------------------------------------------------------


def test_forget_deletes_one_key_and_says_whether_it_existed(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    memory = SqlMemory(engine, prefix, clock=clock)
    memory.set("user:1", "x", "crm")
    memory.set("user:1", "y")
    memory.set("old", "z", ttl=1)
    clock.advance(5)

    preview = claw(app, "forget", "user:1", "--namespace", "crm", "--dry-run")
    missing = claw(app, "forget", "nobody", "--dry-run")
    assert "would delete key 'user:1' in namespace 'crm'" in preview.output
    assert missing.exit_code == 0 and "nothing to delete: no key 'nobody'" in missing.output
    first = claw(app, "forget", "user:1", "--namespace", "crm", "--yes")
    again = claw(app, "forget", "user:1", "--namespace", "crm", "--yes")
    expired = claw(app, "forget", "old", "--yes")

    assert first.exit_code == again.exit_code == expired.exit_code == 0
    assert "deleted key 'user:1' in namespace 'crm'" in first.output
    assert "nothing to delete" in again.output
    assert "deleted key 'old'" in expired.output  # an expired row still existed, and went
    assert memory.get("user:1") == "y" and not memory.has("user:1", "crm")
    assert [line["counts"] for line in audit_lines(app)] == [{"keys": 1}, {"keys": 0}] + [
        {"keys": 1},
        {"keys": 0},
        {"keys": 1},
    ]


def test_forget_conversation_deletes_it_with_its_messages_in_any_conversation_namespace(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    now = utc_datetime(clock)
    gone = add_conversation(engine, prefix, now, messages=4)
    kept = add_conversation(engine, prefix, now, messages=2)
    archived = add_conversation(engine, prefix, now, messages=1, namespace="archive")

    preview = claw(app, "forget", "--conversation", gone, "--dry-run")
    result = claw(app, "forget", "--conversation", gone, "--yes")
    again = claw(app, "forget", "--conversation", gone, "--yes")
    other_namespace = claw(app, "forget", "--conversation", archived, "--yes")

    assert f"would delete conversation {gone} and its 4 messages (dry run" in preview.output
    assert result.exit_code == again.exit_code == other_namespace.exit_code == 0
    assert f"deleted conversation {gone} and its 4 messages" in result.output
    assert f"nothing to delete: no conversation {gone}" in again.output
    assert f"deleted conversation {archived} and its 1 message" in other_namespace.output
    assert _ids(engine, prefix) == {kept} and counts(engine, prefix)[:2] == (1, 2)
    assert orphans(engine, prefix) == 0
    assert [(line["command"], line["counts"]) for line in audit_lines(app)] == [
        ("forget", {"conversations": 1, "messages": 4}),
        ("forget", {"conversations": 1, "messages": 4}),
        ("forget", {"conversations": 0, "messages": 0}),
        ("forget", {"conversations": 1, "messages": 1}),
    ]
    assert all(line["arguments"]["key"] is None for line in audit_lines(app))


def test_forget_key_in_a_namespace_named_conversations_never_reaches_a_conversation(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    # Conversations are not key/value entries any more: the old `forget ID --namespace
    # conversations` now names a key of a key/value namespace, and only that.
    conversation_id = add_conversation(engine, prefix, utc_datetime(clock), messages=3)
    memory = SqlMemory(engine, prefix, clock=clock)
    memory.set(conversation_id, "a key that happens to look like a conversation id", "conversations")

    first = claw(app, "forget", conversation_id, "--namespace", "conversations", "--yes")
    second = claw(app, "forget", conversation_id, "--namespace", "conversations", "--yes")

    assert f"deleted key '{conversation_id}' in namespace 'conversations'" in first.output
    assert f"nothing to delete: no key '{conversation_id}'" in second.output
    assert not memory.has(conversation_id, "conversations")
    assert _ids(engine, prefix) == {conversation_id} and counts(engine, prefix) == (1, 3, 0)


def test_flush_empties_one_namespace_and_counts_expired_rows_too(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    memory = SqlMemory(engine, prefix, clock=clock)
    for n in range(5):
        memory.set(f"k{n}", n, "crm", ttl=None if n else 1)
        memory.set(f"k{n}", n, "crm2")
    clock.advance(10)
    preview = claw(app, "flush", "--namespace", "crm", "--dry-run", "-v")
    result = claw(app, "flush", "--namespace", "crm", "--yes")
    assert "would delete 5 entries of namespace 'crm'" in preview.output and "  crm/k0" in preview.output
    assert "deleted 5 entries of namespace 'crm'" in result.output
    assert memory.all("crm") == {} and len(memory.all("crm2")) == 5


def test_flush_preview_on_the_file_driver_lists_every_key_it_counts(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    app, files = build_file_app(engine, prefix, clock, tmp_path)
    for n in range(3):
        files.set(f"k{n}", n, "crm")
    files.set("other", 1, "crm2")
    preview = claw(app, "flush", "--namespace", "crm", "--dry-run", "-v")
    assert preview.exit_code == 0, preview.output
    assert "would delete 3 entries of namespace 'crm'" in preview.output
    assert sorted(line.strip() for line in preview.output.splitlines() if line.startswith("  ")) == [
        "crm/k0",
        "crm/k1",
        "crm/k2",
    ]
    assert len(files.all("crm")) == 3


def test_flush_of_a_namespace_named_conversations_deletes_no_conversation(
    app: Flask, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    now = utc_datetime(clock)
    kept = {add_conversation(engine, prefix, now, messages=2, namespace="conversations") for _ in range(3)}
    SqlMemory(engine, prefix, clock=clock).set("k", "v", "conversations")
    before = dump(engine, prefix)

    result = claw(app, "flush", "--namespace", "conversations", "--yes")

    assert result.exit_code == 0, result.output
    assert "deleted 1 entry of namespace 'conversations'" in result.output
    assert _ids(engine, prefix) == kept and counts(engine, prefix) == (3, 6, 0)
    after = dump(engine, prefix)
    schema = tables(prefix)
    for table in (schema.conversations, schema.messages):
        assert after[table.name] == before[table.name], table.name
    assert "forget --conversation" in claw(app, "flush", "--help").output
