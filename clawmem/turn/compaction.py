"""Compaction: summarising the older half of a long history so the rest fits the window.

Triggers are strict: ``len(history) > max_messages`` or ``estimate_tokens(history) >
max_tokens``, each only when its threshold is above 0; when both trip, the reason is
``"messages"``. ``context.overflow`` is emitted whenever a trigger trips, whether or not
compaction then runs (it does not when ``enabled`` is false or nothing is old enough to
summarise). Compaction shapes only what is sent to the provider; the stored conversation is
never rewritten.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clawmem import events
from clawmem.providers.base import ChatMessage
from clawmem.recall.words import keywords
from clawmem.rules import validate_count
from clawmem.settings import Settings
from clawmem.sql.conversations import MessageSize, StoredMessage
from clawmem.text import clip, utf8_len

log = logging.getLogger(__name__)

SUMMARY_PREFIX = "[Conversation summary]\n"
SUMMARY_UNAVAILABLE = "(summary unavailable)"
SUMMARY_INSTRUCTION = "Summarise the conversation above in 2\u20133 sentences. Be concise."
BYTES_PER_TOKEN = 4
SUMMARISED_ROLES = ("user", "assistant")  # the only messages the extractive summary reads


@dataclass(frozen=True)
class Summary:
    """What a summariser may return instead of plain text: the text and the provider's token
    usage for the call that made it."""

    text: str
    usage: Mapping[str, Any] | None = None


Summarizer = Callable[[list[dict[str, Any]]], "str | Summary"]


def message_bytes(message: ChatMessage) -> int:
    """Return the UTF-8 size of a message's content plus the JSON of its ``tool_input``."""
    return utf8_len(message.get("content") or "") + tool_input_bytes(message.get("tool_input"))


def tool_input_bytes(tool_input: Any) -> int:
    """Return the UTF-8 size of ``tool_input`` as JSON, as a turn counts it (0 for ``None``)."""
    return 0 if tool_input is None else utf8_len(json.dumps(tool_input))


def history_bytes(history: Sequence[ChatMessage]) -> int:
    """Return the total :func:`message_bytes` of ``history``."""
    return sum(message_bytes(message) for message in history)


def estimate_tokens(history: Sequence[ChatMessage]) -> int:
    """Return the seed's token estimate: total message bytes integer-divided by 4."""
    return history_bytes(history) // BYTES_PER_TOKEN


def split_history(history: Sequence[ChatMessage]) -> tuple[int, int]:
    """Return ``(start, boundary)``: ``history[start:boundary]`` is summarised, the rest kept.

    A leading ``system`` message is set aside (``start`` is 1) and always kept. Of the other
    n messages the newest ceil(n/2) are kept; the boundary then moves earlier while the first
    kept message is a ``tool`` row, so a tool row stays with the assistant turn that called it.
    """
    return split_roles([message.get("role") for message in history])


def split_roles(roles: Sequence[str | None]) -> tuple[int, int]:
    """Return :func:`split_history` of a history with these roles."""
    start = 1 if roles and roles[0] == "system" else 0
    count = len(roles) - start
    boundary = start + count - (count + 1) // 2
    while boundary > start and roles[boundary] == "tool":
        boundary -= 1
    return start, boundary


@dataclass(frozen=True)
class CompactionResult:
    """What compaction did: ``fired`` is true when messages were summarised.

    ``reason`` is the trigger that tripped (``"messages"``, ``"tokens"``) even when compaction
    did not fire; ``summary`` is the summary text; ``error`` is the summariser's exception class
    when it failed; ``provider_calls`` is 1 when the summariser called a provider, else 0, and
    ``usage`` is that call's token usage when the provider reported it. ``history[start:boundary]``
    of the input is what the summary replaced.
    """

    fired: bool
    reason: str | None
    history: tuple[dict[str, Any], ...]
    messages_before: int
    messages_after: int
    bytes_before: int
    bytes_after: int
    provider_calls: int = 0
    summarised: int = 0
    summary: str | None = None
    error: str | None = None
    start: int = 0
    boundary: int = 0
    usage: Mapping[str, Any] | None = None


class HistoryCompactor:
    """Replaces the older half of an oversized history with one summary message.

    Thresholds of 0 are off, so by default nothing ever fires.
    """

    def __init__(
        self, summarizer: Summarizer, max_messages: int = 0, max_tokens: int = 0, enabled: bool = True
    ) -> None:
        validate_count("max_messages", max_messages, " (0 = off)")
        validate_count("max_tokens", max_tokens, " (0 = off)")
        if not callable(summarizer):
            raise TypeError("summarizer must be callable: old messages in, summary text out")
        self.summarizer = summarizer
        self.max_messages = max_messages
        self.max_tokens = max_tokens
        self.enabled = enabled

    def trigger(self, history: Sequence[ChatMessage]) -> str | None:
        """Return ``"messages"`` or ``"tokens"`` when that threshold is exceeded, else ``None``."""
        # The size is only measured when a token threshold can use it.
        size = history_bytes(history) if self.max_tokens > 0 else 0
        return self._reason(len(history), size)

    def _reason(self, count: int, size: int) -> str | None:
        if self.max_messages > 0 and count > self.max_messages:
            return "messages"
        if self.max_tokens > 0 and size // BYTES_PER_TOKEN > self.max_tokens:
            return "tokens"
        return None

    def apply(self, history: Sequence[ChatMessage]) -> CompactionResult:
        """Return the history to send, compacted when a trigger trips; never raises for a
        failing summariser (the summary becomes ``(summary unavailable)``)."""
        messages = [dict(message) for message in history]
        size = history_bytes(messages)
        reason = self._reason(len(messages), size)
        start, boundary = split_history(messages)
        unchanged = CompactionResult(False, reason, tuple(messages), len(messages), len(messages), size, size)
        if reason is None:
            return unchanged
        if not self.enabled:
            action = "disabled"
        elif boundary == start:
            action = "nothing to summarise"
        else:
            action = "compact"
        events.emit(
            "context.overflow",
            reason=reason,
            messages=len(messages),
            estimated_tokens=size // BYTES_PER_TOKEN,
            max_messages=self.max_messages,
            max_tokens=self.max_tokens,
            action=action,
        )
        if action != "compact":
            return unchanged
        old = messages[start:boundary]
        events.emit(
            "compaction.before", reason=reason, messages=len(messages), bytes=size, summarised=len(old)
        )
        summary, usage, error = self._summarise(old)
        compacted = [
            *messages[:start],
            {"role": "assistant", "content": SUMMARY_PREFIX + summary},
            *messages[boundary:],
        ]
        result = CompactionResult(
            fired=True,
            reason=reason,
            history=tuple(compacted),
            messages_before=len(messages),
            messages_after=len(compacted),
            bytes_before=size,
            bytes_after=history_bytes(compacted),
            provider_calls=1 if getattr(self.summarizer, "uses_provider", False) else 0,
            summarised=len(old),
            summary=summary,
            error=error,
            start=start,
            boundary=boundary,
            usage=usage,
        )
        events.emit(
            "compaction.after",
            reason=reason,
            messages_before=result.messages_before,
            messages_after=result.messages_after,
            bytes_before=result.bytes_before,
            bytes_after=result.bytes_after,
            provider_calls=result.provider_calls,
            usage=dict(usage) if usage else None,
            failed=error is not None,
        )
        return result

    def _summarise(self, old: list[dict[str, Any]]) -> tuple[str, Mapping[str, Any] | None, str | None]:
        try:
            summary = self.summarizer([dict(message) for message in old])
            if isinstance(summary, Summary):
                text, usage = summary.text, summary.usage
            elif isinstance(summary, str):
                text, usage = summary, None
            else:
                raise TypeError(f"a summariser must return str or Summary, got {type(summary).__name__}")
        except Exception as exc:  # the summariser's boundary (a provider call, or the caller's code)
            # The class only: the message may quote conversation text.
            log.warning("compaction summary unavailable: %s", type(exc).__name__)
            return SUMMARY_UNAVAILABLE, None, type(exc).__name__
        return (text.strip() or SUMMARY_UNAVAILABLE), usage, None


class ProviderSummarizer:
    """Asks an LLM provider for a 2–3 sentence summary of the old messages (one call)."""

    uses_provider = True

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def __call__(self, messages: list[dict[str, Any]]) -> Summary:
        """Return the provider's summary and the call's token usage; raises whatever the provider raises."""
        reply = self.provider.complete([*messages, {"role": "user", "content": SUMMARY_INSTRUCTION}])
        return Summary(reply.text, reply.usage)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def _sentences(text: str) -> list[str]:
    return [part.strip() for part in _SENTENCE_END.split(text.strip()) if part.strip()]


class ExtractiveSummarizer:
    """A local, deterministic summary that sends nothing anywhere.

    It keeps the first sentence of the first user message, then the (at most) two sentences
    that share the most words recurring across several messages, in conversation order, each
    labelled with its role; at most ``max_chars`` characters in all.
    """

    uses_provider = False

    def __init__(self, max_chars: int = 600, sentence_chars: int = 200) -> None:
        if max_chars < 20 or sentence_chars < 20:
            raise ValueError("max_chars and sentence_chars must be at least 20")
        self.max_chars = max_chars
        self.sentence_chars = sentence_chars

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        """Return the summary of ``messages`` (empty when they hold no user or assistant text)."""
        candidates: list[tuple[str, str, set[str]]] = []
        message_count: Counter[str] = Counter()
        for message in messages:
            if message.get("role") not in SUMMARISED_ROLES:
                continue
            # Sentences split at whitespace, which no word spans: a message's words are those of
            # its sentences, so each sentence is tokenised once.
            content = message.get("content") or ""
            sentences = [(sentence, set(keywords(sentence))) for sentence in _sentences(content)]
            message_count.update(set().union(*(words for _, words in sentences)))
            candidates.extend((message["role"], sentence, words) for sentence, words in sentences)
        recurring = {word for word, count in message_count.items() if count > 1}
        weight = [len(recurring & words) for _, _, words in candidates]
        opening = next((index for index, (role, _, _) in enumerate(candidates) if role == "user"), None)
        chosen = {opening} if opening is not None else set()
        ranked = heapq.nsmallest(
            2,
            (index for index in range(len(candidates)) if index not in chosen),
            key=lambda index: (-weight[index], index),
        )
        chosen.update(index for index in ranked if weight[index] > 0)
        parts = [
            f"{role}: {clip(sentence, self.sentence_chars)}"
            for index, (role, sentence, _) in enumerate(candidates)
            if index in chosen
        ]
        return clip(" ".join(parts), self.max_chars) if parts else ""


# -- analysis: what compaction would do to a stored conversation ---------------------------


def thresholds(max_messages: int, max_tokens: int) -> dict[str, Any]:
    """Return ``max_messages``, ``max_tokens`` and ``enabled`` (whether either is on; 0 = off)."""
    enabled = max_messages > 0 or max_tokens > 0
    return {"max_messages": max_messages, "max_tokens": max_tokens, "enabled": enabled}


def configured_thresholds(settings: Settings) -> dict[str, Any]:
    """Return :func:`thresholds` of the compaction settings of this site."""
    return thresholds(settings.compact_max_messages, settings.compact_max_tokens)


def as_history(messages: Sequence[StoredMessage]) -> list[dict[str, Any]]:
    """Return stored messages as the history dicts the compactor reads."""
    return [
        {"role": m.role, "content": m.content, "tool_name": m.tool_name, "tool_input": m.tool_input}
        for m in messages
    ]


def first_crossings(history: Sequence[ChatMessage], max_messages: int, max_tokens: int) -> dict[str, int]:
    """Return, per threshold that ``history`` exceeds, the 1-based message at which it was first
    exceeded: ``{"messages": 21, "tokens": 18}``. Thresholds of 0 are off and never listed."""
    return crossings_of_sizes([message_bytes(message) for message in history], max_messages, max_tokens)


def crossings_of_sizes(sizes: Sequence[int], max_messages: int, max_tokens: int) -> dict[str, int]:
    """Return :func:`first_crossings` of a history whose messages have these :func:`message_bytes`."""
    found: dict[str, int] = {}
    if max_messages > 0 and len(sizes) > max_messages:
        found["messages"] = max_messages + 1
    if max_tokens > 0:
        total = 0
        for position, size in enumerate(sizes, start=1):
            total += size
            if total // BYTES_PER_TOKEN > max_tokens:
                found["tokens"] = position
                break
    return found


def size_of(message: StoredMessage) -> MessageSize:
    """Return the :class:`~clawmem.sql.conversations.MessageSize` of a message read in full."""
    return MessageSize(message.id, message.role, utf8_len(message.content or ""), message.tool_input)


def analyse(messages: Sequence[StoredMessage], max_messages: int, max_tokens: int) -> dict[str, Any]:
    """Return what compaction would do to this history under the given thresholds (0 = off).

    Keys: ``enabled``, ``reason`` (the threshold that was exceeded first, or ``None``),
    ``first_fire`` (the 1-based message at which it was), ``crossings`` (each exceeded threshold
    with its first message), ``summarised_ids``, counts, bytes, tokens, and a local extractive
    ``summary`` of what would be summarised.
    """
    by_id = {message.id: message for message in messages}
    return analyse_sizes(
        [size_of(message) for message in messages],
        max_messages,
        max_tokens,
        lambda ids: [by_id[message_id] for message_id in ids],
    )


def analyse_sizes(
    sizes: Sequence[MessageSize],
    max_messages: int,
    max_tokens: int,
    read: Callable[[list[str]], Sequence[StoredMessage]],
) -> dict[str, Any]:
    """Return :func:`analyse` of the messages with these sizes (a history's ids, roles and sizes,
    in order). Only the text the summary is made from is read, with ``read(ids)``, which returns
    those messages in the order of ``ids`` and is called only when something would be summarised."""
    validate_count("max_messages", max_messages, " (0 = off)")
    validate_count("max_tokens", max_tokens, " (0 = off)")
    each = [size.content_bytes + tool_input_bytes(size.tool_input) for size in sizes]
    crossings = crossings_of_sizes(each, max_messages, max_tokens)
    # The earlier crossing is the one that fired; on a tie, the message count is named.
    reason = min(crossings, key=lambda name: (crossings[name], name != "messages")) if crossings else None
    start, boundary = split_roles([size.role for size in sizes])
    summarised = slice(start, boundary) if reason else slice(0, 0)
    old = sizes[summarised]
    fires_at = crossings[reason] if reason else None
    total = sum(each)
    # The summariser reads only user and assistant text, so only those rows are read.
    wanted = [size.id for size in old if size.role in SUMMARISED_ROLES]
    return {
        **thresholds(max_messages, max_tokens),
        "messages": len(sizes),
        "tokens": total // BYTES_PER_TOKEN,
        "bytes": total,
        "reason": reason,
        "first_fire": fires_at,
        "crossings": crossings,
        "first_fire_id": sizes[fires_at - 1].id if fires_at else None,
        "summarised_ids": {size.id for size in old},
        "summarised_count": len(old),
        "summarised_tokens": sum(each[summarised]) // BYTES_PER_TOKEN,
        "kept_count": len(sizes) - len(old),
        "kept_system": start == 1,
        "summary": ExtractiveSummarizer()(as_history(read(wanted))) if wanted else "",
    }
