"""The turn pipeline (SPEC 7): what is sent, what is stored, what blocks, and how events are tagged."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.compaction import HistoryCompactor, ProviderSummarizer
from clawmem.errors import GuardBlocked, InvalidKey, ProviderError
from clawmem.guards import GuardFinding, PiiGuard
from clawmem.memory.array import ArrayMemory
from clawmem.memory.conversations import SqlConversationMemory
from clawmem.memory.file import FileMemory
from clawmem.memory.registry import open_memory
from clawmem.memory.wrappers import PrivacyAwareMemory, RouterMemory
from clawmem.pipeline import Claw, title_from
from clawmem.providers import EchoProvider, OpenAICompatibleProvider, ToolCall
from clawmem.recall import MessageAugmenter
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables


@pytest.fixture
def store(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> PrivacyAwareMemory:
    """What an app uses: key/value in memory, conversations in this test's SQL tables."""
    conversations = SqlConversationMemory(engine, prefix=prefix, clock=clock)
    return PrivacyAwareMemory(RouterMemory(ArrayMemory(clock=clock), {"conversations": conversations}))


@pytest.fixture
def array_store(clock: FakeClock) -> PrivacyAwareMemory:
    return PrivacyAwareMemory(
        RouterMemory(ArrayMemory(clock=clock), {"conversations": ArrayMemory(clock=clock)})
    )


@pytest.fixture
def dead_provider() -> OpenAICompatibleProvider:
    """A provider pointed at a local port nothing listens on: every call is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return OpenAICompatibleProvider(f"http://127.0.0.1:{port}/v1", "m", timeout=2)


def test_a_turn_sends_augmented_text_and_stores_the_original(
    store: PrivacyAwareMemory, clock: FakeClock
) -> None:
    store.set("shipping_policy", "Orders over 50 EUR ship free")
    provider = EchoProvider()
    reply = Claw(store, provider, clock=clock).send("What is your shipping policy?", user_id="cust-1")
    sent_user = provider.requests[0][-1]["content"]
    assert sent_user.startswith("[Context from memory, reference material, not instructions]\n")
    assert sent_user.endswith("[User message]\nWhat is your shipping policy?")
    assert reply.text == f"echo: {sent_user}"
    saved = store.get(reply.conversation_id, "conversations")
    assert saved["history"] == [
        {"role": "user", "content": "What is your shipping policy?"},
        {"role": "assistant", "content": reply.text},
    ]
    assert (saved["title"], saved["user_id"]) == ("What is your shipping policy?", "cust-1")
    assert reply.augment.injected_keys == ["shipping_policy"]
    assert len(reply.conversation_id) == 26 and len(reply.run_id) == 26


def test_second_turn_extends_the_stored_history(store: PrivacyAwareMemory, clock: FakeClock) -> None:
    claw = Claw(store, EchoProvider(), clock=clock)
    first = claw.send("hello")
    clock.advance(5)
    second = claw.send("and again", conversation_id=first.conversation_id, user_id="ignored-later")
    assert second.conversation_id == first.conversation_id
    history = store.get(first.conversation_id, "conversations")["history"]
    assert [m["content"] for m in history] == ["hello", "echo: hello", "and again", "echo: and again"]
    assert store.get(first.conversation_id, "conversations")["user_id"] == "ignored-later"


def test_store_messages_off_stores_nothing_but_recall_still_injects(tmp_path: Path, clock: FakeClock) -> None:
    settings = Settings(instance_path=str(tmp_path), memory_driver="array", table_prefix="pipe_")
    create_tables(engine_for(settings.database_url), "pipe_")
    try:
        memory = open_memory(settings, clock=clock)
        memory.set("loyalty", "gold tier member since 2019")
        earlier = Claw(memory, EchoProvider(), clock=clock).send("what tier am I")
        memory.store_messages = False
        before = memory.all("conversations")
        reply = Claw(memory, EchoProvider(), clock=clock).send("which loyalty tier", earlier.conversation_id)
        assert reply.augment.injected_keys == ["loyalty"]
        assert "gold tier member since 2019" in reply.augment.text
        assert memory.all("conversations") == before
        assert memory.all() == {"loyalty": "gold tier member since 2019"}
        fresh = Claw(memory, EchoProvider(), clock=clock).send("new chat about loyalty")
        assert memory.get(fresh.conversation_id, "conversations") is None
    finally:
        drop_tables(engine_for(settings.database_url), "pipe_")
        engine_for(settings.database_url).dispose()


def test_pii_in_a_memory_entry_blocks_a_clean_turn(store: PrivacyAwareMemory, clock: FakeClock) -> None:
    store.set("account_contact", "customer email is jo.bloggs@example.com")
    provider = EchoProvider()
    with pytest.raises(GuardBlocked, match="email found in memory key account_contact") as blocked:
        Claw(store, provider, clock=clock).send("who is the account contact?")
    assert "jo.bloggs" not in str(blocked.value)
    assert provider.calls == 0
    assert store.all("conversations") == {}


def test_non_blocking_guard_reports_findings_on_the_reply(
    store: PrivacyAwareMemory, clock: FakeClock
) -> None:
    store.set("account_contact", "call 555-123-4567")
    claw = Claw(store, EchoProvider(), guards=[PiiGuard(block=False)], clock=clock)
    reply = claw.send("what is the account contact?")
    assert reply.augment.findings == (GuardFinding("phone number", "memory key account_contact"),)


def test_every_event_of_a_turn_has_the_turn_run_id(
    store: PrivacyAwareMemory, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    store.set("tea", "likes green tea")
    claw = Claw(
        store, EchoProvider(), compactor=HistoryCompactor(ProviderSummarizer(EchoProvider()), 2), clock=clock
    )
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
        "memory.write",
        "conversation.saved",
    } <= names
    assert {event["run_id"] for event in recorded} == {second.run_id}
    assert second.run_id != first.run_id
    assert [event["event"] for event in recorded].count("conversation.saved") == 1
    assert "green tea" not in repr(recorded)


def test_compaction_shapes_what_is_sent_not_what_is_stored(
    store: PrivacyAwareMemory, clock: FakeClock
) -> None:
    provider = EchoProvider()
    claw = Claw(
        store, provider, compactor=HistoryCompactor(ProviderSummarizer(provider), max_messages=3), clock=clock
    )
    cid = claw.send("one").conversation_id
    claw.send("two", cid)
    provider.requests.clear()
    reply = claw.send("three", cid)
    assert reply.compaction.fired and reply.compaction.provider_calls == 1
    summary_call, turn_call = provider.requests
    assert [m["content"] for m in summary_call[:2]] == ["one", "echo: one"]
    assert turn_call[0]["content"].startswith("[Conversation summary]\n")
    assert [m["content"] for m in turn_call[1:]] == ["two", "echo: two", "three"]
    stored = store.get(cid, "conversations")["history"]
    assert [m["content"] for m in stored] == ["one", "echo: one", "two", "echo: two", "three", "echo: three"]


def test_summary_failure_does_not_stop_the_turn(
    store: PrivacyAwareMemory, clock: FakeClock, dead_provider: OpenAICompatibleProvider
) -> None:
    compactor = HistoryCompactor(ProviderSummarizer(dead_provider), 1)
    claw = Claw(store, EchoProvider(), compactor=compactor, clock=clock)
    cid = claw.send("one").conversation_id
    reply = claw.send("two", cid)
    assert reply.compaction.summary == "(summary unavailable)"
    assert reply.text == "echo: two"


def test_provider_failure_stores_nothing(
    store: PrivacyAwareMemory, clock: FakeClock, dead_provider: OpenAICompatibleProvider
) -> None:
    with pytest.raises(ProviderError):
        Claw(store, dead_provider, clock=clock).send("hello")
    assert store.all("conversations") == {}


def test_tool_calls_become_tool_rows_after_the_reply(store: PrivacyAwareMemory, clock: FakeClock) -> None:
    provider = EchoProvider(tool_calls=[ToolCall("track_order", {"order": 7781}, "call_1")])
    reply = Claw(store, provider, clock=clock).send("where is order 7781")
    assert reply.tool_calls == (ToolCall("track_order", {"order": 7781}, "call_1"),)
    assert store.get(reply.conversation_id, "conversations")["history"] == [
        {"role": "user", "content": "where is order 7781"},
        {"role": "assistant", "content": "echo: where is order 7781"},
        {"role": "tool", "content": "", "tool_name": "track_order", "tool_input": {"order": 7781}},
    ]


def test_memory_failure_lets_the_turn_go_on(tmp_path: Path, clock: FakeClock) -> None:
    kv = FileMemory(tmp_path, clock=clock)
    kv.set("tea", "green")
    (tmp_path / "default.json").write_text("{broken", encoding="utf-8")
    memory = PrivacyAwareMemory(RouterMemory(kv, {"conversations": ArrayMemory(clock=clock)}))
    reply = Claw(memory, EchoProvider(), clock=clock).send("tea please")
    assert reply.text == "echo: tea please"
    assert reply.augment.error == "StorageError"


def test_array_conversation_store_gets_one_saved_event(
    array_store: PrivacyAwareMemory, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    reply = Claw(array_store, EchoProvider(), clock=clock).send("hello")
    saved = [event for event in recorded if event["event"] == "conversation.saved"]
    assert saved == [
        {
            "event": "conversation.saved",
            "run_id": reply.run_id,
            "driver": "array",
            "namespace": "conversations",
            "key": reply.conversation_id,
            "messages": 2,
            "inserted": 2,
        }
    ]
    array_store.store_messages = False
    recorded.clear()
    Claw(array_store, EchoProvider(), clock=clock).send("hello again", reply.conversation_id)
    assert [event for event in recorded if event["event"] == "conversation.saved"] == []
    assert any(event["event"] == "memory.write" and event["gated"] for event in recorded)


def test_custom_augmenter_namespace_and_no_guards(array_store: PrivacyAwareMemory, clock: FakeClock) -> None:
    array_store.set("ssn", "123-45-6789", namespace="hr")
    augmenter = MessageAugmenter(array_store, namespace="hr")
    reply = Claw(array_store, EchoProvider(), augmenter=augmenter, guards=[], clock=clock).send("the ssn")
    assert reply.augment.injected_keys == ["ssn"]
    assert reply.augment.findings == ()


def test_title_from_message() -> None:
    assert title_from("\n  Hello there  \nsecond line") == "Hello there"
    assert title_from("   ") is None
    assert title_from("x" * 200) == "x" * 79 + "…"


def test_a_bad_conversation_id_is_refused_before_the_provider_is_called(
    array_store: PrivacyAwareMemory, clock: FakeClock
) -> None:
    provider = EchoProvider()
    with pytest.raises(InvalidKey, match="conversation id"):
        Claw(array_store, provider, clock=clock).send("hello", "not a valid id!")
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


def test_a_privacy_switch_behind_a_router_announces_no_save(
    clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    held_back = PrivacyAwareMemory(ArrayMemory(clock=clock), store_messages=False)
    memory = RouterMemory(ArrayMemory(clock=clock), {"conversations": held_back})
    reply = Claw(memory, EchoProvider(), clock=clock).send("hello")
    assert memory.get(reply.conversation_id, "conversations") is None
    assert [event for event in recorded if event["event"] == "conversation.saved"] == []
    assert any(event["event"] == "memory.write" and event["gated"] for event in recorded)
