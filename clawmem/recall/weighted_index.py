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
from clawmem.recall.index import WordIndex
from clawmem.recall.rankings import IndexRanking, indexed_sources
from clawmem.recall.scoring import SCORE_DIGITS, Scored, idf_of, weighted_scan
from clawmem.recall.sources import Readable
from clawmem.recall.words import keywords


class IndexedWeighted(IndexRanking):
    """The ``weighted`` ranking of one message from the namespaces' word indexes: the overlap
    ranking's candidates (every word weighs more than 0), matched words and read-back, scored
    by rarity instead of by count."""

    def __init__(
        self, words: Sequence[str], sources: Sequence[tuple[str, ChangeFeed, WordIndex]], now: int
    ) -> None:
        super().__init__(words, sources, now)
        found = self._candidates.values()
        self.total = self.candidate_count + self.zero_overlap
        holding = dict.fromkeys(self.words, 0)
        for candidates in found:
            for word, postings in candidates.postings.items():
                holding[word] += int(np.count_nonzero(candidates.counts[postings]))
        self.idf = {word: idf_of(self.total, held) for word, held in holding.items()}
        self._ranked: list[tuple[str, int, float]] | None = None

    def _rank(self) -> list[tuple[str, int, float]]:
        if self._ranked is None:
            tagged = []
            for order, (namespace, found) in enumerate(self._candidates.items()):
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
        out = []
        for namespace, slot, score in self._rank()[: max(count, 0)]:
            found = self._candidates[namespace]
            out.append(Candidate(namespace, found.keys[slot], score, int(found.line_size[slot])))  # type: ignore[arg-type]
        return out

    def explain(self, candidate: Candidate) -> Scored:
        """Return the candidate's matched words with their weights."""
        (matched,) = self.matched([candidate])
        order = list(self._candidates).index(candidate.namespace)
        return Scored(
            candidate.namespace,
            candidate.key,
            "",
            float(candidate.score),
            order,
            matched,
            tuple(self.idf[word] for word in matched),
        )


def weighted(memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """Rank by ``weighted`` (module docstring): from the word indexes when every namespace is
    served by a driver that keeps one, else from a full read of the namespaces."""
    words = keywords(message)
    sources = indexed_sources(memory, namespaces)
    if sources is not None:
        return IndexedWeighted(words, sources, now)
    return weighted_scan(memory, message, namespaces, now)
