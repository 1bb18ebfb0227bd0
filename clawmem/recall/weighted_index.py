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

# The first candidates are sought among the holders of the rarest words while these hold at
# most _PRUNE_FROM slots or 1/_PRUNE_SHARE of the namespace; past that, one dense pass.
_PRUNE_FROM = 4096
_PRUNE_SHARE = 16


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
            # With every slot live (nothing removed or expired), a word's holders are its postings.
            every_slot_live = candidates.candidate_count + candidates.zero_overlap == candidates.counts.size
            for word, postings in candidates.postings.items():
                holding[word] += (
                    postings.size if every_slot_live else int(np.count_nonzero(candidates.counts[postings]))
                )
        self.idf = {word: idf_of(self.total, held) for word, held in holding.items()}
        self._scores: dict[str, np.ndarray] = {}

    def _scores_of(self, namespace: str) -> np.ndarray:
        """Return the namespace's score per slot (0 for a slot sharing no word, dead or expired)."""
        scores = self._scores.get(namespace)
        if scores is None:
            found = self._candidates[namespace]
            scores = np.zeros(found.counts.size)
            for word in self.words:
                postings = found.postings.get(word)
                if postings is not None:
                    scores[postings] += self.idf[word]
            scores[found.counts == 0] = 0
            scores = self._scores[namespace] = scores
        return scores

    def _first_of(self, namespace: str, count: int) -> list[tuple[float, str, int, float]]:
        """Return the namespace's first ``count`` candidates in rank order, as ``(rounded score,
        key, slot, score)``."""
        slots = self._pruned(namespace, count)
        if slots is None:
            dense = self._scores_of(namespace)
            slots = np.flatnonzero(dense)
            return self._ordered(namespace, slots, dense[slots], count)
        return self._ordered(namespace, slots, self._exact(namespace, slots), count)

    def _ordered(
        self, namespace: str, slots: np.ndarray, exact: np.ndarray, count: int
    ) -> list[tuple[float, str, int, float]]:
        """Return the first ``count`` of ``slots`` (scored ``exact``) in rank order."""
        found = self._candidates[namespace]
        rounded = np.round(exact, SCORE_DIGITS)
        if count < slots.size:
            # Every slot scoring at least the count-th best score: the ties at the edge are
            # ordered by key below, so none of them may be left out here.
            edge = -np.partition(-rounded, count - 1)[count - 1]
            kept = rounded >= edge
            slots, rounded, exact = slots[kept], rounded[kept], exact[kept]
        order = np.lexsort((found.key_order[slots], -rounded))[:count]
        slots, rounded, exact = slots[order], rounded[order], exact[order]
        out = []
        for slot, score, value in zip(slots.tolist(), rounded.tolist(), exact.tolist(), strict=True):
            key = found.keys[slot]
            found._slot_of[key] = slot  # so matched() finds its words without a pass over every slot
            out.append((score, key, slot, value))
        return out

    def _exact(self, namespace: str, slots: np.ndarray) -> np.ndarray:
        """Return the score of each of ``slots`` (live candidates, ascending), summed in the
        message's word order as the dense pass sums them."""
        found = self._candidates[namespace]
        scores = np.zeros(slots.size)
        for word in self.words:
            postings = found.postings.get(word)
            if postings is None or not postings.size:
                continue
            at = np.minimum(np.searchsorted(postings, slots), postings.size - 1)
            scores[postings[at] == slots] += self.idf[word]
        return scores

    def _pruned(self, namespace: str, count: int) -> np.ndarray | None:
        """Return live candidates among which the first ``count`` surely are, or ``None`` when
        the dense pass over every slot is cheaper.

        Words are taken from the rarest: an entry holding none of the words taken yet scores at
        most the weights of the words left, and one holding some scores at least their weights;
        once ``count`` entries score more by the words taken than any other entry can, no other
        entry can come before them.
        """
        found = self._candidates[namespace]
        held = [(self.idf[w], w) for w in self.words if w in found.postings and found.postings[w].size]
        held.sort(key=lambda item: -item[0])
        left = sum(weight for weight, _ in held)
        limit = max(_PRUNE_FROM, found.counts.size // _PRUNE_SHARE)
        pool = np.empty(0, dtype=np.int32)
        taken: list[tuple[float, np.ndarray]] = []
        for weight, word in held:
            postings = found.postings[word]
            if pool.size + postings.size > limit:
                return None
            pool = np.union1d(pool, postings)
            pool = pool[found.counts[pool] > 0]
            taken.append((weight, postings))
            left -= weight
            if pool.size >= count:
                least = np.zeros(pool.size)
                for taken_weight, taken_postings in taken:
                    at = np.minimum(np.searchsorted(taken_postings, pool), taken_postings.size - 1)
                    least[taken_postings[at] == pool] += taken_weight
                edge = round(float(-np.partition(-least, count - 1)[count - 1]), SCORE_DIGITS)
                if edge > round(left, SCORE_DIGITS):
                    # Only an entry that may still reach the count-th least score can rank.
                    return pool[np.round(least + left, SCORE_DIGITS) >= edge]
        return pool

    def first(self, count: int) -> list[Candidate]:
        if count <= 0:
            return []
        tagged = [
            (-score, key, order, namespace, slot, exact)
            for order, namespace in enumerate(self._candidates)
            for score, key, slot, exact in self._first_of(namespace, count)
        ]
        tagged.sort(key=lambda item: item[:3])
        out = []
        for _, key, _, namespace, slot, exact in tagged[:count]:
            size = int(self._candidates[namespace].line_size[slot])
            out.append(Candidate(namespace, key, exact, size))  # type: ignore[arg-type]
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
