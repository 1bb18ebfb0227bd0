"""The parts an augmented prompt is made of: where each span of text came from, what a guard
found in it, the words that say what happened to each recall or skill candidate, and each
skill's decision."""

from __future__ import annotations

from dataclasses import dataclass

# The Span.source of the user's own words (guards fall back to it too).
USER_MESSAGE = "user message"

# EntryDecision.status values.
INJECTED = "injected"
TRUNCATED = "truncated"
ZERO_OVERLAP = "dropped_zero_overlap"
CUT_TOP_K = "cut_top_k"
CUT_BYTE_CAP = "cut_byte_cap"
BELOW_MIN_SCORE = "dropped_below_min_score"  # scored under CLAW_RECALL_MIN_SCORE


@dataclass(frozen=True)
class Span:
    """A region ``[start, end)`` of the augmented text and where it came from.

    ``source`` is ``USER_MESSAGE`` (``"user message"``), ``"memory key <key>"`` or ``"skill <name>"``.
    """

    start: int
    end: int
    source: str


@dataclass(frozen=True)
class GuardFinding:
    """One kind of personal data found: the pattern's name and where (``user message``,
    ``memory key <key>`` or ``skill <name>``). Never the matched text."""

    pattern: str
    source: str


@dataclass(frozen=True)
class SkillDecision:
    """Whether one skill was injected (``status`` as for memory entries), its score and size."""

    name: str
    score: int
    bytes: int
    status: str
    reason: str

    @property
    def injected(self) -> bool:
        """Return whether the skill's content reached the augmented text."""
        return self.status == INJECTED
