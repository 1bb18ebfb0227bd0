"""A message's own metadata and a conversation's provider-reported tokens (SPEC 4.1), on every
SQL backend: stored in the turn's one append, read back, exported, added to older tables by
init-db, and left out of phpClaw's shape, which has no column for them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.privacy.erasure import conversation_document
from clawmem.settings import PHPCLAW_SCHEMA
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.sql.subjects import conversations_where, iter_conversations
from clawmem.turn.conversations import ConversationLog, Message
from tests.test_cli_basics import build_app, claw, url_of


@pytest.fixture
def log(engine: Any, prefix: str, clock: FakeClock) -> ConversationLog:
    return ConversationLog(engine, prefix=prefix, clock=clock)


def test_a_message_keeps_its_own_metadata_through_every_read(log: ConversationLog) -> None:
    usage = {"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
    item = {"item": {"type": "reasoning", "summary": [], "nested": {"é": [1, 2.5, None, True]}}}
    log.append(
        "c1",
        [
            Message("user", "hello"),
            Message("assistant", "hi", metadata=usage),
            {"role": "tool", "content": None, "tool_name": "t", "metadata": item},
        ],
        tokens=15,
    )
    loaded = log.load("c1")
    assert loaded is not None
    assert [m.metadata for m in loaded.messages] == [None, usage, item]
    assert [m.metadata for m in log.messages("c1").items] == [None, usage, item]
    exported = conversation_document(
        next(
            iter_conversations(log.engine, log.prefix, conversations_where(log.prefix, conversation_id="c1"))
        )
    )
    assert [m["metadata"] for m in exported["messages"]] == [None, usage, item]
    assert exported["total_tokens"] == 15


def test_tokens_are_not_reported_until_a_turn_reports_them_then_add_up(log: ConversationLog) -> None:
    log.append("c1", [Message("user", "a"), Message("assistant", "b")])
    assert log.get("c1").total_tokens is None  # "not reported", never 0
    log.append("c1", [Message("user", "c"), Message("assistant", "d")], tokens=0)
    assert log.get("c1").total_tokens == 0
    log.append("c1", [Message("user", "e"), Message("assistant", "f")], tokens=40)
    log.append("c1", [Message("user", "g")])  # a turn whose provider reported nothing adds nothing
    log.append("c2", [Message("user", "x")], tokens=7)  # counted from the first append
    assert log.get("c1").total_tokens == 40
    assert log.load("c2").total_tokens == 7
    assert {c.id: c.total_tokens for c in log.list().items} == {"c1": 40, "c2": 7}


@pytest.mark.parametrize(
    ("message", "tokens", "error"),
    [
        ({"role": "user", "content": "a", "metadata": ["not", "a", "dict"]}, None, TypeError),
        ({"role": "user", "content": "a", "metadata": {"score": math.nan}}, None, ValueError),
        ({"role": "user", "content": "a", "metadata": {"when": object()}}, None, TypeError),
        ({"role": "user", "content": "a"}, -1, ValueError),
        ({"role": "user", "content": "a"}, 2.5, ValueError),
        ({"role": "user", "content": "a"}, True, ValueError),
    ],
)
def test_bad_metadata_or_tokens_are_refused_with_nothing_written(
    log: ConversationLog, message: dict[str, Any], tokens: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="conversation 'c1'"):
        log.append("c1", [{"role": "user", "content": "first"}, message], tokens=tokens)
    assert log.get("c1") is None


def test_oversized_metadata_is_refused(engine: Any, prefix: str) -> None:
    small = ConversationLog(engine, prefix=prefix, max_value_bytes=100)
    with pytest.raises(ValueError, match="100"):
        small.append("c1", [Message("user", "a", metadata={"blob": "x" * 200})])
    assert small.get("c1") is None


def test_init_db_adds_the_columns_to_older_tables_and_says_so(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    schema = tables(prefix)
    with engine.begin() as conn:  # the tables as an earlier version made them, with a row
        # The index on total_tokens came later still; SQLite drops no column an index holds.
        next(index for index in schema.conversations.indexes if "total_tokens" in index.columns).drop(conn)
        conn.execute(sa.text(f"ALTER TABLE {prefix}phpclaw_messages DROP COLUMN metadata"))
        conn.execute(sa.text(f"ALTER TABLE {prefix}phpclaw_conversations DROP COLUMN total_tokens"))
        conn.execute(
            sa.text(
                f"INSERT INTO {prefix}phpclaw_conversations (id, namespace, user_id, created_at, updated_at) "
                "VALUES ('old', 'default', '', '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
            )
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {prefix}phpclaw_messages (id, conversation_id, role, content, created_at) "
                "VALUES ('m1', 'old', 'user', 'kept', '2026-01-01 00:00:00')"
            )
        )
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance")
    result = claw(app, "init-db")
    assert result.exit_code == 0, result.output
    assert f"added column {schema.conversations.name}.total_tokens\n" in result.output
    assert f"added column {schema.messages.name}.metadata\n" in result.output
    assert f"added index {prefix}phpclaw_conv_tokens\n" in result.output
    assert "added" not in claw(app, "init-db").output  # idempotent
    log = ConversationLog(engine, prefix=prefix, clock=clock)
    old = log.load("old")
    assert old is not None and old.total_tokens is None
    assert [(m.content, m.metadata) for m in old.messages] == [("kept", None)]
    log.append("old", [Message("assistant", "new", metadata={"usage": {"total_tokens": 3}})], tokens=3)
    assert log.get("old").total_tokens == 3


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])  # phpClaw's shape is not made on PostgreSQL
def test_phpclaws_shape_has_no_column_for_them_and_still_takes_the_turn(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    from clawmem.sql.engine import create_engine
    from tests.conftest import sql_url

    engine = create_engine(sql_url(backend, tmp_path))
    create_tables(engine, prefix, PHPCLAW_SCHEMA)
    try:
        log = ConversationLog(engine, prefix=prefix, clock=clock, shape=PHPCLAW_SCHEMA)
        assert not log.stores_metadata
        log.append(
            "c1",
            [Message("user", "a"), Message("assistant", "b", metadata={"usage": {}})],
            tokens=9,
            user_id="7",
        )
        loaded = log.load("c1")
        assert [(m.content, m.metadata) for m in loaded.messages] == [("a", None), ("b", None)]
        assert loaded.total_tokens is None and log.get("c1").total_tokens is None
        columns = {c["name"] for c in sa.inspect(engine).get_columns(f"{prefix}phpclaw_messages")}
        assert "metadata" not in columns
    finally:
        drop_tables(engine, prefix)
        engine.dispose()
