"""``weighted`` answered from the drivers' word indexes: a turn costs the postings of its words.

The score is :mod:`clawmem.recall.scoring`'s; a word's rarity is counted over the live entries of
every namespace read together. Injected entries are read back and checked against the backend,
as :class:`~clawmem.recall.rankings.IndexRanking` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clawmem.recall.candidates import Candidate, Ranking
from clawmem.recall.feeds import ChangeFeed
from clawmem.recall.index import Candidates, WordIndex
from clawmem.recall.rankings import StaleIndex, indexed_sources
from clawmem.recall.scoring import SCORE_DIGITS, Scored, idf_of, weighted_scan
from clawmem.recall.sources import Readable
from clawmem.recall.words import keywords, text_of


class IndexedWeighted:
    """The ``weighted`` ranking of one message from the namespaces' word indexes."""

    def __init__(
        self, words: Sequence[str], sources: Sequence[tuple[str, ChangeFeed, WordIndex]], now: int
    ) -> None:
        self.words = list(words)
        self.now = now
        self._drivers = {namespace: driver for namespace, driver, _ in sources}
        self._found: list[tuple[str, Candidates]] = [
            (namespace, index.query(self.words, now)) for namespace, _, index in sources
        ]
        total = sum(found.candidate_count + found.zero_overlap for _, found in self._found)
        holding = dict.fromkeys(self.words, 0)
        for _, found in self._found:
            for word, postings in found.postings.items():
                holding[word] += int(np.count_nonzero(found.counts[postings]))
        self.idf = {word: idf_of(total, held) for word, held in holding.items()}
        self.candidate_count = sum(found.candidate_count for _, found in self._found)
        self.zero_overlap = total - self.candidate_count
        self.total = total
        self._ranked: list[tuple[str, int, float]] | None = None
        self._slot: dict[tuple[str, str], int] = {}

    def _rank(self) -> list[tuple[str, int, float]]:
        if self._ranked is None:
            tagged = []
            for order, (namespace, found) in enumerate(self._found):
                scores = np.zeros(found.counts.size)
                for word in self.words:
                    postings = found.postings.get(word)
                    if postings is not None:
                        scores[postings] += self.idf[word]
                scores[found.counts == 0] = 0
                slots = np.flatnonzero(scores)
                rounded = np.round(scores[slots], SCORE_DIGITS)
                columns = zip(slots.tolist(), rounded.tolist(), scores[slots].tolist(), strict=True)
                for slot, score, exact in columns:
                    tagged.append((-score, found.keys[slot], order, namespace, slot, exact))
            tagged.sort(key=lambda item: item[:3])
            self._ranked = [(namespace, slot, exact) for _, _, _, namespace, slot, exact in tagged]
        return self._ranked

    def first(self, count: int) -> list[Candidate]:
        found = dict(self._found)
        out = []
        for namespace, slot, score in self._rank()[: max(count, 0)]:
            key = found[namespace].keys[slot]
            self._slot[namespace, key] = slot
            out.append(Candidate(namespace, key, score, int(found[namespace].line_size[slot])))  # type: ignore[arg-type]
        return out

    def _matched(self, namespace: str, key: str) -> tuple[str, ...]:
        found = dict(self._found)[namespace]
        slot = self._slot[namespace, key]
        held = []
        for word in self.words:
            postings = found.postings.get(word)
            if postings is not None:
                at = int(np.searchsorted(postings, slot))
                if at < postings.size and postings[at] == slot:
                    held.append(word)
        return tuple(held)

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        return [self._matched(c.namespace, c.key) for c in candidates]

    def explain(self, candidate: Candidate) -> Scored:
        """Return the candidate's matched words with their weights."""
        matched = self._matched(candidate.namespace, candidate.key)
        order = [namespace for namespace, _ in self._found].index(candidate.namespace)
        return Scored(
            candidate.namespace,
            candidate.key,
            "",
            float(candidate.score),
            order,
            matched,
            tuple(self.idf[word] for word in matched),
        )

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        """Read the candidates back; raises :class:`StaleIndex` when one changed since indexed."""
        texts: dict[tuple[str, str], str] = {}
        found = dict(self._found)
        for namespace, driver in self._drivers.items():
            keys = [c.key for c in candidates if c.namespace == namespace]
            if not keys:
                continue
            rows = driver.fetch(namespace, keys)
            if not found[namespace].index.confirm(keys, rows, self.now):
                raise StaleIndex()
            texts.update(((namespace, key), text_of(rows[key].value)) for key in keys)
        return [texts[c.namespace, c.key] for c in candidates]


def weighted(memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """Rank by ``weighted`` (module docstring): from the word indexes when every namespace is
    served by a driver that keeps one, else from a full read of the namespaces."""
    words = keywords(message)
    sources = indexed_sources(memory, namespaces)
    if sources is not None:
        return IndexedWeighted(words, sources, now)
    return weighted_scan(memory, message, namespaces, now)
