"""ConversationLog: appending, loading, deleting and the read API, on every SQL backend."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

import clawmem
from clawmem.clock import FakeClock, utc_datetime
from clawmem.errors import InvalidCursor
from clawmem.memory.array import ArrayMemory
from clawmem.memory.sql import SqlMemory
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.paging import encode_cursor
from clawmem.sql.retention import delete_in_batches, iter_conversation_ids, older_than
from clawmem.sql.schema import tables
from clawmem.sql.subjects import iter_conversations
from clawmem.turn.conversations import ConversationLog, Message


@pytest.fixture
def log(engine: Any, prefix: str, clock: FakeClock) -> ConversationLog:
    return ConversationLog(engine, prefix=prefix, clock=clock)


def turn(*contents: str) -> list[dict[str, Any]]:
    """Messages alternating user / assistant, starting with user."""
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(contents)]


def orphans(engine: Any, prefix: str) -> int:
    schema = tables(prefix)
    known = sa.select(schema.conversations.c.id)
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count())
            .select_from(schema.messages)
            .where(schema.messages.c.conversation_id.not_in(known))
        ).scalar()


def contents(log: ConversationLog, conversation_id: str) -> list[str | None]:
    return [m.content for m in log.messages(conversation_id).items]


# -- appending -------------------------------------------------------------------------------


def test_append_round_trips_messages_with_tool_rows(log: ConversationLog, clock: FakeClock) -> None:
    messages = [
        Message("system", "Be brief."),
        {"role": "user", "content": "Where is order 42? 📦"},
        Message("assistant", None, tool_name="lookup_order", tool_input={"id": 42, "deep": [1.5, None]}),
        {"role": "tool", "content": '{"status": "shipped"}', "tool_name": "lookup_order"},
        {"role": "assistant", "content": "It shipped."},
    ]
    ids = log.append(
        "c1", messages, user_id="cust-1", title="Refund", metadata={"channel": "web"}, namespace="support"
    )
    conversation = log.load("c1")
    assert conversation is not None
    assert (conversation.id, conversation.namespace, conversation.user_id) == ("c1", "support", "cust-1")
    assert (conversation.title, conversation.metadata) == ("Refund", {"channel": "web"})
    assert conversation.created_at == conversation.updated_at == utc_datetime(clock)
    assert [m.id for m in conversation.messages] == ids
    assert [(m.role, m.content, m.tool_name, m.tool_input) for m in conversation.messages] == [
        ("system", "Be brief.", None, None),
        ("user", "Where is order 42? 📦", None, None),
        ("assistant", None, "lookup_order", {"id": 42, "deep": [1.5, None]}),
        ("tool", '{"status": "shipped"}', "lookup_order", None),
        ("assistant", "It shipped.", None, None),
    ]
    assert {m.conversation_id for m in conversation.messages} == {"c1"}
    assert log.load("missing") is None


def test_message_ids_never_change_and_appends_keep_their_order(
    log: ConversationLog, clock: FakeClock
) -> None:
    first = log.append("c1", turn("hi", "hello"), user_id="alice", title="First", metadata={"n": 1})
    first_stamp = utc_datetime(clock)
    clock.advance(60)
    second = log.append("c1", turn("where is my order?", "on its way"), user_id="bob", title="Other")
    second_stamp = utc_datetime(clock)
    third = log.append("c1", turn("thanks"))  # the same clock reading: ids break the tie
    page = log.messages("c1").items
    assert [m.id for m in page] == first + second + third
    assert len(set(first + second + third)) == 5 and all(len(i) == 26 for i in first + second + third)
    assert [m.content for m in page] == ["hi", "hello", "where is my order?", "on its way", "thanks"]
    assert [m.created_at for m in page] == [first_stamp] * 2 + [second_stamp] * 3
    assert [m.id for m in log.load("c1").messages] == first + second + third
    # A later append touches updated_at and keeps what the first append set.
    summary = log.get("c1")
    assert (summary.created_at, summary.updated_at) == (first_stamp, second_stamp)
    assert (summary.user_id, summary.title, summary.metadata) == ("alice", "First", {"n": 1})
    assert summary.message_count == 5


def test_message_ids_do_not_change_when_another_conversation_is_written(
    log: ConversationLog, clock: FakeClock
) -> None:
    ids = log.append("a", turn("one", "two"))
    clock.advance(1)
    log.append("b", turn("other"))
    log.delete("b")
    assert [m.id for m in log.messages("a").items] == ids


# -- one append is one transaction with one insert ---------------------------------------------


@dataclass
class Watched:
    statements: list[str] = field(default_factory=list)
    begins: int = 0
    commits: int = 0
    rollbacks: int = 0


@contextlib.contextmanager
def watching(engine: Any) -> Iterator[Watched]:
    """Record every statement and transaction boundary ``engine`` issues inside the block."""
    seen = Watched()

    def statement(_conn: Any, _cursor: Any, text: str, *_rest: Any) -> None:
        seen.statements.append(" ".join(text.split()))

    def begin(_conn: Any) -> None:
        seen.begins += 1

    def commit(_conn: Any) -> None:
        seen.commits += 1

    def rollback(_conn: Any) -> None:
        seen.rollbacks += 1

    listeners = [
        ("before_cursor_execute", statement),
        ("begin", begin),
        ("commit", commit),
        ("rollback", rollback),
    ]
    for name, listener in listeners:
        sa.event.listen(engine, name, listener)
    try:
        yield seen
    finally:
        for name, listener in listeners:
            sa.event.remove(engine, name, listener)


def assert_one_insert_in_one_transaction(seen: Watched, engine: Any, prefix: str) -> None:
    messages = tables(prefix).messages.name
    on_messages = [s for s in seen.statements if messages in s]
    assert len(on_messages) == 1, on_messages  # no SELECT, UPDATE or DELETE of the messages table
    assert on_messages[0].upper().startswith(f"INSERT INTO {messages}".upper()), on_messages
    assert not [s for s in seen.statements if s.upper().startswith("SELECT")], seen.statements
    assert (seen.begins, seen.commits, seen.rollbacks) == (1, 1, 0)
    if engine.dialect.name == "sqlite":
        assert [s for s in seen.statements if s.upper().startswith(("BEGIN", "COMMIT"))] == [
            "BEGIN IMMEDIATE"
        ]


def test_an_append_is_one_transaction_with_one_insert_and_no_reads(
    log: ConversationLog, engine: Any, prefix: str, clock: FakeClock
) -> None:
    with watching(engine) as seen:
        log.append("c1", turn("hello", "hi there", "how are you?"))
    assert_one_insert_in_one_transaction(seen, engine, prefix)
    conversations = tables(prefix).conversations.name
    assert [s.split()[0].upper() for s in seen.statements if conversations in s] == ["UPDATE", "INSERT"]

    clock.advance(5)
    with watching(engine) as seen:
        log.append("c1", turn("more", "and more"))
    assert_one_insert_in_one_transaction(seen, engine, prefix)
    assert [s.split()[0].upper() for s in seen.statements if conversations in s] == ["UPDATE"]
    assert log.counts() == {"conversations": 1, "messages": 5}


def test_two_first_appends_of_one_new_id_both_land(engine: Any, prefix: str, clock: FakeClock) -> None:
    log = ConversationLog(engine, prefix=prefix, clock=clock)
    conversations = tables(prefix).conversations.name
    start = threading.Barrier(2, timeout=20)
    # Both writers find no conversation row before either inserts one, so both try to create
    # it. SQLite cannot interleave them (BEGIN IMMEDIATE takes the write lock first), so there
    # the two only start together.
    both_looked = threading.Barrier(2, timeout=20)
    looked: set[int] = set()
    inserts: list[str] = []

    def before(_conn: Any, _cursor: Any, text: str, *_rest: Any) -> None:
        if text.lstrip().upper().startswith("INSERT") and conversations in text:
            inserts.append(text)

    def after(_conn: Any, _cursor: Any, text: str, *_rest: Any) -> None:
        me = threading.get_ident()
        if text.lstrip().upper().startswith("UPDATE") and conversations in text and me not in looked:
            looked.add(me)
            both_looked.wait()

    sa.event.listen(engine, "before_cursor_execute", before)
    if engine.dialect.name != "sqlite":
        sa.event.listen(engine, "after_cursor_execute", after)
    results: dict[str, Any] = {}

    def write(name: str) -> None:
        try:
            start.wait()
            results[name] = log.append("new", turn(f"{name} asks", f"{name} is answered"), user_id=name)
        except BaseException as exc:  # reported by the assertion below
            results[name] = exc

    threads = [threading.Thread(target=write, args=(name,)) for name in ("alice", "bob")]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        if engine.dialect.name != "sqlite":
            sa.event.remove(engine, "after_cursor_execute", after)
    assert not any(thread.is_alive() for thread in threads)
    assert all(isinstance(ids, list) and len(ids) == 2 for ids in results.values()), results
    assert len(results) == 2
    if engine.dialect.name != "sqlite":
        # The race really happened: both tried to create the row. MariaDB may pick one of the two
        # as a deadlock victim, and its retried transaction tries once more.
        assert len(inserts) >= 2
    assert log.counts() == {"conversations": 1, "messages": 4}
    page = log.messages("new").items
    assert sorted(m.id for m in page) == sorted(results["alice"] + results["bob"])
    assert sorted(m.content for m in page) == sorted(
        ["alice asks", "alice is answered", "bob asks", "bob is answered"]
    )
    assert log.get("new").user_id in ("alice", "bob")


def test_forty_new_conversations_begun_at_once_are_all_stored(log: ConversationLog) -> None:
    # Each first append looks for its row (on InnoDB the empty look locks the gap where the row
    # would go) then inserts it: many at once deadlock, and every victim's rerun must get through.
    start = threading.Barrier(40, timeout=20)
    failures: list[BaseException] = []

    def begin(number: int) -> None:
        try:
            start.wait()
            log.append(f"c{number}", turn(f"question {number}", f"answer {number}"))
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=begin, args=(number,)) for number in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures and not any(thread.is_alive() for thread in threads)
    assert log.counts() == {"conversations": 40, "messages": 80}


# -- load() and the summary checkpoint -------------------------------------------------------


def test_load_starts_at_the_newest_summary(log: ConversationLog, clock: FakeClock) -> None:
    log.append("c1", turn("u1", "a1"))
    assert [m.content for m in log.load("c1").messages] == ["u1", "a1"]
    clock.advance(10)
    log.append("c1", [Message("summary", "s1"), Message("user", "u2")])
    clock.advance(10)
    log.append("c1", [Message("assistant", "a2")])
    assert [m.content for m in log.load("c1").messages] == ["s1", "u2", "a2"]
    # A newer checkpoint at the same clock reading as the message before it: the id decides.
    log.append("c1", [Message("summary", "s2"), Message("recall", "[]"), Message("user", "u3")])
    assert [(m.role, m.content) for m in log.load("c1").messages] == [
        ("summary", "s2"),
        ("recall", "[]"),
        ("user", "u3"),
    ]
    # The checkpoint shortens what load() returns, not the stored history.
    assert contents(log, "c1") == ["u1", "a1", "s1", "u2", "a2", "s2", "[]", "u3"]


# -- the privacy switch ----------------------------------------------------------------------


def test_a_gated_append_writes_nothing_and_says_so(
    log: ConversationLog, engine: Any, prefix: str, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    log.append("c1", turn("old conversation"))
    before = log.get("c1")
    gated = ConversationLog(engine, prefix=prefix, clock=clock, store_messages=False)
    clock.advance(60)
    recorded.clear()
    assert gated.append("c1", turn("secret follow-up", "secret answer")) == []
    assert gated.append("c2", turn("secret new conversation"), namespace="support") == []
    assert log.counts() == {"conversations": 1, "messages": 1}
    assert log.get("c1") == before  # not even updated_at moved
    assert log.load("c2") is None
    saved = [e for e in recorded if e["event"] == "conversation.saved"]
    assert [(e["key"], e["namespace"], e["messages"], e["inserted"], e["gated"]) for e in saved] == [
        ("c1", "default", 2, 0, True),
        ("c2", "support", 1, 0, True),
    ]
    assert "secret" not in repr(recorded)
    # Bad input is still refused, and what was stored before stays readable and deletable.
    with pytest.raises(ValueError, match="c1"):
        gated.append("c1", [{"role": "robot", "content": "x"}])
    assert [m.content for m in gated.load("c1").messages] == ["old conversation"]
    assert [c.id for c in gated.list().items] == ["c1"]
    assert gated.delete("c1") == (1, 1)
    assert log.counts() == {"conversations": 0, "messages": 0}


def test_privacy_switch_gates_kv_set_only(engine: Any, prefix: str, clock: FakeClock) -> None:
    kv = SqlMemory(engine, prefix=prefix, clock=clock)
    PrivacyAwareMemory(kv, store_messages=True).set("shipping_policy", "Orders ship in two days")
    gated = PrivacyAwareMemory(kv, store_messages=False)
    writes: list[dict[str, Any]] = []
    clawmem.events.on("memory.write", writes.append)
    try:
        gated.set("new_fact", "never stored")
    finally:
        clawmem.events.off("memory.write", writes.append)
    assert [(w["key"], w["gated"]) for w in writes] == [("new_fact", True)]
    assert gated.get("new_fact") is None
    # What was written before stays readable, searchable and deletable.
    assert gated.get("shipping_policy") == "Orders ship in two days"
    assert gated.all() == {"shipping_policy": "Orders ship in two days"}
    assert [hit.key for hit in gated.search("when do orders ship")] == ["shipping_policy"]
    gated.flush()
    assert gated.all() == {}


def test_gated_set_still_rejects_bad_input() -> None:
    gated = PrivacyAwareMemory(ArrayMemory(), store_messages=False)
    with pytest.raises(clawmem.InvalidKey):
        gated.set("", 1)
    with pytest.raises(clawmem.InvalidNamespace):
        gated.set("k", 1, namespace="a..b")
    with pytest.raises(ValueError, match="k"):
        gated.set("k", float("nan"))


# -- bad input is refused before anything is written -------------------------------------------


BAD_MESSAGES: list[tuple[Any, type]] = [
    ("not a message", TypeError),
    (42, TypeError),
    ({"role": "robot", "content": "x"}, ValueError),
    ({"content": "no role"}, ValueError),
    ({"role": "user", "content": 5}, TypeError),
    ({"role": "user", "content": "nul\x00byte"}, ValueError),
    ({"role": "user", "content": "lone \ud800 surrogate"}, ValueError),
    ({"role": "user", "content": "x", "extra": 1}, ValueError),
    ({"role": "tool", "content": "x", "tool_input": {"bad": float("nan")}}, ValueError),
    ({"role": "tool", "content": "x", "tool_input": {"bad": object()}}, TypeError),
    ({"role": "tool", "content": "x", "tool_name": "t" * 256}, ValueError),
    ({"role": "tool", "content": "x", "tool_name": 7}, TypeError),
]


@pytest.mark.parametrize("bad,error", BAD_MESSAGES, ids=[repr(b)[:30] for b, _ in BAD_MESSAGES])
def test_a_bad_message_is_refused_and_nothing_is_written(
    log: ConversationLog, clock: FakeClock, bad: Any, error: type
) -> None:
    log.append("c1", turn("kept"))
    before = log.get("c1")
    clock.advance(60)
    with pytest.raises(error, match="c1"):
        log.append("c1", [{"role": "user", "content": "valid, but in a refused append"}, bad])
    with pytest.raises(error, match="c2"):
        log.append("c2", [{"role": "user", "content": "valid, but in a refused append"}, bad])
    assert contents(log, "c1") == ["kept"]
    assert log.get("c1") == before
    assert log.load("c2") is None
    assert log.counts() == {"conversations": 1, "messages": 1}


BAD_FIELDS: list[tuple[dict[str, Any], type]] = [
    ({"metadata": {"bad": float("nan")}}, ValueError),
    ({"metadata": ["not", "a", "dict"]}, TypeError),
    ({"user_id": "u" * 181}, ValueError),
    ({"user_id": 7}, TypeError),
    ({"title": "t" * 256}, ValueError),
    ({"namespace": "a..b"}, clawmem.InvalidNamespace),
    ({"namespace": ""}, clawmem.InvalidNamespace),
]


@pytest.mark.parametrize("bad,error", BAD_FIELDS, ids=[repr(b)[:30] for b, _ in BAD_FIELDS])
def test_a_bad_conversation_field_is_refused_and_nothing_is_written(
    log: ConversationLog, bad: dict[str, Any], error: type
) -> None:
    with pytest.raises(error):
        log.append("c1", turn("never stored"), **bad)
    assert log.counts() == {"conversations": 0, "messages": 0}


@pytest.mark.parametrize("conversation_id", ["x" * 27, "has space", "", "dot.ted", "é", None, 5])
def test_a_bad_conversation_id_is_refused(log: ConversationLog, conversation_id: Any) -> None:
    with pytest.raises(clawmem.InvalidKey):
        log.append(conversation_id, turn("never stored"))
    with pytest.raises(clawmem.InvalidKey):
        log.load(conversation_id)
    with pytest.raises(clawmem.InvalidKey):
        log.delete(conversation_id)
    assert log.counts() == {"conversations": 0, "messages": 0}


def test_ids_that_differ_only_in_case_are_two_conversations(log: ConversationLog) -> None:
    # validate_conversation_id accepts both cases, so "c1" and "C1" name two conversations.
    log.append("c1", turn("lower-case conversation"))
    log.append("C1", turn("upper-case conversation"))
    assert log.counts() == {"conversations": 2, "messages": 2}, (
        "a conversation id differing only in case was merged into another conversation"
    )
    assert [m.content for m in log.load("C1").messages] == ["upper-case conversation"]
    assert log.delete("C1") == (1, 1)
    assert [m.content for m in log.load("c1").messages] == ["lower-case conversation"]


def test_the_longest_conversation_id_is_accepted(log: ConversationLog) -> None:
    longest = "Ab_-" + "9" * 22
    log.append(longest, turn("hello"))
    assert log.load(longest).id == longest


def test_an_oversized_message_is_refused_with_nothing_written(engine: Any, prefix: str) -> None:
    small = ConversationLog(engine, prefix=prefix, max_value_bytes=1000)
    small.append("c1", [{"role": "user", "content": "é" * 500}])  # exactly 1000 bytes fits
    with pytest.raises(clawmem.ValueTooLarge, match="message 1"):
        small.append("c1", [{"role": "user", "content": "fine"}, {"role": "user", "content": "é" * 501}])
    with pytest.raises(clawmem.ValueTooLarge):
        small.append("c2", [{"role": "tool", "content": "ok", "tool_input": {"blob": "x" * 1000}}])
    assert small.counts() == {"conversations": 1, "messages": 1}
    assert [len(m.content) for m in small.load("c1").messages] == [500]


# -- delete ----------------------------------------------------------------------------------


def test_delete_removes_messages_and_leaves_no_orphans(
    log: ConversationLog, engine: Any, prefix: str
) -> None:
    for n in range(5):
        log.append(f"c{n}", turn("a", "b", "c"))
    log.append("keep", turn("x"), namespace="archive")
    assert log.delete("c0") == (1, 3)
    assert log.delete("c0") == (0, 0)
    assert log.delete("never-there") == (0, 0)
    assert log.load("c0") is None and log.messages("c0").items == []
    assert log.counts() == {"conversations": 5, "messages": 13}
    assert log.delete("keep") == (1, 1)  # ids are global: any namespace's conversation goes
    assert log.counts() == {"conversations": 4, "messages": 12}
    assert orphans(engine, prefix) == 0
    assert contents(log, "c1") == ["a", "b", "c"]


# -- the read API ----------------------------------------------------------------------------


def test_listing_pages_newest_first_without_gaps(log: ConversationLog, clock: FakeClock) -> None:
    stamps: dict[str, datetime] = {}
    for n in range(23):
        log.append(f"c{n:02d}", turn(f"message {n}"))
        stamps[f"c{n:02d}"] = utc_datetime(clock)
        if n % 3 == 0:
            clock.advance(1)  # several conversations share a created_at: ids break the tie
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = log.list(limit=5, cursor=cursor)
        pages += 1
        seen.extend(c.id for c in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 5
    assert seen == sorted(stamps, key=lambda cid: (stamps[cid], cid), reverse=True)
    assert log.get("c05").message_count == 1
    assert log.get("missing") is None
    exact = log.list(limit=23)
    assert len(exact.items) == 23 and exact.next_cursor is None


def test_listing_filters_and_search(log: ConversationLog, clock: FakeClock) -> None:
    log.append("a1", turn("My parcel is LATE"), user_id="alice", title="Order help")
    clock.advance(86_400)
    log.append("b1", turn("refund please"), user_id="bob", title="100% refund")
    log.append("b2", turn("hello"), user_id="bob", namespace="archive")
    assert [c.id for c in log.list(user_id="bob").items] == ["b2", "b1"]
    assert [c.id for c in log.list(namespace="archive").items] == ["b2"]
    assert [c.id for c in log.list(user_id="bob", namespace="default").items] == ["b1"]
    assert [c.id for c in log.list(query="late").items] == ["a1"]
    assert [c.id for c in log.list(query="ORDER").items] == ["a1"]
    assert [c.id for c in log.list(query="100%").items] == ["b1"]
    assert log.list(query="100_").items == []
    start = datetime.fromtimestamp(clock.now - 3600, UTC).replace(tzinfo=None)
    assert [c.id for c in log.list(since=start).items] == ["b2", "b1"]
    assert [c.id for c in log.list(until=start).items] == ["a1"]
    assert log.namespaces() == ["archive", "default"]
    assert log.oldest() < log.newest()
    assert log.newest() == utc_datetime(clock)
    with pytest.raises(clawmem.InvalidNamespace):
        log.list(namespace="a..b")


def test_the_user_id_filter_is_exact(log: ConversationLog) -> None:
    log.append("lower", turn("a"), user_id="bob")
    log.append("upper", turn("b"), user_id="Bob")
    log.append("padded", turn("c"), user_id="bob ")
    assert [c.id for c in log.list(user_id="bob").items] == ["lower"], (
        "list(user_id=...) also matched other subjects' user ids (case or trailing spaces)"
    )


def test_oldest_and_newest_by_updated_at(log: ConversationLog, clock: FakeClock) -> None:
    assert log.oldest() is None and log.newest(by="updated_at") is None
    log.append("a", turn("first"))
    first = utc_datetime(clock)
    clock.advance(10)
    log.append("b", turn("second"))
    second = utc_datetime(clock)
    clock.advance(10)
    log.append("a", turn("again"))
    assert (log.oldest(), log.newest()) == (first, second)
    assert (log.oldest(by="updated_at"), log.newest(by="updated_at")) == (second, utc_datetime(clock))


def test_messages_page_in_order(log: ConversationLog, clock: FakeClock) -> None:
    log.append("c1", turn(*[f"m{n}" for n in range(7)]))
    clock.advance(1)
    log.append("c1", turn(*[f"m{n}" for n in range(7, 12)]))
    first = log.messages("c1", limit=5)
    second = log.messages("c1", limit=5, cursor=first.next_cursor)
    third = log.messages("c1", limit=5, cursor=second.next_cursor)
    assert [m.content for m in first.items + second.items + third.items] == [f"m{n}" for n in range(12)]
    assert [len(first.items), len(second.items), len(third.items)] == [5, 5, 2]
    assert third.next_cursor is None
    assert log.messages("missing").items == []
    # Newest first across appends; within one append (one created_at) the id decides.
    assert [m.content for m in log.recent_user_messages(3)] == ["m11", "m9", "m7"]
    newest: list[str] = []
    cursor = None
    while True:
        page = log.messages("c1", limit=5, cursor=cursor, descending=True)
        newest += [m.content for m in page.items]
        if (cursor := page.next_cursor) is None:
            break
    assert newest == [f"m{n}" for n in reversed(range(12))], "each message once, newest first"
    # A cursor continues only the direction it was made in.
    backwards = log.messages("c1", limit=5, descending=True).next_cursor
    with pytest.raises(InvalidCursor):
        log.messages("c1", limit=5, cursor=backwards)
    with pytest.raises(InvalidCursor):
        log.messages("c1", limit=5, cursor=first.next_cursor, descending=True)


def test_bad_cursor_and_limit_are_refused(log: ConversationLog) -> None:
    with pytest.raises(InvalidCursor):
        log.list(cursor="garbage!")
    with pytest.raises(InvalidCursor):
        log.messages("c1", cursor="garbage!")
    for limit in (0, 501, True, "5"):
        with pytest.raises(ValueError, match="limit"):
            log.list(limit=limit)
    with pytest.raises(ValueError, match="limit"):
        log.messages("c1", limit=1001)
    with pytest.raises(ValueError, match="limit"):
        log.recent_user_messages(0)
    with pytest.raises(ValueError, match="by must be"):
        log.oldest(by="title")
    with pytest.raises(ValueError, match="by must be"):
        log.newest(by="id")


def test_a_cursor_holding_no_time_is_an_invalid_cursor(log: ConversationLog) -> None:
    log.append("c1", turn("hello"))
    not_a_time = encode_cursor(["x", "y"])
    with pytest.raises(InvalidCursor):
        log.list(cursor=not_a_time)
    with pytest.raises(InvalidCursor):
        log.messages("c1", cursor=not_a_time)


def test_conversation_events_carry_no_text(log: ConversationLog, recorded: list[dict[str, Any]]) -> None:
    with clawmem.run_context("run-7"):
        log.append("c1", turn("secret customer words"), title="secret title", metadata={"secret": "x"})
        log.append("c1", turn("more private words", "private reply"))
        log.load("c1")
        log.list(query="secret")
        log.messages("c1")
        log.delete("c1")
    saved = [e for e in recorded if e["event"] == "conversation.saved"]
    assert [(e["key"], e["messages"], e["inserted"], e["gated"]) for e in saved] == [
        ("c1", 1, 1, False),
        ("c1", 2, 2, False),
    ]
    assert recorded and all(e["run_id"] == "run-7" for e in recorded)
    assert "secret" not in repr(recorded) and "private" not in repr(recorded)


def test_a_short_conversation_id_reads_back_unpadded_everywhere(
    log: ConversationLog, engine: Any, prefix: str
) -> None:
    ids = log.append("c1", turn("hello"))
    assert log.get("c1").id == "c1"
    assert log.load("c1").id == "c1"
    assert [c.id for c in log.list().items] == ["c1"]
    assert [m.conversation_id for m in log.messages("c1").items] == ["c1"]
    assert [m.conversation_id for m in log.load("c1").messages] == ["c1"]
    assert [m.id for m in log.recent_user_messages()] == ids
    where = tables(prefix).conversations.c.namespace == "default"
    with engine.connect() as conn:
        assert [found for found, _ in iter_conversation_ids(conn, prefix, where)] == ["c1"]
    assert [c.id for c in iter_conversations(engine, prefix, where)] == ["c1"]
    assert [batch.conversation_ids for batch in delete_in_batches(engine, prefix, where)] == [("c1",)]
    assert log.counts() == {"conversations": 0, "messages": 0}


# -- subject readers and retention helpers ----------------------------------------------------


def test_subject_reader_pages_through_ties_without_gaps(
    log: ConversationLog, engine: Any, prefix: str
) -> None:
    for n in range(7):  # one clock reading: every created_at ties, so the id decides the order
        log.append(f"c{n}", turn(f"about subject {n}", f"reply {n}"))
    log.append("elsewhere", turn("not selected"), namespace="archive")
    where = tables(prefix).conversations.c.namespace == "default"
    whole = [(c.id, [m.content for m in c.messages]) for c in iter_conversations(engine, prefix, where, 100)]
    paged = [(c.id, [m.content for m in c.messages]) for c in iter_conversations(engine, prefix, where, 2)]
    assert paged == whole == [(f"c{n}", [f"about subject {n}", f"reply {n}"]) for n in range(7)]


def test_retention_deletes_old_conversations_with_their_messages(
    log: ConversationLog, engine: Any, prefix: str, clock: FakeClock
) -> None:
    log.append("old", turn("a", "b"))
    clock.advance(86_400 * 30)
    cutoff = utc_datetime(clock)
    log.append("new", turn("c"))
    batches = list(delete_in_batches(engine, prefix, older_than(prefix, "created_at", cutoff)))
    assert [(b.conversation_ids, b.messages) for b in batches] == [(("old",), 2)]
    assert [c.id for c in log.list().items] == ["new"]
    assert log.counts() == {"conversations": 1, "messages": 1}
    assert orphans(engine, prefix) == 0


def test_retention_refuses_a_bad_order_column_or_batch_size_by_name(engine: Any, prefix: str) -> None:
    where = tables(prefix).conversations.c.namespace == "default"
    with pytest.raises(ValueError, match=r"^by must be one of created_at, updated_at, got 'title'$"):
        older_than(prefix, "title", datetime(2024, 1, 1))
    with pytest.raises(ValueError, match=r"^order_by must be one of created_at, updated_at, got 'id'$"):
        next(delete_in_batches(engine, prefix, where, order_by="id"))
    for batch_size in (0, True, "10"):
        message = rf"^batch_size must be a positive int, got {re.escape(repr(batch_size))}$"
        with pytest.raises(ValueError, match=message):
            next(delete_in_batches(engine, prefix, where, batch_size=batch_size))
