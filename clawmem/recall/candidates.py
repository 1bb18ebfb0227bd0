"""A candidate, and what every ranking answers about the candidates of one message."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from clawmem.recall.words import NO_STEMMING


@dataclass(frozen=True)
class Candidate:
    """One entry that shares at least one word with the message."""

    namespace: str
    key: str
    score: int
    bytes: int  # of its injection line ``- key: text\n``


class Ranking(Protocol):
    """The candidates of one message over one or more namespaces, ranked together: score
    descending, then key, then the namespaces' order (the subject's first).

    ``candidate_count`` is how many entries share a word with the message, ``zero_overlap``
    how many share none.
    """

    candidate_count: int
    zero_overlap: int

    def first(self, count: int) -> list[Candidate]:
        """Return the first ``count`` candidates in rank order."""

    def matched(self, candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
        """Return the query words each of ``candidates`` holds, in the message's order."""

    def texts(self, candidates: Sequence[Candidate]) -> list[str]:
        """Return the value text of each of ``candidates``, as it is stored now."""


# ranker(memory, message, namespaces, now) -> Ranking
Ranker = Callable[[Any, str, Sequence[str], int], Ranking]


@dataclass(frozen=True)
class Stemmed:
    """A ranker run with stemmed words (``CLAW_RECALL_STEMMING``): calls
    ``ranker(memory, message, namespaces, now, stemming=stemming)``."""

    ranker: Callable[..., Ranking]
    stemming: str

    def __call__(self, memory: Any, message: str, namespaces: Sequence[str], now: int) -> Ranking:
        return self.ranker(memory, message, namespaces, now, stemming=self.stemming)


def unstemmed(ranker: Ranker) -> tuple[Callable[..., Ranking], str]:
    """Return the ranker behind ``ranker`` and the stemming it runs with (``off`` when it is
    not :class:`Stemmed`)."""
    if isinstance(ranker, Stemmed):
        return ranker.ranker, ranker.stemming
    return ranker, NO_STEMMING
