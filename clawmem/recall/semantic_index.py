"""``semantic`` answered from the vectors held: a turn reads back its first entries, never a
namespace whole.

The ranking is the reference's (:meth:`clawmem.recall.fusion.SemanticScorer.semantic_scan`):
every live entry holding a vector of its current text, by its cosine to the message rounded to
``digits`` (descending), then key, then the namespaces' order. Here each namespace's vectors
give their first ones by one float32 product (:meth:`~clawmem.recall.embeddings.VectorStore.nearest`),
and each is read back by key: it counts only while its entry is live and holds the text the
vector was made from. One that does not is passed over, and the next ones are taken.
``nearest`` cuts by a float32 rounding, the reference by Python's: the two may differ by one
unit of the last digit, so only candidates more than that above the last one taken are given
out, and a few more than asked are taken to have them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clawmem.recall.candidates import Candidate
from clawmem.recall.embeddings import VectorStore, text_print
from clawmem.recall.feeds import ChangeFeed
from clawmem.recall.index import WordIndex
from clawmem.recall.injection import line_bytes
from clawmem.recall.scoring import Scored
from clawmem.recall.words import NO_STEMMING, entry_words, text_of
from clawmem.rules import is_expired

MARGIN = 16  # vectors taken past the candidates asked for, so the cut above is certain at once
FETCH_BATCH = 1000  # keys read back in one call: a report read to its end may ask for every one

Source = tuple[str, ChangeFeed, WordIndex, VectorStore]  # a namespace, its driver, index and vectors


def verified(
    driver: ChangeFeed, namespace: str, found: Sequence[tuple[str, int, float]], now: int
) -> list[tuple[str, str, float]]:
    """Return ``(key, text, cosine)`` of each ``(key, text print, cosine)`` of ``found`` whose
    entry is live and holds the text its vector was made from, read back by key, in their order."""
    keys = [key for key, _, _ in found]
    rows = {}
    for start in range(0, len(keys), FETCH_BATCH):  # SQLite binds at most 32,766 values a statement
        rows.update(driver.fetch(namespace, keys[start : start + FETCH_BATCH]))
    out = []
    for key, printed, cosine in found:
        row = rows.get(key)
        if row is None or getattr(row, "raw_value", False) or is_expired(row.expires_at, now):
            continue
        text = text_of(row.value)
        if text_print(text) == printed:
            out.append((key, text, cosine))
    return out


class _Nearest:
    """One namespace's candidates, taken from its vectors as far as they are asked for."""

    def __init__(self, source: Source, order: int, query: np.ndarray, now: int, digits: int) -> None:
        self.namespace, self.driver, _, self.store = source
        self.order = order
        self.query = query
        self.now = now
        self.digits = digits
        self.kept: list[Scored] = []  # live and current, in rank order
        self.seen: set[str] = set()  # keys taken from the vectors, kept or passed over
        self.taken = 0  # how many vectors the last product gave
        self.exhausted = False
        self.certain = 0  # of ``kept``, how many surely come before any vector not taken yet

    def first(self, count: int) -> list[Scored]:
        """Return this namespace's first ``count`` candidates in rank order."""
        while self.certain < count and not self.exhausted:
            ask = max(count + MARGIN + len(self.seen) - len(self.kept), 2 * self.taken)
            found = self.store.nearest(self.namespace, self.query, ask, self.digits)
            self.exhausted = len(found) < ask
            self.taken = len(found)
            new = [item for item in found if item[0] not in self.seen]
            self.seen.update(key for key, _, _ in new)
            for key, text, cosine in verified(self.driver, self.namespace, new, self.now):
                item = Scored(self.namespace, key, text, round(cosine, self.digits), self.order)
                item.signals["cosine"] = cosine
                self.kept.append(item)
            self.kept.sort(key=lambda item: (-item.score, item.key))
            if self.exhausted:
                self.certain = len(self.kept)
            else:
                # A vector not taken rounds, in float32, to at most the last one taken's
                # cosine; by Python's rounding it may reach one unit of the last digit above.
                bound = round(float(np.round(np.float32(found[-1][2]), self.digits)), self.digits)
                above = bound + 1.5 * 10.0**-self.digits
                self.certain = sum(1 for item in self.kept if item.score > above)
        return self.kept[: min(count, self.certain)]


class IndexedSemantic:
    """The ``semantic`` ranking of one message from the vectors held (module docstring):
    ``sources`` are each namespace's driver, word index and vectors, all up to date with the
    driver. ``total`` is the live entries (counted by the word indexes), ``embedded`` (and
    ``candidate_count``) the vectors held less those passed over so far (at most one per live
    entry), and ``zero_overlap`` the rest. Following the change feed keeps each vector held of
    a live entry's current text, so these are the full read's counts; a stale vector the feed
    could not show (another process's, read back late) is counted until it is passed over, and
    is never ranked."""

    def __init__(
        self,
        words: Sequence[str],
        query: np.ndarray,
        sources: Sequence[Source],
        now: int,
        digits: int,
        stemming: str = NO_STEMMING,
    ) -> None:
        self.words, self.stemming = list(words), stemming  # the message's words, under stemming
        self._nearest = [_Nearest(source, order, query, now, digits) for order, source in enumerate(sources)]
        self._live = [index.live_count(now) for _, _, index, _ in sources]
        self._held = [store.count(namespace) for namespace, _, _, store in sources]
        self.total = sum(self._live)
        self._ranked: list[Scored] = []
        self._by: dict[tuple[str, str], Scored] = {}

    @property
    def embedded(self) -> int:
        """Return how many live entries have a vector of their text, as far as is known."""
        counts = zip(self._nearest, self._held, self._live, strict=True)
        return sum(
            max(min(held - (len(nearest.seen) - len(nearest.kept)), live), 0)
            for nearest, held, live in counts
        )

    @property
    def candidate_count(self) -> int:
        return self.embedded

    @property
    def zero_overlap(self) -> int:
        return self.total - self.embedded

    def _ranks(self, count: int) -> list[Scored]:
        if count > len(self._ranked):
            merged = [item for nearest in self._nearest for item in nearest.first(count)]
            merged.sort(key=lambda item: (-item.score, item.key, item.order))
            self._ranked = merged[:count]
            for position, item in enumerate(self._ranked, 1):
                item.signals["semantic_rank"] = position
                self._by[item.namespace, item.key] = item
        return self._ranked[:count]

    def first(self, count: int) -> list[Candidate]:
        return [
            Candidate(item.namespace, item.key, item.score, line_bytes(item.key, item.text))  # type: ignore[arg-type]
            for item in self._ranks(max(count, 0))
        ]

    def explain(self, candidate: Candidate) -> Scored:
        """Return the scored candidate behind ``candidate``, with its cosine and rank."""
        return self._by[candidate.namespace, candidate.key]

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        out = []
        for candidate in candidates:
            item = self._by[candidate.namespace, candidate.key]
            if not item.matched:
                held = entry_words(item.key, item.text, self.stemming)
                item.matched = tuple(word for word in self.words if word in held)
            out.append(item.matched)
        return out

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        """Return the candidates' texts, as read back when they were ranked."""
        return [self._by[c.namespace, c.key].text for c in candidates]
