"""Scored rankings: candidates ranked by a real-valued score, and the ``weighted`` scoring.

``weighted`` is BM25 with binary term frequency and no length normalisation (``b = 0``), so that
it is answered from what a word index holds: which live entries hold a word. Over the entries of
the namespaces a turn reads together (``N`` live entries, ``n(w)`` of them holding word ``w``)::

    idf(w)   = ln(1 + (N - n(w) + 0.5) / (n(w) + 0.5))
    score(e) = the sum of idf(w) over the message's words w held by e

Words are :func:`clawmem.recall.words.entry_words`'s (stems, with ``CLAW_RECALL_STEMMING``, and
then ``n(w)`` counts the entries holding the stem), summed in the message's order; the message's
words are :func:`clawmem.recall.words.asked_words`, its words less the ones a question is built
with ("what", "did", "the": :data:`~clawmem.recall.words.QUESTION_WORDS`). A candidate is an
entry holding at least one message word. Ties go as in every ranking: key, then the
namespaces' order. (On LoCoMo's development split, length normalisation changed recall@3 by
less than 0.01.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clawmem.recall.candidates import Candidate, Ranking
from clawmem.recall.injection import line_bytes
from clawmem.recall.sources import Readable
from clawmem.recall.words import NO_STEMMING, asked_words, entry_words, text_of

SCORE_DIGITS = 9  # scores are compared rounded, so equal sums in any order tie


@dataclass
class Scored:
    """One candidate of a scored ranking, with every signal that explains it."""

    namespace: str
    key: str
    text: str
    score: float
    order: int  # the namespace's position (the subject's first)
    matched: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()  # per matched word, its contribution to ``weighted``
    signals: dict[str, Any] = field(default_factory=dict)


class ScoredRanking:
    """A ranking of :class:`Scored` candidates: score descending, then key, then namespace order."""

    def __init__(self, words: Sequence[str], scored: list[Scored], zero_overlap: int, total: int) -> None:
        self.words = list(words)
        scored.sort(key=lambda item: (-round(item.score, SCORE_DIGITS), item.key, item.order))
        self.scored = scored
        self._by = {(item.namespace, item.key): item for item in scored}
        self.candidate_count = len(scored)
        self.zero_overlap = zero_overlap
        self.total = total  # live entries read

    def first(self, count: int) -> list[Candidate]:
        return [
            Candidate(item.namespace, item.key, item.score, line_bytes(item.key, item.text))  # type: ignore[arg-type]
            for item in self.scored[: max(count, 0)]
        ]

    def explain(self, candidate: Candidate) -> Scored:
        """Return the scored candidate behind ``candidate``, with its signals."""
        return self._by[candidate.namespace, candidate.key]

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        return [self._by[c.namespace, c.key].matched for c in candidates]

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        return [self._by[c.namespace, c.key].text for c in candidates]


@dataclass(frozen=True)
class Entry:
    """A live entry as a scoring reads it."""

    namespace: str
    key: str
    text: str
    order: int
    words: frozenset[str]


def read_entries(memory: Readable, namespaces: Sequence[str], stemming: str = NO_STEMMING) -> list[Entry]:
    """Read every live entry of ``namespaces`` (in their order), with its words under ``stemming``."""
    entries = []
    for order, namespace in enumerate(namespaces):
        for key, value in memory.all(namespace).items():
            text = text_of(value)
            entries.append(Entry(namespace, key, text, order, frozenset(entry_words(key, text, stemming))))
    return entries


def idf_of(total: int, holding: int) -> float:
    """Return the weight of a word ``holding`` of ``total`` entries hold."""
    return math.log(1 + (total - holding + 0.5) / (holding + 0.5))


def word_weights(words: Sequence[str], entries: Sequence[Entry]) -> dict[str, float]:
    """Return each message word's idf over ``entries``."""
    holding = dict.fromkeys(words, 0)
    for entry in entries:
        for word in entry.words.intersection(holding):
            holding[word] += 1
    return {word: idf_of(len(entries), held) for word, held in holding.items()}


def weighted_scores(words: Sequence[str], entries: Sequence[Entry]) -> list[Scored]:
    """Return the ``weighted`` candidates of ``entries`` for the message words ``words``."""
    idf = word_weights(words, entries)
    scored = []
    for entry in entries:
        matched = tuple(word for word in words if word in entry.words)
        if matched:
            weights = tuple(idf[word] for word in matched)
            scored.append(
                Scored(entry.namespace, entry.key, entry.text, sum(weights), entry.order, matched, weights)
            )
    return scored


def weighted_scan(
    memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
) -> Ranking:
    """Rank by ``weighted`` from a full read of the namespaces (the reference)."""
    words = asked_words(message, stemming)
    entries = read_entries(memory, namespaces, stemming)
    scored = weighted_scores(words, entries)
    for position, item in enumerate(
        sorted(scored, key=lambda s: (-round(s.score, SCORE_DIGITS), s.key, s.order))
    ):
        item.signals["weighted_rank"] = position + 1
    return ScoredRanking(words, scored, len(entries) - len(scored), len(entries))
