"""Recall: the one tokeniser, the overlap score and the ranking every driver's search uses."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from clawmem.memory.rules import text_of

MIN_WORD_CHARS = 3
DEFAULT_TOP_K = 3

# A word is a maximal run of Unicode letters and digits; a single ' ’ or - between two such
# runs joins them into one word ("don't", "well-known").
_WORD = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")


def keywords(text: str) -> list[str]:
    """Return the distinct casefolded words of ``text`` with 3+ characters, first-seen order."""
    seen: dict[str, None] = {}
    for match in _WORD.finditer(text.casefold()):
        word = match.group()
        if len(word) >= MIN_WORD_CHARS:
            seen.setdefault(word, None)
    return list(seen)


def entry_text(key: str, value: Any) -> str:
    """Return the text an entry is scored on: its key, a space, and the value's text."""
    return f"{key} {text_of(value)}"


def score(query_words: Iterable[str], key: str, value: Any) -> int:
    """Return how many distinct query words occur among the entry's words."""
    entry_words = set(keywords(entry_text(key, value)))
    return sum(1 for word in set(query_words) if word in entry_words)


def rank(
    query: str, entries: Mapping[str, Any], limit: int = DEFAULT_TOP_K
) -> list[tuple[str, Any, int]]:
    """Return up to ``limit`` ``(key, value, score)`` with score > 0, by score desc then key asc."""
    words = keywords(query)
    if not words or limit <= 0:
        return []
    scored = [(key, value, score(words, key, value)) for key, value in entries.items()]
    hits = [hit for hit in scored if hit[2] > 0]
    hits.sort(key=lambda hit: (-hit[2], hit[0]))
    return hits[:limit]
