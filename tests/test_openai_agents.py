"""ClawSession, the OpenAI Agents SDK session (issue 19): the Session protocol over the
conversation log on every SQL backend, session ids, the privacy switch, deletion events, bad
input, and the SDK's own SQLiteSession as the reference a random history must agree with."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # nothing may try to export a trace

agents = pytest.importorskip("agents")
from agents.memory import SQLiteSession  # noqa: E402

from clawmem import events  # noqa: E402
from clawmem.errors import ValueTooLarge  # noqa: E402
from clawmem.integrations import aio  # noqa: E402
from clawmem.integrations.openai_agents import (  # noqa: E402
    ITEM_KEY,
    SESSION_ID_KEY,
    ClawSession,
    conversation_id_for,
)
from clawmem.turn.conversations import ConversationLog, Message  # noqa: E402
from tests.conftest import Run  # noqa: E402

USER = {"role": "user", "content": "Where is my order 1234?"}
ASSISTANT = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "It ships today.", "annotations": [], "logprobs": []}],
}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "track_order",
    "arguments": '{"order": 1234}',
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "in transit"}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
ITEMS = [USER, REASONING, CALL, OUTPUT, ASSISTANT]


@pytest.fixture
def log(engine: Any, prefix: str, clock: Any) -> ConversationLog:
    """The conversation log of this test's tables on each SQL backend."""
    return ConversationLog(engine, prefix, clock)


def test_it_is_an_agents_sdk_session() -> None:
    session = ClawSession("s1", ConversationLog.__new__(ConversationLog))
    assert isinstance(session, agents.memory.Session)
    assert session.session_id == "s1"
    assert session.session_settings == agents.memory.SessionSettings()


def test_phpclaws_tables_are_refused_since_they_cannot_keep_an_item() -> None:
    log = ConversationLog.__new__(ConversationLog)
    log.shape = "phpclaw-wordpress"
    with pytest.raises(ValueError, match="no column for: use a database of the clawmem schema"):
        ClawSession("s1", log)


def test_import_clawmem_never_imports_the_sdk_and_without_it_one_line_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "import clawmem, clawmem.integrations.openai_agents as oa\n"
        "assert 'agents' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    oa.ClawSession('s', None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == (
        "the openai-agents integration needs the agents package, which is not installed: "
        "pip install 'clawmem[openai-agents]'\n"
    )


def test_every_item_is_one_stored_message_and_comes_back_equal(run: Run, log: ConversationLog) -> None:
    session = ClawSession("order-chat", log, user_id="cust-7")
    run(session.add_items(ITEMS))
    assert run(session.get_items()) == ITEMS
    assert run(session.get_items(limit=2)) == [OUTPUT, ASSISTANT]
    assert run(session.get_items(limit=0)) == []
    assert run(session.get_items(limit=99)) == ITEMS
    stored = log.load("order-chat")
    assert stored is not None and stored.user_id == "cust-7" and stored.title == USER["content"]
    assert stored.metadata == {SESSION_ID_KEY: "order-chat"}
    rows = [(m.role, m.content, m.tool_name, m.tool_input) for m in stored.messages]
    assert rows == [
        ("user", "Where is my order 1234?", None, None),
        ("assistant", None, None, None),  # reasoning: kept, nothing said
        ("tool", None, "track_order", {"order": 1234}),
        ("tool", "in transit", None, None),
        ("assistant", "It ships today.", None, None),
    ]
    assert [m.metadata[ITEM_KEY] for m in stored.messages] == ITEMS
    # Search sees what was said.
    assert [c.id for c in log.list(query="ships today").items] == ["order-chat"]


def test_recall_and_summary_rows_are_never_items_and_plain_rows_become_messages(
    run: Run,
    log: ConversationLog,
) -> None:
    log.append("mixed", [Message("recall", "[]"), Message("user", "hi"), Message("summary", "older")])
    session = ClawSession("mixed", log)
    run(session.add_items([ASSISTANT]))
    assert run(session.get_items()) == [{"role": "user", "content": "hi"}, ASSISTANT]
    assert run(session.get_items(limit=1)) == [ASSISTANT]


def test_pop_item_removes_the_newest_item_and_clear_session_the_conversation_with_events(
    run: Run, log: ConversationLog, recorded: list[dict[str, Any]]
) -> None:
    session = ClawSession("to-pop", log)
    run(session.add_items(ITEMS))
    log.append("to-pop", [Message("summary", "checkpoint")])  # not an item: never popped
    recorded.clear()
    assert run(session.pop_item()) == ASSISTANT
    assert run(session.get_items()) == ITEMS[:-1]
    forgets = [event for event in recorded if event["event"] == "memory.forget"]
    assert len(forgets) == 1 and forgets[0]["run_id"] is not None
    assert {k: forgets[0][k] for k in ("key", "namespace", "conversations", "messages")} == {
        "key": "to-pop",
        "namespace": "default",
        "conversations": 0,
        "messages": 1,
    }
    recorded.clear()
    run(session.clear_session())
    assert log.load("to-pop") is None
    assert run(session.get_items()) == [] and run(session.pop_item()) is None
    forgets = [event for event in recorded if event["event"] == "memory.forget"]
    assert [(e["key"], e["conversations"], e["messages"]) for e in forgets] == [("to-pop", 1, 5)]
    assert forgets[0]["run_id"] is not None
    # The CLI's forget --conversation deletes through the same call, so it emits the same event.
    log.append("by-cli", [Message("user", "x")])
    recorded.clear()
    assert log.delete("by-cli") == (1, 1)
    assert [e["event"] for e in recorded] == ["memory.forget"]


def test_popping_a_user_message_takes_its_recall_record_with_it(run: Run, log: ConversationLog) -> None:
    log.append("turned", [Message("recall", "[]"), Message("user", "hello")])
    session = ClawSession("turned", log)
    assert run(session.pop_item()) == {"role": "user", "content": "hello"}
    stored = log.load("turned")
    assert stored is not None and stored.messages == ()


def test_a_session_id_that_is_no_conversation_id_maps_to_a_stable_one_of_its_own(
    run: Run,
    log: ConversationLog,
) -> None:
    session_id = str(uuid.UUID(int=42))  # 36 characters
    mapped = conversation_id_for(session_id)
    assert len(mapped) == 26 and mapped == conversation_id_for(session_id)
    assert conversation_id_for("a" * 27) != conversation_id_for("a" * 28)
    run(ClawSession(session_id, log).add_items([USER]))
    stored = log.load(mapped)
    assert stored is not None and stored.metadata == {SESSION_ID_KEY: session_id}
    assert run(ClawSession(session_id, log).get_items()) == [USER]
    # A session id equal to that conversation id must not share it, and nothing is written.
    squatter = ClawSession(mapped, log)
    with pytest.raises(ValueError, match="belongs to session"):
        run(squatter.add_items([ASSISTANT]))
    with pytest.raises(ValueError, match="belongs to session"):
        run(squatter.get_items())
    assert run(ClawSession(session_id, log).get_items()) == [USER]


def test_a_mapped_id_never_takes_over_a_conversation_another_writer_made(
    run: Run, log: ConversationLog
) -> None:
    session_id = "free form: ticket #9"
    log.append(conversation_id_for(session_id), [Message("user", "someone else's")])
    with pytest.raises(ValueError, match="belongs to another writer"):
        run(ClawSession(session_id, log).add_items([USER]))
    # A valid conversation id opens a conversation Claw.send made: the same thing, continued.
    log.append("claw-made", [Message("user", "hi")])
    run(ClawSession("claw-made", log).add_items([ASSISTANT]))
    assert run(ClawSession("claw-made", log).get_items()) == [{"role": "user", "content": "hi"}, ASSISTANT]


@pytest.mark.parametrize(
    ("session_id", "error"),
    [
        (42, TypeError),
        ("", ValueError),
        ("x" * 1001, ValueError),
        ("a\x00b", ValueError),
        ("\ud800", ValueError),
    ],
)
def test_a_bad_session_id_is_refused_at_once(session_id: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="session_id"):
        ClawSession(session_id, ConversationLog.__new__(ConversationLog))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"role": "user", "content": object()}, TypeError, "object"),
        ({"role": "user", "content": float("nan")}, ValueError, "item 1' holds nan .* only finite numbers"),
        ("just text", TypeError, "item 1 must be a dict"),
        ({"role": "user", "content": "x" * 5000}, ValueTooLarge, "over the limit of 4096 bytes"),
    ],
)
def test_a_bad_item_is_refused_and_nothing_of_its_batch_is_written(
    run: Run, engine: Any, prefix: str, clock: Any, bad: Any, error: type[Exception], match: str
) -> None:
    log = ConversationLog(engine, prefix, clock, max_value_bytes=4096)
    session = ClawSession("strict", log)
    with pytest.raises(error, match=match):
        run(session.add_items([USER, bad]))
    with pytest.raises(TypeError, match="items must be a list"):
        run(session.add_items(USER))  # type: ignore[arg-type]
    assert log.load("strict") is None and log.counts() == {"conversations": 0, "messages": 0}


def test_with_the_privacy_switch_off_new_items_are_not_stored(
    run: Run, engine: Any, prefix: str, clock: Any, recorded: list[dict[str, Any]]
) -> None:
    ConversationLog(engine, prefix, clock).append("private", [Message("user", "before")])
    session = ClawSession("private", ConversationLog(engine, prefix, clock, store_messages=False))
    run(session.add_items([ASSISTANT]))
    assert run(session.get_items()) == [{"role": "user", "content": "before"}]
    saved = [e for e in recorded if e["event"] == "conversation.saved"]
    assert [e["gated"] for e in saved] == [False, True]


# -- the SDK's own SQLiteSession as the reference ----------------------------------------------

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
item = st.one_of(
    st.builds(
        lambda role, content: {"role": role, "content": content},
        st.sampled_from(["user", "assistant", "system", "developer"]),
        text,
    ),
    st.builds(
        lambda name, call: {"type": "function_call", "call_id": call, "name": name, "arguments": "{}"},
        text,
        text,
    ),
    st.builds(
        lambda call, output: {"type": "function_call_output", "call_id": call, "output": output}, text, text
    ),
    st.fixed_dictionaries({"type": st.just("reasoning"), "id": text, "summary": st.just([])}),
)
operation = st.one_of(
    st.tuples(st.just("add"), st.lists(item, max_size=4)),
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(-1, 6))),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("clear"), st.none()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(operation, max_size=12))
@pytest.mark.slow
def test_random_histories_agree_with_the_sdks_sqlite_session(
    run: Run, log: ConversationLog, operations: list[tuple[str, Any]]
) -> None:
    session_id = f"differential {uuid.uuid4()}"  # a free-form id: the mapped path
    ours, reference = ClawSession(session_id, log), SQLiteSession(session_id)

    async def both(name: str, argument: Any) -> tuple[Any, Any]:
        if name == "add":
            return await ours.add_items(argument), await reference.add_items(argument)
        if name == "get":
            return await ours.get_items(argument), await reference.get_items(argument)
        if name == "pop":
            return await ours.pop_item(), await reference.pop_item()
        return await ours.clear_session(), await reference.clear_session()

    async def replay() -> None:
        for name, argument in operations:
            mine, theirs = await both(name, argument)
            assert mine == theirs, (name, argument)
        assert await ours.get_items() == await reference.get_items()

    try:
        run(replay())
    finally:
        reference.close()


def test_on_a_server_database_the_async_path_runs_on_the_loops_thread(
    run: Run, log: ConversationLog, sql_backend: str
) -> None:
    threads: list[int] = []

    def seen(event: dict[str, Any]) -> None:
        threads.append(threading.get_ident())

    async def turn() -> tuple[int, list[Any]]:
        session = ClawSession("threads", log)
        await session.add_items([USER])
        return threading.get_ident(), await session.get_items()

    events.on("conversation.saved", seen)
    try:
        loop_thread, items = run(turn())
    finally:
        events.off("conversation.saved", seen)
    assert items == [USER] and len(threads) == 1
    on_loop = sql_backend != "sqlite" and not aio.hopping()
    assert (threads[0] == loop_thread) is on_loop
