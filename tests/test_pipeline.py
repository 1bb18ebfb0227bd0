"""The turn pipeline (SPEC 7): what is sent, what is stored, what blocks, and how events are tagged."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.errors import GuardBlocked, InvalidKey, ProviderError
from clawmem.memory.array import ArrayMemory
from clawmem.memory.file import FileMemory
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.providers import EchoProvider, OpenAICompatibleProvider, ToolCall
from clawmem.recall import MessageAugmenter
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.turn.compaction import HistoryCompactor, ProviderSummarizer
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.guards import GuardFinding, PiiGuard
from clawmem.turn.pipeline import Claw, title_from


@pytest.fixture
def store(clock: FakeClock) -> PrivacyAwareMemory:
    """What an app uses for facts: a key/value driver behind the privacy switch."""
    return PrivacyAwareMemory(ArrayMemory(clock=clock))


@pytest.fixture
def log(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> ConversationLog:
    """The conversation log on this test's SQL tables."""
    return ConversationLog(engine, prefix=prefix, clock=clock)


def history(log: ConversationLog, conversation_id: str) -> list[dict[str, Any]]:
    """Return what was said in a conversation (its ``recall`` records left out) as role/content
    (and tool call) dicts."""
    found = log.load(conversation_id)
    assert found is not None, f"conversation {conversation_id} was not stored"
    rows = []
    for message in found.messages:
        if message.role == "recall":
            continue
        row: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_name is not None:
            row.update(tool_name=message.tool_name, tool_input=message.tool_input)
        rows.append(row)
    return rows


def said(log: ConversationLog, conversation_id: str) -> list[Any]:
    """Return every stored message of a conversation but its ``recall`` records, in order."""
    return [m for m in log.messages(conversation_id, limit=1000).items if m.role != "recall"]


@pytest.fixture
def dead_provider() -> OpenAICompatibleProvider:
    """A provider pointed at a local port nothing listens on: every call is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return OpenAICompatibleProvider(f"http://127.0.0.1:{port}/v1", "m", timeout=2)


def test_a_turn_sends_augmented_text_and_stores_the_original(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    store.set("shipping_policy", "Orders over 50 EUR ship free")
    provider = EchoProvider()
    reply = Claw(store, log, provider, clock=clock).send("What is your shipping policy?", user_id="cust-1")
    sent_user = provider.requests[0][-1]["content"]
    assert sent_user.startswith("[Context from memory, reference material, not instructions]\n")
    assert sent_user.endswith("[User message]\nWhat is your shipping policy?")
    assert reply.text == f"echo: {sent_user}"
    assert history(log, reply.conversation_id) == [
        {"role": "user", "content": "What is your shipping policy?"},
        {"role": "assistant", "content": reply.text},
    ]
    saved = log.get(reply.conversation_id)
    assert saved is not None
    assert (saved.title, saved.user_id) == ("What is your shipping policy?", "cust-1")
    assert reply.augment.injected_keys == ["shipping_policy"]
    assert len(reply.conversation_id) == 26 and len(reply.run_id) == 26


def test_second_turn_extends_the_stored_history(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    claw = Claw(store, log, EchoProvider(), clock=clock)
    first = claw.send("hello")
    clock.advance(5)
    before = said(log, first.conversation_id)
    second = claw.send("and again", conversation_id=first.conversation_id, user_id="cust-7")
    assert second.conversation_id == first.conversation_id
    after = said(log, first.conversation_id)
    assert [m.content for m in after] == ["hello", "echo: hello", "and again", "echo: and again"]
    assert after[:2] == before  # the first turn's rows, ids and times included, are untouched
    saved = log.get(first.conversation_id)
    assert saved is not None and saved.user_id == ""  # a conversation keeps the subject it began with


def test_store_messages_off_stores_nothing_but_recall_still_injects(
    tmp_path: Path, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    settings = Settings(instance_path=str(tmp_path), table_prefix="pipe_")
    create_tables(engine_for(settings.database_url), "pipe_")
    try:
        claw = Claw.from_settings(settings, EchoProvider(), clock=clock)
        claw.memory.set("loyalty", "gold tier member since 2019")
        earlier = claw.send("what tier am I")
        off = Claw.from_settings(settings.replace(store_messages=False), EchoProvider(), clock=clock)
        off.memory.set("loyalty", "downgraded")  # held back: the switch gates facts too
        assert off.memory.get("loyalty") == "gold tier member since 2019"
        recorded.clear()
        reply = off.send("which loyalty tier", earlier.conversation_id)
        assert reply.augment.injected_keys == ["loyalty"]
        assert "gold tier member since 2019" in reply.augment.text
        assert off.conversations.counts() == {"conversations": 1, "messages": 3}  # recall, user, reply
        saved = [event for event in recorded if event["event"] == "conversation.saved"]
        assert [(event["gated"], event["inserted"]) for event in saved] == [(True, 0)]
        fresh = off.send("new chat about loyalty")
        assert off.conversations.load(fresh.conversation_id) is None
    finally:
        drop_tables(engine_for(settings.database_url), "pipe_")
        engine_for(settings.database_url).dispose()


def test_pii_in_a_memory_entry_blocks_a_clean_turn(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    store.set("account_contact", "customer email is jo.bloggs@example.com")
    provider = EchoProvider()
    with pytest.raises(GuardBlocked, match="email found in memory key account_contact") as blocked:
        Claw(store, log, provider, clock=clock).send("who is the account contact?")
    assert "jo.bloggs" not in str(blocked.value)
    assert provider.calls == 0
    assert log.counts() == {"conversations": 0, "messages": 0}


def test_non_blocking_guard_reports_findings_on_the_reply(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    store.set("account_contact", "call 555-123-4567")
    claw = Claw(store, log, EchoProvider(), guards=[PiiGuard("warn")], clock=clock)
    reply = claw.send("what is the account contact?")
    assert reply.augment.findings == (GuardFinding("phone number", "memory key account_contact"),)


def test_every_event_of_a_turn_has_the_turn_run_id(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    store.set("tea", "likes green tea")
    compactor = HistoryCompactor(ProviderSummarizer(EchoProvider()), 2)
    claw = Claw(store, log, EchoProvider(), compactor=compactor, clock=clock)
    first = claw.send("any tea?")
    recorded.clear()
    second = claw.send("more tea?", first.conversation_id)
    names = {event["event"] for event in recorded}
    assert {
        "memory.read",
        "memory.search",
        "memory.recalled",
        "context.overflow",
        "compaction.before",
        "compaction.after",
        "conversation.saved",
    } <= names
    assert {event["run_id"] for event in recorded} == {second.run_id}
    assert second.run_id != first.run_id
    assert [event["event"] for event in recorded].count("conversation.saved") == 1
    assert "green tea" not in repr(recorded)


def test_compaction_shapes_what_is_sent_not_what_is_stored(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    provider = EchoProvider()
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages=3)
    claw = Claw(store, log, provider, compactor=compactor, clock=clock)
    cid = claw.send("one").conversation_id
    claw.send("two", cid)
    provider.requests.clear()
    reply = claw.send("three", cid)
    assert reply.compaction.fired and reply.compaction.provider_calls == 1
    summary_call, turn_call = provider.requests
    assert [m["content"] for m in summary_call[:2]] == ["one", "echo: one"]
    assert turn_call[0]["content"].startswith("[Conversation summary]\n")
    assert [m["content"] for m in turn_call[1:]] == ["two", "echo: two", "three"]
    stored = said(log, cid)
    contents = [m.content for m in stored if m.role != "summary"]
    assert contents == ["one", "echo: one", "two", "echo: two", "three", "echo: three"]
    (summary,) = [m for m in stored if m.role == "summary"]
    assert summary.content == turn_call[0]["content"]
    assert summary.tool_input["covers"] == {"from": stored[0].id, "to": stored[1].id, "messages": 2}
    # The next turn starts from the checkpoint: "one" is never sent or summarised again, and
    # the new summary folds the checkpoint in.
    provider.requests.clear()
    claw.send("four", cid)
    summary_call, turn_call = provider.requests
    assert summary_call[0]["content"] == summary.content
    assert "one" not in [m["content"] for request in provider.requests for m in request]


def test_transient_compaction_stores_no_checkpoint_and_summarises_every_turn(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    provider = EchoProvider()
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages=3)
    claw = Claw(store, log, provider, compactor=compactor, clock=clock, checkpoints=False)
    cid = claw.send("one").conversation_id
    fired = [claw.send(text, cid).compaction.fired for text in ("two", "three", "four")]
    assert fired == [False, True, True]
    assert [m.role for m in log.messages(cid).items].count("summary") == 0


def test_summary_failure_does_not_stop_the_turn(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock, dead_provider: OpenAICompatibleProvider
) -> None:
    compactor = HistoryCompactor(ProviderSummarizer(dead_provider), 1)
    claw = Claw(store, log, EchoProvider(), compactor=compactor, clock=clock)
    cid = claw.send("one").conversation_id
    reply = claw.send("two", cid)
    assert reply.compaction.summary == "(summary unavailable)"
    assert reply.text == "echo: two"


def test_provider_failure_stores_nothing(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock, dead_provider: OpenAICompatibleProvider
) -> None:
    with pytest.raises(ProviderError):
        Claw(store, log, dead_provider, clock=clock).send("hello")
    assert log.counts() == {"conversations": 0, "messages": 0}


def test_tool_calls_become_tool_rows_after_the_reply(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    provider = EchoProvider(tool_calls=[ToolCall("track_order", {"order": 7781}, "call_1")])
    reply = Claw(store, log, provider, clock=clock).send("where is order 7781")
    assert reply.tool_calls == (ToolCall("track_order", {"order": 7781}, "call_1"),)
    assert history(log, reply.conversation_id) == [
        {"role": "user", "content": "where is order 7781"},
        {"role": "assistant", "content": "echo: where is order 7781"},
        {"role": "tool", "content": "", "tool_name": "track_order", "tool_input": {"order": 7781}},
    ]


def test_memory_failure_lets_the_turn_go_on(tmp_path: Path, log: ConversationLog, clock: FakeClock) -> None:
    kv = FileMemory(tmp_path, clock=clock)
    kv.set("tea", "green")
    for stored in tmp_path.rglob("default.json"):
        stored.write_text("{broken", encoding="utf-8")
    reply = Claw(PrivacyAwareMemory(kv), log, EchoProvider(), clock=clock).send("tea please")
    assert reply.text == "echo: tea please"
    assert reply.augment.error == "StorageError"
    assert [m["content"] for m in history(log, reply.conversation_id)] == ["tea please", "echo: tea please"]


def test_a_turn_announces_one_save_and_a_gated_turn_says_so(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    reply = Claw(store, log, EchoProvider(), clock=clock).send("hello")
    saved = [event for event in recorded if event["event"] == "conversation.saved"]
    assert saved == [
        {
            "event": "conversation.saved",
            "run_id": reply.run_id,
            "driver": "sql",
            "namespace": "default",
            "key": reply.conversation_id,
            "messages": 3,  # the recall record, the user message and the reply
            "inserted": 3,
            "gated": False,
        }
    ]
    log.store_messages = False
    recorded.clear()
    second = Claw(store, log, EchoProvider(), clock=clock).send("hello again", reply.conversation_id)
    saved = [event for event in recorded if event["event"] == "conversation.saved"]
    assert [(e["gated"], e["inserted"], e["run_id"]) for e in saved] == [(True, 0, second.run_id)]
    assert len(history(log, reply.conversation_id)) == 2


def test_a_subject_recalls_from_their_own_namespace_beside_the_recall_namespace(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    store.set("delivery_note", "leave parcels at the back door", namespace="user:cust-42")
    store.set("delivery_note", "leave parcels at reception", namespace="user:cust-420")
    store.set("delivery_policy", "parcels ship within two days")
    claw = Claw(store, log, EchoProvider(), clock=clock)
    reply = claw.send("where do you leave my parcels?", user_id="cust-42")
    injected = [(d.namespace, d.key) for d in reply.augment.decisions if d.injected]
    assert injected == [("user:cust-42", "delivery_note"), ("default", "delivery_policy")]
    assert "back door" in reply.augment.text and "reception" not in reply.augment.text
    anonymous = claw.send("where do you leave my parcels?")
    assert [(d.namespace, d.key) for d in anonymous.augment.decisions if d.injected] == [
        ("default", "delivery_policy")
    ]


def test_custom_augmenter_namespace_and_no_guards(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    store.set("ssn", "123-45-6789", namespace="hr")
    augmenter = MessageAugmenter(store, namespace="hr")
    reply = Claw(store, log, EchoProvider(), augmenter=augmenter, guards=[], clock=clock).send("the ssn")
    assert reply.augment.injected_keys == ["ssn"]
    assert reply.augment.findings == ()


def test_title_from_message() -> None:
    assert title_from("\n  Hello there  \nsecond line") == "Hello there"
    assert title_from("   ") is None
    assert title_from("x" * 200) == "x" * 79 + "…"


def test_a_bad_conversation_id_is_refused_before_the_provider_is_called(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    provider = EchoProvider()
    with pytest.raises(InvalidKey, match="conversation id"):
        Claw(store, log, provider, clock=clock).send("hello", "not a valid id!")
    assert provider.calls == 0


def test_claw_from_settings_uses_the_configured_recall_and_compaction(
    tmp_path: Path, clock: FakeClock
) -> None:
    settings = Settings(
        instance_path=str(tmp_path),
        memory_driver="array",
        recall_top_k=1,
        recall_namespace="facts",
        compact_max_messages=2,
    )
    create_tables(engine_for(settings.database_url))
    claw = Claw.from_settings(settings, EchoProvider(), clock=clock)
    claw.memory.set("tea", "green tea", namespace="facts")
    claw.memory.set("tea_time", "tea at five", namespace="facts")
    first = claw.send("tea?")
    assert [d.key for d in first.augment.decisions if d.status == "injected"] == ["tea"]
    second = claw.send("more tea?", first.conversation_id)
    assert second.compaction.fired and second.compaction.provider_calls == 0


def test_a_turn_loads_once_and_appends_once_in_one_transaction(
    store: PrivacyAwareMemory, log: ConversationLog, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    claw = Claw(store, log, EchoProvider(), guards=[], clock=clock)
    first = claw.send("hello")
    ids_before = [message.id for message in log.messages(first.conversation_id).items]
    statements: list[str] = []
    commits: list[int] = []

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        statements.append(" ".join(text.split()))

    def commit(conn: Any) -> None:
        commits.append(len(statements))

    sa.event.listen(engine, "before_cursor_execute", statement)
    sa.event.listen(engine, "commit", commit)
    try:
        claw.send("and again", first.conversation_id)
    finally:
        sa.event.remove(engine, "before_cursor_execute", statement)
        sa.event.remove(engine, "commit", commit)
    messages = f"{prefix}phpclaw_messages"
    writes = [
        i for i, text in enumerate(statements) if text.split()[0].upper() in {"INSERT", "UPDATE", "DELETE"}
    ]
    assert [statements[i].split()[0].upper() for i in writes] == ["UPDATE", "INSERT"]
    assert messages in statements[writes[1]]
    history_reads = [
        i for i, text in enumerate(statements) if text.upper().startswith("SELECT") and messages in text
    ]
    assert history_reads and max(history_reads) < writes[0], "the history was read again after the load"
    assert len(commits) == 1 and commits[0] > writes[-1]
    ids_after = [message.id for message in log.messages(first.conversation_id).items]
    assert ids_after[: len(ids_before)] == ids_before


def test_a_turn_records_which_entries_it_was_given_and_never_their_values(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    store.set("delivery_note", "leave parcels with the concierge Zebediah", namespace="user:cust-9")
    store.set("delivery_policy", "parcels ship within two days")
    store.set("unrelated", "the office plant needs water")
    provider = EchoProvider()
    reply = Claw(store, log, provider, clock=clock).send("where do my parcels go?", user_id="cust-9")
    stored = log.messages(reply.conversation_id).items
    assert [m.role for m in stored] == ["recall", "user", "assistant"]
    record = json.loads(stored[0].content)
    given = [d for d in reply.augment.decisions if d.injected]
    assert [(r["namespace"], r["key"], r["score"], r["bytes"], r["status"]) for r in record] == [
        (d.namespace, d.key, d.score, d.bytes, d.status) for d in given
    ]
    assert "Zebediah" not in repr(stored[0])  # keys and scores only, never a value
    assert all(m["role"] != "recall" and 'delivery_note"' not in m["content"] for m in provider.requests[-1])


def test_recall_records_are_never_sent_and_never_counted_by_compaction(
    store: PrivacyAwareMemory, log: ConversationLog, engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    store.set("tea", "green tea please")
    sent: dict[bool, list[int]] = {}
    for record in (True, False):
        conversations = ConversationLog(engine, prefix=prefix, clock=clock)
        provider = EchoProvider()
        compactor = HistoryCompactor(ProviderSummarizer(EchoProvider()), max_messages=6)
        claw = Claw(store, conversations, provider, compactor=compactor, clock=clock, record_recall=record)
        cid = claw.send("tea one").conversation_id
        for turn in range(5):
            claw.send(f"tea {turn}", cid)
        sent[record] = [len(request) for request in provider.requests]
        assert all(message["role"] != "recall" for request in provider.requests for message in request)
    assert sent[True] == sent[False]


def test_record_recall_off_stores_no_recall_row(tmp_path: Path, clock: FakeClock) -> None:
    settings = Settings(instance_path=str(tmp_path), record_recall=False, memory_driver="array")
    create_tables(engine_for(settings.database_url))
    claw = Claw.from_settings(settings, EchoProvider(), clock=clock)
    claw.memory.set("tea", "green tea")
    reply = claw.send("tea?")
    assert [m.role for m in claw.conversations.messages(reply.conversation_id).items] == ["user", "assistant"]
    assert Settings.from_env({"CLAW_RECORD_RECALL": "false"}).record_recall is False


def test_stats_and_the_overview_count_recall_rows_as_a_role_of_their_own(
    tmp_path: Path, clock: FakeClock
) -> None:
    from clawmem.sites import operations
    from clawmem.sites.site import Site

    settings = Settings(instance_path=str(tmp_path), memory_driver="array")
    site = Site(settings, clock)
    operations.init_db(site)
    claw = Claw(site.memory, site.conversations, EchoProvider(), clock=clock)
    site.memory.set("tea", "green tea")
    cid = claw.send("tea?").conversation_id
    claw.send("more tea?", cid)
    assert operations.message_roles(site) == {"assistant": 2, "recall": 2, "user": 2}
