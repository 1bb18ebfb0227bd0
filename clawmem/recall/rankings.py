"""Rankings: the candidates of one message, in the order recall injects them.

A :class:`Ranking` answers what recall and its report need, and no more: how many entries
share a word with the message (``candidate_count``) and how many do not (``zero_overlap``), the first
``n`` candidates in rank order, the query words each matched, and the injection lines of the
few that are injected. Two rankings give the same answers:

- :class:`IndexRanking`, from the drivers' word indexes: a turn costs the postings of the
  message's words, and the injected entries are read back and checked against the backend;
- :class:`ScanRanking`, from a full read of the namespaces: what a driver without an index
  gets, and the reference the index is tested against.

:func:`word_overlap` picks between them. It is the default ranker; another (a semantic one)
plugs in as any callable ``ranker(memory, message, namespaces, now) -> Ranking``.

Each takes ``stemming`` (``CLAW_RECALL_STEMMING``): the query's words, the entries' and the
index's are then all stems (:mod:`clawmem.recall.words`), and the index asked is the one built
under that stemming.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from clawmem.errors import StaleIndex
from clawmem.recall.candidates import Candidate, Ranker, Ranking, unstemmed
from clawmem.recall.feeds import ChangeFeed, fresh_index
from clawmem.recall.index import Candidates, WordIndex
from clawmem.recall.injection import line_bytes
from clawmem.recall.sources import Readable, conforms, serving_driver
from clawmem.recall.words import DEFAULT_TOP_K, NO_STEMMING, entry_words, keywords, text_of

log = logging.getLogger(__name__)

ATTEMPTS = 3  # index rankings rebuilt after finding a stale candidate, before scanning instead


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
    """A ranking computed from every entry of the namespaces, read in full; ``words`` are the
    message's :func:`keywords` under ``stemming``, which the entries' words are taken with."""

    def __init__(
        self,
        words: Sequence[str],
        sources: Sequence[tuple[str, Mapping[str, Any]]],
        stemming: str = NO_STEMMING,
    ) -> None:
        self.words = list(words)
        wanted = set(words)
        self._texts: dict[tuple[str, str], str] = {}
        self._words: dict[tuple[str, str], set[str]] = {}
        scored: list[tuple[int, str, int, Candidate]] = []
        self.zero_overlap = 0
        for order, (namespace, entries) in enumerate(sources):
            for key, value in entries.items():
                text = text_of(value)
                held = wanted.intersection(entry_words(key, text, stemming))
                if not held:
                    self.zero_overlap += 1
                    continue
                self._texts[namespace, key] = text
                self._words[namespace, key] = held
                candidate = Candidate(namespace, key, len(held), line_bytes(key, text))
                scored.append((-len(held), key, order, candidate))
        scored.sort(key=lambda item: item[:3])
        self._ranked = [item[3] for item in scored]
        self.candidate_count = len(self._ranked)

    def first(self, count: int) -> list[Candidate]:
        return self._ranked[: max(count, 0)]

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        return [
            tuple(word for word in self.words if word in self._words[c.namespace, c.key]) for c in candidates
        ]

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        return [self._texts[c.namespace, c.key] for c in candidates]


class IndexRanking:
    """A ranking answered from each namespace's word index (see :mod:`clawmem.recall.feeds`):
    ``sources`` are ``(namespace, driver, index)``, the index up to date with the driver."""

    def __init__(
        self, words: Sequence[str], sources: Sequence[tuple[str, ChangeFeed, WordIndex]], now: int
    ) -> None:
        self.words = list(words)
        self.now = now
        self._drivers = {namespace: driver for namespace, driver, _ in sources}
        self._stemming = {namespace: index.stemming for namespace, _, index in sources}
        self._candidates: dict[str, Candidates] = {
            namespace: index.query(self.words, now) for namespace, _, index in sources
        }
        self.candidate_count = sum(len(found) for found in self._candidates.values())
        self.zero_overlap = sum(found.zero_overlap for found in self._candidates.values())
        # The words of the entries read back, confirmed to be the indexed ones: what they matched
        # is read off them, without searching a posting list per word.
        self._held: dict[tuple[str, str], set[str]] = {}

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
        for candidate in candidates:
            held = self._held.get((candidate.namespace, candidate.key))
            if held is not None:
                found[candidate.namespace, candidate.key] = tuple(word for word in self.words if word in held)
        for namespace, candidates_of in self._candidates.items():
            keys = [c.key for c in candidates if c.namespace == namespace and (namespace, c.key) not in found]
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
            if not self._candidates[namespace].confirm(keys, rows, self.now):
                raise StaleIndex()
            for key in keys:
                text = texts[namespace, key] = text_of(rows[key].value)
                self._held[namespace, key] = entry_words(key, text, self._stemming[namespace])
        return [texts[c.namespace, c.key] for c in candidates]


def indexed_sources(
    memory: Readable, namespaces: Sequence[str], stemming: str = NO_STEMMING
) -> list[tuple[str, ChangeFeed, WordIndex]] | None:
    """Return ``(namespace, driver, index)`` for each namespace, each index (built under
    ``stemming``) up to date with its driver, or ``None`` when a namespace's driver publishes no
    change feed (recall then scans)."""
    drivers = [serving_driver(memory, namespace)[0] for namespace in namespaces]
    if not all(conforms(driver, ChangeFeed) for driver in drivers):
        return None
    return [
        (namespace, driver, fresh_index(driver, namespace, stemming=stemming))  # type: ignore[arg-type]
        for namespace, driver in zip(namespaces, drivers, strict=True)
    ]


def word_overlap(
    memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
) -> Ranking:
    """Rank by word overlap (SPEC 5): from the word indexes when every namespace is served by a
    driver that keeps one, else from a full read of the namespaces."""
    words = keywords(message, stemming)
    sources = indexed_sources(memory, namespaces, stemming)
    if sources is not None:
        return IndexRanking(words, sources, now)
    return ScanRanking(words, [(namespace, memory.all(namespace)) for namespace in namespaces], stemming)


def overlap_stemming(ranker: Ranker) -> str | None:
    """Return the stemming ``ranker`` ranks with when it is word overlap (stemmed or not), else
    ``None``."""
    base, stemming = unstemmed(ranker)
    return stemming if base is word_overlap else None


def rank_each(
    memory: Readable,
    messages: Iterable[str],
    namespace: str,
    now: int,
    ranker: Ranker = word_overlap,
    index: WordIndex | None = None,
) -> Iterator[Ranking]:
    """Rank each of ``messages`` over ``namespace``. With word overlap from an index, the index
    is brought up to date once for them all (as the backend stands at this call), not once a
    message: a survey of a thousand messages costs one catch-up, not a thousand. ``index`` is
    the namespace's index already brought up to date by the caller, if it has one (used only
    when it was built under the ranker's stemming)."""
    driver = serving_driver(memory, namespace)[0]
    stemming = overlap_stemming(ranker)
    if stemming is None or not conforms(driver, ChangeFeed):
        return (ranker(memory, message, [namespace], now) for message in messages)
    if index is None or index.stemming != stemming:
        index = fresh_index(driver, namespace, stemming=stemming)
    source = [(namespace, driver, index)]
    return (IndexRanking(keywords(message, stemming), source, now) for message in messages)


def scan_ranking(
    memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
) -> Ranking:
    """Rank by word overlap from a full read of the namespaces (the reference, and the ranker
    of drivers without an index)."""
    return ScanRanking(
        keywords(message, stemming),
        [(namespace, memory.all(namespace)) for namespace in namespaces],
        stemming,
    )


def rank(query: str, entries: Mapping[str, Any], limit: int = DEFAULT_TOP_K) -> list[tuple[str, Any, int]]:
    """Return up to ``limit`` ``(key, value, score)`` of ``entries`` with score > 0, by score
    descending then key: what a search of one namespace returns (SPEC 2 and 5)."""
    if limit <= 0:
        return []
    ranking = ScanRanking(keywords(query), [("", entries)])
    return [(c.key, entries[c.key], c.score) for c in ranking.first(limit)]
