"""The Agents SDK adapter's ``remember`` tool (issue 35): ``ClawSession.memory_tools()`` in real
``Runner.run`` turns whose model is a chat-completions server on the loopback. The fact lands
in the subject's namespace attributed to ``agents`` and is recalled in another session of the
same subject; bad arguments, the PII guard and the privacy switch write nothing; an anonymous
session offers no tool."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # nothing may try to export a trace

agents = pytest.importorskip("agents")
openai = pytest.importorskip("openai")

from clawmem.clock import FakeClock  # noqa: E402
from clawmem.integrations.openai_agents import ClawSession  # noqa: E402
from clawmem.memory.sql import SqlMemory  # noqa: E402
from clawmem.settings import Settings  # noqa: E402
from clawmem.sql.engine import create_engine  # noqa: E402
from clawmem.sql.schema import create_tables  # noqa: E402
from clawmem.turn.conversations import ConversationLog  # noqa: E402
from clawmem.turn.guards import PiiGuard  # noqa: E402
from tests.writing import SUBJECT, USER  # noqa: E402

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

pytest_plugins = ["tests.dashboard_fixtures", "tests.loopback"]


def remember(arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    """Return a scripted assistant message calling remember with ``arguments``."""
    from tests.loopback import calls, tool_call

    return calls(tool_call("remember", arguments, call_id))


def _agent(server: LoopbackCompletions, tools: list[Any]) -> Any:
    client = openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model="local-model", openai_client=client)
    return agents.Agent(name="support", instructions="Answer the shop's customers.", model=model, tools=tools)


def _run(session: ClawSession, server: LoopbackCompletions, text: str) -> Any:
    agent = _agent(server, session.memory_tools())
    return asyncio.run(agents.Runner.run(agent, text, session=session, run_config=session.run_config()))


def _tool_results(server: LoopbackCompletions) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for request in server.requests for m in request if m["role"] == "tool"]


def _session(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, name: str, **options: Any
) -> ClawSession:
    memory = SqlMemory(engine, prefix=prefix, clock=clock, max_value_bytes=1024)
    return ClawSession(name, ConversationLog(engine, prefix, clock), user_id=USER, memory=memory, **options)


def test_a_fact_remembered_in_one_session_is_recalled_in_another_of_the_same_subject(
    engine: sa.engine.Engine,
    prefix: str,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    recorded: list[dict[str, Any]],
) -> None:
    first = _session(engine, prefix, clock, "shop-chat/1")
    loopback.script(remember({"key": "favourite_colour", "value": "teal"}), "Teal it is.")

    result = _run(first, loopback, "My favourite colour is teal.")

    assert result.final_output == "Teal it is."
    assert loopback.offered[0] == ["remember"]
    assert _tool_results(loopback) == [{"stored": True, "key": "favourite_colour"}]
    row = first.memory.entry(SUBJECT, "favourite_colour")  # type: ignore[union-attr]
    assert row is not None and row.value == "teal"
    searched = next(e for e in recorded if e["event"] == "memory.search")
    assert row.metadata == {
        "origin": "agents",
        "conversation_id": first.conversation_id,
        "message_id": None,
        "run_id": searched["run_id"],  # the run whose turn recalled memory for this message
        "written_at": "2023-11-14T22:13:20.250000+00:00",
    }
    stored = ConversationLog(engine, prefix, clock).messages(first.conversation_id).items
    # The SDK stored the call and its output as tool rows of the session's conversation.
    assert [(m.role, m.tool_name) for m in stored if m.role == "tool"] == [
        ("tool", "remember"),
        ("tool", None),
    ]
    call_row = next(m for m in stored if m.tool_name == "remember")
    assert call_row.metadata["wrote"] == {"namespace": SUBJECT, "key": "favourite_colour"}

    clock.advance(60)
    second = _session(engine, prefix, clock, "shop-chat/2")
    _run(second, loopback, "Which colour should my new bike be?")

    asked = loopback.requests[-1][-1]["content"]
    assert "- favourite_colour: teal" in asked
    assert second.conversation_id != first.conversation_id


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("{not json", "bad arguments: the arguments are not valid JSON"),
        ({"key": "colour", "value": 42}, "value must be text (a string), got int"),
        ({"key": "", "value": "teal"}, "bad key: key must not be empty"),
        ({"key": "colour"}, "remember needs a value: the fact, as text"),
        ({"key": "colour", "value": "teal", "ttl": 60}, "remember takes only key and value, not 'ttl'"),
        ({"key": "colour", "value": "x" * 2000}, "over the limit of 1024 bytes"),
    ],
)
def test_bad_arguments_tell_the_model_and_write_nothing(
    lite: sa.engine.Engine,
    prefix: str,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    arguments: Any,
    error: str,
) -> None:
    session = _session(lite, prefix, clock, "shop-chat/bad")
    loopback.script(remember(arguments), "Sorry, I could not store that.")

    result = _run(session, loopback, "Remember my colour.")

    assert result.final_output == "Sorry, I could not store that."
    (told,) = _tool_results(loopback)
    assert told["stored"] is False and error in told["error"] and "nothing was written" in told["error"]
    assert session.memory.all(SUBJECT) == {}  # type: ignore[union-attr]


def test_the_pii_guard_blocks_or_redacts_what_the_tool_would_store(
    lite: sa.engine.Engine, prefix: str, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    said = {"key": "contact", "value": "write to ana@example.com"}
    blocking = _session(lite, prefix, clock, "shop-chat/block", guards=[PiiGuard("block")])
    loopback.script(remember(said), "I cannot keep that.")
    _run(blocking, loopback, "Keep my mail address, please.")
    assert "personal data (email)" in _tool_results(loopback)[0]["error"]
    assert blocking.memory.all(SUBJECT) == {}  # type: ignore[union-attr]

    redacting = _session(lite, prefix, clock, "shop-chat/redact", guards=[PiiGuard("redact")])
    loopback.script(remember(said, "call_2"), "Kept, without the address.")
    _run(redacting, loopback, "Keep my mail address, please.")
    assert redacting.memory.get("contact", SUBJECT) == "write to [email]"  # type: ignore[union-attr]
    assert "ana@example.com" not in json.dumps(redacting.memory.all(SUBJECT))  # type: ignore[union-attr]


def test_with_storage_off_the_tool_is_refused_and_nothing_is_written(
    tmp_path: Path, prefix: str, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    url = f"sqlite:///{tmp_path / 'off.db'}"
    engine = create_engine(url)
    create_tables(engine, prefix)
    settings = Settings(
        instance_path=str(tmp_path), database_url=url, table_prefix=prefix, store_messages=False
    )
    session = ClawSession.from_settings("shop-chat/off", settings, user_id=USER)
    loopback.script(remember({"key": "colour", "value": "teal"}), "Understood.")

    _run(session, loopback, "My colour is teal.")

    (told,) = _tool_results(loopback)
    assert told["stored"] is False and "privacy switch" in told["error"]
    assert SqlMemory(engine, prefix=prefix, clock=clock).all(SUBJECT) == {}
    engine.dispose()


def test_an_anonymous_session_offers_no_tool(lite: sa.engine.Engine, prefix: str, clock: FakeClock) -> None:
    memory = SqlMemory(lite, prefix=prefix, clock=clock)
    anonymous = ClawSession("shop-chat/anon", ConversationLog(lite, prefix, clock), memory=memory)
    assert anonymous.memory_tools() == []
    # The one tool a subject's session offers writes; none deletes or expires anything.
    named = ClawSession("shop-chat/named", ConversationLog(lite, prefix, clock), user_id=USER, memory=memory)
    (tool,) = named.memory_tools()
    assert tool.name == "remember" and set(tool.params_json_schema["properties"]) == {"key", "value"}
    bare = ClawSession("shop-chat/bare", ConversationLog(lite, prefix, clock), user_id=USER)
    with pytest.raises(ValueError, match="a session without memory cannot offer remember"):
        bare.memory_tools()


def test_the_conversation_page_links_the_entry_a_call_wrote(
    app: Any, signed_in: Any, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from dashboard import state
    from tests.dashboard_helpers import page_text

    with app.app_context():
        settings = state.settings()
    session = ClawSession.from_settings("shop-chat/page", settings, user_id=USER)
    loopback.script(
        remember({"key": "favourite_colour", "value": "teal"}),
        remember({"key": "", "value": "nothing"}, "call_2"),
        "Teal it is.",
    )
    _run(session, loopback, "My favourite colour is teal.")

    body = " ".join(page_text(signed_in.get(f"/conversations/{session.conversation_id}")).split())
    assert body.count("Memory this call wrote:") == 1  # the refused call wrote nothing
    assert (
        'Memory this call wrote: <a href="/memory/user:ana-7/entry?key=favourite_colour">'
        "<code>favourite_colour</code></a>" in body
    )


def test_erasing_the_subject_takes_what_the_session_remembered(
    tmp_path: Path, prefix: str, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from clawmem.privacy import erasure
    from clawmem.privacy.subjects import Subject
    from clawmem.sites import operations
    from clawmem.sites.site import Site

    url = f"sqlite:///{tmp_path / 'erase.db'}"
    settings = Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix)
    site = Site(settings, clock)
    operations.init_db(site)
    session = ClawSession.from_settings("shop-chat/erase", settings, user_id=USER)
    loopback.script(remember({"key": "favourite_colour", "value": "teal"}), "Noted.")
    _run(session, loopback, "My favourite colour is teal.")
    assert session.memory.get("favourite_colour", SUBJECT) == "teal"  # type: ignore[union-attr]

    erasure.erase_subject(site, Subject(user_id=USER))

    assert session.memory.all(SUBJECT) == {}  # type: ignore[union-attr]
    assert session.conversations.get(session.conversation_id) is None
