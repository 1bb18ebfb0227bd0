"""Recall quality on a labelled file: what ``clawmem eval FILE`` measures.

The file is JSON Lines. A *question* line holds ``message``, the ``keys`` that should be
recalled, and optionally ``namespace`` (the recall namespace, else the default), ``subject``
(a subject namespace ranked with it) and ``category`` (a label the figures can be broken down
by, as ``clawmem eval --by category`` does). An *entry* line holds ``namespace``, ``key`` and
``value``, and optionally ``metadata`` (a JSON object, as ``set(..., metadata=...)`` takes);
a file with entry lines is self-contained: it is evaluated on an in-process memory holding just
those entries, never on the site's, each embedded first for ``semantic`` and ``hybrid`` as a
write through a site would embed it (:func:`embed_entries`). Each question is one turn (top-k
and byte budget as usual):

- recall@n: the share of questions with a wanted key among the first ``n`` injected entries;
- MRR: the mean of 1 / the rank of the first wanted key in the ranking (0 past :data:`MRR_DEPTH`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clawmem.errors import EvalFileError
from clawmem.recall.augmenter import MessageAugmenter
from clawmem.recall.candidates import Ranker
from clawmem.recall.sources import Readable
from clawmem.recall.words import text_of

MRR_DEPTH = 100
NO_CATEGORY = "(none)"  # the category of a question line that names none


@dataclass(frozen=True)
class Question:
    """One labelled message."""

    message: str
    keys: frozenset[str]
    namespace: str | None = None
    subject: str | None = None
    category: str | None = None


@dataclass(frozen=True)
class Scores:
    """One scoring's numbers over the questions (``group``: the category they are of, ``None``
    for them all)."""

    scoring: str
    questions: int
    recall_at: dict[int, float]
    mrr: float
    group: str | None = None


@dataclass(frozen=True)
class EvalEntry:
    """One entry line of an eval file."""

    namespace: str
    key: str
    value: Any
    metadata: dict[str, Any] | None = None


def _text(line: dict[str, Any], field: str, number: int, optional: bool = False) -> str | None:
    value = line.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise EvalFileError(f"line {number}: {field!r} must be a non-empty string")
    return value


def parse(lines: Iterable[str]) -> tuple[list[EvalEntry], list[Question]]:
    """Return the entries and questions of an eval file's lines."""
    entries: list[EvalEntry] = []
    questions: list[Question] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            raise EvalFileError(f"line {number}: not JSON") from None
        if not isinstance(line, dict):
            raise EvalFileError(f"line {number}: not a JSON object")
        if "message" in line:
            keys = line.get("keys")
            if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
                raise EvalFileError(f"line {number}: 'keys' must be a non-empty list of strings")
            questions.append(
                Question(
                    str(_text(line, "message", number)),
                    frozenset(keys),
                    _text(line, "namespace", number, optional=True),
                    _text(line, "subject", number, optional=True),
                    _text(line, "category", number, optional=True),
                )
            )
        elif "key" in line:
            if "value" not in line:
                raise EvalFileError(f"line {number}: an entry needs a 'value'")
            metadata = line.get("metadata")
            if metadata is not None and not isinstance(metadata, dict):
                raise EvalFileError(f"line {number}: 'metadata' must be a JSON object")
            namespace, key = str(_text(line, "namespace", number)), str(_text(line, "key", number))
            entries.append(EvalEntry(namespace, key, line["value"], metadata))
        else:
            raise EvalFileError(f"line {number}: neither a question ('message') nor an entry ('key')")
    if not questions:
        raise EvalFileError("the file holds no question")
    return entries, questions


def embed_entries(
    memory: object,
    entries: Sequence[EvalEntry],
    progress: Callable[[int], None] | None = None,
    embedder: str = "",
) -> int:
    """Give each entry of an eval file held by ``memory`` its vector in the process's scorer of
    ``embedder`` (``CLAW_RECALL_EMBEDDER``: the one the ``semantic`` and ``hybrid`` rankers ask), calling
    ``progress`` per batch; return how many were embedded. Raises
    :class:`~clawmem.errors.EmbedderUnavailable` without the ``semantic`` extra."""
    from clawmem.recall.fusion import default_scorer

    texts: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
    for entry in entries:
        texts[entry.namespace].append((entry.key, text_of(entry.value)))
    store = default_scorer(embedder).store_for(memory)
    return sum(store.embed_missing(namespace, own, on_batch=progress) for namespace, own in texts.items())


def _scores(
    scoring: str, outcomes: Sequence[tuple[int | None, float]], cuts: Sequence[int], group: str | None
) -> Scores:
    """Return the figures of ``outcomes``: per question, the rank of its first wanted key among
    the injected entries (``None``: none) and its reciprocal rank in the ranking."""
    count = len(outcomes)
    recall_at = {n: sum(1 for at, _ in outcomes if at is not None and at <= n) / count for n in cuts}
    return Scores(scoring, count, recall_at, sum(rr for _, rr in outcomes) / count, group)


def evaluate(
    memory: Readable,
    questions: Sequence[Question],
    scoring: str,
    ranker: Ranker,
    top_k: int,
    default_namespace: str = "default",
    progress: Callable[[int], None] | None = None,
    by_category: bool = False,
) -> list[Scores]:
    """Return ``scoring``'s recall@1, @3, @``top_k`` and MRR over ``questions``; with
    ``by_category``, followed by the same over the questions of each category (by name; the
    questions without one as :data:`NO_CATEGORY`)."""
    depth = max(3, top_k)
    cuts = sorted({1, 3, top_k})
    outcomes: list[tuple[int | None, float]] = []
    augmenters: dict[str, MessageAugmenter] = {}
    for question in questions:
        namespace = question.namespace or default_namespace
        augmenter = augmenters.get(namespace)
        if augmenter is None:
            augmenter = augmenters[namespace] = MessageAugmenter(
                memory, top_k=depth, namespace=namespace, ranker=ranker, announce=False
            )
        namespaces = [namespace] if question.subject in (None, namespace) else [question.subject, namespace]
        ranking, _, planned = augmenter.rank(question.message, namespaces)
        injected = [decision.key for decision in planned if decision.injected]
        at = next((n for n, key in enumerate(injected, 1) if key in question.keys), None)
        reciprocal = next(
            (1 / rank for rank, c in enumerate(ranking.first(MRR_DEPTH), 1) if c.key in question.keys), 0.0
        )
        outcomes.append((at, reciprocal))
        if progress is not None:
            progress(1)
    results = [_scores(scoring, outcomes, cuts, None)]
    if by_category:
        groups: defaultdict[str, list[tuple[int | None, float]]] = defaultdict(list)
        for question, outcome in zip(questions, outcomes, strict=True):
            groups[question.category or NO_CATEGORY].append(outcome)
        results += [_scores(scoring, groups[name], cuts, name) for name in sorted(groups)]
    return results


def table(results: Sequence[Scores], top_k: int) -> str:
    """Return the results side by side, one scoring a row; when some are of one category, with
    a category column and each row's count of questions (``all``: every question)."""
    cuts = sorted({1, 3, top_k})
    columns = [f"recall@{n}" for n in cuts] + ["MRR"]
    grouped = any(result.group is not None for result in results)
    head = "scoring   " + (f"{'category':<13}{'questions':>9}  " if grouped else "")
    lines = [head + "  ".join(f"{c:>9}" for c in columns)]
    for result in results:
        values = [result.recall_at[n] for n in cuts] + [result.mrr]
        label = f"{result.group or 'all':<13}{result.questions:>9}  " if grouped else ""
        lines.append(f"{result.scoring:<10}{label}" + "  ".join(f"{v:>9.3f}" for v in values))
    return "\n".join(lines)
