"""Every order of the conversation list and of a namespace's keys pages exactly: each row once,
in the order a sort of the whole set gives, ties and missing values included, on every backend
(a namespace's keys on every driver: tests/conformance/test_operator_api.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.errors import InvalidCursor
from clawmem.ids import new_id
from clawmem.memory.sql import SqlMemory
from clawmem.paging import SORTS as KEY_SORTS
from clawmem.sql.conversation_list import SORTS as CONVERSATION_SORTS
from clawmem.sql.schema import create_tables, tables
from clawmem.turn.conversations import ConversationLog
from tests.conformance.test_operator_api import fill_sorted, walk

# Lower-case letters only, so that every backend's collation orders them as Python does.
TITLES = ["delta", "alpha", None, "charlie", "alpha", "bravo", None, "delta"]
START = datetime(2024, 3, 1, 12, 0, 0)


def insert_conversations(engine: sa.engine.Engine, prefix: str, count: int = 45) -> list[dict[str, Any]]:
    """Insert ``count`` conversations of three subjects and return their rows: three share each
    start and four each last activity (so ids break the ties), and some have no title."""
    rows = [
        {
            "id": new_id(),
            "namespace": "web",
            "user_id": f"cust-{number % 3}",
            "title": TITLES[number % len(TITLES)],
            "created_at": START + timedelta(seconds=number // 3),
            "updated_at": START + timedelta(minutes=(count - number) // 4),
            # Ties, and every fifth not reported (NULL, listed last either way).
            "total_tokens": None if number % 5 == 0 else (number % 7) * 100,
        }
        for number in range(count)
    ]
    # Messages said (number % 4, so ties), each turn's recall record counted apart.
    messages = [
        {
            "id": new_id(),
            "conversation_id": row["id"],
            "role": role,
            "content": "x",
            "created_at": row["created_at"],
        }
        for number, row in enumerate(rows)
        for said in range(number % 4)
        for role in ("recall", "user" if said % 2 == 0 else "assistant")
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(tables(prefix).conversations), rows)
        if messages:
            conn.execute(sa.insert(tables(prefix).messages), messages)
    for number, row in enumerate(rows):
        row["said"] = number % 4
    return rows


def expected_order(rows: list[dict[str, Any]], sort: str, descending: bool | None = None) -> list[str]:
    """Return the ids of ``rows`` in the order the list sorted by ``sort`` must give them
    (``descending`` turns it the other way; what has no value stays last)."""
    if sort in ("tokens", "messages"):
        column = "total_tokens" if sort == "tokens" else "said"
        down = True if descending is None else descending
        present = sorted(
            (r for r in rows if r[column] is not None), key=lambda r: (r[column], r["id"]), reverse=down
        )
        missing = sorted((r for r in rows if r[column] is None), key=lambda r: r["id"], reverse=down)
        return [row["id"] for row in present + missing]
    if descending is not None and descending != (sort != "title"):
        return (
            list(reversed(expected_order(rows, sort)))
            if sort != "title"
            else [
                row["id"]
                for row in sorted(
                    (r for r in rows if r["title"] is not None),
                    key=lambda r: (r["title"], r["id"]),
                    reverse=True,
                )
            ]
            + [
                row["id"]
                for row in sorted(
                    (r for r in rows if r["title"] is None), key=lambda r: r["id"], reverse=True
                )
            ]
        )
    if sort == "title":
        titled = sorted((r for r in rows if r["title"] is not None), key=lambda r: (r["title"], r["id"]))
        untitled = sorted((r for r in rows if r["title"] is None), key=lambda r: r["id"])
        return [row["id"] for row in titled + untitled]
    column = {"created": "created_at", "updated": "updated_at"}[sort]
    return [row["id"] for row in sorted(rows, key=lambda row: (row[column], row["id"]), reverse=True)]


@pytest.mark.parametrize("sort", list(CONVERSATION_SORTS))
def test_every_conversation_order_pages_each_row_once_in_order(
    engine: sa.engine.Engine, prefix: str, sort: str
) -> None:
    rows = insert_conversations(engine, prefix)
    log = ConversationLog(engine, prefix=prefix)
    listed = [c.id for c in walk(lambda cursor: log.list(limit=4, cursor=cursor, sort=sort))]
    assert listed == expected_order(rows, sort)
    of_one = {"user_id": "cust-1"}
    filtered = [c.id for c in walk(lambda cursor: log.list(limit=4, cursor=cursor, sort=sort, **of_one))]
    assert filtered == [i for i in expected_order(rows, sort) if i in {r["id"] for r in rows[1::3]}]
    assert log.count(user_id="cust-1") == len(filtered) == 15
    assert log.count() == 45
    titled_alpha = sum(1 for row in rows if row["title"] == "alpha")
    assert log.count(query="alpha", at_most=5) == 5 < titled_alpha
    assert log.count(query="alpha", at_most=1000) == titled_alpha == 12
    for descending in (True, False):
        turned = [
            c.id
            for c in walk(
                lambda cursor, d=descending: log.list(limit=4, cursor=cursor, sort=sort, descending=d)
            )
        ]
        assert turned == expected_order(rows, sort, descending), descending


def test_a_conversation_cursor_of_another_order_is_refused(engine: sa.engine.Engine, prefix: str) -> None:
    insert_conversations(engine, prefix, 10)
    log = ConversationLog(engine, prefix=prefix)
    cursors = {sort: log.list(limit=2, sort=sort).next_cursor for sort in CONVERSATION_SORTS}
    for sort, cursor in cursors.items():
        for other in CONVERSATION_SORTS:
            if other != sort:
                with pytest.raises(InvalidCursor):
                    log.list(limit=2, sort=other, cursor=cursor)
    with pytest.raises(InvalidCursor):  # a cursor of the other direction
        log.list(limit=2, sort="tokens", descending=False, cursor=cursors["tokens"])
    with pytest.raises(ValueError, match="sort must be one of updated, created, title, tokens, messages"):
        log.list(sort="size")


def test_search_finds_the_start_of_each_conversations_first_matching_message(
    engine: sa.engine.Engine, prefix: str
) -> None:
    log = ConversationLog(engine, prefix=prefix)
    from clawmem.turn.conversations import Message

    log.append(
        "c-refund",
        [Message("user", "Hello"), Message("user", "I want a REFUND now"), Message("user", "refund again")],
    )
    log.append("c-other", [Message("user", "where is my parcel")])
    found = log.first_matches(["c-refund", "c-other"], "refund")
    assert found == {"c-refund": "I want a REFUND now"}
    assert log.count(query="refund") == 1


# -- a namespace's keys, on every driver ------------------------------------------------------


def test_init_db_adds_the_sort_indexes_to_existing_tables(engine: sa.engine.Engine, prefix: str) -> None:
    schema = tables(prefix)
    three = (schema.conversations, schema.messages, schema.memory)
    added = {index.name for table in three for index in table.indexes}
    names = (
        "conv_updated",
        "conv_title",
        "conv_tokens",
        "msg_conv_role",
        "mem_ns_updated_key",
        "mem_ns_expires_key",
    )
    wanted = {f"{prefix}phpclaw_{name}" for name in names}
    assert wanted <= added
    with engine.begin() as conn:
        for name in wanted:
            # Tables an earlier version made: without the indexes of the sorts and counts.
            table = next(table for table in three if any(index.name == name for index in table.indexes))
            next(index for index in table.indexes if index.name == name).drop(conn)
    changes = create_tables(engine, prefix)
    assert sorted(changes) == sorted(f"added index {name}" for name in wanted)
    inspector = sa.inspect(engine)
    present = {index["name"] for table in three for index in inspector.get_indexes(table.name)}
    assert wanted <= present


@pytest.mark.parametrize("sql_backend", ["sqlite"], indirect=True)
def test_rows_with_unreadable_times_page_once_in_every_order(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    # Another program's rows: SQLite keeps whatever text it was given in a time column.
    schema = tables(prefix)
    rows = insert_conversations(engine, prefix, 12)
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    fill_sorted(memory, clock)
    with engine.begin() as conn:
        for row in rows[::4]:
            conn.exec_driver_sql(
                f"UPDATE {schema.conversations.name} SET updated_at = 'soon', created_at = 'then' "
                "WHERE id = ?",
                (row["id"],),
            )
        conn.exec_driver_sql(
            f"UPDATE {schema.memory.name} SET updated_at = 'soon', expires_at = 'later' "
            "WHERE lookup_key IN ('b', 'k')"
        )
    log = ConversationLog(engine, prefix=prefix)
    for sort in CONVERSATION_SORTS:
        listed = [c.id for c in walk(lambda cursor, sort=sort: log.list(limit=2, cursor=cursor, sort=sort))]
        assert sorted(listed) == sorted(row["id"] for row in rows), sort
    for sort in KEY_SORTS:
        keys = [
            r.key
            for r in walk(
                lambda cursor, sort=sort: memory.entries("sorted", limit=2, sort=sort, cursor=cursor)
            )
        ]
        assert sorted(keys) == sorted("mbxakzcqd"), sort
