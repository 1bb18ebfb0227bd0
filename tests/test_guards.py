"""PiiGuard: what it detects, where it says the match came from, and that it never repeats the match."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawmem import events
from clawmem.errors import GuardBlocked
from clawmem.guards import GuardFinding, PiiGuard, luhn_valid
from clawmem.memory.array import ArrayMemory
from clawmem.recall import MessageAugmenter
from clawmem.skills import Skill, SkillRegistry


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
