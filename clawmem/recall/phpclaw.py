"""phpClaw's own scoring (``CLAW_RECALL_SCORING=phpclaw``), byte for byte, and the choice of
ranker by the scoring's name."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clawmem import php
from clawmem.recall.candidates import Candidate, Ranker, Ranking, Stemmed
from clawmem.recall.injection import line_bytes
from clawmem.recall.rankings import word_overlap
from clawmem.recall.sources import InsertionOrdered, Readable, serving_driver
from clawmem.recall.words import NO_STEMMING, check_stemming


def phpclaw_keywords(text: str) -> list[str]:
    """Return phpClaw's query or entry words: ``str_word_count(strtolower($text))`` (ASCII letters,
    ``'`` and ``-``), at least 3 bytes, de-duplicated in first-seen order."""
    return list(dict.fromkeys(word for word in php.words(text) if len(word) >= 3))


def phpclaw_text(value: Any) -> str:
    """Return an entry's text as phpClaw scores and injects it: a string as it is, anything else
    encoded with ``json_encode`` (escaped ``/`` and unicode, arrays in insertion order)."""
    return value if isinstance(value, str) else php.json_encode(value)


@dataclass(frozen=True)
class _Scored:
    position: int
    key: str
    value: Any
    text: str
    matched: tuple[str, ...]


def _phpclaw_order(a: _Scored, b: _Scored) -> int:
    # arsort() over ['score' => n, 'value' => v]: score, then the value by PHP 8's <=>, both
    # descending; PHP 8's sort is stable, so what is still tied keeps all()'s order.
    by_score = php.compare(len(b.matched), len(a.matched))
    return by_score or php.compare(b.value, a.value) or a.position - b.position


class PhpClawRanking:
    """phpClaw's recall, byte for byte (its ``TokenOverlapScorer::rank`` over ``all()`` of the
    recall namespace): only the value is scored, words are :func:`phpclaw_keywords`, arrays go
    through ``json_encode``, and ties go by PHP's comparison of the values, then by ``all()``'s order.

    ``entries`` are the live entries in the order phpClaw's ``all()`` returns them (insertion
    order: see :meth:`clawmem.SqlMemory.entries_in_order`).
    """

    def __init__(self, message: str, namespace: str, entries: Sequence[tuple[str, Any]]) -> None:
        self.namespace = namespace
        query = phpclaw_keywords(message)
        scored: list[_Scored] = []
        self.zero_overlap = 0
        for position, (key, value) in enumerate(entries):
            text = phpclaw_text(value)
            held = set(phpclaw_keywords(text))
            matched = tuple(word for word in query if word in held)
            if matched:
                scored.append(_Scored(position, key, value, text, matched))
            else:
                self.zero_overlap += 1
        scored.sort(key=functools.cmp_to_key(_phpclaw_order))
        self._ranked = scored
        self._by_key = {item.key: item for item in scored}
        self.candidate_count = len(scored)

    def first(self, count: int) -> list[Candidate]:
        return [
            Candidate(self.namespace, item.key, len(item.matched), line_bytes(item.key, item.text))
            for item in self._ranked[: max(count, 0)]
        ]

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        return [self._by_key[c.key].matched for c in candidates]

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        return [self._by_key[c.key].text for c in candidates]


def phpclaw_overlap(memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """Rank as phpClaw does (:class:`PhpClawRanking`). phpClaw recalls from one namespace, so
    only the recall namespace (the last of ``namespaces``) is read, never a subject's."""
    namespace = namespaces[-1]
    driver, _ = serving_driver(memory, namespace)
    if isinstance(driver, InsertionOrdered):
        entries = driver.entries_in_order(namespace)
    else:
        entries = list(memory.all(namespace).items())
    return PhpClawRanking(message, namespace, entries)


def _rankers() -> dict[str, Ranker]:
    from clawmem.recall.fusion import hybrid, semantic
    from clawmem.recall.weighted_index import weighted

    return {
        "clawmem": word_overlap,
        "phpclaw": phpclaw_overlap,
        "weighted": weighted,
        "semantic": semantic,
        "hybrid": hybrid,
    }


RANKERS: dict[str, Ranker] = _rankers()


def ranker_for(scoring: str, embedder: str = "", stemming: str = NO_STEMMING) -> Ranker:
    """Return the ranker of ``CLAW_RECALL_SCORING``: ``clawmem`` (SPEC 5), ``phpclaw``, ``weighted``,
    ``semantic`` or ``hybrid``; the last two with the process's scorer of ``embedder``
    (``CLAW_RECALL_EMBEDDER``, see :func:`clawmem.recall.fusion.default_scorer`); each but
    ``phpclaw`` (phpClaw's words, never stemmed) with the words of ``stemming``
    (``CLAW_RECALL_STEMMING``). Raises ``ValueError`` for an unknown scoring or stemming."""
    try:
        ranker = RANKERS[scoring]
    except KeyError:
        raise ValueError(f"recall scoring must be one of {', '.join(RANKERS)}, got {scoring!r}") from None
    check_stemming(stemming)
    if embedder.strip() and scoring in ("semantic", "hybrid"):
        from clawmem.recall.fusion import default_scorer

        ranker = getattr(default_scorer(embedder), scoring)
    if stemming == NO_STEMMING or ranker is phpclaw_overlap:
        return ranker
    return Stemmed(ranker, stemming)
