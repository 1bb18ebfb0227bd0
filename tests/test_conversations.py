"""Conversations on the two SQL tables, and ConversationStore, on every SQL backend."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

import clawmem
from clawmem.errors import InvalidCursor
from clawmem.memory.array import ArrayMemory
from clawmem.memory.conversations import SqlConversationMemory
from clawmem.memory.sql import SqlMemory
from clawmem.memory.wrappers import PrivacyAwareMemory, RouterMemory
from clawmem.sql.conversations import ConversationStore
from clawmem.sql.paging import encode_cursor
from clawmem.sql.retention import delete_in_batches, iter_conversation_ids, older_than
from clawmem.sql.schema import tables
from clawmem.sql.subjects import delete_memory, iter_conversations, iter_memory

NS = "conversations"


@pytest.fixture
def conversations(engine: Any, prefix: str, clock: Any) -> SqlConversationMemory:
    return SqlConversationMemory(engine, prefix=prefix, clock=clock)


@pytest.fixture
def store(engine: Any, prefix: str) -> ConversationStore:
    return ConversationStore(engine, prefix=prefix)


def payload(*contents: str, user_id: str = "cust-1", title: str | None = "Order help") -> dict[str, Any]:
    roles = ["user", "assistant"]
    history = [{"role": roles[i % 2], "content": text} for i, text in enumerate(contents)]
    return {"title": title, "user_id": user_id, "metadata": {"channel": "web"}, "history": history}


def orphans(engine: Any, prefix: str) -> int:
    schema = tables(prefix)
    known = sa.select(schema.conversations.c.id)
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count())
            .select_from(schema.messages)
            .where(schema.messages.c.conversation_id.not_in(known))
        ).scalar()


def test_payload_round_trips_with_tool_rows(conversations: SqlConversationMemory) -> None:
    data = {
        "title": "Refund",
        "user_id": "cust-1",
        "metadata": {"channel": "web", "score": 1.0},
        "created_at": "2024-03-01T12:30:00+00:00",
        "history": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is order 42? 📦"},
            {"role": "assistant", "content": None, "tool_name": "lookup_order", "tool_input": {"id": 42}},
            {"role": "tool", "content": '{"status": "shipped"}', "tool_name": "lookup_order"},
            {"role": "assistant", "content": "It shipped."},
        ],
    }
    conversations.set("01HX0000000000000000000001", data, NS)
    assert conversations.get("01HX0000000000000000000001", NS) == data
    assert conversations.has("01HX0000000000000000000001", NS)
    assert conversations.get("01HX0000000000000000000001", "elsewhere") is None


def test_extending_history_inserts_only_new_messages(
    conversations: SqlConversationMemory, store: ConversationStore, clock: Any
) -> None:
    conversations.set("c1", payload("hi", "hello"), NS)
    before = store.messages("c1").items
    clock.advance(60)
    conversations.set("c1", payload("hi", "hello", "where is my order?", "on its way"), NS)
    after = store.messages("c1").items
    assert [m.id for m in after[:2]] == [m.id for m in before]
    assert [m.created_at for m in after[:2]] == [m.created_at for m in before]
    assert [m.content for m in after] == ["hi", "hello", "where is my order?", "on its way"]
    assert after[2].created_at > before[1].created_at


def test_diverging_history_is_replaced(
    conversations: SqlConversationMemory, store: ConversationStore
) -> None:
    conversations.set("c1", payload("hi", "hello", "third"), NS)
    old_ids = {m.id for m in store.messages("c1").items}
    conversations.set("c1", payload("hi", "changed"), NS)
    after = store.messages("c1").items
    assert [m.content for m in after] == ["hi", "changed"]
    assert old_ids.isdisjoint(m.id for m in after)
    assert store.counts() == {"conversations": 1, "messages": 2}


def test_forget_and_flush_leave_no_orphans(
    conversations: SqlConversationMemory, store: ConversationStore, engine: Any, prefix: str
) -> None:
    for n in range(5):
        conversations.set(f"c{n}", payload("a", "b", "c"), NS)
    conversations.set("keep", payload("x"), "conversations.archive")
    conversations.forget("c0", NS)
    conversations.forget("c0", NS)
    conversations.forget("keep", NS)  # another namespace's conversation is not this one's to forget
    assert store.counts() == {"conversations": 5, "messages": 13}
    conversations.flush(NS)
    assert store.counts() == {"conversations": 1, "messages": 1}
    assert conversations.all("conversations.archive") == {
        "keep": conversations.get("keep", "conversations.archive")
    }
    assert orphans(engine, prefix) == 0


def test_all_returns_every_payload_sorted(conversations: SqlConversationMemory) -> None:
    conversations.set("b", payload("two"), NS)
    conversations.set("a", payload("one"), NS)
    everything = conversations.all(NS)
    assert list(everything) == ["a", "b"]
    assert everything["a"]["history"] == [{"role": "user", "content": "one"}]


BAD_PAYLOADS = [
    ("not a dict", TypeError),
    ({"history": "text"}, TypeError),
    ({"history": [{"role": "robot", "content": "x"}]}, ValueError),
    ({"history": [{"role": "user", "content": 5}]}, TypeError),
    ({"history": [{"role": "user", "content": "nul\x00byte"}]}, ValueError),
    ({"history": [{"role": "user", "content": "x", "extra": 1}]}, ValueError),
    ({"history": [], "colour": "blue"}, ValueError),
    ({"history": [], "metadata": {"bad": float("nan")}}, ValueError),
    ({"history": [], "user_id": "u" * 181}, ValueError),
    ({"history": [], "created_at": "last tuesday"}, ValueError),
]


@pytest.mark.parametrize("bad,error", BAD_PAYLOADS, ids=[repr(b)[:30] for b, _ in BAD_PAYLOADS])
def test_bad_payloads_raise_and_write_nothing(
    conversations: SqlConversationMemory, store: ConversationStore, bad: Any, error: type
) -> None:
    conversations.set("c1", payload("kept"), NS)
    with pytest.raises(error, match="c1"):
        conversations.set("c1", bad, NS)
    assert conversations.get("c1", NS)["history"] == [{"role": "user", "content": "kept"}]
    assert store.counts() == {"conversations": 1, "messages": 1}


def test_conversation_ids_and_ttl_are_checked(conversations: SqlConversationMemory) -> None:
    with pytest.raises(clawmem.InvalidKey):
        conversations.set("x" * 27, payload("a"), NS)
    with pytest.raises(clawmem.InvalidKey):
        conversations.set("has space", payload("a"), NS)
    with pytest.raises(ValueError, match="do not expire"):
        conversations.set("c1", payload("a"), NS, ttl=60)
    assert conversations.all(NS) == {}


def test_oversized_message_is_refused(engine: Any, prefix: str) -> None:
    small = SqlConversationMemory(engine, prefix=prefix, max_value_bytes=1000)
    with pytest.raises(clawmem.ValueTooLarge, match="history\\[1\\]"):
        small.set("c1", payload("fine", "x" * 1001), NS)
    assert small.all(NS) == {}


# -- ConversationStore -----------------------------------------------------------------------


def test_listing_pages_newest_first_without_gaps(
    conversations: SqlConversationMemory, store: ConversationStore, clock: Any
) -> None:
    for n in range(23):
        conversations.set(f"c{n:02d}", payload(f"message {n}"), NS)
        if n % 3 == 0:
            clock.advance(1)  # several conversations share a created_at: ids break the tie
    seen: list[str] = []
    cursor = None
    while True:
        page = store.list(limit=5, cursor=cursor)
        seen.extend(c.id for c in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert len(seen) == 23 == len(set(seen))
    created = [store.get(cid).created_at for cid in seen]
    assert created == sorted(created, reverse=True)
    assert store.get("c05").message_count == 1


def test_listing_filters_and_search(
    conversations: SqlConversationMemory, store: ConversationStore, clock: Any
) -> None:
    conversations.set("a1", payload("My parcel is LATE", user_id="alice"), NS)
    clock.advance(86_400)
    conversations.set("b1", payload("refund please", user_id="bob", title="100% refund"), NS)
    conversations.set("b2", payload("hello", user_id="bob"), "conversations.archive")
    assert [c.id for c in store.list(user_id="bob").items] == ["b2", "b1"]
    assert [c.id for c in store.list(namespace="conversations.archive").items] == ["b2"]
    assert [c.id for c in store.list(query="late").items] == ["a1"]
    assert [c.id for c in store.list(query="100%").items] == ["b1"]
    assert store.list(query="100_").items == []
    start = datetime.fromtimestamp(clock.now - 3600, UTC).replace(tzinfo=None)
    assert {c.id for c in store.list(since=start).items} == {"b1", "b2"}
    assert [c.id for c in store.list(until=start).items] == ["a1"]
    assert store.namespaces() == ["conversations", "conversations.archive"]
    assert store.oldest() < store.newest()


def test_messages_page_in_order(conversations: SqlConversationMemory, store: ConversationStore) -> None:
    conversations.set("c1", payload(*[f"m{n}" for n in range(12)]), NS)
    first = store.messages("c1", limit=5)
    second = store.messages("c1", limit=5, cursor=first.next_cursor)
    third = store.messages("c1", limit=5, cursor=second.next_cursor)
    contents = [m.content for m in first.items + second.items + third.items]
    assert contents == [f"m{n}" for n in range(12)]
    assert third.next_cursor is None
    assert [m.content for m in store.recent_user_messages(2)] == ["m10", "m8"]


def test_bad_cursor_and_limit_are_refused(store: ConversationStore) -> None:
    with pytest.raises(InvalidCursor):
        store.list(cursor="garbage!")
    with pytest.raises(ValueError, match="limit"):
        store.list(limit=0)
    with pytest.raises(ValueError, match="by must be"):
        store.oldest(by="title")


def test_a_cursor_holding_no_time_is_an_invalid_cursor(
    conversations: SqlConversationMemory, store: ConversationStore
) -> None:
    conversations.set("c1", payload("hello"), NS)
    not_a_time = encode_cursor(["x", "y"])
    with pytest.raises(InvalidCursor):
        store.list(cursor=not_a_time)
    with pytest.raises(InvalidCursor):
        store.messages("c1", cursor=not_a_time)


# -- the privacy switch ----------------------------------------------------------------------


def test_privacy_switch_gates_set_only(engine: Any, prefix: str, clock: Any) -> None:
    kv = SqlMemory(engine, prefix=prefix, clock=clock)
    conversations = SqlConversationMemory(engine, prefix=prefix, clock=clock)
    open_ = PrivacyAwareMemory(RouterMemory(kv, {NS: conversations}), store_messages=True)
    open_.set("shipping_policy", "Orders ship in two days")
    open_.set("c1", payload("old conversation"), NS)

    gated = PrivacyAwareMemory(RouterMemory(kv, {NS: conversations}), store_messages=False)
    writes: list[dict[str, Any]] = []
    clawmem.events.on("memory.write", writes.append)
    try:
        gated.set("new_fact", "never stored")
        gated.set("c2", payload("new conversation"), NS)
    finally:
        clawmem.events.off("memory.write", writes.append)
    assert [(w["key"], w["gated"]) for w in writes] == [("new_fact", True), ("c2", True)]
    assert gated.get("new_fact") is None
    assert gated.get("c2", NS) is None
    # What was written before stays readable, searchable and deletable.
    assert gated.get("shipping_policy") == "Orders ship in two days"
    assert gated.all() == {"shipping_policy": "Orders ship in two days"}
    assert [hit.key for hit in gated.search("when do orders ship")] == ["shipping_policy"]
    assert list(gated.all(NS)) == ["c1"]
    gated.forget("c1", NS)
    gated.flush()
    assert gated.all() == {} and gated.all(NS) == {}


def test_gated_set_still_rejects_bad_input() -> None:
    gated = PrivacyAwareMemory(ArrayMemory(), store_messages=False)
    with pytest.raises(clawmem.InvalidKey):
        gated.set("", 1)
    with pytest.raises(clawmem.InvalidNamespace):
        gated.set("k", 1, namespace="a..b")
    with pytest.raises(ValueError, match="k"):
        gated.set("k", float("nan"))


def test_conversation_events_carry_no_text(conversations: SqlConversationMemory) -> None:
    seen: list[dict[str, Any]] = []
    clawmem.events.on("*", seen.append)
    try:
        with clawmem.run_context("run-7"):
            conversations.set("c1", payload("secret customer words"), NS)
            conversations.set("c1", payload("secret customer words", "more private words"), NS)
            conversations.get("c1", NS)
    finally:
        clawmem.events.off("*", seen.append)
    saved = [e for e in seen if e["event"] == "conversation.saved"]
    assert [(e["inserted"], e["replaced"]) for e in saved] == [(1, False), (1, False)]
    assert all(e["run_id"] == "run-7" for e in seen)
    assert "secret" not in repr(seen) and "private" not in repr(seen)


def test_a_short_conversation_id_reads_back_unpadded_everywhere(
    conversations: SqlConversationMemory, store: ConversationStore, engine: Any, prefix: str
) -> None:
    conversations.set("c1", payload("hello"), NS)
    assert store.get("c1").id == "c1"
    assert [m.conversation_id for m in store.messages("c1").items] == ["c1"]
    assert list(conversations.all(NS)) == ["c1"]
    where = tables(prefix).conversations.c.namespace == NS
    with engine.connect() as conn:
        assert [found for found, _ in iter_conversation_ids(conn, prefix, where)] == ["c1"]
    assert [batch.conversation_ids for batch in delete_in_batches(engine, prefix, where)] == [("c1",)]


def test_subject_readers_page_through_ties_and_namespaces_without_gaps(
    conversations: SqlConversationMemory, engine: Any, prefix: str, clock: Any
) -> None:
    kv = SqlMemory(engine, prefix=prefix, clock=clock)
    for n in range(7):  # one clock reading: every created_at ties, so the id decides the order
        conversations.set(f"c{n}", payload(f"about subject {n}"), NS)
        kv.set(f"k{n}", f"subject {n}", f"ns{n % 3}")
    where = tables(prefix).conversations.c.namespace == NS
    whole = [(c.id, [m.content for m in c.messages]) for c in iter_conversations(engine, prefix, where, 100)]
    paged = [(c.id, [m.content for m in c.messages]) for c in iter_conversations(engine, prefix, where, 2)]
    assert paged == whole == [(f"c{n}", [f"about subject {n}"]) for n in range(7)]
    memory = [(row.namespace, row.key, row.value) for row in iter_memory(engine, prefix, "subject", 3)]
    assert memory == sorted((f"ns{n % 3}", f"k{n}", f"subject {n}") for n in range(7))


def test_retention_refuses_a_bad_order_column_or_batch_size_by_name(engine: Any, prefix: str) -> None:
    where = tables(prefix).conversations.c.namespace == NS
    with pytest.raises(ValueError, match=r"^by must be one of created_at, updated_at, got 'title'$"):
        older_than(prefix, "title", datetime(2024, 1, 1))
    with pytest.raises(ValueError, match=r"^order_by must be one of created_at, updated_at, got 'id'$"):
        next(delete_in_batches(engine, prefix, where, order_by="id"))
    for batch_size in (0, True, "10"):
        message = rf"^batch_size must be a positive int, got {re.escape(repr(batch_size))}$"
        with pytest.raises(ValueError, match=message):
            next(delete_in_batches(engine, prefix, where, batch_size=batch_size))
        with pytest.raises(ValueError, match=message):
            next(delete_memory(engine, prefix, "anything", batch_size))
