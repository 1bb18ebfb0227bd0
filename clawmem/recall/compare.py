"""Two scorings side by side on one message: what each injects, and what one gains or loses
against the other. The dashboard's preview shows this; it never scores itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clawmem.recall.augmenter import MessageAugmenter, RecallSettings
from clawmem.recall.phpclaw import ranker_for
from clawmem.recall.report import AugmentResult, EntryDecision
from clawmem.recall.sources import Readable


@dataclass(frozen=True)
class Side:
    """One scoring's turn: its name, its report, and the decisions of what it injected."""

    scoring: str
    result: AugmentResult
    injected: tuple[EntryDecision, ...]


@dataclass(frozen=True)
class Comparison:
    """``first`` and ``second`` on one message. ``gained`` are what ``second`` injects and
    ``first`` does not, ``lost`` the reverse, ``kept`` what both inject (as ``second`` has them)."""

    first: Side
    second: Side
    gained: tuple[EntryDecision, ...]
    lost: tuple[EntryDecision, ...]
    kept: tuple[EntryDecision, ...]

    @property
    def same(self) -> bool:
        """Return whether both scorings inject the same entries in the same order."""
        return [_id(d) for d in self.first.injected] == [_id(d) for d in self.second.injected]


def _id(decision: EntryDecision) -> tuple[str, str]:
    return decision.namespace, decision.key


def _injected(result: AugmentResult) -> tuple[EntryDecision, ...]:
    return tuple(decision for decision in result.decisions[: result.top_k] if decision.injected)


def compare_results(first: tuple[str, AugmentResult], second: tuple[str, AugmentResult]) -> Comparison:
    """Return the comparison of two reports of one message, each given with its scoring's name."""
    one = Side(first[0], first[1], _injected(first[1]))
    two = Side(second[0], second[1], _injected(second[1]))
    in_one = {_id(d) for d in one.injected}
    in_two = {_id(d) for d in two.injected}
    return Comparison(
        one,
        two,
        gained=tuple(d for d in two.injected if _id(d) not in in_one),
        lost=tuple(d for d in one.injected if _id(d) not in in_two),
        kept=tuple(d for d in two.injected if _id(d) in in_one),
    )


def compare(
    memory: Readable,
    settings: RecallSettings,
    message: str,
    scorings: Sequence[str],
    namespace: str | None = None,
    subject_namespace: str | None = None,
) -> Comparison:
    """Run ``message`` as a turn under each of two ``scorings`` (the settings' top-k and
    namespace otherwise) without announcing it, and compare what each injects. The floor
    (``CLAW_RECALL_MIN_SCORE``) is on the configured scoring's scale, so only that scoring
    applies it. Raises
    ``ValueError`` for an unknown scoring or when not given exactly two."""
    if len(scorings) != 2:
        raise ValueError(f"compare needs exactly two scorings, got {len(scorings)}")
    results = []
    for scoring in scorings:
        ranker_for(scoring)  # refuses an unknown name before any turn runs
    stemming = getattr(settings, "recall_stemming", "off")
    for scoring in scorings:
        augmenter = MessageAugmenter.from_settings(memory, settings, announce=False, namespace=namespace)
        augmenter.ranker = ranker_for(scoring, getattr(settings, "recall_embedder", ""), stemming)
        if scoring != settings.recall_scoring:
            augmenter.min_score = None
        results.append((scoring, augmenter.augment(message, subject_namespace)))
    return compare_results(results[0], results[1])
