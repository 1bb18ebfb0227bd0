"""The words recall scores with under each ``CLAW_RECALL_STEMMING``, made independently of
:mod:`clawmem.recall.words`' stemming: the unstemmed words, each stemmed by PyStemmer here."""

from __future__ import annotations

import Stemmer

from clawmem.recall.words import QUESTION_WORDS, entry_words, keywords

STEMMINGS = ("off", "english")
_ENGLISH = Stemmer.Stemmer("english")


def reference_keywords(message: str, stemming: str) -> list[str]:
    """Return the message's distinct words, or their distinct stems, in first-seen order."""
    words = keywords(message)
    if stemming == "off":
        return words
    return list(dict.fromkeys(_ENGLISH.stemWord(word) for word in words))


def reference_asked_words(message: str, stemming: str) -> list[str]:
    """Return :func:`reference_keywords` less the words a question is built with (as written)."""
    words = [word for word in keywords(message) if word not in QUESTION_WORDS]
    if stemming == "off":
        return words
    return list(dict.fromkeys(_ENGLISH.stemWord(word) for word in words))


def reference_entry_words(key: str, text: str, stemming: str) -> set[str]:
    """Return the entry's distinct words, or their stems."""
    words = entry_words(key, text)
    return words if stemming == "off" else {_ENGLISH.stemWord(word) for word in words}
