"""Compaction analysis of one stored conversation, computed with the compactor's own rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clawmem.compaction import (
    BYTES_PER_TOKEN,
    ExtractiveSummarizer,
    HistoryCompactor,
    estimate_tokens,
    history_bytes,
    split_history,
)
from clawmem.settings import Settings
from clawmem.sql.conversations import StoredMessage


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


def _first_fire(compactor: HistoryCompactor, history: Sequence[dict[str, Any]]) -> int:
    """Return the smallest n for which ``history[:n]`` trips a threshold; ``history`` must trip one.

    Both triggers only grow as messages are added, so a binary search over prefixes finds it.
    """
    low, high = 1, len(history)
    while low < high:
        middle = (low + high) // 2
        if compactor.trigger(history[:middle]) is None:
            low = middle + 1
        else:
            high = middle
    return low


def analyse(messages: Sequence[StoredMessage], max_messages: int, max_tokens: int) -> dict[str, Any]:
    """Return what compaction would do to this history under the given thresholds (0 = off).

    Keys: ``enabled``, ``reason`` (trigger now or ``None``), ``first_fire`` (1-based message
    at which a threshold is first exceeded), ``summarised_ids`` / ``kept_ids``, counts, bytes,
    tokens, and a local extractive ``summary`` of what would be summarised.
    """
    history = as_history(messages)
    compactor = HistoryCompactor(ExtractiveSummarizer(), max_messages=max_messages, max_tokens=max_tokens)
    reason = compactor.trigger(history)
    start, boundary = split_history(history)
    summarised = slice(start, boundary) if reason else slice(0, 0)
    old = history[summarised]
    fires_at = _first_fire(compactor, history) if reason else None
    size = history_bytes(history)
    return {
        **thresholds(max_messages, max_tokens),
        "messages": len(history),
        "tokens": size // BYTES_PER_TOKEN,
        "bytes": size,
        "reason": reason,
        "first_fire": fires_at,
        "first_fire_id": messages[fires_at - 1].id if fires_at else None,
        "summarised_ids": {m.id for m in messages[summarised]},
        "summarised_count": len(old),
        "summarised_tokens": estimate_tokens(old),
        "kept_count": len(history) - len(old),
        "kept_system": start == 1,
        "summary": compactor.summarizer(old) if old else "",
    }
