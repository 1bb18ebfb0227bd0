"""The ``semantic`` and ``hybrid`` scorings (local embeddings, and their fusion with ``weighted``).

``semantic`` ranks the embedded entries of the namespaces read by the cosine of their vector to
the message's. ``hybrid`` ranks the union of ``weighted``'s candidates (every entry sharing a
word) and ``semantic``'s first :data:`POOL`, so a keyword-only and a meaning-only candidate can
each be injected. Its fused score is a weighted reciprocal rank fusion::

    fused(e) = WEIGHTED_SHARE / (RRF_K + rank_w(e)) + (1 - WEIGHTED_SHARE) / (RRF_K + rank_s(e))

where ``rank_w`` and ``rank_s`` are the entry's 1-based ranks in the full ``weighted`` and
``semantic`` orders; an entry absent from one list (no shared word, or no vector yet) gets no
term for it. An entry without a vector is thus scored by ``weighted`` alone, and the report
says how many entries are embedded.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from clawmem.recall.candidates import Ranking
from clawmem.recall.embeddings import Embedder, UniversalSentenceEncoder, VectorStore
from clawmem.recall.feeds import ChangeFeed
from clawmem.recall.persisted import Stores
from clawmem.recall.scoring import SCORE_DIGITS, Entry, Scored, ScoredRanking, read_entries, weighted_scores
from clawmem.recall.sources import Readable, serving_driver
from clawmem.recall.words import keywords

POOL = 20  # semantic's first entries that join hybrid's candidates
EMBED_PER_TURN = 128  # entries a turn embeds at most (a few hundred ms); the rest wait for later
RRF_K = 1.0  # tuned on LoCoMo conversations 0-4 only (60 gave 0.646 recall@3 there, 1 gave 0.681)
WEIGHTED_SHARE = 0.5


COSINE_DIGITS = 5  # float32 cosines are compared rounded, so equal texts tie


def _order(items: list[Scored], digits: int = SCORE_DIGITS) -> list[Scored]:
    return sorted(items, key=lambda item: (-round(item.score, digits), item.key, item.order))


class SemanticScorer:
    """Holds one embedder's vectors and answers the ``semantic`` and ``hybrid`` rankers.

    With ``embed_on_read`` an entry without a vector of its current text is embedded by the
    first turn that reads it (at most :data:`EMBED_PER_TURN` a turn; ``clawmem embed`` does
    the rest). The vectors of the sql driver's entries are kept in its database
    (:mod:`clawmem.recall.vector_table`) unless ``persist`` is off; every other driver's are
    held in process.
    """

    def __init__(
        self, embedder: Embedder | None = None, embed_on_read: bool = True, persist: bool = True
    ) -> None:
        self._embedder = embedder
        self._store: VectorStore | None = None
        self.embed_on_read = embed_on_read
        self.persist = persist
        self._stores = Stores()
        # Each driver's own (gone with it): two drivers may hold one key in one namespace.
        self._held: weakref.WeakKeyDictionary[Any, VectorStore] = weakref.WeakKeyDictionary()

    @property
    def store(self) -> VectorStore:
        """Return the scorer's own in-process store: the message vectors' cache, and the
        vectors of a memory that is no driver (loading the bundled encoder on first use)."""
        if self._store is None:
            self._store = VectorStore(self._embedder or UniversalSentenceEncoder())
        return self._store

    def store_for(self, driver: object) -> VectorStore:
        """Return the store of ``driver``'s vectors: its database's when it keeps them (and
        ``persist`` is on), else one held in process for that driver alone."""
        embedder = self.store.embedder
        persisted = self._stores.of(driver, embedder) if self.persist else None
        if persisted is not None:
            return persisted
        try:
            held = self._held.get(driver)
            if held is None:
                held = self._held[driver] = VectorStore(embedder)
        except TypeError:  # a memory that cannot be weakly referenced
            return self.store
        return held

    def _semantic(
        self, memory: Readable, message: str, entries: Sequence[Entry], namespaces: Sequence[str], now: int
    ) -> list[Scored]:
        query = self.store.query(message)
        scored: list[Scored] = []
        for order, namespace in enumerate(namespaces):
            own = [(entry.key, entry.text) for entry in entries if entry.order == order]
            driver = serving_driver(memory, namespace)[0]
            store = self.store_for(driver)
            if isinstance(driver, ChangeFeed):
                store.follow(driver.changes, namespace, now)
            store.refresh(namespace, len(own))
            if self.embed_on_read:
                store.embed_missing(namespace, own, limit=EMBED_PER_TURN)
            for (key, text), cosine in zip(own, store.cosines(namespace, own, query), strict=True):
                if cosine is not None:
                    scored.append(Scored(namespace, key, text, cosine, order, signals={"cosine": cosine}))
        for position, item in enumerate(_order(scored, COSINE_DIGITS)):
            item.signals["semantic_rank"] = position + 1
            item.score = round(item.score, COSINE_DIGITS)
        return scored

    def semantic(self, memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
        """Rank the embedded entries by cosine to the message."""
        entries = read_entries(memory, namespaces)
        words = keywords(message)
        scored = self._semantic(memory, message, entries, namespaces, now)
        held = {(entry.namespace, entry.key): entry.words for entry in entries}
        for item in scored:
            item.matched = tuple(word for word in words if word in held[item.namespace, item.key])
        ranking = ScoredRanking(words, scored, len(entries) - len(scored), len(entries))
        ranking.embedded = len(scored)  # type: ignore[attr-defined]
        return ranking

    def hybrid(self, memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
        """Rank the union of ``weighted``'s candidates and ``semantic``'s first :data:`POOL`."""
        entries = read_entries(memory, namespaces)
        words = keywords(message)
        keyword = _order(weighted_scores(words, entries))
        meaning = _order(self._semantic(memory, message, entries, namespaces, now), COSINE_DIGITS)
        fused: dict[tuple[str, str], Scored] = {}
        for rank, item in enumerate(keyword, 1):
            fused[item.namespace, item.key] = Scored(
                item.namespace,
                item.key,
                item.text,
                WEIGHTED_SHARE / (RRF_K + rank),
                item.order,
                item.matched,
                item.weights,
                {"weighted": item.score, "weighted_rank": rank},
            )
        for rank, item in enumerate(meaning, 1):
            found = fused.get((item.namespace, item.key))
            if found is None:
                if rank > POOL:
                    continue
                found = fused[item.namespace, item.key] = Scored(
                    item.namespace, item.key, item.text, 0.0, item.order
                )
            found.score += (1 - WEIGHTED_SHARE) / (RRF_K + rank)
            found.signals.update(cosine=item.signals["cosine"], semantic_rank=rank)
        scored = list(fused.values())
        for item in scored:
            item.signals["fused"] = item.score
        ranking = ScoredRanking(words, scored, len(entries) - len(scored), len(entries))
        ranking.embedded = len(meaning)  # type: ignore[attr-defined]
        return ranking


_DEFAULT: SemanticScorer | None = None


def default_scorer() -> SemanticScorer:
    """Return the process's scorer with the bundled encoder (created on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SemanticScorer()
    return _DEFAULT


def semantic(memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """The ``semantic`` ranker of the process's scorer."""
    return default_scorer().semantic(memory, message, namespaces, now)


def hybrid(memory: Readable, message: str, namespaces: Sequence[str], now: int) -> Ranking:
    """The ``hybrid`` ranker of the process's scorer."""
    return default_scorer().hybrid(memory, message, namespaces, now)
