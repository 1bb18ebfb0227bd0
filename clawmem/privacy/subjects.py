"""Who a fact belongs to: subjects, and what of theirs export and erasure cover.

A subject is a person the agent talks to, named by ``user_id``. What the project holds about
one is their conversations (``user_id`` equal to theirs), every entry of their subject
namespace, and entries elsewhere whose key or value mentions their id as a whole token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from clawmem.recall.words import text_of, whole_token_pattern


def mention_pattern(user_id: str) -> re.Pattern[str]:
    """Return the regex of ``user_id`` as a whole token: no letter or digit right before or after."""
    return whole_token_pattern(user_id)


def mentions(pattern: re.Pattern[str], key: str, value: Any) -> bool:
    """Return whether an entry's key or value text holds ``pattern`` (see :func:`mention_pattern`)."""
    return bool(pattern.search(key) or pattern.search(text_of(value)))


MIN_MENTION_LENGTH = 6
MENTION_CONTEXT = 30  # characters shown either side of a matched mention


def mention_search_refusal(user_id: str) -> str | None:
    """Return why ``user_id`` is never matched as a mention (only digits, or shorter than
    :data:`MIN_MENTION_LENGTH` characters: it cannot be told apart from ordinary text, as a
    WordPress id ``30`` and "within 30 days"), or ``None`` when its mentions are searched."""
    if user_id.isdecimal():
        return "it is only digits"
    if len(user_id) < MIN_MENTION_LENGTH:
        return f"it is shorter than {MIN_MENTION_LENGTH} characters"
    return None


def matched_text(pattern: re.Pattern[str], key: str, value: Any) -> tuple[str, str] | None:
    """Return where ``pattern`` first matches an entry (``"key"`` or ``"value"``) and the
    matched text with up to :data:`MENTION_CONTEXT` characters either side, or ``None``."""
    for where, text in (("key", key), ("value", text_of(value))):
        found = pattern.search(text)
        if found is not None:
            start, end = max(0, found.start() - MENTION_CONTEXT), found.end() + MENTION_CONTEXT
            head = "…" if start > 0 else ""
            tail = "…" if end < len(text) else ""
            return where, head + text[start:end] + tail
    return None


def text_pattern(text: str) -> re.Pattern[str]:
    """Return the regex of ``text`` exactly as given (a ``--match`` text: any substring)."""
    return re.compile(re.escape(text))


@dataclass(frozen=True)
class Subject:
    """Who an export or erasure concerns: exactly one of ``user_id``, ``conversation_id``, ``match``.

    Raises ``ValueError`` unless exactly one is a non-empty str.
    """

    user_id: str | None = None
    conversation_id: str | None = None
    match: str | None = None

    def __post_init__(self) -> None:
        given = [value for value in (self.user_id, self.conversation_id, self.match) if value is not None]
        if len(given) != 1:
            raise ValueError("a subject is exactly one of a user id, a conversation id or a match text")
        if not isinstance(given[0], str) or not given[0]:
            raise ValueError("the subject must be a non-empty str")

    @property
    def text(self) -> str:
        """Return the text memory entries are matched against."""
        return self.user_id or self.conversation_id or self.match or ""

    def describe(self) -> dict[str, str]:
        """Return the subject as ``{"user_id": ...}``, ``{"conversation": ...}`` or ``{"match": ...}``."""
        if self.user_id is not None:
            return {"user_id": self.user_id}
        if self.conversation_id is not None:
            return {"conversation": self.conversation_id}
        return {"match": self.text}
