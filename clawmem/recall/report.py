"""The report of one turn's recall: every candidate's decision, and the augmented text."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from clawmem.prompt import CUT_TOP_K, INJECTED, TRUNCATED, GuardFinding, SkillDecision, Span
from clawmem.recall.candidates import Candidate, Ranking
from clawmem.recall.words import NO_STEMMING, shown_matches, stems_of


def explain(ranking: Ranking, candidate: Candidate) -> tuple[tuple[str, str], ...]:
    """Return the signals behind ``candidate``'s score when ``ranking`` records them."""
    explained = getattr(ranking, "explain", None)
    if explained is None:
        return ()
    scored = explained(candidate)
    signals: list[tuple[str, str]] = []
    if scored.weights:
        pairs = zip(scored.matched, scored.weights, strict=True)
        shown = ", ".join(f"{word} {weight:.3f}" for word, weight in pairs)
        signals.append(("words", shown))
    for name, label in (
        ("weighted", "weighted"),
        ("weighted_rank", "weighted rank"),
        ("cosine", "cosine"),
        ("semantic_rank", "semantic rank"),
        ("time", "time"),
        ("time_named", "time named"),
        ("line_date", "line dated"),
        ("fused", "fused"),
    ):
        if name in scored.signals:
            value = scored.signals[name]
            signals.append((label, f"{value:.4f}" if isinstance(value, float) else str(value)))
    return tuple(signals)


@dataclass(frozen=True)
class EntryDecision:
    """What recall did with one entry: ``status`` is one of the module's status constants.

    ``bytes`` is the size of the entry's full injection line; ``reason`` says why, in words.
    """

    key: str
    score: int
    bytes: int
    status: str
    reason: str
    namespace: str = ""
    matched: tuple[str, ...] = ()
    # Each signal behind the score, as (name, shown value): the matched words with their
    # weights, the cosine, the rank in each list and the fused score (scored rankings only).
    signals: tuple[tuple[str, str], ...] = ()

    @property
    def injected(self) -> bool:
        """Return whether any part of the entry reached the augmented text."""
        return self.status in (INJECTED, TRUNCATED)


@dataclass(frozen=True)
class AugmentResult:
    """The augmented text and the report of how it was built.

    ``decisions`` covers every live entry of the namespaces read (the subject's, when
    ``subject_namespace`` is set, and the recall namespace) that shares a word with the
    message, in rank order (score descending, then key), computed as far as it is read;
    ``zero_overlap`` counts the live entries that share none; ``bytes_used`` is the size of the
    memory block (0 when nothing was injected); ``error`` is the exception class name when the
    memory backend failed and recall was skipped; ``findings`` are attached by the turn pipeline
    or the preview after the guards ran; ``stemming`` is what the words were stemmed by
    (``CLAW_RECALL_STEMMING``; ``off`` for ``phpclaw``), so each decision's ``matched`` holds stems.
    """

    text: str
    message: str
    namespace: str
    top_k: int
    max_recall_bytes: int
    subject_namespace: str | None = None
    decisions: Sequence[EntryDecision] = ()
    zero_overlap: int = 0
    skills: tuple[SkillDecision, ...] = ()
    bytes_used: int = 0
    error: str | None = None
    spans: tuple[Span, ...] = ()
    findings: tuple[GuardFinding, ...] = ()
    stemming: str = NO_STEMMING

    @property
    def injected_keys(self) -> list[str]:
        """Return the keys that reached the augmented text, in injection order."""
        return [decision.key for decision in self.decisions[: self.top_k] if decision.injected]

    @property
    def semantic_coverage(self) -> str | None:
        """Return "semantic: N of M entries embedded" for a semantic or hybrid turn, else ``None``
        (an entry without a vector is scored by ``weighted`` alone)."""
        ranking = getattr(self.decisions, "_ranking", None)
        embedded = getattr(ranking, "embedded", None)
        if embedded is None:
            return None
        return f"semantic: {embedded:,} of {ranking.total:,} entries embedded"  # type: ignore[union-attr]

    def matched_words(self, decision: EntryDecision) -> tuple[str, ...]:
        """Return the words ``decision`` matched as a report shows them: each stem the message
        wrote otherwise as ``shipped → ship``, every other word as it is."""
        if self.stemming == NO_STEMMING:
            return decision.matched
        return shown_matches(decision.matched, stems_of(self.message, self.stemming))

    @property
    def changed(self) -> bool:
        """Return whether the augmented text differs from the user's message."""
        return self.text != self.message


class Decisions(Sequence[EntryDecision]):
    """Every candidate's decision in rank order, computed only as far as it is read: the first
    ``top_k`` were planned with the turn (their decisions made on the first read), the rest were
    cut by top-k."""

    def __init__(
        self,
        ranking: Ranking | None,
        planned: list[EntryDecision] | Callable[[], list[EntryDecision]],
        top_k: int,
    ) -> None:
        self._ranking = ranking
        # The planned decisions, or (with a ranking) the call that makes them on the first read.
        self._planned, self._known = (planned, []) if callable(planned) else (None, list(planned))
        self._top_k = top_k
        self._hits = ranking.candidate_count if ranking is not None else len(self._known)

    def __len__(self) -> int:
        return self._hits

    def _extend(self, stop: int, ahead: bool = True) -> None:
        if self._planned is not None:
            self._known, self._planned = self._planned(), None
        if stop <= len(self._known) or self._ranking is None:
            return
        start = len(self._known)
        # Read ahead when reading one by one, which would rank the first n again for every n;
        # a slice (the MCP server's 25 candidates) says where it stops, so nothing past it.
        stop = min(max(stop, 2 * start, 50) if ahead else stop, self._hits)
        more = self._ranking.first(stop)[start:]
        for position, (candidate, words) in enumerate(
            zip(more, self._ranking.matched(more), strict=True), start
        ):
            reason = f"rank {position + 1} of {self._hits} hits; top_k is {self._top_k}"
            self._known.append(
                EntryDecision(
                    candidate.key,
                    candidate.score,
                    candidate.bytes,
                    CUT_TOP_K,
                    reason,
                    candidate.namespace,
                    words,
                    explain(self._ranking, candidate),
                )
            )

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            positions = range(*index.indices(self._hits))
            self._extend(max(positions, default=-1) + 1, ahead=False)
            return [self._known[position] for position in positions]
        position = index + self._hits if index < 0 else index
        if not 0 <= position < self._hits:
            raise IndexError("decision index out of range")
        self._extend(position + 1)
        return self._known[position]

    def __iter__(self) -> Iterator[EntryDecision]:
        self._extend(self._hits)
        return iter(self._known[: self._hits])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Decisions({self._hits} candidates, {len(self._known)} computed)"
