"""Summary checkpoints (SPEC 6): what a long conversation sends and what keeping it coherent
costs, on SQLite, MariaDB and PostgreSQL; token usage; erasure; the compaction analysis; and
the dashboard pages that show them."""

from __future__ import annotations

import html
import io
import json
import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.errors import GuardBlocked
from clawmem.memory.array import ArrayMemory
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.privacy import erasure
from clawmem.privacy.subjects import Subject
from clawmem.providers import EchoProvider, OpenAICompatibleProvider, ToolCall
from clawmem.settings import Settings
from clawmem.sites import operations
from clawmem.sites.site import Site
from clawmem.sql.conversations import StoredMessage
from clawmem.sql.schema import tables
from clawmem.turn.compaction import (
    SUMMARY_INSTRUCTION,
    SUMMARY_PREFIX,
    ExtractiveSummarizer,
    HistoryCompactor,
    ProviderSummarizer,
    Summary,
    analyse,
    estimate_tokens,
)
from clawmem.turn.conversations import ConversationLog, Message
from clawmem.turn.pipeline import Claw, provider_history
from dashboard import accounts, state
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

pytest_plugins = ["tests.dashboard_fixtures", "tests.loopback"]

TURNS = 60
SYSTEM = "You are Northwind's support agent. Be brief and kind."


class RecordingSummarizer:
    """A ProviderSummarizer over its own EchoProvider that keeps every list of messages it was given."""

    uses_provider = True

    def __init__(self) -> None:
        self.provider = EchoProvider()
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]]) -> Summary:
        self.calls.append([dict(message) for message in messages])
        return ProviderSummarizer(self.provider)(messages)

    def seen(self) -> Counter[str]:
        """Return how often each message other than a summary was given to the summariser."""
        return Counter(
            message["content"]
            for call in self.calls
            for message in call
            if not (message["content"] or "").startswith(SUMMARY_PREFIX)
        )


def question(turn: int) -> str:
    """Return the user message of ``turn``: unique, and of a few different lengths."""
    return f"turn {turn:02d}: is delivery slot {turn} still free" + " on Friday" * (turn % 3) + "?"


def site_of(engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path) -> Site:
    """Return the site of this test's tables (what the CLI's operations run on)."""
    url = engine.url.render_as_string(hide_password=False)
    return Site(Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix), clock)


def summary_rows(engine: sa.engine.Engine, prefix: str, conversation_id: str | None = None) -> int:
    """Return how many ``summary`` rows the messages table holds (of one conversation, if given)."""
    table = tables(prefix).messages
    select = sa.select(sa.func.count()).select_from(table).where(table.c.role == "summary")
    if conversation_id is not None:
        select = select.where(table.c.conversation_id == conversation_id)
    with engine.connect() as conn:
        return int(conn.execute(select).scalar() or 0)


@pytest.fixture
def store(clock: FakeClock) -> PrivacyAwareMemory:
    """An empty key/value memory: nothing is injected, so what is sent is what was said."""
    return PrivacyAwareMemory(ArrayMemory(clock=clock))


@pytest.fixture
def log(engine: sa.engine.Engine, prefix: str, clock: FakeClock) -> ConversationLog:
    """The conversation log on this test's SQL tables."""
    return ConversationLog(engine, prefix=prefix, clock=clock)


# -- checkpoints over a long conversation ----------------------------------------------------------


@pytest.mark.parametrize(("max_messages", "max_tokens"), [(10, 0), (0, 150)], ids=["count", "tokens"])
def test_checkpoints_keep_what_is_sent_under_the_threshold_and_pay_once_per_crossing(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock, max_messages: int, max_tokens: int
) -> None:
    """Sixty turns against one threshold.

    What "under the threshold" means: on a count threshold, everything sent, the new message
    included, is at most ``max_messages`` messages. On a token threshold, the history sent
    before the new message is at most ``max_tokens`` estimated tokens (the new message is always
    sent whole), and a turn that does not compact sends at most ``max_tokens`` in all. The
    compactor keeps the newest half by count, so this holds while each message and the summary
    are small against the threshold, as here.
    """
    summarizer = RecordingSummarizer()
    provider = EchoProvider()
    compactor = HistoryCompactor(summarizer, max_messages=max_messages, max_tokens=max_tokens)
    claw = Claw(store, log, provider, compactor=compactor, guards=[], clock=clock)
    conversation_id: str | None = None
    expected: list[dict[str, Any]] = []  # what the next turn must load: last turn's history and reply
    crossings = 0
    for turn in range(1, TURNS + 1):
        text = question(turn)
        stored = log.load(conversation_id) if conversation_id else None
        loaded = provider_history(stored.messages) if stored else []
        assert loaded == expected, f"turn {turn} did not load the newest checkpoint and what follows it"
        candidate = [*loaded, {"role": "user", "content": text}]
        crossed = (max_messages > 0 and len(candidate) > max_messages) or (
            max_tokens > 0 and estimate_tokens(candidate) > max_tokens
        )
        crossings += crossed
        calls_before = len(summarizer.calls)
        reply = claw.send(text, conversation_id)
        conversation_id = reply.conversation_id
        sent = provider.requests[-1]
        assert len(summarizer.calls) - calls_before == int(crossed), f"turn {turn}"
        assert reply.compaction.fired == crossed
        assert sent[-1] == {"role": "user", "content": text}
        if max_messages:
            assert len(sent) <= max_messages, f"turn {turn} sent {len(sent)} messages"
        if max_tokens:
            assert estimate_tokens(sent[:-1]) <= max_tokens, f"turn {turn}"
            if not crossed:
                assert estimate_tokens(sent) <= max_tokens, f"turn {turn}"
        expected = [
            *sent[:-1],
            {"role": "user", "content": text},
            {"role": "assistant", "content": reply.text},
        ]
        clock.advance(7)
    assert len(summarizer.calls) == crossings
    assert 10 <= crossings < TURNS // 2 + 1, "a crossing is paid once, not on every later turn"
    seen = summarizer.seen()
    assert seen and max(seen.values()) == 1, [text for text, times in seen.items() if times > 1]
    said = {m.content for m in log.messages(conversation_id, limit=1000).items if m.role != "summary"}
    assert set(seen) <= said
    # Every summary after the first folds the previous checkpoint in, as its first message.
    assert all(call[0]["content"].startswith(SUMMARY_PREFIX) for call in summarizer.calls[1:])
    assert summary_rows(log.engine, log.prefix, conversation_id) == crossings


def test_transient_compaction_reproduces_phpclaws_numbers(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    """checkpoints=False: with ProviderSummarizer and max_messages=10, twelve turns send 1, 3,
    5, 7, 9 messages and then 7, 8, 9 … 13, and every turn from the sixth pays an extra call."""
    provider = EchoProvider()
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages=10)
    claw = Claw(store, log, provider, compactor=compactor, guards=[], clock=clock, checkpoints=False)
    conversation_id = None
    sizes, calls = [], []
    for turn in range(1, 13):
        before = provider.calls
        conversation_id = claw.send(question(turn), conversation_id).conversation_id
        sizes.append(len(provider.requests[-1]))
        calls.append(provider.calls - before)
        clock.advance(7)
    assert sizes == [1, 3, 5, 7, 9, 7, 8, 9, 10, 11, 12, 13]
    assert calls == [1] * 5 + [2] * 7
    roles = Counter(message.role for message in log.messages(conversation_id).items)
    assert (roles["user"], roles["assistant"], roles["summary"]) == (12, 12, 0)


def test_compact_persist_false_in_the_environment_is_transient(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    environ = {
        "CLAW_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "CLAW_TABLE_PREFIX": prefix,
        "CLAW_MEMORY_DRIVER": "array",
        "CLAW_COMPACT_MAX_MESSAGES": "10",
    }
    results = {}
    for persist in ("true", "false"):
        settings = Settings.from_env({**environ, "CLAW_COMPACT_PERSIST": persist}, tmp_path)
        provider = EchoProvider()
        claw = Claw.from_settings(settings, provider, clock=clock)
        assert claw.checkpoints is (persist == "true")
        conversation_id = None
        for turn in range(1, 13):
            conversation_id = claw.send(question(turn), conversation_id).conversation_id
        results[persist] = (
            [len(request) for request in provider.requests],
            summary_rows(engine, prefix, conversation_id),
        )
    assert results["false"] == ([1, 3, 5, 7, 9, 7, 8, 9, 10, 11, 12, 13], 0)
    sizes, checkpoints = results["true"]
    assert max(sizes) <= 10 and checkpoints == 4


def test_a_tool_call_and_its_result_are_never_split_and_the_system_message_is_always_sent_first(
    store: PrivacyAwareMemory, log: ConversationLog, clock: FakeClock
) -> None:
    conversation_id = "support-chat-1"
    log.append(conversation_id, [Message("system", SYSTEM)])
    clock.advance(1)
    summarizer = RecordingSummarizer()
    provider = EchoProvider(tool_calls=[ToolCall("lookup_order", {"order": "A-20931"}, "call_1")])
    compactor = HistoryCompactor(summarizer, max_messages=8)
    claw = Claw(store, log, provider, compactor=compactor, guards=[], clock=clock)
    for turn in range(1, 31):
        claw.send(question(turn), conversation_id)
        clock.advance(7)
    assert len(summarizer.calls) >= 10
    for request in provider.requests:
        assert request[0] == {"role": "system", "content": SYSTEM}
        for before, message in zip(request, request[1:], strict=False):
            if message["role"] == "tool":
                assert before["role"] == "assistant" and before["content"].startswith("echo: "), request
    for call in summarizer.calls:
        assert all(message["role"] != "system" for message in call)
        # Every assistant reply here called a tool, so none may end what is summarised.
        assert call[-1]["role"] != "assistant", "an assistant turn was summarised without its tool row"
        for before, message in zip(call, call[1:], strict=False):
            if message["role"] == "tool":
                assert before["role"] == "assistant"
    stored = log.messages(conversation_id, limit=1000).items
    position = {message.id: index for index, message in enumerate(stored)}
    for checkpoint in (message for message in stored if message.role == "summary"):
        after = stored[position[checkpoint.tool_input["covers"]["to"]] + 1]
        assert after.role != "tool", "a checkpoint covers a tool call without its tool row"


# -- erasure, retention and export ----------------------------------------------------------------


def test_erase_and_prune_leave_no_summary_behind_and_export_lists_the_checkpoints(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path, store: PrivacyAwareMemory
) -> None:
    site = site_of(engine, prefix, clock, tmp_path)
    compactor = HistoryCompactor(ProviderSummarizer(EchoProvider()), max_messages=4)
    claw = Claw(store, site.conversations, EchoProvider(), compactor=compactor, guards=[], clock=clock)
    chats = {}
    for user_id in ("cust-42", "cust-7"):
        conversation_id = None
        for turn in range(1, 7):
            conversation_id = claw.send(question(turn), conversation_id, user_id=user_id).conversation_id
        chats[user_id] = conversation_id
        assert summary_rows(engine, prefix, conversation_id) >= 2

    out = io.StringIO()
    erasure.export_subject(site, Subject(user_id="cust-42"), out)
    (exported,) = json.loads(out.getvalue())["conversations"]
    stored = [
        m for m in site.conversations.messages(chats["cust-42"], limit=1000).items if m.role == "summary"
    ]
    listed = [m for m in exported["messages"] if m["role"] == "summary"]
    assert [(m["id"], m["content"], m["tool_input"]) for m in listed] == [
        (m.id, m.content, m.tool_input) for m in stored
    ]
    assert all(m["tool_input"]["covers"]["messages"] > 0 for m in listed)

    erased = erasure.erase_subject(site, Subject(user_id="cust-42"))
    assert erased.conversations == 1
    assert summary_rows(engine, prefix, chats["cust-42"]) == 0
    assert summary_rows(engine, prefix, chats["cust-7"]) > 0, "another subject's checkpoints stay"

    clock.advance(40 * 86_400)
    pruned = operations.prune(site, timedelta(days=30))
    assert pruned.conversations == 1
    assert summary_rows(engine, prefix) == 0
    assert site.conversations.counts() == {"conversations": 0, "messages": 0}


# -- usage --------------------------------------------------------------------------------------


def test_usage_of_the_turn_and_of_the_summary_call(
    log: ConversationLog,
    clock: FakeClock,
    store: PrivacyAwareMemory,
    loopback: LoopbackCompletions,
    recorded: list[dict[str, Any]],
) -> None:
    provider = OpenAICompatibleProvider(loopback.url, "m")
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages=2)
    claw = Claw(store, log, provider, compactor=compactor, guards=[], clock=clock)
    first = claw.send("Where is order A-20931?")
    assert first.usage == loopback.usage(1)
    assert first.compaction.usage is None
    recorded.clear()
    second = claw.send("Will it arrive before Friday?", first.conversation_id)
    assert len(loopback.bodies) == 3  # the summary call, then the turn's
    assert SUMMARY_INSTRUCTION in loopback.requests[1][-1]["content"]
    assert second.compaction.usage == loopback.usage(2)
    assert second.usage == loopback.usage(3)
    (after,) = [event for event in recorded if event["event"] == "compaction.after"]
    assert after["usage"] == loopback.usage(2) and after["provider_calls"] == 1
    assert "A-20931" not in repr(recorded) and "Noted" not in repr(recorded), "events never carry text"
    (checkpoint,) = [m for m in log.messages(first.conversation_id).items if m.role == "summary"]
    assert checkpoint.tool_input["usage"] == loopback.usage(2)
    assert checkpoint.tool_input["provider_calls"] == 1


# -- the analysis ----------------------------------------------------------------------------------


def stored_messages(sizes: list[int], roles: list[str] | None = None) -> list[StoredMessage]:
    """Return stored messages of the given content sizes in bytes (user and assistant in turn)."""
    stamp = datetime(2026, 1, 5, 9, 0, tzinfo=UTC).replace(tzinfo=None)
    roles = roles or ["user" if index % 2 == 0 else "assistant" for index in range(len(sizes))]
    return [
        StoredMessage(f"m{index:02d}", "c1", role, "x" * size, None, None, stamp)
        for index, (size, role) in enumerate(zip(sizes, roles, strict=True))
    ]


def test_the_analysis_names_the_threshold_that_was_exceeded_first() -> None:
    # 68 bytes a message: 17 messages are 1156 bytes (289 tokens), 18 are 1224 (306 > 300).
    messages = stored_messages([68] * 24)
    found = analyse(messages, max_messages=20, max_tokens=300)
    assert found["reason"] == "tokens"
    assert found["first_fire"] == 18 and found["first_fire_id"] == "m17"
    assert found["crossings"] == {"messages": 21, "tokens": 18}
    count_only = analyse(messages, max_messages=20, max_tokens=0)
    assert (count_only["reason"], count_only["first_fire"], count_only["crossings"]) == (
        "messages",
        21,
        {"messages": 21},
    )
    # 60 bytes a message: both thresholds are first exceeded at message 21; the count is named.
    tie = analyse(stored_messages([60] * 24), max_messages=20, max_tokens=300)
    assert (tie["reason"], tie["first_fire"], tie["crossings"]) == (
        "messages",
        21,
        {"messages": 21, "tokens": 21},
    )


def test_a_checkpoint_is_sent_as_its_text_only() -> None:
    stamp = datetime(2026, 1, 5, 9, 0)
    record = {"covers": {"from": "a", "to": "b", "messages": 2}, "provider_calls": 1, "usage": None}
    checkpoint = StoredMessage("s1", "c1", "summary", SUMMARY_PREFIX + "They asked.", None, record, stamp)
    recall = StoredMessage("r1", "c1", "recall", '[{"key": "tea"}]', None, None, stamp)
    assert provider_history([recall, checkpoint]) == [
        {"role": "assistant", "content": SUMMARY_PREFIX + "They asked."}
    ]


# -- the dashboard ---------------------------------------------------------------------------------

OPERATOR_CONTACT = "Escalate damaged deliveries to the support lead at support-lead@northwind.example."
CUSTOMER_CONTACT = "The customer asked us to write to jo.bloggs@example.com about the delivery."


def signed_in_client(app: Flask, first: bool = True) -> FlaskClient:
    """Return a client of ``app`` signed in as the admin (created when ``first``)."""
    if first:
        with app.app_context():
            accounts.create_admin(ADMIN, PASSWORD, 0)
    client = app.test_client()
    assert sign_in(client).status_code == 302
    return client


def checkpoint_lines(body: str) -> list[str]:
    """Return the text of every checkpoint line on a conversation page, tags removed."""
    found = re.findall(r'<p class="checkpoint">(.*?)</p>', body, re.S)
    return [" ".join(re.sub(r"<[^>]+>", "", html.unescape(line)).split()) for line in found]


def test_the_conversation_page_shows_what_each_checkpoint_covers_and_cost(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, loopback: LoopbackCompletions
) -> None:
    provider = OpenAICompatibleProvider(loopback.url, "m")
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages=4)
    with app.app_context():
        log = state.conversations()
        claw = Claw(state.memory(), log, provider, compactor=compactor, guards=[], clock=clock)
        conversation_id = None
        for turn in range(1, 6):
            conversation_id = claw.send(question(turn), conversation_id).conversation_id
            clock.advance(60)
        stored = log.messages(conversation_id).items
    position = {message.id: index for index, message in enumerate(stored, start=1)}
    checkpoints = [message for message in stored if message.role == "summary"]
    assert len(checkpoints) >= 2
    calls = [
        loopback.requests.index(request) + 1
        for request in loopback.requests
        if SUMMARY_INSTRUCTION in request[-1]["content"]
    ]
    expected = []
    for checkpoint, call in zip(checkpoints, calls, strict=True):
        covers = checkpoint.tool_input["covers"]
        usage = loopback.usage(call)
        expected.append(
            f"Checkpoint: summarises messages {position[covers['from']]}–{position[covers['to']]} "
            f"({covers['messages']} messages). Cost: 1 provider call, {usage['total_tokens']} tokens "
            f"(prompt_tokens {usage['prompt_tokens']}, completion_tokens 7, "
            f"total_tokens {usage['total_tokens']})."
        )
    body = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    assert checkpoint_lines(body) == expected
    # Row 1 is the first turn's recall record; rows 2 and 3 are what was said in it.
    assert expected[0].startswith("Checkpoint: summarises messages 2–3 (2 messages).")
    # The second summary folds the first in: it covers from the first message said on.
    assert expected[1].startswith("Checkpoint: summarises messages 2–")
    assert re.findall(r'<span class="position">#(\d+)</span>', body) == [
        str(n) for n in range(1, len(stored) + 1)
    ]


def test_a_checkpoint_of_a_conversation_too_long_to_analyse_names_message_ids(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.views import conversations as view

    compactor = HistoryCompactor(ExtractiveSummarizer(), max_messages=4)
    with app.app_context():
        claw = Claw(
            state.memory(), state.conversations(), EchoProvider(), compactor=compactor, guards=[], clock=clock
        )
        conversation_id = None
        for turn in range(1, 4):
            conversation_id = claw.send(question(turn), conversation_id).conversation_id
        (checkpoint,) = [
            m for m in state.conversations().messages(conversation_id).items if m.role == "summary"
        ]
    monkeypatch.setattr(view, "MESSAGE_PAGE_SIZE", 3)
    monkeypatch.setattr(view, "ANALYSIS_LIMIT", 3)
    body = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    assert "too long to analyse" in body
    pages = [body]
    while more := re.search(r'id="messages-more".*?href="([^"]+)"', pages[-1], re.S):
        pages.append(page_text(signed_in.get(html.unescape(more.group(1)))))
    assert len(pages) > 1 and all('<span class="position">' not in page for page in pages)
    covers = checkpoint.tool_input["covers"]
    assert [line for page in pages for line in checkpoint_lines(page)] == [
        f"Checkpoint: summarises messages {covers['from']} to {covers['to']} (2 messages). "
        "Cost: no provider call (summarised locally)."
    ]


def said_and_recorded(app: Flask) -> tuple[str, list[str]]:
    """Store 24 messages of 68 bytes with a recall row before the first and a summary row after
    the tenth; return the conversation id and the ids in conversation order."""
    rows: list[Message] = [Message("recall", '[{"namespace": "default", "key": "slots", "score": 1}]')]
    for index in range(24):
        rows.append(Message("user" if index % 2 == 0 else "assistant", f"{index:02d} " + "x" * 65))
        if index == 9:
            rows.append(
                Message(
                    "summary",
                    SUMMARY_PREFIX + "Slots were discussed.",
                    None,
                    {"covers": {"from": "a", "to": "b", "messages": 10}},
                )
            )
    with app.app_context():
        log = state.conversations()
        log.append("analysed-1", rows, title="Delivery slots")
        return "analysed-1", [m.id for m in log.messages("analysed-1").items]


@pytest.mark.parametrize("persist", [True, False])
def test_the_analysis_names_the_threshold_exceeded_first_and_the_other(
    make_app: Callable[..., Flask], clock: FakeClock, persist: bool
) -> None:
    app = make_app(COMPACT_PERSIST=persist)
    client = signed_in_client(app)
    conversation_id, ids = said_and_recorded(app)
    body = page_text(client.get(f"/conversations/{conversation_id}?max_messages=20&max_tokens=300"))
    text = " ".join(re.sub(r"<[^>]+>", "", html.unescape(body)).split())
    # Said message 18 is row 20 of the conversation (a recall row and a summary row come before
    # it), and said message 21 is row 23.
    assert (
        "With these thresholds, the token estimate threshold would first be exceeded at message 20 "
        "(the message count threshold at message 23),"
    ) in text
    assert "leaves out the 2 checkpoint and recall rows" in text
    # What the agent did comes first, apart from the what-if.
    did, what_if = text.split("What the agent did", 1)[1].split("What if: the dashboard's trial thresholds")
    assert "The agent compacted this conversation 1 time" in did and "would" not in did
    assert "Worked out here from the stored messages, not what the agent ran with" in what_if
    rows = re.findall(r'<li class="message role-(\w+)(?: (\w+))?" id="m-([0-9A-Z]{26})">', body)
    assert [row[2] for row in rows] == ids
    fates = [(role, fate) for role, fate, _ in rows]
    assert fates[0] == ("recall", "") and fates[11] == ("summary", ""), (
        "left out, so neither kept nor summarised"
    )
    said = [fate for role, fate in fates if role not in ("recall", "summary")]
    assert said == ["summarised"] * 12 + ["kept"] * 12
    (marked,) = [
        chunk for chunk in body.split('<li class="message')[1:] if "threshold first exceeded here" in chunk
    ]
    assert f'id="m-{ids[19]}"' in marked
    if persist:
        assert "each message summarised once" in text and "every turn from there on" not in text
    else:
        assert "compaction would fire on every turn from there on" in text and "summarised once" not in text


@pytest.mark.parametrize(
    ("config", "shown", "absent"),
    [
        (
            {},
            [
                "The PII guard would block this turn.",
                "email found in memory key customer_contact",
                "email found in memory key escalation_contact",
                "email found in user message",
            ],
            ["[email]"],
        ),
        (
            {"PII_ALLOW_KEYS": "escalation_contact"},
            [
                "The PII guard would block this turn.",
                "email found in memory key customer_contact",
                "Allowed by CLAW_PII_ALLOW_KEYS, so never blocked or redacted: "
                "email in memory key escalation_contact.",
            ],
            ["email found in memory key escalation_contact"],
        ),
        (
            {"PII_GUARD": "redact", "PII_ALLOW_KEYS": "escalation_contact"},
            [
                "The PII guard would redact this turn:",
                "email found in memory key customer_contact",
                "Text sent to the model (redacted)",
                "write to [email] about",
                "Reply to [email] please",
                "support-lead@northwind.example",
            ],
            ["jo.bloggs@example.com", "jane@example.com", "would block"],
        ),
        (
            {"PII_GUARD": "warn"},
            [
                "The PII guard would send this turn unchanged, with a warning",
                "email found in user message",
                "jo.bloggs@example.com",
                "Reply to jane@example.com please",
            ],
            ["[email]", "would block"],
        ),
        (
            {"PII_GUARD": "off"},
            ["The PII guard is off (CLAW_PII_GUARD=off): nothing is scanned.", "jane@example.com"],
            ["found in", "[email]", "would block"],
        ),
    ],
    ids=["block", "block-allowed", "redact-allowed", "warn", "off"],
)
def test_the_injection_preview_shows_what_the_configured_guard_would_do(
    make_app: Callable[..., Flask], config: dict[str, str], shown: list[str], absent: list[str]
) -> None:
    app = make_app(**config)
    with app.app_context():
        state.memory().set("escalation_contact", OPERATOR_CONTACT)
        state.memory().set("customer_contact", CUSTOMER_CONTACT)
    client = signed_in_client(app)
    message = "Who handles escalation for this customer's damaged delivery? Reply to jane@example.com please"
    # The result fragment alone: the guard's verdict and the text sent, before the entry table.
    fragment = client.get(
        "/preview",
        query_string={"message": message},
        headers={"HX-Request": "true", "HX-Target": "preview-result"},
    )
    body = page_text(fragment).split('<table class="list decisions">', 1)[0]
    text = " ".join(re.sub(r"<[^>]+>", "", html.unescape(body)).split())
    assert "- customer_contact:" in text and "- escalation_contact:" in text, "both entries are injected"
    for phrase in shown:
        assert phrase in text
    for phrase in absent:
        assert phrase not in text


def test_the_demo_allows_its_escalation_contact_and_still_catches_a_customers_email(
    app: Flask, demo: None, make_app: Callable[..., Flask], clock: FakeClock
) -> None:
    config = Path(app.instance_path) / "config.py"
    assert 'PII_ALLOW_KEYS = "escalation_contact"' in config.read_text(encoding="utf-8").replace("'", '"')
    again = app.test_cli_runner().invoke(args=["claw", "demo", "--reset", "--yes"])
    assert again.exit_code == 0, again.output
    assert config.read_text(encoding="utf-8").count("PII_ALLOW_KEYS") == 1
    restarted = make_app()
    with restarted.app_context():
        settings = state.settings()
        assert (settings.pii_guard, settings.allowed_pii_keys) == ("block", ("escalation_contact",))
        assert state.setting_sources()["PII_ALLOW_KEYS"] == "instance config file"
        claw = Claw.from_settings(settings, EchoProvider(), clock=clock)
        reply = claw.send("Question number 0 about delivery slots")
        assert "escalation_contact" in reply.augment.injected_keys
        with pytest.raises(GuardBlocked, match="email found in user message") as blocked:
            claw.send("Send it to jane@example.com please")
        assert "escalation_contact" not in str(blocked.value)


def test_the_demo_says_so_and_writes_nothing_when_the_allowed_keys_are_set(
    make_app: Callable[..., Flask], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAW_PII_ALLOW_KEYS", "vip_line")
    app = make_app()
    result = app.test_cli_runner().invoke(args=["claw", "demo"])
    assert result.exit_code == 0, result.output
    assert "CLAW_PII_ALLOW_KEYS is set (environment) without escalation_contact" in result.output
    assert not (Path(app.instance_path) / "config.py").exists()
