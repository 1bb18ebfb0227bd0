"""Realistic demo data: a small shop's support agent with memory, subjects and tool calls.

Everything is written through the real memory drivers on a fake clock that is moved back and
forth, so entries expire, conversations spread over three weeks, and messages get their own times.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from clawmem.clock import FakeClock
from clawmem.ids import new_id
from clawmem.memory.base import MemoryInterface
from clawmem.recall import MessageAugmenter
from clawmem.rules import DEFAULT_SUBJECT_NAMESPACE, subject_namespace
from clawmem.turn.conversations import ConversationLog, Message
from clawmem.turn.pipeline import recall_record
from dashboard.state import every_item

DAY = 86_400
HOUR = 3_600
DEMO_MARKER = "demo"
# The demo shop's own business address: an allowed key of the PII guard (flask claw demo says so).
DEMO_ALLOWED_KEY = "escalation_contact"
SUBJECTS = {"cust-1001": "Alice Moreau", "cust-2002": "Bob Okafor"}
OTHER_SUBJECTS = ["cust-3003", "cust-3004", "cust-3005", "cust-3006", ""]


@dataclass(frozen=True)
class DemoEntry:
    """One key/value fact; ``written_ago`` and ``ttl`` decide whether it is live, expiring or expired."""

    namespace: str
    key: str
    value: Any
    ttl: int | None = None
    written_ago: int = 0


@dataclass
class DemoReport:
    """What the demo wrote (or removed): key/value entries and conversations with their messages."""

    entries: int = 0
    conversations: int = 0
    messages: int = 0
    namespaces: set[str] = field(default_factory=set)


ENTRIES: tuple[DemoEntry, ...] = (
    DemoEntry(
        "default",
        "shipping_policy",
        "Orders ship within 2 business days from the Leeds warehouse; "
        "express delivery arrives the next working day.",
    ),
    DemoEntry(
        "default",
        "returns_policy",
        "Returns are accepted within 30 days with the receipt. Refunds go "
        "back to the original payment method within 5 days.",
    ),
    DemoEntry("default", "store_hours", "Support answers Monday to Friday, 9:00 to 17:30 UK time."),
    DemoEntry(
        "default",
        "brand_voice",
        {
            "tone": "warm and direct",
            "avoid": ["jargon", "exclamation marks"],
            "sign_off": "The Northwind team",
        },
    ),
    DemoEntry(
        "default", "loyalty_program", "Members earn 1 point per pound; 500 points give a 5 pound voucher."
    ),
    DemoEntry("default", "gift_wrapping", "Gift wrapping costs 3 pounds and is not available for furniture."),
    DemoEntry(
        "default",
        "warranty_terms",
        {
            "electronics_months": 24,
            "furniture_months": 12,
            "claims": "photo of the fault and the order number",
        },
    ),
    DemoEntry(
        "default",
        "escalation_contact",
        "Escalate damaged delivery complaints to the support lead at support-lead@northwind.example.",
    ),
    DemoEntry(
        "default", "holiday_sale", "20% off every winter jacket until Sunday.", ttl=3 * DAY, written_ago=HOUR
    ),
    DemoEntry(
        "default",
        "courier_strike",
        "Parcel delays of up to 2 days in the north-east because of a strike.",
        ttl=6 * HOUR,
        written_ago=2 * HOUR,
    ),
    DemoEntry(
        "default",
        "promo_code_spring",
        "SPRING10 gives 10% off orders over 50 pounds.",
        ttl=7 * DAY,
        written_ago=9 * DAY,
    ),
    DemoEntry(
        "default",
        "warehouse_backlog",
        "Orders placed on Monday ship one day late.",
        ttl=DAY,
        written_ago=3 * DAY,
    ),
    DemoEntry("user:cust-1001", "profile", {"name": "Alice Moreau", "language": "fr", "tier": "gold"}),
    DemoEntry(
        "user:cust-1001",
        "last_order",
        {"order_id": "A-20931", "status": "in transit", "items": ["rain jacket", "wool scarf"]},
    ),
    DemoEntry(
        "user:cust-1001",
        "open_ticket",
        "Delivery of A-20931 late; promised a call back.",
        ttl=2 * DAY,
        written_ago=5 * HOUR,
    ),
    DemoEntry("user:cust-2002", "profile", {"name": "Bob Okafor", "language": "en", "tier": "standard"}),
    DemoEntry("user:cust-2002", "preferences", "Prefers phone calls in the afternoon; no marketing email."),
    DemoEntry(
        "user:cust-2002",
        "refund_in_progress",
        {"order_id": "B-11870", "amount_pounds": 89.5},
        ttl=DAY,
        written_ago=4 * DAY,
    ),
    DemoEntry(
        "agent:scratch",
        "last_tool_error",
        "lookup_order timed out after 10 s",
        ttl=HOUR,
        written_ago=30 * HOUR,
    ),
    DemoEntry("agent:scratch", "rate_limit_reset", 1_700_000_000, ttl=15 * 60, written_ago=10 * 60),
    DemoEntry("agent:scratch", "model_hint", "Answer in the customer's language when it is known."),
)

# Entries rewritten once the conversations are loaded, so earlier turns were given an older value.
CHANGED_AFTERWARDS = (
    ("user:cust-1001", "last_order", {"order_id": "A-20931", "status": "delivered", "items": ["jacket"]}),
)

# (title, opening line with {name}, assistant reply, tool call or None, follow-up, closing reply)
TOPICS: tuple[tuple[str, str, str, dict[str, Any] | None, str, str], ...] = (
    (
        "Where is my order?",
        "Hi, this is {name}. My order {order} still hasn't arrived, where is it?",
        "Let me look that order up for you.",
        {
            "name": "lookup_order",
            "input": {"order_id": "{order}"},
            "result": '{{"status": "in transit", "eta": "tomorrow"}}',
        },
        "Is the warehouse backlog slowing it down?",
        "It is in transit and due tomorrow, well before the weekend.",
    ),
    (
        "Returning a jacket",
        "Hello, {name} here. The rain jacket is too small, can I return it?",
        "Yes: returns are accepted within 30 days with the receipt.",
        None,
        "Do I get my money back or a voucher?",
        "The refund goes back to your original payment method.",
    ),
    (
        "Express delivery",
        "Can I get express delivery to Leeds? It's {name}.",
        "Express delivery arrives the next working day.",
        None,
        "And if I order on Friday evening?",
        "Then it ships Monday and arrives Tuesday.",
    ),
    (
        "Damaged parcel",
        "My parcel arrived damaged, the box was crushed. {name}, order {order}.",
        "I'm sorry to hear that. I'll open a claim for you.",
        {
            "name": "open_claim",
            "input": {"order_id": "{order}", "reason": "damaged"},
            "result": '{{"claim": "C-5521"}}',
        },
        "Do you need photos?",
        "Yes please: a photo of the damage and the order number are enough.",
    ),
    (
        "Warranty question",
        "Is my kettle still under warranty? I'm {name}.",
        "Electronics have a 24-month warranty.",
        None,
        "It's 20 months old and stopped heating.",
        "Then it is covered; send a photo of the fault and the order.",
    ),
    (
        "Loyalty points",
        "How many loyalty points do I have? {name} speaking.",
        "Let me check your account.",
        {"name": "loyalty_balance", "input": {"customer": "{subject}"}, "result": '{{"points": 640}}'},
        "Can I use them today?",
        "Yes, 500 points give you a 5 pound voucher at checkout.",
    ),
)


def _fill(template: Any, values: dict[str, str]) -> Any:
    if isinstance(template, str):
        return template.format(**values)
    if isinstance(template, dict):
        return {key: _fill(item, values) for key, item in template.items()}
    return template


def _turns(topic: tuple[Any, ...], values: dict[str, str], system: bool) -> Iterator[list[dict[str, Any]]]:
    # Yields the messages of each turn; the conversation is saved after every one, as an agent does.
    _, opening, reply, tool, follow_up, closing = topic
    first: list[dict[str, Any]] = []
    if system:
        first.append({"role": "system", "content": "You are Northwind's support agent. Be brief and kind."})
    first.append({"role": "user", "content": _fill(opening, values)})
    if tool is not None:
        call = _fill(tool, values)
        first.append(
            {"role": "assistant", "content": reply, "tool_name": call["name"], "tool_input": call["input"]}
        )
        first.append({"role": "tool", "content": call["result"], "tool_name": call["name"]})
    else:
        first.append({"role": "assistant", "content": reply})
    yield first
    yield [{"role": "user", "content": follow_up}, {"role": "assistant", "content": closing}]


def _long_turns(values: dict[str, str], count: int) -> Iterator[list[dict[str, Any]]]:
    # One long conversation, so the compaction analysis has something to show.
    yield [{"role": "user", "content": f"Hi, {values['name']} again, I need help planning a big order."}]
    for number in range(count):
        yield [
            {"role": "assistant", "content": f"Noted item {number + 1}. Shall I check stock for it?"},
            {
                "role": "user",
                "content": f"Yes, and add item {number + 2}: a set of {number + 2} oak chairs, "
                "delivered to the Leeds office before the end of the month.",
            },
        ]


def _namespace(entry: DemoEntry, template: str) -> str:
    # The customers' own facts go to their subject namespaces, wherever the site keeps those.
    for subject in SUBJECTS:
        if entry.namespace == subject_namespace(subject):
            return subject_namespace(subject, template)
    return entry.namespace


def _with_usage(
    added: list[dict[str, Any] | Message], sent_bytes: int
) -> tuple[list[dict[str, Any] | Message], int, int]:
    """Return ``added`` with each assistant message carrying the usage a provider would report
    for it (about four bytes a token), the tokens of the turn, and the bytes sent so far."""
    rows: list[dict[str, Any] | Message] = []
    tokens = 0
    for message in added:
        role, content = (
            (message.role, message.content)
            if isinstance(message, Message)
            else (message["role"], message.get("content"))
        )
        if role == "assistant":
            prompt = sent_bytes // 4 + 40
            completion = max(1, len((content or "").encode()) // 4)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            message = (
                dataclasses.replace(message, metadata={"usage": usage})
                if isinstance(message, Message)
                else {**message, "metadata": {"usage": usage}}
            )
            tokens += prompt + completion
        if role != "recall":
            sent_bytes += len((content or "").encode())
        rows.append(message)
    return rows, tokens, sent_bytes


def load_demo(
    memory: MemoryInterface,
    conversations: ConversationLog,
    clock: FakeClock,
    now: float,
    subject_template: str = DEFAULT_SUBJECT_NAMESPACE,
    seed: int = 7,
) -> DemoReport:
    """Write the demo data through ``memory`` and ``conversations`` (which read ``clock``),
    ending at ``now``. The customers' own facts go to their subject namespaces.

    Returns what was written. The caller builds both on ``clock``; this function moves it.
    """
    report = DemoReport()
    chooser = random.Random(seed)
    recall = MessageAugmenter(memory, announce=False)
    start = now - 21 * DAY
    for entry in ENTRIES:
        # Facts that never expire were there before the first conversation; the others were
        # written when their TTL needs them to be live, expiring or expired now.
        clock.now = start - DAY if entry.ttl is None else now - entry.written_ago
        namespace = _namespace(entry, subject_template)
        memory.set(entry.key, entry.value, namespace, ttl=entry.ttl)
        report.entries += 1
        report.namespaces.add(namespace)
    subjects = [*SUBJECTS, *SUBJECTS, *OTHER_SUBJECTS]
    for number in range(30):
        subject = subjects[number % len(subjects)]
        name = SUBJECTS.get(subject, "a customer")
        order = f"{'AB'[number % 2]}-{20900 + number}"
        values = {"name": name, "order": order, "subject": subject or "guest"}
        topic = TOPICS[number % len(TOPICS)]
        turns = _long_turns(values, 24) if number == 29 else _turns(topic, values, system=number % 5 == 0)
        title = "Planning a large office order" if number == 29 else topic[0]
        clock.now = start + number * 16 * HOUR + chooser.randint(0, 3 * HOUR)
        conversation_id = new_id()
        metadata = {"channel": chooser.choice(["web", "email", "app"]), DEMO_MARKER: True}
        sent_bytes = 0
        for turn in turns:
            said = [_with_recall(recall, message, subject, subject_template) for message in turn]
            added = [message for pair in said for message in pair]
            # As a provider bills: the history sent as the prompt, the reply as the completion.
            # Every seventh conversation's provider reports no usage, as some do.
            tokens = None
            if number % 7 != 3:
                added, tokens, sent_bytes = _with_usage(added, sent_bytes)
            conversations.append(
                conversation_id, added, user_id=subject, title=title, metadata=metadata, tokens=tokens
            )
            report.messages += len(added)
            clock.advance(chooser.randint(40, 400))
        report.conversations += 1
    clock.now = now
    # Changed since the turns that were given it: the conversation page marks it so.
    # (In a namespace without expired entries: a write to one sweeps them on the file driver.)
    for namespace, key, value in CHANGED_AFTERWARDS:
        memory.set(key, value, _namespace(DemoEntry(namespace, key, value), subject_template))
    return report


def _with_recall(
    recall: MessageAugmenter, message: dict[str, Any], subject: str, template: str
) -> list[dict[str, Any] | Message]:
    """Return a user message preceded by the recall record a turn would have stored for it."""
    if message["role"] != "user":
        return [message]
    augment = recall.augment(message["content"], subject_namespace(subject, template) if subject else None)
    return [recall_record(augment), message]


def remove_demo(memory: MemoryInterface, conversations: ConversationLog, subject_template: str) -> DemoReport:
    """Delete the demo's keys (live or expired) and every conversation marked as demo data; return
    the keys tried and the conversations and messages deleted."""
    report = DemoReport()
    for entry in ENTRIES:
        namespace = _namespace(entry, subject_template)
        memory.forget(entry.key, namespace)
        report.entries += 1
        report.namespaces.add(namespace)
    # Collected in full before deleting, so no deletion happens under the listing's cursor.
    marked = list(_demo_conversation_ids(conversations))
    for conversation_id in marked:
        deleted, messages = conversations.delete(conversation_id)
        report.conversations += deleted
        report.messages += messages
    return report


def demo_loaded(conversations: ConversationLog) -> bool:
    """Return whether any conversation marked as demo data exists (stops at the first)."""
    return next(_demo_conversation_ids(conversations), None) is not None


def _demo_conversation_ids(conversations: ConversationLog) -> Iterator[str]:
    listed = every_item(lambda cursor: conversations.list(limit=500, cursor=cursor))
    return (c.id for c in listed if (c.metadata or {}).get(DEMO_MARKER) is True)
