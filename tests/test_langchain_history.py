"""ClawChatMessageHistory on SQLite, MariaDB and PostgreSQL: messages round-trip equal, each is
one ordinary row an operator sees, and bad input is refused whole."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

from clawmem.clock import FakeClock
from clawmem.ids import new_id
from clawmem.integrations.langchain import ClawChatMessageHistory
from clawmem.turn.conversations import ConversationLog

CHAT = [
    SystemMessage("You are the shop's support agent."),
    HumanMessage("Where is order 1234?", id="h-1"),
    AIMessage(
        "",
        tool_calls=[
            {"name": "orders", "args": {"order": 1234}, "id": "call-1", "type": "tool_call"},
            {"name": "couriers", "args": {"region": "Leeds"}, "id": "call-2", "type": "tool_call"},
        ],
        response_metadata={"model_name": "m-1", "finish_reason": "tool_calls"},
        usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
    ),
    ToolMessage("shipped on Monday", tool_call_id="call-1", name="orders"),
    ToolMessage('{"courier": "DPD"}', tool_call_id="call-2", name="couriers", artifact={"raw": [1, 2]}),
    AIMessage([{"type": "text", "text": "It shipped on Monday with DPD."}], additional_kwargs={"x": 1}),
]


@pytest.fixture
def log(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> ConversationLog:
    return ConversationLog(engine, prefix, clock=clock, max_value_bytes=4000)


def test_every_kind_of_message_round_trips_equal_across_processes(log: ConversationLog) -> None:
    conversation_id = new_id()
    history = ClawChatMessageHistory(log, conversation_id, user_id="cust-1001")
    history.add_messages(CHAT[:3])
    history.add_messages(CHAT[3:])
    assert history.messages == CHAT
    again = ClawChatMessageHistory(ConversationLog(log.engine, log.prefix), conversation_id)
    assert again.messages == CHAT


def test_each_message_is_a_row_of_its_role_with_its_text(log: ConversationLog) -> None:
    conversation_id = new_id()
    ClawChatMessageHistory(log, conversation_id, user_id="cust-1001").add_messages(CHAT)
    rows = log.messages(conversation_id).items
    assert [row.role for row in rows] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert rows[1].content == "Where is order 1234?"
    assert rows[5].content == "It shipped on Monday with DPD."
    assert rows[2].tool_input == [
        {"name": "orders", "args": {"order": 1234}},
        {"name": "couriers", "args": {"region": "Leeds"}},
    ]
    assert (rows[3].tool_name, rows[3].content) == ("orders", "shipped on Monday")
    assert log.get(conversation_id).user_id == "cust-1001"


def test_rows_written_by_clawmems_own_turns_read_as_messages(log: ConversationLog) -> None:
    conversation_id = new_id()
    log.append(
        conversation_id,
        [
            {"role": "recall", "content": "[]"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": None, "tool_name": "orders", "tool_input": {"n": 1}},
            {"role": "tool", "content": "shipped", "tool_name": "orders"},
            {"role": "assistant", "content": "It shipped."},
        ],
    )
    messages = ClawChatMessageHistory(log, conversation_id).messages
    assert [type(m).__name__ for m in messages] == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert [m.text for m in messages] == ["hello", "", "shipped", "It shipped."]
    assert messages[1].tool_calls[0]["name"] == "orders" and messages[1].tool_calls[0]["args"] == {"n": 1}


def test_clear_deletes_the_conversation(log: ConversationLog) -> None:
    conversation_id = new_id()
    history = ClawChatMessageHistory(log, conversation_id)
    history.add_messages(CHAT)
    history.clear()
    assert history.messages == [] and log.get(conversation_id) is None


def test_with_the_privacy_switch_off_nothing_new_is_stored(engine: sa.engine.Engine, prefix: str) -> None:
    conversation_id = new_id()
    ClawChatMessageHistory(ConversationLog(engine, prefix), conversation_id).add_messages(CHAT[:2])
    private = ClawChatMessageHistory(ConversationLog(engine, prefix, store_messages=False), conversation_id)
    private.add_messages(CHAT[2:])
    assert private.messages == CHAT[:2]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (ChatMessage("a critic's note", role="critic"), TypeError),
        ("a plain string", TypeError),
        (HumanMessage("x" * 5000), ValueError),
        (HumanMessage("a NUL \x00 inside"), ValueError),
        (HumanMessage("a lone surrogate \ud800"), ValueError),
    ],
)
def test_a_bad_message_refuses_the_whole_batch(
    log: ConversationLog, bad: Any, error: type[Exception]
) -> None:
    conversation_id = new_id()
    with pytest.raises(error):
        ClawChatMessageHistory(log, conversation_id).add_messages([HumanMessage("fine"), bad])
    assert log.get(conversation_id) is None


@pytest.mark.parametrize("bad_id", ["", "has space", "x" * 27, "5f0c2d1e-8a9b-4c3d-9e8f-7a6b5c4d3e2f"])
def test_a_conversation_id_clawmem_cannot_hold_is_refused(log: ConversationLog, bad_id: str) -> None:
    with pytest.raises(ValueError):
        ClawChatMessageHistory(log, bad_id)


TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
MESSAGES = st.one_of(
    st.builds(HumanMessage, TEXT),
    st.builds(SystemMessage, TEXT),
    st.builds(AIMessage, TEXT),
    st.builds(lambda text, name: ToolMessage(text, tool_call_id="c-1", name=name), TEXT, st.none() | TEXT),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(MESSAGES, max_size=4) | st.just("clear"), max_size=5))
def test_random_additions_and_clears_agree_with_a_list(log: ConversationLog, batches: list[Any]) -> None:
    history = ClawChatMessageHistory(log, new_id())
    model: list[Any] = []
    for batch in batches:
        if batch == "clear":
            history.clear()
            model.clear()
        else:
            history.add_messages(batch)
            model.extend(batch)
        assert history.messages == model


class HeldLog(ConversationLog):
    """Reads wait until the test lets them go, as a slow database would."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()

    def messages(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        if not self.release.wait(10):
            raise TimeoutError("the event loop never ran the releasing coroutine")
        return super().messages(*args, **kwargs)


def test_async_reads_leave_the_event_loop_free(engine: sa.engine.Engine, prefix: str) -> None:
    log = HeldLog(engine, prefix)
    history = ClawChatMessageHistory(log, new_id())

    async def main() -> list[Any]:
        reading = asyncio.create_task(history.aget_messages())
        while not log.entered.is_set():
            await asyncio.sleep(0)  # this coroutine keeps running while the read is held
        log.release.set()
        return await reading

    assert asyncio.run(main()) == []
