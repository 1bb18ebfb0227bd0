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
from clawmem.recall.words import NO_STEMMING, asked_words

# The first candidates are sought among the holders of the rarest words while these hold at
# most _PRUNE_FROM slots or 1/_PRUNE_SHARE of the namespace; past that, one dense pass.
_PRUNE_FROM = 4096
_PRUNE_SHARE = 16
_PRUNE_BATCH = 1024  # holders of the rarest words taken together before a cut is tried


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
        """Return the namespace's score per slot (0 for a slot sharing no word, dead or expired),
        summed in the message's word order: one weighted count over every word's postings."""
        scores = self._scores.get(namespace)
        if scores is None:
            found = self._candidates[namespace]
            held = [(word, found.postings[word]) for word in self.words if word in found.postings]
            if held:
                # bincount adds each slot's weights in the order given: the message's
                slots = np.concatenate([postings for _, postings in held])
                weights = np.repeat([self.idf[word] for word, _ in held], [p.size for _, p in held])
                scores = np.bincount(slots, weights=weights, minlength=found.counts.size)
                scores[found.counts == 0] = 0
            else:
                scores = np.zeros(found.counts.size)
            self._scores[namespace] = scores
        return scores

    def _first_of(self, namespace: str, count: int) -> list[tuple[float, str, int, float]]:
        """Return the namespace's first ``count`` candidates in rank order, as ``(rounded score,
        key, slot, score)``."""
        pruned = self._pruned(namespace, count)
        if pruned is None:
            dense = self._scores_of(namespace)
            slots = np.flatnonzero(dense)
            return self._ordered(namespace, slots, dense[slots], count)
        return self._ordered(namespace, *pruned, count)

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
        """Return the score of each of ``slots`` (ascending, as the postings' int32), summed in
        the message's word order as the dense pass sums them."""
        found = self._candidates[namespace]
        scores = np.zeros(slots.size)
        for word in self.words:
            postings = found.postings.get(word)
            if postings is None or not postings.size:
                continue
            marks = found.marks.get(word)
            if marks is not None and marks.size >= found.counts.size:
                held = marks[slots].view(bool)
            else:
                at = np.minimum(np.searchsorted(postings, slots), postings.size - 1)
                held = postings[at] == slots
            np.add(scores, self.idf[word], out=scores, where=held)
        return scores

    def _pruned(self, namespace: str, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Return live candidates among which the first ``count`` surely are, with their scores,
        or ``None`` when the dense pass over every slot is cheaper.

        Words are taken from the rarest (max-score pruning): an entry holding none of the words
        taken yet scores at most the weights of the words left; once ``count`` holders of the
        words taken score more than that, no other entry can come before them. Each holder is
        scored once, when its word is taken; words are taken together while their holders are
        fewer than :data:`_PRUNE_BATCH`, so a cut is tried once or twice a turn.
        """
        found = self._candidates[namespace]
        held = [(self.idf[w], w) for w in self.words if w in found.postings and found.postings[w].size]
        held.sort(key=lambda item: -item[0])
        left = sum(weight for weight, _ in held)
        limit = max(_PRUNE_FROM, found.counts.size // _PRUNE_SHARE)
        pools: list[np.ndarray] = []  # the holders scored so far, each ascending
        scores: list[np.ndarray] = []
        waiting: list[np.ndarray] = []  # postings of the words taken since
        taken = 0
        for position, (weight, word) in enumerate(held):
            postings = found.postings[word]
            if taken + postings.size > limit:
                return None
            waiting.append(postings)
            taken += postings.size
            left -= weight
            last = position == len(held) - 1
            if not last and (
                taken < count or taken + found.postings[held[position + 1][1]].size <= _PRUNE_BATCH
            ):
                continue  # too few holders for a cut yet, or more are cheap to take first
            new = waiting[0] if len(waiting) == 1 else np.unique(np.concatenate(waiting))
            waiting = []
            new = new[found.counts[new] > 0]
            for earlier in pools:  # holders already scored are not scored again
                if new.size and earlier.size:
                    at = np.minimum(np.searchsorted(earlier, new), earlier.size - 1)
                    new = new[earlier[at] != new]
            pools.append(new)
            scores.append(self._exact(namespace, new))
            if last:
                break
            pool, exact = np.concatenate(pools), np.concatenate(scores)
            if pool.size < count:
                continue
            rounded = np.round(exact, SCORE_DIGITS)
            edge = float(-np.partition(-rounded, count - 1)[count - 1])
            # ``left`` may carry a float's error from the subtractions: a margin far above it.
            if edge > round(left, SCORE_DIGITS) + 10.0**-SCORE_DIGITS:
                kept = rounded >= edge
                return pool[kept], exact[kept]
        if not pools:
            return np.empty(0, dtype=np.int32), np.zeros(0)
        return np.concatenate(pools), np.concatenate(scores)

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


def weighted(
    memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
) -> Ranking:
    """Rank by ``weighted`` (module docstring): from the word indexes (those built under
    ``stemming``) when every namespace is served by a driver that keeps one, else from a full
    read of the namespaces."""
    words = asked_words(message, stemming)
    sources = indexed_sources(memory, namespaces, stemming)
    if sources is not None:
        return IndexedWeighted(words, sources, now)
    return weighted_scan(memory, message, namespaces, now, stemming)
