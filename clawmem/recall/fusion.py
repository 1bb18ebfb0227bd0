"""The ``semantic`` and ``hybrid`` scorings (local embeddings, and their fusion with ``weighted``).

``semantic`` ranks the embedded entries of the namespaces read by the cosine of their vector to
the message's. ``hybrid`` ranks the union of ``weighted``'s first :data:`DEPTH` candidates and
``semantic``'s first :data:`DEPTH`, so a keyword-only and a meaning-only candidate can each be
injected. Its fused score adds the two scores, each standardised over its own list::

    fused(e) = WEIGHTED_SHARE * z_w(e) + (1 - WEIGHTED_SHARE) * z_s(e) [+ TIME_WEIGHT]
    z_w(e)   = (weighted(e) - mean) / deviation, over weighted's list (likewise z_s for cosines)

An entry absent from a list is given the lowest score that list could still hold for it: 0
when the list holds every candidate (weighted: no shared word; semantic: no vector yet), else
the list's last score; a list whose scores are all equal gives every entry 0. When the message
names a time (:func:`clawmem.recall.timing.named_periods`: "in July 2023", "last week"), a
candidate whose time (:func:`clawmem.recall.timing.entry_time`: metadata ``at``, else
``updated_at``) falls in one of them gains :data:`TIME_WEIGHT`; its signals say which. When the
message asks when (:func:`clawmem.recall.timing.asks_when`: "When did Ann move?"), the weighing
is the same, and each injected line of an entry with a time carries its date, ``- key: text
(dated 2023-05-08)``: the answer a when-question seeks is often that date, and the entry's text
alone does not hold it. An entry without a vector is scored by ``weighted`` alone, and the report
says how many entries are embedded.

When every namespace is served by a driver with a word index and the vectors are kept for the
scorer (not embedded as a turn reads them), neither reads a namespace whole: a ``semantic`` turn
reads back its first entries only (:mod:`clawmem.recall.semantic_index`), and a ``hybrid`` turn
its finalists, ``weighted`` from the word indexes and ``semantic`` by one float32 product over
the int8 codes of the vectors held. Else they read the namespaces whole, as
:meth:`SemanticScorer.semantic_scan` (the reference) does.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence
from datetime import UTC, datetime
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
from clawmem.recall.timing import Period, asks_when, entry_time, named_periods
from clawmem.recall.weighted_index import IndexedWeighted
from clawmem.recall.words import NO_STEMMING, asked_words, entry_words
from clawmem.text import utf8_len

# Chosen by leave-one-conversation-out on LoCoMo's dev split (python -m bench.tune, stemming
# english; README "Recall scorings"), each on four conversations and scored on the fifth, a
# setting worth the mean of it and its grid neighbours, ``weighted`` without QUESTION_WORDS:
DEPTH = 100  # 50 to 300 gave 0.727-0.735 recall@3 on all five (flat); the folds chose 100 or 200
WEIGHTED_SHARE = 0.5  # 0.4 to 0.7 gave 0.725-0.735 (flat); the folds chose 0.3 to 0.7, 0.5 twice
TIME_WEIGHT = 4.0  # 0 gave 0.714, 3 to 8 gave 0.733-0.735 on all five; the folds chose 3, 4, 4, 6, 8
EMBED_PER_TURN = 128  # entries a turn embeds at most (a few hundred ms); the rest wait for later


COSINE_DIGITS = 5  # float32 cosines are compared rounded, so equal texts tie


def dated(text: str, item: Scored) -> str:
    """Return ``text`` as the line of ``item`` injects it: with its date when the message asks
    when and the entry has a time (signal ``line_date``)."""
    date = item.signals.get("line_date")
    return f"{text} (dated {date})" if date else text


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
        """Rank the embedded entries by cosine to the message (the words each matched, shown and
        never scored, are taken as ``weighted`` takes them, under ``stemming`` and less
        :data:`~clawmem.recall.words.QUESTION_WORDS`; the vectors are of the texts as written):
        from the vectors held when every namespace is served by a driver with a word index and no
        turn embeds, else as :meth:`semantic_scan` does (the two rank alike)."""
        if not self.embed_on_read:
            sources = indexed_sources(memory, namespaces, stemming)
            if sources is not None:
                query = self.store.query(message)
                held = self._followed(sources, now)
                words = asked_words(message, stemming)
                return IndexedSemantic(words, query, held, now, COSINE_DIGITS, stemming)
        return self.semantic_scan(memory, message, namespaces, now, stemming)

    def semantic_scan(
        self, memory: Readable, message: str, namespaces: Sequence[str], now: int, stemming: str = NO_STEMMING
    ) -> Ranking:
        """Rank the embedded entries by cosine to the message from a full read of the namespaces
        (the reference; with ``embed_on_read``, the entries read without a vector are embedded)."""
        entries = read_entries(memory, namespaces, stemming)
        words = asked_words(message, stemming)
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
        """Rank the union of ``weighted``'s (its words under ``stemming``, less
        :data:`~clawmem.recall.words.QUESTION_WORDS`) and ``semantic``'s first :data:`DEPTH`
        candidates."""
        words = asked_words(message, stemming)
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
        periods = named_periods(message, now)
        asked = asks_when(message)
        when = _times(memory, keyword, meaning[:DEPTH]) if periods or asked else {}
        scored = fuse(keyword, meaning[:DEPTH], periods, when, asked)
        for item in scored:
            item.text = dated(item.text, item)
        ranking = ScoredRanking(words, scored, 0, len(entries))
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
        periods = named_periods(message, now)
        asked = asks_when(message)
        when = _times({n: d for n, d, _ in sources}, keyword, meaning) if periods or asked else {}
        return FusedRanking(
            words,
            fuse(keyword, meaning, periods, when, asked),
            keyword_ranking,
            semantic.embedded,
            sizes,
            stemming,
        )


def _times(
    memory: Readable | dict[str, Any], keyword: Sequence[Scored], meaning: Sequence[Scored]
) -> dict[tuple[str, str], float]:
    """Return the time of each candidate of the two lists that has one, read back by key (one
    read a namespace); ``memory`` is the memory read, or each namespace's driver."""
    keys: dict[str, set[str]] = {}
    for item in (*keyword, *meaning):
        keys.setdefault(item.namespace, set()).add(item.key)
    out = {}
    for namespace, wanted in keys.items():
        driver = memory[namespace] if isinstance(memory, dict) else serving_driver(memory, namespace)[0]
        fetch = getattr(driver, "fetch", None)
        if fetch is None:  # a memory that cannot read rows back keeps no time
            continue
        for key, row in fetch(namespace, sorted(wanted)).items():
            moment = entry_time(key, getattr(row, "updated_at", None), getattr(row, "metadata", None))
            if moment is not None:
                out[namespace, key] = moment
    return out


def standardised(scores: Sequence[float], cut: bool) -> tuple[list[float], float]:
    """Return ``scores`` (one list, in rank order) as z-scores over the list, and the z-score an
    entry absent from it is given: the last score's when the list is ``cut``, else 0's."""
    if not scores:
        return [], 0.0
    count = len(scores)
    mean = sum(scores) / count
    deviation = math.sqrt(sum((score - mean) ** 2 for score in scores) / count)
    if deviation <= 1e-12:
        return [0.0] * count, 0.0
    absent = scores[-1] if cut else 0.0
    return [(score - mean) / deviation for score in scores], (absent - mean) / deviation


def fuse(
    keyword: Sequence[Scored],
    meaning: Sequence[Scored],
    periods: Sequence[Period] = (),
    when: dict[tuple[str, str], float] | None = None,
    asked: bool = False,
) -> list[Scored]:
    """Return the fused candidates of ``weighted``'s and ``semantic``'s lists (each in rank
    order, already cut at :data:`DEPTH`), each with its signals (module docstring): ``periods``
    are the times the message names, ``when`` the candidates' times, ``asked`` whether the
    message asks when (each line with a time then carries its date)."""
    z_keyword, keyword_absent = standardised([item.score for item in keyword], len(keyword) >= DEPTH)
    # the cosines as semantic ranks them (rounded), so the held vectors' and a full read's agree
    z_meaning, meaning_absent = standardised([item.score for item in meaning], len(meaning) >= DEPTH)
    fused: dict[tuple[str, str], Scored] = {}
    for rank, (item, z) in enumerate(zip(keyword, z_keyword, strict=True), 1):
        fused[item.namespace, item.key] = Scored(
            item.namespace,
            item.key,
            item.text,
            WEIGHTED_SHARE * z,
            item.order,
            item.matched,
            item.weights,
            {"weighted": item.score, "weighted_rank": rank},
        )
    for rank, (item, z) in enumerate(zip(meaning, z_meaning, strict=True), 1):
        found = fused.get((item.namespace, item.key))
        if found is None:
            found = Scored(item.namespace, item.key, item.text, WEIGHTED_SHARE * keyword_absent, item.order)
            found.matched = item.matched
            fused[item.namespace, item.key] = found
        found.score += (1 - WEIGHTED_SHARE) * z
        found.signals.update(cosine=item.signals["cosine"], semantic_rank=rank)
    scored = list(fused.values())
    for item in scored:
        if "semantic_rank" not in item.signals:
            item.score += (1 - WEIGHTED_SHARE) * meaning_absent
        moment = (when or {}).get((item.namespace, item.key))
        if moment is not None and (periods or asked):
            item.signals["time"] = datetime.fromtimestamp(moment, UTC).date().isoformat()
            if asked:
                item.signals["line_date"] = item.signals["time"]
            named = next((period for period in periods if period.holds(moment)), None)
            if named is not None:
                item.score += TIME_WEIGHT
                item.signals["time_named"] = named.text
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
            if "line_date" in item.signals:
                size += utf8_len(dated("", item))
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
        rankings do), each as its line injects it (:func:`dated`)."""
        texts = self._keyword.texts(candidates)
        return [dated(text, self.explain(c)) for text, c in zip(texts, candidates, strict=True)]


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
