"""What the dashboard shows of recall without running a turn: how often each entry would be
injected into past messages (the cold-memory survey), the size of every live entry's line, and
the entries a message shares no word with. The dashboard asks these; it never scores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from clawmem.prompt import INJECTED, TRUNCATED
from clawmem.recall.candidates import Ranker
from clawmem.recall.feeds import ChangeFeed, fresh_index
from clawmem.recall.index import WordIndex
from clawmem.recall.injection import DEFAULT_MAX_RECALL_BYTES, fit, line_bytes
from clawmem.recall.rankings import rank_each, word_overlap
from clawmem.recall.sources import Readable, conforms, serving_driver
from clawmem.recall.words import keywords, text_of


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
    namespace's, already brought up to date).
    """
    counts: Counter[str] = Counter()
    if top_k <= 0:
        return counts
    for ranking in rank_each(memory, messages, namespace, now, ranker, index):
        first = ranking.first(top_k)
        outcomes = fit(first, ranking.candidate_count, max_bytes)
        counts.update(
            c.key
            for c, (status, _, _) in zip(first, outcomes, strict=True)
            if status in (INJECTED, TRUNCATED)
        )
    return counts


def _index_of(memory: Readable, namespace: str) -> WordIndex | None:
    driver = serving_driver(memory, namespace)[0]
    return fresh_index(driver, namespace) if conforms(driver, ChangeFeed) else None


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
    index = _index_of(memory, namespace)
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
    index = _index_of(memory, namespace)
    if ranker is word_overlap and index is not None:
        words = keywords(message)
        return index.query(words, now).zero_overlap, index.without_words(words, now, after, limit)
    ranking = ranker(memory, message, [namespace], now)
    matched = {candidate.key for candidate in ranking.first(ranking.candidate_count)}
    sizes = live_sizes(memory, namespace, now)
    keys = [key for key in sizes if key not in matched and (after is None or key > after)][:limit]
    return ranking.zero_overlap, [(key, sizes[key], _expiry(index, key)) for key in keys]


def _expiry(index: WordIndex | None, key: str) -> int | None:
    indexed = index.state(key) if index is not None else None  # (fingerprint, expires_at)
    return indexed[1] if indexed else None
