"""Words: the one tokeniser and the overlap score, the ground floor recall stands on.

A word is a maximal run of Unicode letters and digits, casefolded; a single ``'``, ``’`` or
``-`` between two runs joins them (``don't``, ``well-known``). Query words have at least three
characters. An entry's score is how many distinct query words occur among the words of
``key + " " + text(value)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

MIN_WORD_CHARS = 3
DEFAULT_TOP_K = 3

# A word is a maximal run of Unicode letters and digits; a single ' ’ or - between two such
# runs joins them into one word ("don't", "well-known").
_WORD = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")


def _words(folded: str) -> list[str]:
    seen: dict[str, None] = {}
    for match in _WORD.finditer(folded):
        word = match.group()
        if len(word) >= MIN_WORD_CHARS:
            seen.setdefault(word, None)
    return list(seen)


def keywords(text: str) -> list[str]:
    """Return the distinct casefolded words of ``text`` with 3+ characters, first-seen order."""
    return _words(text.casefold())


def text_of(value: Any) -> str:
    """Return the text recall scores and injects: a str as is, anything else as sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def entry_text(key: str, value: Any) -> str:
    """Return the text an entry is scored on: its key, a space, and the value's text."""
    return f"{key} {text_of(value)}"


def _score_folded(query_words: Iterable[str], folded: str) -> int:
    # Every word of the entry is a substring of its folded text, so a query word that is not
    # a substring cannot count; most entries are settled here without tokenising them.
    candidates = [word for word in query_words if word in folded]
    if not candidates:
        return 0
    entry_words = set(_WORD.findall(folded))
    return sum(1 for word in candidates if word in entry_words)


def score(query_words: Iterable[str], key: str, value: Any) -> int:
    """Return how many distinct query words occur among the entry's words."""
    # A caller scoring many entries passes a set once rather than having it rebuilt per entry.
    words = query_words if isinstance(query_words, AbstractSet) else set(query_words)
    return _score_folded(words, entry_text(key, value).casefold())


def rank(query: str, entries: Mapping[str, Any], limit: int = DEFAULT_TOP_K) -> list[tuple[str, Any, int]]:
    """Return up to ``limit`` ``(key, value, score)`` with score > 0, by score desc then key asc."""
    words = set(keywords(query))
    if not words or limit <= 0:
        return []
    scored = [
        (key, value, _score_folded(words, entry_text(key, value).casefold()))
        for key, value in entries.items()
    ]
    hits = [hit for hit in scored if hit[2] > 0]
    hits.sort(key=lambda hit: (-hit[2], hit[0]))
    return hits[:limit]


def utf8_len(text: str) -> int:
    """Return the UTF-8 size of ``text`` in bytes."""
    return len(text.encode("utf-8"))


def cut_utf8(text: str, max_bytes: int) -> str:
    """Return the longest prefix of ``text`` that fits in ``max_bytes`` UTF-8 bytes."""
    if max_bytes <= 0:
        return ""
    # Decoding a byte prefix with "ignore" drops only a partial character at its end.
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def clip(text: str, max_chars: int) -> str:
    """Return ``text`` unchanged if it has at most ``max_chars`` characters, else its first
    ``max_chars - 1`` characters, trailing whitespace removed, followed by "…"."""
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"
