"""CLAW_MEMORY_WRITES=extract: after a turn with a subject, one extraction call over real HTTP to
a local chat-completions server finds the facts to add or replace. A fact extracted in one
conversation is recalled in another of the same subject on SQLite, MariaDB and PostgreSQL; it
carries where it came from, a replaced value is kept, its tokens are billed apart, and a bad
answer or a failing provider writes nothing and never fails the turn."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.providers import OpenAICompatibleProvider
from clawmem.settings import Settings
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables
from clawmem.turn.conversations import StoredMessage
from clawmem.turn.extraction import HISTORY, INSTRUCTIONS, MAX_FACTS
from clawmem.turn.pipeline import Claw, Reply

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

from tests.writing import SUBJECT, USER, driver_of
from tests.writing import make_claw as remembering_claw

pytest_plugins = ["tests.loopback", "tests.dashboard_fixtures"]


def make_claw(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, server: Any, **settings: Any
) -> Claw:
    """Return a Claw as the remember tool's tests make it, with ``memory_writes=extract`` unless
    told otherwise."""
    return remembering_claw(
        engine, prefix, tmp_path, clock, server, **{"memory_writes": "extract", **settings}
    )


def facts(*pairs: tuple[str, str]) -> str:
    """Return an extraction answer naming ``pairs`` as facts."""
    return json.dumps({"facts": [{"key": key, "value": value} for key, value in pairs]})


def assistant_row(claw: Claw, reply: Reply) -> StoredMessage:
    (row,) = [m for m in claw.conversations.messages(reply.conversation_id).items if m.role == "assistant"]
    return row


def extraction_sent(server: LoopbackCompletions, number: int) -> dict[str, Any]:
    """Return what the ``number``-th request (from 0) sent as an extraction: its JSON object."""
    system, user = server.requests[number]
    assert system == {"role": "system", "content": INSTRUCTIONS}
    return json.loads(user["content"])


def test_a_fact_extracted_in_turn_1_is_recalled_in_turn_3_of_another_conversation(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script("Teal is a lovely colour.", facts(("favourite_colour", "teal")))

    first = claw.send("My favourite colour is teal.", user_id=USER)

    assert first.text == "Teal is a lovely colour."
    # One call for the reply, then one extraction call: the turn and the facts known (none yet).
    assert len(loopback.bodies) == 2 and loopback.offered == [[], []]
    assert extraction_sent(loopback, 1) == {
        "known_facts": [],
        "turn": {"user": "My favourite colour is teal.", "assistant": "Teal is a lovely colour."},
    }
    # The reply's call (108) and the extraction's (109) are both billed, the latter apart.
    assert claw.conversations.get(first.conversation_id).total_tokens == 217
    assistant = assistant_row(claw, first)
    assert assistant.metadata["usage"] == {"prompt_tokens": 101, "completion_tokens": 7, "total_tokens": 108}
    assert assistant.metadata["memory_writing_tokens"] == 109
    assert assistant.metadata["memory_writing"] == {
        "namespace": SUBJECT,
        "usage": {"prompt_tokens": 102, "completion_tokens": 7, "total_tokens": 109},
        "wrote": ["favourite_colour"],
    }

    row = driver_of(claw).entry(SUBJECT, "favourite_colour")
    assert row is not None and row.value == "teal"
    assert row.metadata == {
        "origin": "extract",
        "conversation_id": first.conversation_id,
        "message_id": assistant.id,
        "run_id": first.run_id,
        "written_at": "2023-11-14T22:13:20.250000+00:00",
    }

    clock.advance(60)
    loopback.script("You're welcome.", facts())
    claw.send("Thanks!", first.conversation_id, user_id=USER)
    clock.advance(60)
    loopback.script("A teal bike would suit you.", facts())
    third = claw.send("Which colour should my new bike be?", user_id=USER)

    assert third.conversation_id != first.conversation_id
    sent = loopback.requests[4][-1]["content"]
    assert "- favourite_colour: teal" in sent
    assert third.augment.injected_keys == ["favourite_colour"]
    # The extraction of turn 3 is shown the subject's nearest entry, so it can replace it by key.
    assert extraction_sent(loopback, 5)["known_facts"] == [{"key": "favourite_colour", "value": "teal"}]
    assert len(loopback.bodies) == 6  # never more than one extraction call a turn


def test_a_replaced_value_keeps_the_last_five_it_replaced(
    lite: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback)
    cities = ["Lisbon", "Porto", "Faro", "Braga", "Evora", "Coimbra", "Aveiro"]
    stamps = []
    for city in cities:
        loopback.script("Noted.", facts(("city", city)))
        claw.send(f"I live in {city} now.", user_id=USER)
        stamps.append(driver_of(claw).entry(SUBJECT, "city").metadata["written_at"])
        clock.advance(3600)

    row = driver_of(claw).entry(SUBJECT, "city")
    assert row.value == "Aveiro"
    assert row.metadata["origin"] == "extract"
    assert row.metadata["history"] == [
        {"value": city, "written_at": stamp} for city, stamp in zip(cities[1:-1], stamps[1:-1], strict=True)
    ]
    assert len(row.metadata["history"]) == HISTORY

    # The same value again changes nothing: no write, no history.
    loopback.script("Noted.", facts(("city", "Aveiro")))
    claw.send("Still in Aveiro.", user_id=USER)
    assert driver_of(claw).entry(SUBJECT, "city").metadata == row.metadata


BAD_ANSWERS = [
    ("not JSON", "I think the user likes teal", "the answer is not JSON"),
    ("facts not a list", json.dumps({"facts": "teal"}), "the facts are a str, not a list"),
    ("other fields", json.dumps({"facts": [], "delete": ["city"]}), "without exactly one field, facts"),
    ("a number value", json.dumps([{"key": "age", "value": 41}]), "fact 1 has a value that is a int"),
    ("a number key", json.dumps([{"key": 7, "value": "teal"}]), "fact 1 has a key that is a int"),
    ("no value", json.dumps([{"key": "colour"}]), "fact 1 is not an object of exactly key and value"),
    ("a ttl", json.dumps([{"key": "c", "value": "teal", "ttl": 5}]), "fact 1 is not an object of exactly"),
    ("a list fact", json.dumps([["colour", "teal"]]), "fact 1 is not an object"),
    (
        "too many",
        facts(*[(f"fact_{n}", f"secret fact {n}") for n in range(MAX_FACTS + 1)]),
        f"the answer holds 21 facts, more than {MAX_FACTS}",
    ),
    (
        "too large",
        facts(("colour", "teal"), ("essay", "secret " * 200)),
        "fact 2 breaks a rule: the value size",
    ),
    ("empty key", facts(("colour", "teal"), ("", "secret")), "fact 2 breaks a rule: the key rules"),
    ("control key", facts(("secret\x00key", "teal")), "fact 1 breaks a rule: the key rules"),
    ("long key", facts(("k" * 192, "teal")), "fact 1 breaks a rule: the key rules"),
    ("blank value", facts(("colour", "   ")), "fact 1 breaks a rule: a blank value"),
]


@pytest.mark.parametrize(
    ("answer", "reason"), [bad[1:] for bad in BAD_ANSWERS], ids=[b[0] for b in BAD_ANSWERS]
)
def test_a_bad_answer_writes_nothing_and_the_turn_keeps_its_reply(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    caplog: pytest.LogCaptureFixture,
    answer: str,
    reason: str,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback, max_value_bytes=1024)
    loopback.script("Teal is a lovely colour.", answer)

    with caplog.at_level(logging.WARNING, logger="clawmem.turn.extraction"):
        reply = claw.send("My favourite colour is teal.", user_id=USER)

    assert reply.text == "Teal is a lovely colour."
    assert driver_of(claw).namespaces() == []
    (warning,) = [r for r in caplog.records if r.name == "clawmem.turn.extraction"]
    assert warning.levelno == logging.WARNING and reason in warning.getMessage()
    assert "teal" not in warning.getMessage() and "secret" not in warning.getMessage()
    assistant = assistant_row(claw, reply)
    assert reason in assistant.metadata["memory_writing"]["error"]
    assert "wrote" not in assistant.metadata["memory_writing"]
    # The extraction call was made and is billed, even though it wrote nothing.
    assert claw.conversations.get(reply.conversation_id).total_tokens == 108 + 109


def test_a_bad_answer_writes_nothing_on_every_backend(
    engine: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    caplog: pytest.LogCaptureFixture,
) -> None:
    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script("Noted.", facts(("colour", "teal"), ("bad\nkey", "teal")))
    with caplog.at_level(logging.WARNING, logger="clawmem.turn.extraction"):
        reply = claw.send("My favourite colour is teal.", user_id=USER)
    assert reply.text == "Noted."
    assert driver_of(claw).namespaces() == []
    assert len([r for r in caplog.records if r.name == "clawmem.turn.extraction"]) == 1


@pytest.mark.parametrize("failure", ["hang", "500", "503"])
def test_a_failing_provider_never_fails_the_turn(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    caplog: pytest.LogCaptureFixture,
    failure: str,
) -> None:
    from tests.loopback import HANG, failing

    claw = make_claw(lite, prefix, tmp_path, clock, loopback, timeout=0.5)
    loopback.script("Teal is a lovely colour.", HANG if failure == "hang" else failing(int(failure)))

    with caplog.at_level(logging.WARNING, logger="clawmem.turn.extraction"):
        reply = claw.send("My favourite colour is teal.", user_id=USER)

    assert reply.text == "Teal is a lovely colour."
    assert driver_of(claw).namespaces() == []
    (warning,) = [r for r in caplog.records if r.name == "clawmem.turn.extraction"]
    expected = "the provider timed out" if failure == "hang" else "the provider call failed"
    assert warning.getMessage() == f"memory extraction wrote nothing: {expected}"
    assistant = assistant_row(claw, reply)
    assert assistant.metadata["memory_writing"]["error"] == expected
    assert "memory_writing_tokens" not in assistant.metadata  # nothing was reported for it
    assert claw.conversations.get(reply.conversation_id).total_tokens == 108
    # The turn was stored whole, and the next turn runs as usual.
    roles = [m.role for m in claw.conversations.messages(reply.conversation_id).items]
    assert roles == ["recall", "user", "assistant"]
    loopback.script("Noted.", facts(("colour", "teal")))
    claw.send("Teal, as I said.", reply.conversation_id, user_id=USER)
    assert driver_of(claw).get("colour", SUBJECT) == "teal"


@pytest.mark.parametrize(
    ("mode", "stored"),
    [
        ("block", None),
        ("redact", "write to [email] after 6pm"),
        ("warn", "write to ana.ruiz@example.com after 6pm"),
    ],
)
def test_the_pii_guard_holds_for_an_extracted_value(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    mode: str,
    stored: str | None,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback, pii_guard=mode)
    loopback.script(
        "Done.", facts(("contact", "write to ana.ruiz@example.com after 6pm"), ("city", "Lisbon"))
    )

    reply = claw.send("Please keep my contact details for later; I live in Lisbon.", user_id=USER)

    assert reply.text == "Done."
    driver = driver_of(claw)
    assert driver.get("city", SUBJECT) == "Lisbon"  # the guard refuses a fact, not the answer
    record = assistant_row(claw, reply).metadata["memory_writing"]
    assert record["findings"] == [{"pattern": "email", "source": "remember value of key contact"}]
    row = driver.entry(SUBJECT, "contact")
    if stored is None:
        assert row is None
        assert record["refused"] == [
            {"key": "contact", "error": "not stored: the value holds personal data (email), which is refused"}
        ]
        assert record["wrote"] == ["city"]
    else:
        assert row.value == stored and row.metadata["origin"] == "extract"
        assert "refused" not in record


def test_a_redacted_turn_is_sent_redacted_to_the_extraction(
    lite: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback, pii_guard="redact")
    loopback.script("Noted.", facts())
    claw.send("Mail me at ana.ruiz@example.com please.", user_id=USER)
    assert "ana.ruiz" not in loopback.received
    assert extraction_sent(loopback, 1)["turn"]["user"] == "Mail me at [email] please."


def test_the_privacy_switch_makes_no_extraction_call(
    lite: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback, store_messages=False)
    loopback.script("Noted.", facts(("favourite_colour", "teal")))
    reply = claw.send("My favourite colour is teal.", user_id=USER)
    assert reply.text == "Noted." and reply.extraction is None
    assert len(loopback.bodies) == 1  # nothing could be stored, so the turn is not sent again
    assert driver_of(claw).namespaces() == []


@pytest.mark.parametrize("mode", ["extract", "off", "tool"])
def test_only_extract_with_a_subject_makes_the_call(
    lite: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    loopback: LoopbackCompletions,
    mode: str,
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback, memory_writes=mode)
    loopback.script("Noted.", facts(("favourite_colour", "teal")))
    anonymous = claw.send("My favourite colour is teal.")
    assert anonymous.extraction is None and len(loopback.bodies) == 1
    if mode != "extract":
        loopback.script("Noted.", facts(("favourite_colour", "teal")))
        claw.send("My favourite colour is teal.", user_id=USER)
        assert len(loopback.bodies) == 2
        assert driver_of(claw).namespaces() == []


def test_extract_is_a_setting() -> None:
    assert Settings.from_env({"CLAW_MEMORY_WRITES": " Extract "}).memory_writes == "extract"


def test_an_answer_in_a_code_fence_is_read(
    lite: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    claw = make_claw(lite, prefix, tmp_path, clock, loopback)
    loopback.script("Noted.", "```json\n" + json.dumps([{"key": "city", "value": "Lisbon"}]) + "\n```")
    claw.send("I live in Lisbon.", user_id=USER)
    assert driver_of(claw).get("city", SUBJECT) == "Lisbon"


def test_a_replaced_value_is_sealed_at_rest_with_the_entry(
    tmp_path: Path, prefix: str, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from clawmem.crypto import generate_key
    from clawmem.sql.schema import tables

    engine = create_engine(f"sqlite:///{tmp_path / 'sealed.db'}")
    create_tables(engine, prefix)
    key = generate_key("k1")
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, encryption_keys=key)
    loopback.script("Noted.", facts(("city", "Lisbon")), "Noted.", facts(("city", "Porto")))
    claw.send("I live in Lisbon.", user_id=USER)
    clock.advance(60)
    # The next turn runs in another process, as a site's web workers do.
    claw = make_claw(engine, prefix, tmp_path, clock, loopback, encryption_keys=key)
    claw.send("My city is Porto now.", user_id=USER)

    with engine.connect() as conn:
        value, metadata = conn.execute(
            sa.select(tables(prefix).memory.c.value, tables(prefix).memory.c.metadata)
        ).one()
    assert "Porto" not in value and "Lisbon" not in metadata
    row = driver_of(claw).entry(SUBJECT, "city")
    assert row.value == "Porto" and [item["value"] for item in row.metadata["history"]] == ["Lisbon"]
    # The second extraction was shown the first fact, read back through the cipher.
    assert extraction_sent(loopback, 3)["known_facts"] == [{"key": "city", "value": "Lisbon"}]
    engine.dispose()


def test_erasing_the_subject_takes_what_was_extracted(
    engine: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from clawmem.privacy import erasure
    from clawmem.privacy.subjects import Subject
    from clawmem.sites.site import Site

    claw = make_claw(engine, prefix, tmp_path, clock, loopback)
    loopback.script("Noted.", facts(("city", "Lisbon")), "Noted.", facts(("city", "Porto")))
    first = claw.send("I live in Lisbon.", user_id=USER)
    claw.send("I moved to Porto.", user_id=USER)
    assert driver_of(claw).entry(SUBJECT, "city").metadata["history"][0]["value"] == "Lisbon"

    url = engine.url.render_as_string(hide_password=False)
    site = Site(Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix), clock)
    erasure.erase_subject(site, Subject(user_id=USER))

    assert driver_of(claw).namespaces() == []
    assert claw.conversations.get(first.conversation_id) is None


def test_the_conversation_page_shows_the_memory_writing_and_the_entries_written(
    app: Any, signed_in: Any, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from dashboard import state
    from tests.dashboard_helpers import page_text

    with app.app_context():
        settings = state.settings().replace(memory_writes="extract")
    provider = OpenAICompatibleProvider(loopback.url, "local-model", timeout=10)
    claw = Claw.from_settings(settings, provider, clock=clock)
    loopback.script("Teal is a lovely colour.", facts(("favourite_colour", "teal")))
    reply = claw.send("My favourite colour is teal.", user_id=USER)

    response = signed_in.get(f"/conversations/{reply.conversation_id}")
    assert response.status_code == 200
    body = " ".join(page_text(response).split())
    assert (
        "billed <strong>108</strong> tokens (prompt 101, completion 7, total 108); "
        "memory writing <strong>109</strong> tokens" in body
    )
    assert "Tokens billed</dt><dd><strong>217</strong>" in body
    assert "Memory this turn's extraction wrote:" in body
    assert '<a href="/memory/user:ana-7/entry?key=favourite_colour"><code>favourite_colour</code></a>' in body


def test_the_overview_counts_the_memory_writing_in_its_total_and_its_days(
    app: Any, signed_in: Any, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from dashboard import state
    from tests.dashboard_helpers import page_text

    with app.app_context():
        settings = state.settings().replace(memory_writes="extract")
    provider = OpenAICompatibleProvider(loopback.url, "local-model", timeout=10)
    claw = Claw.from_settings(settings, provider, clock=clock)
    loopback.script("Teal is a lovely colour.", facts(("favourite_colour", "teal")))
    claw.send("My favourite colour is teal.", user_id=USER)

    body = " ".join(page_text(signed_in.get("/")).split())
    assert "Tokens billed, over every stored conversation: <strong>217</strong>" in body
    chart = body.split('id="tokens-chart-title"', 1)[1].split("</figure>", 1)[0]
    assert '<tr><td>14 Nov</td><td class="num">217</td></tr>' in chart
    extraction = "(each turn's extraction call, <code>CLAW_MEMORY_WRITES=extract</code>)"
    assert f"memory writing {extraction}: <strong>109</strong>" in body


def test_the_subject_page_shows_who_wrote_each_entry(
    app: Any, signed_in: Any, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    from dashboard import state
    from tests.dashboard_helpers import page_text

    with app.app_context():
        settings = state.settings().replace(memory_writes="extract")
    provider = OpenAICompatibleProvider(loopback.url, "local-model", timeout=10)
    claw = Claw.from_settings(settings, provider, clock=clock)
    loopback.script("Noted.", facts(("city", "Lisbon")), "Noted.", facts(("city", "Porto")))
    claw.send("I live in Lisbon.", user_id=USER)
    clock.advance(60)
    claw.send("My city is Porto now.", user_id=USER)
    claw.memory.set("plan", "gold", SUBJECT)  # the operator's code: no origin

    body = " ".join(page_text(signed_in.get(f"/subjects/{USER}")).split())
    assert (
        '<code>city</code></a> <span class="tag origin">written by extraction</span> '
        '<span class="muted">(1 earlier value kept)</span>' in body
    )
    assert "<code>plan</code></a></td>" in body
    # the two extraction calls' tokens, shown apart inside the subject's tokens billed
    assert (
        "Tokens billed</dt><dd><strong>438</strong>, of which memory writing <strong>220</strong> "
        "(the turns' extraction calls)</dd>" in body
    )


class Scripted:
    """A provider of the host's own code: replies, then raises during the extraction."""

    name = "scripted"
    model = "scripted"

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: Any) -> Any:
        from clawmem.providers.base import ProviderReply

        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("secret teal crash")
        return ProviderReply("Noted.")


def test_a_provider_of_the_hosts_code_that_raises_never_fails_the_turn(
    lite: sa.engine.Engine, prefix: str, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    url = lite.url.render_as_string(hide_password=False)
    settings = Settings(
        instance_path=str(tmp_path), database_url=url, table_prefix=prefix, memory_writes="extract"
    )
    claw = Claw.from_settings(settings, Scripted(), clock=clock)
    with caplog.at_level(logging.WARNING, logger="clawmem.turn.extraction"):
        reply = claw.send("My favourite colour is teal.", user_id=USER)
    assert reply.text == "Noted."
    (warning,) = [r for r in caplog.records if r.name == "clawmem.turn.extraction"]
    assert warning.getMessage() == "memory extraction wrote nothing: the provider call failed (RuntimeError)"
    assert driver_of(claw).namespaces() == []
