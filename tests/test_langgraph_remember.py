"""LangGraph's ``remember`` tool over ``ClawStore`` (issue 35), run as a graph runs it: a
``ToolNode`` of a compiled ``StateGraph`` answering an ``AIMessage``'s tool calls. The fact
lands in the subject's namespace attributed to ``langgraph`` and a clawmem turn of the same
subject recalls it over real HTTP; bad arguments, the PII guard, the privacy switch and a run
without a user write nothing and are error results; an anonymous user gets no tool."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402

from clawmem.clock import FakeClock  # noqa: E402
from clawmem.integrations.langgraph import ClawStore  # noqa: E402
from clawmem.memory.sql import SqlMemory  # noqa: E402
from clawmem.settings import Settings  # noqa: E402
from clawmem.sql.engine import create_engine  # noqa: E402
from clawmem.sql.schema import create_tables  # noqa: E402
from clawmem.turn.guards import PiiGuard  # noqa: E402
from tests.writing import SUBJECT, USER, make_claw  # noqa: E402

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

pytest_plugins = ["tests.dashboard_fixtures", "tests.loopback"]

THREAD = {"configurable": {"user_id": USER, "thread_id": "support-thread-9"}}


def _graph(tools: list[Any], store: ClawStore) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile(store=store)


def _call(store: ClawStore, arguments: Any, config: Any = THREAD, **options: Any) -> ToolMessage:
    """Run the model's one ``remember`` call through the graph; return the tool's message."""
    asked = AIMessage(
        content="", tool_calls=[{"name": "remember", "args": arguments, "id": "call_1", "type": "tool_call"}]
    )
    (tool,) = store.memory_tools(**options)
    answered = _graph([tool], store).invoke({"messages": [asked]}, config=config)["messages"][-1]
    assert isinstance(answered, ToolMessage) and answered.tool_call_id == "call_1"
    return answered


def _store(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> ClawStore:
    return ClawStore(SqlMemory(engine, prefix=prefix, clock=clock, max_value_bytes=1024), clock=clock)


def test_a_fact_a_graph_remembers_is_recalled_by_a_turn_of_the_same_subject(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    store = _store(engine, prefix, clock)

    answered = _call(store, {"key": "favourite_colour", "value": "teal"})

    assert answered.status == "success"
    assert answered.content == '{"stored": true, "key": "favourite_colour"}'
    row = store.memory.entry(SUBJECT, "favourite_colour")  # type: ignore[attr-defined]
    assert row is not None and row.value == "teal"
    assert len(row.metadata.pop("run_id")) == 26
    assert row.metadata == {
        "origin": "langgraph",
        "conversation_id": None,
        "message_id": None,
        "thread_id": "support-thread-9",
        "written_at": "2023-11-14T22:13:20.250000+00:00",
    }
    # The subject's own fact, not a LangGraph item: the store's search does not list it.
    assert store.search(("users", USER)) == []

    claw = make_claw(engine, prefix, tmp_path, clock, loopback, memory_writes="off")
    claw.send("Which colour should my new bike be?", user_id=USER)
    assert "- favourite_colour: teal" in loopback.requests[-1][-1]["content"]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"key": "colour", "value": 42}, "value must be text (a string), got int"),
        ({"key": "", "value": "teal"}, "bad key: key must not be empty"),
        ({"value": "teal"}, "remember needs a key"),
        ({"key": "colour"}, "remember needs a value"),
        ({"key": "colour", "value": "   "}, "value must not be blank"),
        ({"key": "colour", "value": "teal", "ttl": 60}, "remember takes only key and value, not 'ttl'"),
        ({"key": "colour", "value": "x" * 2000}, "over the limit of 1024 bytes"),
    ],
)
def test_bad_arguments_are_an_error_result_and_write_nothing(
    lite: sa.engine.Engine, prefix: str, clock: FakeClock, arguments: Any, error: str
) -> None:
    store = _store(lite, prefix, clock)

    answered = _call(store, arguments)

    assert answered.status == "error"
    assert error in answered.content and "nothing was written" in answered.content
    assert store.memory.all(SUBJECT) == {}


def test_the_pii_guard_blocks_or_redacts_and_a_bound_user_needs_no_config(
    lite: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    store = _store(lite, prefix, clock)
    said = {"key": "contact", "value": "write to ana@example.com"}

    blocked = _call(store, said)  # the default guard blocks, as a turn's does
    assert blocked.status == "error" and "personal data (email)" in blocked.content
    assert store.memory.all(SUBJECT) == {}

    redacted = _call(store, said, config={}, user_id=USER, guards=[PiiGuard("redact")])
    assert redacted.status == "success"
    assert store.memory.get("contact", SUBJECT) == "write to [email]"


def test_a_run_without_a_user_is_refused_and_an_anonymous_user_gets_no_tool(
    lite: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    store = _store(lite, prefix, clock)
    assert store.memory_tools(user_id="") == []
    # The one tool writes; none deletes or expires anything.
    (tool,) = store.memory_tools()
    assert (
        tool.name == "remember" and set(tool.args["key"]) >= {"type"} and set(tool.args) == {"key", "value"}
    )
    with pytest.raises(TypeError, match="user_id must be a str or None, got int"):
        store.memory_tools(user_id=7)  # type: ignore[arg-type]

    answered = _call(store, {"key": "colour", "value": "teal"}, config={})

    assert answered.status == "error" and "this run has no user id" in answered.content
    assert store.memory.namespaces() == []  # type: ignore[attr-defined]


def test_with_storage_off_the_tool_is_refused_and_nothing_is_written(
    tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    url = f"sqlite:///{tmp_path / 'off.db'}"
    engine = create_engine(url)
    create_tables(engine, prefix)
    settings = Settings(
        instance_path=str(tmp_path), database_url=url, table_prefix=prefix, store_messages=False
    )
    store = ClawStore.from_settings(settings, clock)

    answered = _call(store, {"key": "colour", "value": "teal"})

    assert answered.status == "error" and "privacy switch" in answered.content
    assert SqlMemory(engine, prefix=prefix, clock=clock).all(SUBJECT) == {}
    engine.dispose()


def test_the_subject_page_says_which_adapter_wrote_each_entry(
    app: Any, signed_in: Any, clock: FakeClock
) -> None:
    from dashboard import state
    from tests.dashboard_helpers import page_text

    with app.app_context():
        settings = state.settings()
    store = ClawStore.from_settings(settings, clock)
    _call(store, {"key": "favourite_colour", "value": "teal"})
    agents_attributed = {"origin": "agents", "conversation_id": None, "message_id": None, "run_id": None}
    store.memory.set("city", "Lisbon", SUBJECT, metadata={**agents_attributed, "written_at": None})  # type: ignore[call-arg]

    body = " ".join(page_text(signed_in.get(f"/subjects/{USER}")).split())
    assert (
        '<code>favourite_colour</code></a> <span class="tag origin">'
        "written by LangGraph&#39;s remember</span>" in body
    )
    assert (
        '<code>city</code></a> <span class="tag origin">written by the Agents SDK&#39;s remember</span>'
        in body
    )
