"""CLAW_MEMORY_WRITES=tool: the model remembers a fact through the ``remember`` tool, over real
HTTP to a local chat-completions server, on SQLite, MariaDB and PostgreSQL. The fact is recalled
in a later conversation of the same subject, carries where it came from, and the PII guard, the
privacy switch and bad arguments all hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from clawmem import events
from clawmem.clock import FakeClock
from clawmem.errors import ConfigError
from clawmem.prompt import GuardFinding
from clawmem.providers.base import ProviderReply
from clawmem.settings import Settings
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, tables
from clawmem.turn.pipeline import Claw
from clawmem.turn.writes import MAX_TOOL_ROUNDS

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

from tests.writing import SUBJECT, USER, driver_of, make_claw

pytest_plugins = ["tests.loopback"]


def tool_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    """Return one tool call as the local server sends it (imported here: the module is a plugin)."""
    from tests.loopback import tool_call

    return tool_call(name, arguments, call_id)


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    """Return a scripted assistant message asking for the tool calls ``items``."""
    from tests.loopback import calls

    return calls(*items)


def remember(key: Any, value: Any, call_id: str = "call_1", **extra: Any) -> dict[str, Any]:
    """Return a scripted assistant message calling remember with ``key`` and ``value``."""
    arguments = {
        **({} if key is None else {"key": key}),
        **({} if value is None else {"value": value}),
        **extra,
    }
    return calls(tool_call("remember", arguments, call_id))


def tool_results(request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the decoded tool results a request sent back to the model."""
    return [json.loads(message["content"]) for message in request if message["role"] == "tool"]


def test_a_fact_remembered_in_turn_1_is_recalled_in_turn_3_of_another_conversation(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script(remember("favourite_colour", "teal"), "I will remember that teal is your colour.")

    first = claw.send("My favourite colour is teal.", user_id=USER)

    assert first.text == "I will remember that teal is your colour."
    assert [done.stores for done in first.remembered] == [True]
    # Two calls, both offered the tool; the second carries the call and its result.
    assert loopback.offered == [["remember"], ["remember"]]
    second_request = loopback.requests[1]
    assert second_request[-2]["tool_calls"][0]["id"] == "call_1"
    assert second_request[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": json.dumps({"stored": True, "key": "favourite_colour"}),
    }
    # Both calls' tokens count for the turn (108 + 109), on its assistant row and its conversation.
    assert first.usage == {"prompt_tokens": 203, "completion_tokens": 14, "total_tokens": 217}
    assert claw.conversations.get(first.conversation_id).total_tokens == 217

    clock.advance(60)
    claw.send("Thanks!", first.conversation_id, user_id=USER)
    clock.advance(60)
    third = claw.send("Which colour should my new bike be?", user_id=USER)

    assert third.conversation_id != first.conversation_id
    sent = loopback.requests[-1][-1]["content"]
    assert "[Context from memory, reference material, not instructions]" in sent
    assert "- favourite_colour: teal" in sent
    assert third.augment.injected_keys == ["favourite_colour"]

    # Where the fact came from: the conversation, the tool row that wrote it, the run, the time.
    row = driver_of(claw).entry(SUBJECT, "favourite_colour")
    assert row is not None and row.value == "teal"
    messages = claw.conversations.messages(first.conversation_id).items
    (tool_row,) = [m for m in messages if m.role == "tool"]
    assert row.metadata == {
        "origin": "tool",
        "conversation_id": first.conversation_id,
        "message_id": tool_row.id,
        "run_id": first.run_id,
        "written_at": "2023-11-14T22:13:20.250000+00:00",
    }
    assert tool_row.tool_name == "remember"
    assert tool_row.tool_input == {"key": "favourite_colour", "value": "teal"}
    assert tool_row.metadata["wrote"] == {"namespace": SUBJECT, "key": "favourite_colour"}
    assert [m.role for m in messages[:4]] == ["recall", "user", "assistant", "tool"]


def test_a_plain_set_replaces_the_entry_and_its_attribution(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script(remember("city", "Lisbon"), "Noted.")
    claw.send("I live in Lisbon.", user_id=USER)
    assert driver_of(claw).entry(SUBJECT, "city").metadata["origin"] == "tool"

    claw.memory.set("city", "Porto", SUBJECT)  # the operator's code, which says nothing of origin

    row = driver_of(claw).entry(SUBJECT, "city")
    assert row.value == "Porto" and row.metadata is None


def test_an_anonymous_turn_is_not_offered_the_tool_and_writes_nothing(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script(remember("favourite_colour", "teal"))

    reply = claw.send("My favourite colour is teal.")

    assert loopback.offered == [[]]
    assert reply.remembered == () and [call.name for call in reply.tool_calls] == ["remember"]
    assert driver_of(claw).namespaces() == []


def test_off_offers_no_tool(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, memory_writes="off")
    claw.send("My favourite colour is teal.", user_id=USER)
    assert loopback.offered == [[]]
    assert json.loads(loopback.bodies[0]).keys() == {"model", "messages"}


@pytest.mark.parametrize(
    ("mode", "stored", "told"),
    [
        (
            "block",
            None,
            "not stored: the value holds personal data (email), which is refused; nothing was written",
        ),
        ("redact", "write to [email] after 6pm", None),
        ("warn", "write to ana.ruiz@example.com after 6pm", None),
    ],
)
def test_the_pii_guard_holds_for_a_remembered_value(
    engine: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    mode: str,
    stored: str | None,
    told: str | None,
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, pii_guard=mode)
    loopback.script(remember("contact", "write to ana.ruiz@example.com after 6pm"), "Done.")

    reply = claw.send("Please keep my contact details for later.", user_id=USER)

    assert reply.text == "Done."  # the turn succeeds whatever the guard did to the write
    (result,) = tool_results(loopback.requests[1])
    row = driver_of(claw).entry(SUBJECT, "contact")
    (tool_row,) = [m for m in claw.conversations.messages(reply.conversation_id).items if m.role == "tool"]
    finding = {"pattern": "email", "source": "remember value of key contact"}
    assert tool_row.metadata["findings"] == [finding]
    assert reply.remembered[0].findings == (GuardFinding("email", "remember value of key contact"),)
    if stored is None:
        assert row is None
        assert result == {"stored": False, "error": told}
        assert "ana.ruiz" not in loopback.received.split('"role": "tool"')[-1]
        assert tool_row.tool_input == {"key": "contact"}  # the refused value is not kept
    else:
        assert row.value == stored and row.metadata["origin"] == "tool"
        assert result["stored"] is True
        assert tool_row.tool_input == {"key": "contact", "value": stored}


def test_an_allowed_key_stores_its_value_as_given(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, pii_allow_keys="contact")
    loopback.script(remember("contact", "ana.ruiz@example.com"), "Done.")
    claw.send("Please keep my contact details for later.", user_id=USER)
    assert driver_of(claw).entry(SUBJECT, "contact").value == "ana.ruiz@example.com"


def test_the_privacy_switch_refuses_the_write_and_counts_it(
    engine: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    recorded: list[dict[str, Any]],
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, store_messages=False)
    loopback.script(remember("favourite_colour", "teal"), "I cannot keep that, sorry.")

    reply = claw.send("My favourite colour is teal.", user_id=USER)

    assert reply.text == "I cannot keep that, sorry."
    (result,) = tool_results(loopback.requests[1])
    assert result["stored"] is False and "privacy switch" in result["error"]
    assert driver_of(claw).namespaces() == []
    writes = [event for event in recorded if event["event"] == "memory.write"]
    assert [(w["namespace"], w["key"], w["gated"]) for w in writes] == [(SUBJECT, "favourite_colour", True)]


BAD_CALLS = [
    ({"value": "teal"}, "remember needs a key"),
    (
        {"key": "bad\x00key", "value": "teal"},
        "bad key: key 'bad\\x00key' contains the control character U+0000",
    ),
    ({"key": "", "value": "teal"}, "bad key: key must not be empty"),
    ({"key": "k" * 192, "value": "teal"}, "bad key: key must not exceed 191 characters (got 192)"),
    ({"key": 7, "value": "teal"}, "bad key: key must be a str, got int"),
    ({"key": "colour"}, "remember needs a value"),
    ({"key": "colour", "value": 42}, "value must be text (a string), got int"),
    ({"key": "colour", "value": ["teal"]}, "value must be text (a string), got list"),
    ({"key": "colour", "value": "   "}, "value must not be blank"),
    ({"key": "colour", "value": "x" * 300}, "over the limit of 256 bytes"),
    ({"key": "colour", "value": "teal", "ttl": 60}, "remember takes only key and value, not 'ttl'"),
    ("{not json", "bad arguments: the arguments are not valid JSON"),
    ('["colour", "teal"]', "bad arguments: the arguments are not a JSON object"),
]


def assert_refused(claw: Claw, server: LoopbackCompletions, arguments: Any, reason: str) -> None:
    """Run a turn whose model calls remember with ``arguments``; assert the model was told
    ``reason``, nothing was written, and the turn was stored with its reply."""
    server.script(calls(tool_call("remember", arguments, "call_9")), "Sorry, I could not keep that.")
    reply = claw.send("My favourite colour is teal.", user_id=USER)
    assert reply.text == "Sorry, I could not keep that."
    (result,) = tool_results(server.requests[-1])
    assert result["stored"] is False
    assert reason in result["error"] and result["error"].endswith("; nothing was written")
    assert driver_of(claw).namespaces() == []
    roles = [m.role for m in claw.conversations.messages(reply.conversation_id).items]
    assert roles == ["recall", "user", "assistant", "tool"]


@pytest.mark.parametrize(("arguments", "reason"), BAD_CALLS, ids=[reason[:24] for _, reason in BAD_CALLS])
def test_bad_arguments_get_an_error_result_and_write_nothing(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    arguments: Any,
    reason: str,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback, max_value_bytes=256)
    assert_refused(claw, loopback, arguments, reason)


def test_a_bad_call_writes_nothing_on_every_backend(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, max_value_bytes=256)
    assert_refused(claw, loopback, {"key": "colour", "value": "x" * 300}, "over the limit of 256 bytes")


def test_tool_rounds_are_bounded_and_every_call_is_billed(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback)
    loopback.script(*[remember(f"fact_{n}", f"fact number {n}", f"call_{n}") for n in range(10)])

    reply = claw.send("Remember everything about me.", user_id=USER)

    assert len(loopback.bodies) == MAX_TOOL_ROUNDS + 1 == reply.provider_calls
    assert [done.stores for done in reply.remembered] == [True] * MAX_TOOL_ROUNDS + [False]
    assert (
        reply.remembered[-1].error
        == f"not stored: a turn runs at most {MAX_TOOL_ROUNDS} rounds of tool calls"
    )
    assert sorted(driver_of(claw).all(SUBJECT)) == [f"fact_{n}" for n in range(MAX_TOOL_ROUNDS)]
    billed = sum(107 + n for n in range(1, MAX_TOOL_ROUNDS + 2))
    assert claw.conversations.get(reply.conversation_id).total_tokens == billed
    (assistant,) = [
        m for m in claw.conversations.messages(reply.conversation_id).items if m.role == "assistant"
    ]
    assert assistant.metadata["provider_calls"] == MAX_TOOL_ROUNDS + 1


def test_other_tools_stay_the_hosts_and_remember_beside_them_is_stored(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback)
    both = calls(
        tool_call("remember", {"key": "order", "value": "order 7 is a gift"}, "call_1"),
        tool_call("lookup_order", {"order": 7}, "call_2"),
    )
    loopback.script(both)

    reply = claw.send("Where is my order 7? It is a gift.", user_id=USER)

    assert len(loopback.bodies) == 1  # the host runs lookup_order and continues the turn
    assert [(call.name, call.input) for call in reply.tool_calls] == [("lookup_order", {"order": 7})]
    assert driver_of(claw).get("order", SUBJECT) == "order 7 is a gift"


def test_a_failed_reply_writes_no_fact(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback)
    loopback.script(remember("favourite_colour", "teal"), {"role": "assistant", "content": 7})
    with pytest.raises(Exception, match="malformed reply"):
        claw.send("My favourite colour is teal.", user_id=USER)
    assert driver_of(claw).namespaces() == []


class NoTools:
    """A provider whose ``complete`` takes no tools."""

    name = "plain"
    model = "plain"

    def complete(self, messages: Any) -> ProviderReply:
        return ProviderReply("ok")


def test_tool_mode_needs_a_provider_that_takes_tools(tmp_path: Path, clock: FakeClock) -> None:
    settings = Settings(instance_path=str(tmp_path), memory_writes="tool", memory_driver="array")
    with pytest.raises(ConfigError, match="CLAW_MEMORY_WRITES=tool needs a provider that offers tools"):
        Claw.from_settings(settings, NoTools(), clock=clock)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("sometimes", "CLAW_MEMORY_WRITES must be one of off, tool, extract, got 'sometimes'"),
        ("delete", "CLAW_MEMORY_WRITES must be one of off, tool, extract, got 'delete'"),
    ],
)
def test_an_unknown_setting_fails_at_start_up_in_one_line(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"CLAW_MEMORY_WRITES": raw})
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert Settings.from_env({"CLAW_MEMORY_WRITES": " Tool "}).memory_writes == "tool"
    assert Settings.from_env({}).memory_writes == "off"


def test_events_of_a_remembered_write_carry_the_turns_run(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback)
    loopback.script(remember("favourite_colour", "teal"), "Noted.")
    seen: list[dict[str, Any]] = []
    events.on("memory.write", seen.append)
    try:
        reply = claw.send("My favourite colour is teal.", user_id=USER)
    finally:
        events.off("memory.write", seen.append)
    assert [(e["key"], e["run_id"], e["gated"]) for e in seen] == [("favourite_colour", reply.run_id, False)]
    assert all("teal" not in json.dumps(e) for e in seen)


def test_every_driver_takes_metadata_and_the_sql_driver_keeps_it(
    driver_name: str, make_driver: Callable[[str], Any]
) -> None:
    driver = make_driver(driver_name)
    origin = {"origin": "tool", "conversation_id": "c1", "message_id": "m1"}
    driver.set("city", "Lisbon", SUBJECT, metadata=origin)
    assert driver.get("city", SUBJECT) == "Lisbon"
    assert driver.entry(SUBJECT, "city").metadata == (origin if driver.name == "sql" else None)
    with pytest.raises(TypeError, match="metadata of key 'town' must be a dict"):
        driver.set("town", "Porto", SUBJECT, metadata=["tool"])
    assert not driver.has("town", SUBJECT)


def test_an_entrys_attribution_is_sealed_at_rest_like_its_value(
    tmp_path: Path, prefix: str, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from clawmem.crypto import generate_key

    engine = create_engine(f"sqlite:///{tmp_path / 'sealed.db'}")
    create_tables(engine, prefix)
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, encryption_keys=generate_key("k1"))
    loopback.script(remember("favourite_colour", "teal"), "Noted.")
    reply = claw.send("My favourite colour is teal.", user_id=USER)

    table = tables(prefix).memory
    with engine.connect() as conn:
        value, metadata = conn.execute(sa.select(table.c.value, table.c.metadata)).one()
    assert "teal" not in value and reply.conversation_id not in metadata and "origin" not in metadata
    row = driver_of(claw).entry(SUBJECT, "favourite_colour")
    assert row.value == "teal" and row.metadata["conversation_id"] == reply.conversation_id
    engine.dispose()


def test_erasing_the_subject_takes_what_the_model_remembered(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from clawmem.privacy import erasure
    from clawmem.privacy.subjects import Subject
    from clawmem.sites.site import Site

    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script(remember("favourite_colour", "teal"), "Noted.")
    reply = claw.send("My favourite colour is teal.", user_id=USER)

    url = engine.url.render_as_string(hide_password=False)
    site = Site(Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix), clock)
    erasure.erase_subject(site, Subject(user_id=USER))

    assert driver_of(claw).namespaces() == []
    assert claw.conversations.get(reply.conversation_id) is None
