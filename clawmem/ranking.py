"""Rankings: the candidates of one message, in the order recall injects them.

A :class:`Ranking` answers what recall and its report need, and no more: how many entries
share a word with the message (``hits``) and how many do not (``zero_overlap``), the first
``n`` candidates in rank order, the query words each matched, and the injection lines of the
few that are injected. Two rankings give the same answers:

- :class:`IndexRanking`, from the drivers' word indexes: a turn costs the postings of the
  message's words, and the injected entries are read back and checked against the backend;
- :class:`ScanRanking`, from a full read of the namespaces: what a driver without an index
  gets, and the reference the index is tested against.

:func:`word_overlap` picks between them. It is the default ranker; another (a semantic one)
plugs in as any callable ``ranker(memory, message, namespaces, now) -> Ranking``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from clawmem import php
from clawmem.memory.base import BaseMemory, MemoryRow
from clawmem.memory.index import Candidates, WordIndex, line_bytes
from clawmem.memory.wrappers import serving_driver
from clawmem.words import _WORD, keywords, text_of

log = logging.getLogger(__name__)

_ATTEMPTS = 3  # index rankings rebuilt after finding a stale candidate, before scanning instead


@dataclass(frozen=True)
class Candidate:
    """One entry that shares at least one word with the message."""

    namespace: str
    key: str
    score: int
    bytes: int  # of its injection line ``- key: text\n``


class Ranking(Protocol):
    """The candidates of one message over one or more namespaces, ranked together: score
    descending, then key, then the namespaces' order (the subject's first)."""

    hits: int
    zero_overlap: int

    def first(self, count: int) -> list[Candidate]:
        """Return the first ``count`` candidates in rank order."""

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        """Return the query words each of ``candidates`` holds, in the message's order."""

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        """Return the value text of each of ``candidates``, as it is stored now."""


Ranker = Callable[[Any, str, Sequence[str], int], Ranking]


class StaleIndex(Exception):
    """An indexed candidate no longer matched the backend; the index has been corrected."""


def _merge(lists: Sequence[list[Candidate]], count: int) -> list[Candidate]:
    """Merge per-namespace lists already in rank order (namespaces in tie order)."""
    tagged = [
        (-candidate.score, candidate.key, order, candidate)
        for order, candidates in enumerate(lists)
        for candidate in candidates
    ]
    tagged.sort(key=lambda item: item[:3])
    return [item[3] for item in tagged[:count]]


class ScanRanking:
    """A ranking computed from every entry of the namespaces, read in full."""

    def __init__(self, words: Sequence[str], sources: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        self.words = list(words)
        wanted = set(words)
        self._texts: dict[tuple[str, str], str] = {}
        self._words: dict[tuple[str, str], set[str]] = {}
        scored: list[tuple[int, str, int, Candidate]] = []
        self.zero_overlap = 0
        for order, (namespace, entries) in enumerate(sources):
            for key, value in entries.items():
                text = text_of(value)
                held = wanted.intersection(_WORD.findall(f"{key} {text}".casefold()))
                if not held:
                    self.zero_overlap += 1
                    continue
                self._texts[namespace, key] = text
                self._words[namespace, key] = held
                candidate = Candidate(namespace, key, len(held), line_bytes(key, text))
                scored.append((-len(held), key, order, candidate))
        scored.sort(key=lambda item: item[:3])
        self._ranked = [item[3] for item in scored]
        self.hits = len(self._ranked)

    def first(self, count: int) -> list[Candidate]:
        return self._ranked[: max(count, 0)]

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        return [
            tuple(word for word in self.words if word in self._words[c.namespace, c.key]) for c in candidates
        ]

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        return [self._texts[c.namespace, c.key] for c in candidates]


class IndexSource(Protocol):
    """What an :class:`IndexRanking` reads of a namespace's driver."""

    def word_index(self, namespace: str) -> WordIndex: ...

    def fetch(self, namespace: str, keys: Sequence[str]) -> dict[str, MemoryRow]: ...


class IndexRanking:
    """A ranking answered from each namespace's word index (see :mod:`clawmem.memory.index`)."""

    def __init__(self, words: Sequence[str], sources: Sequence[tuple[str, IndexSource]], now: int) -> None:
        self.words = list(words)
        self.now = now
        self._drivers = {namespace: driver for namespace, driver in sources}
        self._candidates: dict[str, Candidates] = {
            namespace: driver.word_index(namespace).query(self.words, now) for namespace, driver in sources
        }
        self.hits = sum(len(found) for found in self._candidates.values())
        self.zero_overlap = sum(found.zero_overlap for found in self._candidates.values())

    def first(self, count: int) -> list[Candidate]:
        if count <= 0:
            return []
        lists = [
            [Candidate(namespace, key, score, size) for key, score, size in found.first(count)]
            for namespace, found in self._candidates.items()
        ]
        return lists[0] if len(lists) == 1 else _merge(lists, count)

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        found: dict[tuple[str, str], tuple[str, ...]] = {}
        for namespace, candidates_of in self._candidates.items():
            keys = [c.key for c in candidates if c.namespace == namespace]
            if keys:
                for key, words in candidates_of.matched(keys, self.words).items():
                    found[namespace, key] = words
        return [found[c.namespace, c.key] for c in candidates]

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        """Read the candidates back from the backend. Raises :class:`StaleIndex` (after
        correcting the index) when one was deleted, changed or expired since it was indexed."""
        texts: dict[tuple[str, str], str] = {}
        for namespace, driver in self._drivers.items():
            keys = [c.key for c in candidates if c.namespace == namespace]
            if not keys:
                continue
            rows = driver.fetch(namespace, keys)
            if not self._candidates[namespace].index.confirm(keys, rows, self.now):
                raise StaleIndex()
            texts.update(((namespace, key), text_of(rows[key].value)) for key in keys)
        return [texts[c.namespace, c.key] for c in candidates]


def word_overlap(memory: Any, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """Rank by word overlap (SPEC 5): from the word indexes when every namespace is served by a
    driver that keeps one, else from a full read of the namespaces."""
    words = keywords(message)
    drivers = [serving_driver(memory, namespace)[0] for namespace in namespaces]
    if all(isinstance(driver, BaseMemory) for driver in drivers):
        return IndexRanking(words, list(zip(namespaces, drivers, strict=True)), now)
    return ScanRanking(words, [(namespace, memory.all(namespace)) for namespace in namespaces])


class _HeldIndex:
    """A driver whose index of one namespace was brought up to date once, for many rankings."""

    def __init__(self, driver: BaseMemory, namespace: str) -> None:
        self._driver = driver
        self._index = driver.word_index(namespace)

    def word_index(self, namespace: str) -> WordIndex:
        return self._index

    def fetch(self, namespace: str, keys: Sequence[str]) -> dict[str, MemoryRow]:
        return self._driver.fetch(namespace, keys)


def rank_each(
    memory: Any, messages: Iterable[str], namespace: str, now: int, ranker: Ranker = word_overlap
) -> Iterator[Ranking]:
    """Rank each of ``messages`` over ``namespace``. With word overlap from an index, the index
    is brought up to date once for them all (as the backend stands at this call), not once a
    message: a survey of a thousand messages costs one catch-up, not a thousand."""
    driver = serving_driver(memory, namespace)[0]
    if ranker is not word_overlap or not isinstance(driver, BaseMemory):
        return (ranker(memory, message, [namespace], now) for message in messages)
    source = [(namespace, _HeldIndex(driver, namespace))]
    return (IndexRanking(keywords(message), source, now) for message in messages)


def scan_ranking(memory: Any, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """Rank by word overlap from a full read of the namespaces (the reference, and the ranker
    of drivers without an index)."""
    return ScanRanking(keywords(message), [(namespace, memory.all(namespace)) for namespace in namespaces])


# -- phpClaw's own scoring (CLAW_RECALL_SCORING=phpclaw) ------------------------------------------


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
        self.hits = len(scored)

    def first(self, count: int) -> list[Candidate]:
        return [
            Candidate(self.namespace, item.key, len(item.matched), line_bytes(item.key, item.text))
            for item in self._ranked[: max(count, 0)]
        ]

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        return [self._by_key[c.key].matched for c in candidates]

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        return [self._by_key[c.key].text for c in candidates]


def phpclaw_overlap(memory: Any, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """Rank as phpClaw does (:class:`PhpClawRanking`). phpClaw recalls from one namespace, so
    only the recall namespace (the last of ``namespaces``) is read, never a subject's."""
    namespace = namespaces[-1]
    driver, _ = serving_driver(memory, namespace)
    in_order = getattr(driver, "entries_in_order", None)
    entries = in_order(namespace) if in_order is not None else list(memory.all(namespace).items())
    return PhpClawRanking(message, namespace, entries)


RANKERS: dict[str, Ranker] = {"clawmem": word_overlap, "phpclaw": phpclaw_overlap}


def ranker_for(scoring: str) -> Ranker:
    """Return the ranker of ``CLAW_RECALL_SCORING``: ``clawmem`` (SPEC 5) or ``phpclaw``."""
    try:
        return RANKERS[scoring]
    except KeyError:
        raise ValueError(f"recall scoring must be one of {', '.join(RANKERS)}, got {scoring!r}") from None
