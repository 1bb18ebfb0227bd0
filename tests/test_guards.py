"""PiiGuard: what it detects, where it says the match came from, and that it never repeats the match."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawmem import events
from clawmem.clock import FakeClock
from clawmem.errors import ConfigError, GuardBlocked
from clawmem.memory.array import ArrayMemory
from clawmem.providers import EchoProvider, OpenAICompatibleProvider
from clawmem.recall import AugmentResult, MessageAugmenter
from clawmem.settings import Settings
from clawmem.sql.engine import create_engine, engine_for
from clawmem.sql.schema import create_tables
from clawmem.turn.compaction import HistoryCompactor, ProviderSummarizer
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.guards import GuardFinding, PiiGuard, RedactingGuard, luhn_valid
from clawmem.turn.pipeline import Claw
from clawmem.turn.skills import Skill, SkillRegistry

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

pytest_plugins = ["tests.loopback"]


def patterns(text: str) -> list[str]:
    return [finding.pattern for finding in PiiGuard("warn").check(text)]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("write to ana.ruiz+shop@example.co.uk please", ["email"]),
        ("card 4111 1111 1111 1111 exp 12/29", ["card number"]),
        ("card 4111-1111-1111-1111", ["card number"]),
        ("card 4111111111111111", ["card number"]),
        ("amex 378282246310005", ["card number"]),
        ("ssn 123-45-6789", ["SSN"]),
        ("ssn 123 45 6789", ["SSN"]),
        ("call (555) 123-4567 today", ["phone number"]),
        ("call 555-123-4567", ["phone number"]),
        ("call 555.123.4567", ["phone number"]),
        ("call +1 555 123 4567", ["phone number"]),
        ("ring +44 20 7946 0958", ["phone number"]),
        ("mail a@b.io or call 555-123-4567", ["email", "phone number"]),
        # Near misses that must not block a turn.
        ("card 4111 1111 1111 1112", []),  # fails Luhn
        ("id 411111111111", []),  # 12 digits
        ("ref 41111111111111111111", []),  # 20 digits
        ("ssn 000-12-3456 or 123-00-4567 or 123-45 6789", []),
        ("timestamp 1700000000 and 5551234567", []),
        ("released 2024-01-15 as v1.2.3", []),
        ("user@localhost", []),
        ("order #12345, total 99.90 EUR", []),
    ],
)
def test_detection(text: str, found: list[str]) -> None:
    assert patterns(text) == found


@given(
    body=st.lists(st.integers(0, 9), min_size=12, max_size=18),
    separator=st.sampled_from(["", " ", "-"]),
)
def test_every_luhn_valid_card_is_found_in_groups_of_four(body: list[int], separator: str) -> None:
    check = next(d for d in range(10) if luhn_valid("".join(map(str, body)) + str(d)))
    digits = "".join(map(str, body)) + str(check)
    grouped = separator.join(digits[i : i + 4] for i in range(0, len(digits), 4))
    assert patterns(f"my card is {grouped}, thanks") == ["card number"]


def test_luhn() -> None:
    assert luhn_valid("79927398713")
    assert not luhn_valid("79927398710")


def test_findings_are_distinct_and_in_text_order() -> None:
    text = "call 555-123-4567 or mail a@b.io or b@c.io"
    assert PiiGuard("warn").check(text) == [
        GuardFinding("phone number", "user message"),
        GuardFinding("email", "user message"),
    ]


@pytest.fixture
def recorded() -> Any:
    seen: list[dict[str, Any]] = []
    events.on("guard.blocked", seen.append)
    yield seen
    events.off("guard.blocked", seen.append)


def test_a_recalled_memory_entry_blocks_and_is_named(clock: Any, recorded: list[dict[str, Any]]) -> None:
    memory = ArrayMemory(clock=clock)
    memory.set("customer_contact", "reach the customer at jo@example.com")
    augmented = MessageAugmenter(memory).augment("how do I reach the customer?")
    with pytest.raises(GuardBlocked) as blocked:
        PiiGuard().check(augmented)
    message = str(blocked.value)
    assert message == "PII guard blocked the turn: email found in memory key customer_contact"
    assert "jo@example.com" not in message
    assert blocked.value.findings == (GuardFinding("email", "memory key customer_contact"),)
    assert recorded == [
        {
            "event": "guard.blocked",
            "run_id": None,
            "guard": "pii",
            "findings": [{"pattern": "email", "source": "memory key customer_contact"}],
        }
    ]


def test_sources_split_between_user_text_memory_keys_and_skills(clock: Any) -> None:
    memory = ArrayMemory(clock=clock)
    memory.set("billing", "card on file 4111 1111 1111 1111")
    memory.set("shipping", "ships from the warehouse")
    skills = SkillRegistry([Skill("escalation", "escalate billing issues", "Escalate to +44 20 7946 0958.")])
    augmented = MessageAugmenter(memory, skills=skills).augment("billing question from ana@example.org")
    assert PiiGuard("warn").check(augmented) == [
        GuardFinding("phone number", "skill escalation"),
        GuardFinding("card number", "memory key billing"),
        GuardFinding("email", "user message"),
    ]


def test_non_blocking_guard_reports_without_raising_or_emitting(recorded: list[dict[str, Any]]) -> None:
    guard = PiiGuard("warn")
    assert guard.check("ssn 123-45-6789") == [GuardFinding("SSN", "user message")]
    assert recorded == []


def test_blocking_guard_passes_clean_text(recorded: list[dict[str, Any]]) -> None:
    assert PiiGuard().check("where is my order 1234?") == []
    assert recorded == []


def test_find_never_raises_even_when_blocking() -> None:
    assert PiiGuard().find("ssn 123-45-6789") == [GuardFinding("SSN", "user message")]
    with pytest.raises(TypeError):
        PiiGuard().find(42)  # type: ignore[arg-type]


# -- modes (SPEC 7) -------------------------------------------------------------------------------

CUSTOMER_CARD = "card on file 4111 1111 1111 1111, SSN 123-45-6789"
OPERATOR_CONTACT = "Escalate damaged deliveries to the support lead at support-lead@northwind.example."
SECRETS = ("jane@example.com", "4111 1111 1111 1111", "123-45-6789", "555-123-4567")


@pytest.fixture
def conversations(tmp_path: Path, clock: FakeClock) -> Iterator[ConversationLog]:
    """A conversation log on a fresh SQLite file (the guard does not depend on the backend)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'guard.db'}")
    create_tables(engine)
    yield ConversationLog(engine, clock=clock)
    engine.dispose()


def test_redact_sends_no_match_to_a_real_provider(
    loopback: LoopbackCompletions, conversations: ConversationLog, clock: FakeClock
) -> None:
    memory = ArrayMemory(clock=clock)
    memory.set("customer_card", CUSTOMER_CARD)
    provider = OpenAICompatibleProvider(loopback.url, "m")
    # Compaction after two turns sends the earlier turns to a summariser over the same server.
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages=3)
    guards = [PiiGuard("redact")]
    claw = Claw(memory, conversations, provider, compactor=compactor, guards=guards, clock=clock)
    first = claw.send("Send the card receipt to jane@example.com please")
    assert first.augment.findings == (
        GuardFinding("card number", "memory key customer_card"),
        GuardFinding("SSN", "memory key customer_card"),
        GuardFinding("email", "user message"),
    )
    later = [
        claw.send(text, first.conversation_id)
        for text in ("Or call me on 555-123-4567 about the card", "Thanks!", "Anything else?")
    ]
    assert any(reply.compaction.fired for reply in later)
    assert len(loopback.bodies) >= 5, "every turn and every summary reached the server"
    received = loopback.received
    for secret in SECRETS:
        assert secret not in received
    for label in ("[email]", "[card]", "[ssn]", "[phone]"):
        assert label in received
    # The host keeps what the customer said; only what leaves it is redacted.
    said = [m.content for m in conversations.messages(first.conversation_id).items if m.role == "user"]
    assert said[:2] == [
        "Send the card receipt to jane@example.com please",
        "Or call me on 555-123-4567 about the card",
    ]


def test_redact_history_replaces_matches_in_content_and_tool_input_only_when_redacting() -> None:
    history = [
        {"role": "user", "content": "mail jane@example.com or call 555-123-4567"},
        {"role": "tool", "content": "", "tool_name": "notify", "tool_input": {"to": ["jane@example.com"]}},
    ]
    assert PiiGuard("redact").redact_history(history) == [
        {"role": "user", "content": "mail [email] or call [phone]"},
        {"role": "tool", "content": "", "tool_name": "notify", "tool_input": {"to": ["[email]"]}},
    ]
    for mode in ("block", "warn", "off"):
        assert PiiGuard(mode).redact_history(history) == history


def contacts(clock: FakeClock) -> MessageAugmenter:
    memory = ArrayMemory(clock=clock)
    memory.set("escalation_contact", OPERATOR_CONTACT)
    memory.set("customer_contact", "the customer asked us to write to jo.bloggs@example.com")
    return MessageAugmenter(memory)


def test_allow_keys_let_the_operators_key_through_and_still_catch_a_customers_email(clock: FakeClock) -> None:
    augmented = contacts(clock).augment("who handles escalation of a damaged delivery for this customer?")
    assert sorted(augmented.injected_keys) == ["customer_contact", "escalation_contact"]
    with pytest.raises(GuardBlocked) as blocked:
        PiiGuard("block", allow_keys=["escalation_contact"]).apply(augmented)
    assert blocked.value.findings == (GuardFinding("email", "memory key customer_contact"),)
    redacted = PiiGuard("redact", allow_keys=["escalation_contact"]).apply(augmented)
    assert "support-lead@northwind.example" in redacted.text
    assert "jo.bloggs@example.com" not in redacted.text and "write to [email]" in redacted.text
    both = PiiGuard("block", allow_keys=["escalation_contact", "customer_contact"])
    assert both.apply(augmented) is augmented


def test_warn_sends_the_text_unchanged_and_reports_findings(
    conversations: ConversationLog, clock: FakeClock, recorded: list[dict[str, Any]]
) -> None:
    provider = EchoProvider()
    claw = Claw(ArrayMemory(clock=clock), conversations, provider, guards=[PiiGuard("warn")], clock=clock)
    reply = claw.send("Send it to jane@example.com please")
    assert provider.requests[-1][-1]["content"] == "Send it to jane@example.com please"
    assert reply.augment.findings == (GuardFinding("email", "user message"),)
    assert recorded == []


def test_off_finds_nothing_and_sends_the_text_unchanged(
    conversations: ConversationLog, clock: FakeClock
) -> None:
    guard = PiiGuard("off")
    assert guard.find("ssn 123-45-6789, jane@example.com") == []
    assert guard.check("ssn 123-45-6789, jane@example.com") == []
    provider = EchoProvider()
    reply = Claw(ArrayMemory(clock=clock), conversations, provider, guards=[guard], clock=clock).send(
        "ssn 123-45-6789"
    )
    assert provider.requests[-1][-1]["content"] == "ssn 123-45-6789"
    assert reply.augment.findings == ()


def test_claw_from_settings_builds_the_guard_from_the_environment(tmp_path: Path, clock: FakeClock) -> None:
    environ = {
        "CLAW_MEMORY_DRIVER": "array",
        "CLAW_PII_GUARD": "Redact",
        "CLAW_PII_ALLOW_KEYS": " escalation_contact, ,vip_line ",
    }
    settings = Settings.from_env(environ, tmp_path)
    create_tables(engine_for(settings.database_url))
    extra = PiiGuard("block", allow_keys=["escalation_contact"])
    provider = EchoProvider()
    claw = Claw.from_settings(settings, provider, clock=clock, guards=[extra])
    configured, added = claw.guards
    assert (configured.mode, configured.allow_keys) == ("redact", {"escalation_contact", "vip_line"})
    assert added is extra
    claw.memory.set("escalation_contact", OPERATOR_CONTACT)
    reply = claw.send("Please escalate the damaged delivery, my address is jane@example.com")
    sent = provider.requests[-1][-1]["content"]
    assert "support-lead@northwind.example" in sent and "jane@example.com" not in sent
    assert reply.augment.findings == (GuardFinding("email", "user message"),)
    default = Claw.from_settings(Settings.from_env({"CLAW_MEMORY_DRIVER": "array"}, tmp_path), provider)
    (guard,) = default.guards
    assert (guard.mode, guard.allow_keys) == ("block", frozenset())


@pytest.mark.parametrize("raw", ["loud", "blocking", "true"])
def test_a_bad_pii_guard_setting_is_a_config_error_naming_the_variable(raw: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"CLAW_PII_GUARD must be one of block, redact, warn, off") as error:
        Settings.from_env({"CLAW_PII_GUARD": raw}, tmp_path)
    assert repr(raw) in str(error.value)
    with pytest.raises(ValueError, match="PII guard mode must be one of"):
        PiiGuard(raw)


class _Shouting:
    """An application's own guard that only checks the turn's text."""

    def apply(self, augmented: AugmentResult) -> AugmentResult:
        return augmented


class _HidingCodes(_Shouting):
    """An application's own redacting guard: earlier turns' order codes are hidden too."""

    def redact_history(self, history: Any) -> list[dict[str, Any]]:
        return [
            {**message, "content": str(message.get("content", "")).replace("A-17", "[code]")}
            for message in history
        ]


def test_a_guard_that_redacts_history_is_told_so_by_its_protocol(
    conversations: ConversationLog, clock: FakeClock
) -> None:
    assert isinstance(PiiGuard(), RedactingGuard) and isinstance(_HidingCodes(), RedactingGuard)
    assert not isinstance(_Shouting(), RedactingGuard)
    provider = EchoProvider()
    guards = [_Shouting(), _HidingCodes()]
    claw = Claw(ArrayMemory(clock=clock), conversations, provider, guards=guards, clock=clock)
    first = claw.send("Where is order A-17?")
    claw.send("Any news?", first.conversation_id)
    earlier = provider.requests[-1][:-1]
    assert earlier and all("A-17" not in str(message.get("content")) for message in earlier)
    assert "[code]" in str(earlier)
