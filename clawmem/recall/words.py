"""Words: the one tokeniser, and the one definition of how many words an entry shares.

A word is a maximal run of Unicode letters and digits, casefolded; a single ``'``, ``’`` or
``-`` between two runs joins them (``don't``, ``well-known``). Words have at least three
characters. An entry's score is how many distinct query words occur among the words of
``key + " " + text(value)`` (:func:`entry_words`); the scan (:class:`~clawmem.recall.rankings.ScanRanking`)
and the index (:class:`~clawmem.recall.index.WordIndex`) both score with these words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

MIN_WORD_CHARS = 3
DEFAULT_TOP_K = 3

# A word is a maximal run of Unicode letters and digits; a single ' ’ or - between two such
# runs joins them into one word ("don't", "well-known").
_LETTER_OR_DIGIT = r"[^\W_]"
_WORD = re.compile(rf"{_LETTER_OR_DIGIT}+(?:['’\-]{_LETTER_OR_DIGIT}+)*")


def keywords(text: str) -> list[str]:
    """Return the distinct casefolded words of ``text`` with 3+ characters, first-seen order."""
    seen: dict[str, None] = {}
    for match in _WORD.finditer(text.casefold()):
        word = match.group()
        if len(word) >= MIN_WORD_CHARS:
            seen.setdefault(word, None)
    return list(seen)


def whole_token_pattern(text: str) -> re.Pattern[str]:
    """Return the regex of ``text`` standing as a whole token: no letter or digit (as words
    count them) right before or after it."""
    return re.compile(rf"(?<!{_LETTER_OR_DIGIT}){re.escape(text)}(?!{_LETTER_OR_DIGIT})")


def text_of(value: Any) -> str:
    """Return the text recall scores and injects: a str as is, anything else as sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def entry_words(key: str, text: str) -> set[str]:
    """Return the distinct words of an entry whose value text is ``text``: what a query word
    must be one of to count."""
    return {word for word in _WORD.findall(f"{key} {text}".casefold()) if len(word) >= MIN_WORD_CHARS}


def shared_words(query_words: Iterable[str], key: str, text: str) -> list[str]:
    """Return the query words (in their order) that occur among the entry's words."""
    held = entry_words(key, text)
    return [word for word in query_words if word in held]


def score(query_words: Iterable[str], key: str, value: Any) -> int:
    """Return how many distinct query words occur among the words of the entry ``(key, value)``."""
    return len(set(shared_words(set(query_words), key, text_of(value))))
