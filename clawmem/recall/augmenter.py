"""MessageAugmenter: one turn's recall, from the ranking to the augmented text and its report.

The format of the injected block is :mod:`clawmem.recall.injection`'s; the report's is
:mod:`clawmem.recall.report`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from clawmem import events
from clawmem.clock import Clock, now_seconds
from clawmem.errors import StaleIndex
from clawmem.prompt import SkillDecision, Span
from clawmem.recall.candidates import Ranker, Ranking, unstemmed
from clawmem.recall.injection import DEFAULT_MAX_RECALL_BYTES, MEMORY_HEADER, plan_lines, render_memory_text
from clawmem.recall.phpclaw import ranker_for
from clawmem.recall.rankings import ATTEMPTS, ScanRanking, scan_ranking, word_overlap
from clawmem.recall.report import AugmentResult, Decisions, EntryDecision
from clawmem.recall.sources import Readable, driver_name, serving_driver
from clawmem.recall.words import DEFAULT_TOP_K
from clawmem.rules import validate_count, validate_namespace
from clawmem.text import utf8_len

log = logging.getLogger(__name__)


class SkillSource(Protocol):
    """The skills a turn wraps around its memory-augmented text (:class:`clawmem.SkillRegistry`)."""

    def decide(self, message: str) -> list[SkillDecision]: ...

    def wrap(
        self, text: str, spans: list[Span], decisions: list[SkillDecision]
    ) -> tuple[str, list[Span]]: ...


class RecallSettings(Protocol):
    """What a turn's recall reads of :class:`clawmem.settings.Settings` (which stands above it)."""

    recall_top_k: int
    recall_namespace: str
    recall_scoring: str
    recall_min_score: float | None


class MessageAugmenter:
    """Injects the best-matching memory entries (and skills) into a user message.

    ``ranker`` finds the candidates (default :func:`clawmem.recall.rankings.word_overlap`, answered
    from the drivers' word indexes); a backend failure skips recall for the turn instead of
    failing it. With ``min_score`` a candidate scoring below it is reported, not injected.
    With ``announce=False`` (previews of turns that never happen) it emits no
    ``memory.search`` or ``memory.recalled`` events.
    """

    def __init__(
        self,
        memory: Readable,
        top_k: int = DEFAULT_TOP_K,
        namespace: str = "default",
        skills: SkillSource | None = None,
        max_recall_bytes: int = DEFAULT_MAX_RECALL_BYTES,
        announce: bool = True,
        ranker: Ranker = word_overlap,
        clock: Clock | None = None,
        min_score: float | None = None,
    ) -> None:
        self.top_k = validate_count("top_k", top_k)
        self.max_recall_bytes = validate_count("max_recall_bytes", max_recall_bytes)
        self.memory = memory
        self.namespace = validate_namespace(namespace)
        self.skills = skills
        self.announce = announce
        self.ranker = ranker
        self.clock = clock
        self.min_score = min_score  # below it a candidate is not injected (CLAW_RECALL_MIN_SCORE)

    @classmethod
    def from_settings(
        cls, memory: Readable, settings: RecallSettings, announce: bool = True, namespace: str | None = None
    ) -> MessageAugmenter:
        """Return the augmenter a turn runs with under ``settings``: its top-k, recall namespace
        (unless ``namespace`` is given), scoring (``CLAW_RECALL_SCORING``) and floor
        (``CLAW_RECALL_MIN_SCORE``), with the embedder of ``CLAW_RECALL_EMBEDDER`` for
        ``semantic`` and ``hybrid``, and the words of ``CLAW_RECALL_STEMMING``. Raises
        ``ValueError`` for an unknown scoring or stemming."""
        return cls(
            memory,
            settings.recall_top_k,
            settings.recall_namespace if namespace is None else namespace,
            announce=announce,
            ranker=ranker_for(
                settings.recall_scoring,
                getattr(settings, "recall_embedder", ""),
                getattr(settings, "recall_stemming", "off"),
            ),
            min_score=settings.recall_min_score,
        )

    def _now(self, namespace: str) -> int:
        # Expiry is judged on the clock of the driver that serves the namespace.
        clock = self.clock or getattr(serving_driver(self.memory, namespace)[0], "clock", time.time)
        return now_seconds(clock)

    def rank(
        self, message: str, namespaces: Sequence[str]
    ) -> tuple[Ranking, list[tuple[str, str]], list[EntryDecision]]:
        """Return the ranking of ``message`` over ``namespaces`` and its planned block."""
        ranking, lines, decide = self._planned(message, namespaces)
        return ranking, lines, decide()

    def _planned(
        self, message: str, namespaces: Sequence[str]
    ) -> tuple[Ranking, list[tuple[str, str]], Callable[[], list[EntryDecision]]]:
        # The block now, its decisions when the report is read (see plan_lines).
        for _ in range(ATTEMPTS):
            ranking = self.ranker(self.memory, message, namespaces, self._now(namespaces[-1]))
            try:
                lines, decide = plan_lines(ranking, self.top_k, self.max_recall_bytes, self.min_score)
            except StaleIndex:
                continue  # the index corrected itself; rank again
            return ranking, lines, decide
        # The reference scan, with the words the ranker takes (stems, when it stems).
        stemming = unstemmed(self.ranker)[1]
        ranking = scan_ranking(self.memory, message, namespaces, self._now(namespaces[-1]), stemming)
        lines, decide = plan_lines(ranking, self.top_k, self.max_recall_bytes, self.min_score)
        return ranking, lines, decide

    def augment(self, message: str, subject_namespace: str | None = None) -> AugmentResult:
        """Return the augmented text and its report. Never raises for a memory backend failure.

        With ``subject_namespace`` (see :func:`clawmem.subject_namespace`) that namespace's
        entries are ranked together with the recall namespace's, the subject's first on a tie.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        namespaces = [self.namespace]
        if subject_namespace is not None and validate_namespace(subject_namespace) != self.namespace:
            namespaces.insert(0, subject_namespace)
        lines: list[tuple[str, str]] = []
        decisions: Decisions = Decisions(None, [], self.top_k)
        zero_overlap = 0
        error: str | None = None
        block_bytes = 0
        if self.top_k > 0:
            try:
                ranking, lines, planned = self._planned(message, namespaces)
            except Exception as exc:  # the memory backend's and the embedder's boundary, both
                # possibly the caller's own code: the turn goes on without memory, and the log
                # names the class only, as an exception message may quote stored data.
                error = type(exc).__name__
                log.warning("memory recall skipped for namespaces %s: %s", ", ".join(namespaces), error)
            else:
                decisions = Decisions(ranking, planned, self.top_k)
                zero_overlap = ranking.zero_overlap
                if lines:
                    block_bytes = utf8_len(MEMORY_HEADER) + sum(utf8_len(line) for _, line in lines)
                if self.announce:
                    self._emit(ranking, lines, block_bytes)
        text, spans = render_memory_text(message, lines)
        skill_decisions: list[SkillDecision] = []
        if self.skills is not None:
            skill_decisions = self.skills.decide(message)
            text, spans = self.skills.wrap(text, spans, skill_decisions)
        return AugmentResult(
            text=text,
            message=message,
            namespace=self.namespace,
            top_k=self.top_k,
            max_recall_bytes=self.max_recall_bytes,
            subject_namespace=namespaces[0] if len(namespaces) > 1 else None,
            decisions=decisions,
            zero_overlap=zero_overlap,
            skills=tuple(skill_decisions),
            bytes_used=block_bytes,
            error=error,
            spans=tuple(spans),
            stemming=unstemmed(self.ranker)[1],
        )

    def _emit(self, ranking: Ranking, lines: list[tuple[str, str]], block_bytes: int) -> None:
        driver = driver_name(self.memory, self.namespace)
        events.emit(
            "memory.search",
            driver=driver,
            namespace=self.namespace,
            mode="scan" if isinstance(ranking, ScanRanking) else "index",
            limit=self.top_k,
            entries=ranking.candidate_count + ranking.zero_overlap,
            hits=ranking.candidate_count,
        )
        if lines:
            events.emit(
                "memory.recalled",
                driver=driver,
                namespace=self.namespace,
                keys=[key for key, _ in lines],
                count=len(lines),
                bytes=block_bytes,
            )
