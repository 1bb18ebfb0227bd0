"""What the dashboard shows of recall without running a turn: how often each entry would be
injected into past messages (the cold-memory survey), the size of every live entry's line, and
the entries a message shares no word with. The dashboard asks these; it never scores.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clawmem.prompt import INJECTED, TRUNCATED
from clawmem.recall.candidates import Ranker, Ranking
from clawmem.recall.feeds import ChangeFeed, fresh_index
from clawmem.recall.index import WordIndex
from clawmem.recall.injection import DEFAULT_MAX_RECALL_BYTES, fit, line_bytes
from clawmem.recall.rankings import overlap_stemming, rank_each, word_overlap
from clawmem.recall.sources import Readable, conforms, serving_driver
from clawmem.recall.words import NO_STEMMING, keywords, text_of

# Per namespace index: the keys each message text injects, for one state of the index (see
# WordIndex.answers_as_of) and one top_k and byte cap. An Overview asks the same fifty messages
# on every load: while memory is unchanged, only messages it has not ranked yet are ranked.
_INJECTED: weakref.WeakKeyDictionary[WordIndex, tuple[Any, dict[str, tuple[str, ...]]]] = (
    weakref.WeakKeyDictionary()
)
_INJECTED_LOCK = threading.Lock()
MAX_REMEMBERED = 4096  # message texts kept per index before starting again


def injection_counts(
    memory: Readable,
    messages: Iterable[str],
    namespace: str,
    top_k: int,
    now: int,
    max_bytes: int = DEFAULT_MAX_RECALL_BYTES,
    ranker: Ranker = word_overlap,
    index: WordIndex | None = None,
) -> Counter[str]:
    """Return, per key, how many of ``messages`` would inject the entry (as a turn would).

    Only line sizes are needed, so nothing but the index is read per message (``index``: the
    namespace's, already brought up to date). With word overlap over an index, a message text
    already ranked against the same state of the index is not ranked again.
    """
    counts: Counter[str] = Counter()
    if top_k <= 0:
        return counts
    stemming = overlap_stemming(ranker)
    if stemming is not None and (index is None or index.stemming != stemming):
        index = _index_of(memory, namespace, stemming)
    if stemming is None or index is None:
        for ranking in rank_each(memory, messages, namespace, now, ranker, index):
            counts.update(_injected(ranking, top_k, max_bytes))
        return counts
    texts = list(messages)
    state = (index.answers_as_of(now), top_k, max_bytes)
    with _INJECTED_LOCK:
        remembered = _INJECTED.get(index)
        known = dict(remembered[1]) if remembered is not None and remembered[0] == state else {}
    unknown = list(dict.fromkeys(text for text in texts if text not in known))
    for text, ranking in zip(unknown, rank_each(memory, unknown, namespace, now, ranker, index), strict=True):
        known[text] = _injected(ranking, top_k, max_bytes)
    if unknown and index.answers_as_of(now) == state[0]:  # the index did not move meanwhile
        with _INJECTED_LOCK:
            # Past the cap, only this survey's messages are kept: the others were asked before.
            kept = known if len(known) <= MAX_REMEMBERED else {text: known[text] for text in texts}
            _INJECTED[index] = (state, kept)
    for text in texts:
        counts.update(known[text])
    return counts


def _injected(ranking: Ranking, top_k: int, max_bytes: int) -> tuple[str, ...]:
    """Return the keys of ``ranking``'s first ``top_k`` candidates that go into the block,
    whole or cut, in rank order."""
    first = ranking.first(top_k)
    outcomes = fit(first, ranking.candidate_count, max_bytes)
    return tuple(
        c.key for c, (status, _, _) in zip(first, outcomes, strict=True) if status in (INJECTED, TRUNCATED)
    )


def _index_of(memory: Readable, namespace: str, stemming: str = NO_STEMMING) -> WordIndex | None:
    driver = serving_driver(memory, namespace)[0]
    return fresh_index(driver, namespace, stemming=stemming) if conforms(driver, ChangeFeed) else None


def live_sizes(memory: Readable, namespace: str, now: int) -> dict[str, int]:
    """Return the injection-line size in bytes of every live entry of ``namespace``, by key."""
    index = _index_of(memory, namespace)
    if index is not None:
        return index.live_sizes(now)
    return {key: line_bytes(key, text_of(value)) for key, value in memory.all(namespace).items()}


@dataclass(frozen=True)
class InjectionSurvey:
    """How often each key of a namespace would have been injected into ``messages`` user
    messages, and every live entry's line size: ``cold`` are the live keys never injected."""

    messages: int
    injections: Counter[str]
    sizes: dict[str, int]
    cold: list[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cold", [key for key in self.sizes if key not in self.injections])

    @property
    def cold_bytes(self) -> int:
        """Return the line bytes of the cold entries."""
        return sum(self.sizes[key] for key in self.cold)

    @property
    def total_bytes(self) -> int:
        """Return the line bytes of every live entry."""
        return sum(self.sizes.values())


def survey(
    memory: Readable,
    messages: list[str],
    namespace: str,
    top_k: int,
    now: int,
    ranker: Ranker = word_overlap,
) -> InjectionSurvey:
    """Return the :class:`InjectionSurvey` of ``messages`` over ``namespace`` as turns would see
    it, the index (if the driver keeps one) brought up to date once for the counts and sizes."""
    index = _index_of(memory, namespace, overlap_stemming(ranker) or NO_STEMMING)
    injections = injection_counts(memory, messages, namespace, top_k, now, ranker=ranker, index=index)
    sizes = index.live_sizes(now) if index is not None else live_sizes(memory, namespace, now)
    return InjectionSurvey(len(messages), injections, sizes)


def unmatched_entries(
    memory: Readable,
    message: str,
    namespace: str,
    now: int,
    after: str | None,
    limit: int,
    ranker: Ranker = word_overlap,
) -> tuple[int, list[tuple[str, int, int | None]]]:
    """Return how many live entries of ``namespace`` share no word with ``message`` under
    ``ranker``'s scoring, and up to ``limit`` of them after key ``after`` in key order, as
    ``(key, line bytes, expires_at)``. Word overlap over an index reads the index alone."""
    stemming = overlap_stemming(ranker)
    index = _index_of(memory, namespace, stemming or NO_STEMMING)
    if stemming is not None and index is not None:
        words = keywords(message, stemming)
        return index.query(words, now).zero_overlap, index.without_words(words, now, after, limit)
    ranking = ranker(memory, message, [namespace], now)
    matched = {candidate.key for candidate in ranking.first(ranking.candidate_count)}
    sizes = live_sizes(memory, namespace, now)
    keys = [key for key in sizes if key not in matched and (after is None or key > after)][:limit]
    return ranking.zero_overlap, [(key, sizes[key], _expiry(index, key)) for key in keys]


def _expiry(index: WordIndex | None, key: str) -> int | None:
    indexed = index.state(key) if index is not None else None  # (fingerprint, expires_at)
    return indexed[1] if indexed else None
