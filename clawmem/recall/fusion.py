"""The ``semantic`` and ``hybrid`` scorings (local embeddings, and their fusion with ``weighted``).

``semantic`` ranks the embedded entries of the namespaces read by the cosine of their vector to
the message's. ``hybrid`` ranks the union of ``weighted``'s first :data:`DEPTH` candidates and
``semantic``'s first :data:`DEPTH`, so a keyword-only and a meaning-only candidate can each be
injected. Its fused score is a weighted reciprocal rank fusion::

    fused(e) = WEIGHTED_SHARE / (RRF_K + rank_w(e)) + (1 - WEIGHTED_SHARE) / (RRF_K + rank_s(e))

where ``rank_w`` and ``rank_s`` are the entry's 1-based ranks in the ``weighted`` and
``semantic`` orders; an entry past :data:`DEPTH` in one list (or absent from it: no shared word,
or no vector yet) gets no term for it. An entry without a vector is thus scored by ``weighted``
alone, and the report says how many entries are embedded.

When every namespace is served by a driver with a word index and the vectors are kept for the
scorer (not embedded as a turn reads them), neither reads a namespace whole: a ``semantic`` turn
reads back its first entries only (:mod:`clawmem.recall.semantic_index`), and a ``hybrid`` turn
its finalists, ``weighted`` from the word indexes and ``semantic`` by one float32 product over
the int8 codes of the vectors held. Else they read the namespaces whole, as
:meth:`SemanticScorer.semantic_scan` (the reference) does.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from clawmem.recall.candidates import Candidate, Ranking
from clawmem.recall.embeddings import (
    Embedder,
    UniversalSentenceEncoder,
    VectorStore,
    load_embedder,
)
from clawmem.recall.feeds import ChangeFeed
from clawmem.recall.index import WordIndex
from clawmem.recall.injection import line_bytes
from clawmem.recall.persisted import Stores
from clawmem.recall.rankings import indexed_sources
from clawmem.recall.scoring import SCORE_DIGITS, Entry, Scored, ScoredRanking, read_entries, weighted_scores
from clawmem.recall.semantic_index import IndexedSemantic, Source
from clawmem.recall.sources import Readable, conforms, serving_driver
from clawmem.recall.weighted_index import IndexedWeighted
from clawmem.recall.words import NO_STEMMING, entry_words, keywords

DEPTH = 100  # each list's first entries that hybrid fuses (on LoCoMo's dev split 50 fused as well as all)
EMBED_PER_TURN = 128  # entries a turn embeds at most (a few hundred ms); the rest wait for later
RRF_K = 1.0  # tuned on LoCoMo conversations 0-4 only (60 gave 0.654 recall@3 there, 1 gave 0.683)
WEIGHTED_SHARE = 0.5


COSINE_DIGITS = 5  # float32 cosines are compared rounded, so equal texts tie


def _order(items: list[Scored], digits: int = SCORE_DIGITS) -> list[Scored]:
    return sorted(items, key=lambda item: (-round(item.score, digits), item.key, item.order))


class SemanticScorer:
    """Holds one embedder's vectors and answers the ``semantic`` and ``hybrid`` rankers.

    Entries are embedded as they are written (:mod:`clawmem.memory.vector_writes`) and by
    ``clawmem embed``; a turn reads the vectors kept and scores an entry without one by
    ``weighted`` alone. With ``embed_on_read`` a turn also embeds the entries it finds without
    a vector of their current text (at most :data:`EMBED_PER_TURN` a turn), which makes it read
    the namespaces whole. The vectors of the sql, redis and file drivers' entries are kept
    beside them (:mod:`clawmem.recall.persisted`) unless ``persist`` is off; the array driver's
    are held in process.
    """

    def __init__(
        self, embedder: Embedder | None = None, embed_on_read: bool = False, persist: bool = True
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
            if conforms(driver, ChangeFeed):
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

    def semantic(
        self, memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
    ) -> Ranking:
        """Rank the embedded entries by cosine to the message (the words each matched are taken
        under ``stemming``; the vectors are of the texts as written): from the vectors held when
        every namespace is served by a driver with a word index and no turn embeds, else as
        :meth:`semantic_scan` does (the two rank alike)."""
        if not self.embed_on_read:
            sources = indexed_sources(memory, namespaces, stemming)
            if sources is not None:
                query = self.store.query(message)
                held = self._followed(sources, now)
                return IndexedSemantic(keywords(message, stemming), query, held, now, COSINE_DIGITS, stemming)
        return self.semantic_scan(memory, message, namespaces, now, stemming)

    def semantic_scan(
        self, memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
    ) -> Ranking:
        """Rank the embedded entries by cosine to the message from a full read of the namespaces
        (the reference; with ``embed_on_read``, the entries read without a vector are embedded)."""
        entries = read_entries(memory, namespaces, stemming)
        words = keywords(message, stemming)
        scored = self._semantic(memory, message, entries, namespaces, now)
        held = {(entry.namespace, entry.key): entry.words for entry in entries}
        for item in scored:
            item.matched = tuple(word for word in words if word in held[item.namespace, item.key])
        ranking = ScoredRanking(words, scored, len(entries) - len(scored), len(entries))
        ranking.embedded = len(scored)  # type: ignore[attr-defined]
        return ranking

    def hybrid(
        self, memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
    ) -> Ranking:
        """Rank the union of ``weighted``'s (its words under ``stemming``) and ``semantic``'s
        first :data:`DEPTH` candidates."""
        words = keywords(message, stemming)
        if not self.embed_on_read:
            sources = indexed_sources(memory, namespaces, stemming)
            if sources is not None:
                return self._indexed_hybrid(words, message, sources, now, stemming)
        entries = read_entries(memory, namespaces, stemming)
        keyword = _order(weighted_scores(words, entries))[:DEPTH]
        meaning = _order(self._semantic(memory, message, entries, namespaces, now), COSINE_DIGITS)
        embedded = len(meaning)
        held = {(entry.namespace, entry.key): entry.words for entry in entries}
        for item in meaning[:DEPTH]:
            item.matched = tuple(word for word in words if word in held[item.namespace, item.key])
        ranking = ScoredRanking(words, fuse(keyword, meaning[:DEPTH]), 0, len(entries))
        ranking.zero_overlap = len(entries) - ranking.candidate_count
        ranking.embedded = embedded  # type: ignore[attr-defined]
        return ranking

    def _followed(self, sources: Sequence[tuple[str, ChangeFeed, WordIndex]], now: int) -> list[Source]:
        """Return each source with its store of vectors, in step with the driver's change feed
        and with what other processes stored."""
        held = []
        for namespace, driver, index in sources:
            store = self.store_for(driver)
            store.follow(driver.changes, namespace, now)
            store.refresh(namespace, len(index))
            held.append((namespace, driver, index, store))
        return held

    def _indexed_hybrid(
        self,
        words: list[str],
        message: str,
        sources: Sequence[tuple[str, ChangeFeed, WordIndex]],
        now: int,
        stemming: str,
    ) -> Ranking:
        query = self.store.query(message)
        keyword_ranking = IndexedWeighted(words, sources, now)
        order_of = {namespace: order for order, (namespace, _, _) in enumerate(sources)}
        keyword = []
        sizes = {}
        first = keyword_ranking.first(DEPTH)
        for candidate, matched in zip(first, keyword_ranking.matched(first), strict=True):
            weights = tuple(keyword_ranking.idf[word] for word in matched)
            namespace, key = candidate.namespace, candidate.key
            score = float(candidate.score)
            keyword.append(Scored(namespace, key, "", score, order_of[namespace], matched, weights))
            sizes[namespace, key] = candidate.bytes
        # semantic's first DEPTH, each read back and checked as a semantic turn's are
        semantic = IndexedSemantic(words, query, self._followed(sources, now), now, COSINE_DIGITS, stemming)
        meaning = [semantic.explain(candidate) for candidate in semantic.first(DEPTH)]
        return FusedRanking(
            words, fuse(keyword, meaning), keyword_ranking, semantic.embedded, sizes, stemming
        )


def fuse(keyword: Sequence[Scored], meaning: Sequence[Scored]) -> list[Scored]:
    """Return the fused candidates of ``weighted``'s and ``semantic``'s lists (each in rank
    order, already cut at :data:`DEPTH`), each with its signals (module docstring)."""
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
            found = Scored(item.namespace, item.key, item.text, 0.0, item.order, item.matched)
            fused[item.namespace, item.key] = found
        found.score += (1 - WEIGHTED_SHARE) / (RRF_K + rank)
        found.signals.update(cosine=item.signals["cosine"], semantic_rank=rank)
    scored = list(fused.values())
    for item in scored:
        item.signals["fused"] = item.score
    return scored


class FusedRanking(ScoredRanking):
    """``hybrid``'s ranking from the word indexes and the vectors held: its candidates are
    ranked in full (a few hundred at most); the injected ones are read back and checked as the
    word index's rankings do."""

    def __init__(
        self,
        words: Sequence[str],
        scored: list[Scored],
        keyword: IndexedWeighted,
        embedded: int,
        sizes: dict[tuple[str, str], int],
        stemming: str = NO_STEMMING,
    ) -> None:
        super().__init__(words, scored, keyword.total - len(scored), keyword.total)
        self.stemming = stemming
        self._keyword = keyword
        self._sizes = sizes
        self.embedded = embedded

    def first(self, count: int) -> list[Candidate]:
        out = []
        for item in self.scored[: max(count, 0)]:
            size = self._sizes.get((item.namespace, item.key))
            if size is None:  # a meaning-only candidate: its text was read with its vector's check
                size = self._sizes[item.namespace, item.key] = line_bytes(item.key, item.text)
            out.append(Candidate(item.namespace, item.key, item.score, size))  # type: ignore[arg-type]
        return out

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        out = []
        for candidate in candidates:
            item = self.explain(candidate)
            if "weighted_rank" not in item.signals and not item.matched:
                # meaning-only: the message words its text holds (past weighted's first DEPTH)
                held = entry_words(item.key, item.text, self.stemming)
                item.matched = tuple(word for word in self.words if word in held)
            out.append(item.matched)
        return out

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        """Read the candidates back from the backend (raises ``StaleIndex`` as the word index's
        rankings do)."""
        return self._keyword.texts(candidates)


_SCORERS: dict[str, SemanticScorer] = {}
_SCORERS_LOCK = threading.Lock()


def default_scorer(embedder: str = "") -> SemanticScorer:
    """Return the process's scorer of the embedder ``embedder`` names (``CLAW_RECALL_EMBEDDER``,
    ``module:callable``; ``""``: the bundled encoder, loaded on first use), created once. Raises
    :class:`~clawmem.errors.ConfigError` for a name that makes no embedder."""
    spec = embedder.strip()
    with _SCORERS_LOCK:
        scorer = _SCORERS.get(spec)
        if scorer is None:
            scorer = _SCORERS[spec] = SemanticScorer(load_embedder(spec) if spec else None)
        return scorer


def semantic(
    memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
) -> Ranking:
    """The ``semantic`` ranker of the process's scorer."""
    return default_scorer().semantic(memory, message, namespaces, now, stemming)


def hybrid(
    memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
) -> Ranking:
    """The ``hybrid`` ranker of the process's scorer."""
    return default_scorer().hybrid(memory, message, namespaces, now, stemming)
