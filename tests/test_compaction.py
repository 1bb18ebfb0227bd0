"""Compaction (SPEC 6): strict triggers, the split with its tool and system rules, the summarisers."""

from __future__ import annotations

import json
import socket
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem import events
from clawmem.errors import ProviderError
from clawmem.ids import new_id
from clawmem.providers import EchoProvider, OpenAICompatibleProvider
from clawmem.sql.conversations import StoredMessage
from clawmem.sql.schema import tables
from clawmem.turn.compaction import (
    SUMMARY_UNAVAILABLE,
    CompactionResult,
    ExtractiveSummarizer,
    HistoryCompactor,
    ProviderSummarizer,
    analyse,
    analyse_sizes,
    estimate_tokens,
    split_history,
)
from clawmem.turn.conversations import ConversationLog


def msg(role: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def numbered(n: int) -> list[dict[str, Any]]:
    return [msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(n)]


@pytest.fixture
def unused_port() -> int:
    """A local port nothing listens on, so a connection to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def connect_attempts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Refuse every outgoing socket connection for the rest of the test; return the attempts."""
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise ConnectionRefusedError(f"network disabled in this test: {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


# -- estimate -----------------------------------------------------------------------------------


def test_estimate_tokens_is_utf8_bytes_plus_tool_input_json_over_four() -> None:
    assert estimate_tokens([]) == 0
    assert estimate_tokens([msg("user", "abc")]) == 0
    assert estimate_tokens([msg("user", "abcd")]) == 1
    assert estimate_tokens([msg("user", "é" * 4)]) == 2  # 8 bytes
    tool = msg("tool", "ok", tool_name="lookup", tool_input={"q": "é"})
    assert len(json.dumps({"q": "é"})) == 15
    assert estimate_tokens([tool]) == (2 + 15) // 4
    assert estimate_tokens([{"role": "tool", "content": None}]) == 0


# -- triggers --------------------------------------------------------------------------------------


def test_message_trigger_is_strict(recorded: list[dict[str, Any]]) -> None:
    compactor = HistoryCompactor(ExtractiveSummarizer(), max_messages=4)
    at_threshold = compactor.apply(numbered(4))
    assert (at_threshold.fired, at_threshold.reason) == (False, None)
    assert list(at_threshold.history) == numbered(4)
    assert recorded == []
    above = compactor.apply(numbered(5))
    assert (above.fired, above.reason) == (True, "messages")


def test_token_trigger_is_strict() -> None:
    compactor = HistoryCompactor(ExtractiveSummarizer(), max_tokens=10)
    forty_bytes = [msg("user", "a" * 20), msg("assistant", "b" * 20)]
    forty_three = [msg("user", "a" * 20), msg("assistant", "b" * 23)]
    forty_four = [msg("user", "a" * 20), msg("assistant", "b" * 24)]
    assert compactor.apply(forty_bytes).fired is False
    assert compactor.apply(forty_three).fired is False  # still 10 tokens
    result = compactor.apply(forty_four)
    assert (result.fired, result.reason) == (True, "tokens")


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
    max_messages=st.integers(min_value=0, max_value=8),
    max_tokens=st.integers(min_value=0, max_value=60),
)
def test_trigger_names_the_reason_apply_reports(sizes: list[int], max_messages: int, max_tokens: int) -> None:
    history = [msg("user", "é" * size) for size in sizes]
    compactor = HistoryCompactor(ExtractiveSummarizer(), max_messages=max_messages, max_tokens=max_tokens)
    expected = None
    if max_messages and len(history) > max_messages:
        expected = "messages"
    elif max_tokens and estimate_tokens(history) > max_tokens:
        expected = "tokens"
    assert compactor.trigger(history) == expected
    assert compactor.apply(history).reason == expected


def test_thresholds_of_zero_never_fire() -> None:
    result = HistoryCompactor(ExtractiveSummarizer()).apply(numbered(500))
    assert (result.fired, result.reason, result.messages_after) == (False, None, 500)


def test_disabled_compactor_reports_overflow_but_keeps_history(recorded: list[dict[str, Any]]) -> None:
    result = HistoryCompactor(ExtractiveSummarizer(), max_messages=2, enabled=False).apply(numbered(3))
    assert (result.fired, result.reason, len(result.history)) == (False, "messages", 3)
    assert [event["event"] for event in recorded] == ["context.overflow"]
    assert recorded[0]["action"] == "disabled"


# -- split -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "summarised", "kept"),
    [
        (1, [], [0]),
        (2, [0], [1]),
        (3, [0], [1, 2]),
        (4, [0, 1], [2, 3]),
        (5, [0, 1], [2, 3, 4]),
        (6, [0, 1, 2], [3, 4, 5]),
        (7, [0, 1, 2], [3, 4, 5, 6]),
    ],
)
def test_split_keeps_the_newest_half_rounded_up(n: int, summarised: list[int], kept: list[int]) -> None:
    history = numbered(n)
    assert split_history(history) == (0, len(summarised))
    result = HistoryCompactor(ExtractiveSummarizer(), max_tokens=1).apply(history)
    assert result.summarised == len(summarised)
    if summarised:
        assert result.fired
        assert result.history[0]["content"].startswith("[Conversation summary]\n")
        assert list(result.history[1:]) == [history[i] for i in kept]
    else:
        assert not result.fired and list(result.history) == history


def test_tool_row_stays_with_the_assistant_turn_that_called_it() -> None:
    history = [
        msg("user", "find order 7"),
        msg("assistant", "looking it up"),
        msg("tool", "shipped", tool_name="orders", tool_input={"id": 7}),
        msg("tool", "tracking 123", tool_name="tracking", tool_input={"id": 7}),
        msg("user", "thanks"),
        msg("assistant", "you're welcome"),
    ]
    # Without the rule the newest 3 would start at the second tool row.
    assert split_history(history) == (0, 1)
    result = HistoryCompactor(ExtractiveSummarizer(), max_messages=5).apply(history)
    assert list(result.history[1:]) == history[1:]
    assert result.history[1]["role"] == "assistant"


def test_nothing_to_summarise_when_only_a_tool_chain_remains(recorded: list[dict[str, Any]]) -> None:
    history = [msg("assistant", "calling"), msg("tool", "a"), msg("tool", "b"), msg("tool", "c")]
    result = HistoryCompactor(ExtractiveSummarizer(), max_messages=3).apply(history)
    assert (result.fired, result.reason, list(result.history)) == (False, "messages", history)
    assert [event["action"] for event in recorded] == ["nothing to summarise"]


def test_leading_system_message_is_kept_and_never_summarised() -> None:
    history = [msg("system", "You are helpful."), *numbered(5)]
    result = HistoryCompactor(ExtractiveSummarizer(), max_messages=5).apply(history)
    assert result.fired and result.summarised == 2
    assert result.history[0] == history[0]
    assert result.history[1]["role"] == "assistant"
    assert "You are helpful" not in result.history[1]["content"]
    assert list(result.history[2:]) == history[3:]


ROLES = st.sampled_from(["user", "assistant", "tool"])


@given(
    roles=st.lists(ROLES, min_size=1, max_size=30),
    system=st.booleans(),
)
def test_split_properties(roles: list[str], system: bool) -> None:
    history = ([msg("system", "rules")] if system else []) + [msg(r, str(i)) for i, r in enumerate(roles)]
    start, boundary = split_history(history)
    assert start == (1 if system else 0)
    assert start <= boundary <= len(history) - (len(roles) + 1) // 2
    if boundary > start:
        assert history[boundary]["role"] != "tool"
    else:
        assert all(m["role"] == "tool" for m in history[start + 1 : len(history) - (len(roles) + 1) // 2 + 1])


# -- summaries -------------------------------------------------------------------------------------


def test_provider_summarizer_sends_old_messages_and_the_instruction() -> None:
    provider = EchoProvider()
    history = numbered(5)
    result = HistoryCompactor(ProviderSummarizer(provider), max_messages=4).apply(history)
    assert provider.requests == [
        [
            *history[:2],
            {
                "role": "user",
                "content": "Summarise the conversation above in 2\u20133 sentences. Be concise.",
            },
        ]
    ]
    assert result.history[0] == {
        "role": "assistant",
        "content": "[Conversation summary]\necho: Summarise the conversation above in 2\u20133 sentences. "
        "Be concise.",
    }
    assert (result.provider_calls, result.summary.startswith("echo: "), result.error) == (1, True, None)


def test_provider_failure_gives_summary_unavailable(unused_port: int) -> None:
    failing = OpenAICompatibleProvider(f"http://127.0.0.1:{unused_port}/v1", "m", timeout=2)
    with pytest.raises(ProviderError):
        failing.complete([msg("user", "hi")])
    result = HistoryCompactor(ProviderSummarizer(failing), max_messages=2).apply(numbered(3))
    assert result.fired
    assert result.summary == SUMMARY_UNAVAILABLE
    assert result.history[0]["content"] == "[Conversation summary]\n(summary unavailable)"
    assert (result.error, result.provider_calls) == ("ProviderError", 1)
    assert list(result.history[1:]) == numbered(3)[1:]


def test_a_summariser_returning_non_text_counts_as_failure() -> None:
    result = HistoryCompactor(lambda old: None, max_messages=1).apply(numbered(2))
    assert (result.summary, result.error) == (SUMMARY_UNAVAILABLE, "TypeError")


def test_extractive_summarizer_makes_no_network_call(connect_attempts: list[Any], unused_port: int) -> None:
    with pytest.raises(ProviderError):  # the guard is live: it sees and stops a provider
        OpenAICompatibleProvider(f"http://127.0.0.1:{unused_port}", "m").complete([msg("user", "x")])
    assert connect_attempts == [("127.0.0.1", unused_port)]
    connect_attempts.clear()
    history = [
        msg("user", "My parcel to Lyon is late. It was order 7781."),
        msg("assistant", "I am sorry the parcel is late. Let me check order 7781."),
        msg("tool", "carrier says: delayed at depot", tool_name="track", tool_input={"order": 7781}),
        msg("assistant", "The carrier reports the parcel is delayed at the Lyon depot."),
        msg("user", "Can you refund the shipping?"),
        msg("assistant", "Yes, shipping is refunded."),
        msg("user", "Thanks"),
    ]
    compactor = HistoryCompactor(ExtractiveSummarizer(), max_messages=6)
    first = compactor.apply(history)
    again = compactor.apply(history)
    assert first == again
    assert first.provider_calls == 0
    assert first.summary.startswith("user: My parcel to Lyon is late.")
    assert "order 7781" in first.summary
    assert "carrier says" not in first.summary  # tool rows are not sentences of the conversation
    assert connect_attempts == []


def test_extractive_summary_is_bounded() -> None:
    history = [msg("user", "word " * 2000), msg("assistant", ("long sentence here " * 50 + ". ") * 40)]
    summary = ExtractiveSummarizer(max_chars=300, sentence_chars=100)(history)
    assert 0 < len(summary) <= 300
    assert ExtractiveSummarizer()([]) == ""


def test_events_carry_counts_and_no_text(recorded: list[dict[str, Any]]) -> None:
    history = [msg("user", "my card is secret-4111"), *numbered(4)]
    with events.run_context("RUN-C"):
        result = HistoryCompactor(ExtractiveSummarizer(), max_messages=4).apply(history)
    assert [event["event"] for event in recorded] == [
        "context.overflow",
        "compaction.before",
        "compaction.after",
    ]
    after = recorded[-1]
    assert (after["messages_before"], after["messages_after"]) == (5, 4)
    assert after["bytes_before"] == result.bytes_before
    assert after["bytes_after"] == result.bytes_after
    assert all(event["run_id"] == "RUN-C" for event in recorded)
    assert "secret" not in repr(recorded)


def test_result_reports_sizes() -> None:
    history = numbered(6)
    result = HistoryCompactor(ExtractiveSummarizer(), max_messages=5).apply(history)
    assert isinstance(result, CompactionResult)
    assert (result.messages_before, result.messages_after) == (6, 4)
    assert result.bytes_before == sum(len(m["content"]) for m in history)
    assert result.bytes_after == sum(len(m["content"].encode()) for m in result.history)


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_messages"):
        HistoryCompactor(ExtractiveSummarizer(), max_messages=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        HistoryCompactor(ExtractiveSummarizer(), max_tokens=1.5)  # type: ignore[arg-type]


# -- the analysis from sizes: what the dashboard reads instead of every message -------------------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60)
_WORDS = ["parcel", "refund", "late.", "Größe", "日本語", "don't", "ok!\n"]
_WORDY = st.lists(st.sampled_from(_WORDS), max_size=12).map(" ".join)
_TOOL_INPUT = (
    st.none()
    | st.dictionaries(_TEXT, _TEXT | st.integers(), max_size=3).map(
        lambda value: json.dumps(value, ensure_ascii=False)
    )
    | _TEXT.map(lambda text: "not json: " + text)
)


@st.composite
def stored_rows(draw: st.DrawFn, dialect: str) -> list[dict[str, Any]]:
    """Draw message rows as any program may store them: every role, any text, JSON or not."""
    roles = st.sampled_from(["system", "user", "assistant", "tool", "summary", "recall"])
    # Another program may leave a BLOB of any bytes in SQLite's content column.
    content = st.none() | _TEXT | _WORDY | (st.binary(max_size=20) if dialect == "sqlite" else _TEXT)
    count = draw(st.integers(0, 14))
    return [
        {"role": draw(roles), "content": draw(content), "tool_input": draw(_TOOL_INPUT)} for _ in range(count)
    ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_analysis_from_sizes_equals_the_analysis_of_the_whole_history(
    engine: sa.engine.Engine, prefix: str, data: st.DataObject
) -> None:
    rows = data.draw(stored_rows(engine.dialect.name))
    max_messages = data.draw(st.integers(0, len(rows) + 1))
    max_tokens = data.draw(st.integers(0, 60))
    schema, conversation_id, stamp = tables(prefix), new_id(), datetime(2026, 1, 5, 9, 0)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.conversations).values(
                id=conversation_id,
                namespace="default",
                user_id="",
                title=None,
                metadata=None,
                created_at=stamp,
                updated_at=stamp,
            )
        )
        for position, row in enumerate(rows):
            conn.execute(
                sa.insert(schema.messages).values(
                    id=new_id(),
                    conversation_id=conversation_id,
                    tool_name=None,
                    created_at=stamp + timedelta(seconds=position),
                    **row,
                )
            )
    log = ConversationLog(engine, prefix)
    history = log.messages(conversation_id, limit=1000).items
    assert len(history) == len(rows)
    read: list[list[str]] = []

    def read_text(ids: list[str]) -> list[StoredMessage]:
        read.append(ids)
        found = log.messages_with_ids(conversation_id, ids)
        return [found[message_id] for message_id in ids]

    sizes = log.message_sizes(conversation_id)
    expected = analyse(history, max_messages, max_tokens)
    assert analyse_sizes(sizes, max_messages, max_tokens, read_text) == expected
    # Only the text of what would be summarised is read, and only when there is any.
    assert [message_id for ids in read for message_id in ids] == [
        message.id
        for message in history
        if message.id in expected["summarised_ids"] and message.role in ("user", "assistant")
    ]
