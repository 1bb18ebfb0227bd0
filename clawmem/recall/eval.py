"""Recall quality on a labelled file: what ``clawmem eval FILE`` measures.

The file is JSON Lines. A *question* line holds ``message``, the ``keys`` that should be
recalled, and optionally ``namespace`` (the recall namespace, else the default) and ``subject``
(a subject namespace ranked with it). An *entry* line holds ``namespace``, ``key`` and ``value``;
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


@dataclass(frozen=True)
class Question:
    """One labelled message."""

    message: str
    keys: frozenset[str]
    namespace: str | None = None
    subject: str | None = None


@dataclass(frozen=True)
class Scores:
    """One scoring's numbers over the questions."""

    scoring: str
    questions: int
    recall_at: dict[int, float]
    mrr: float


def _text(line: dict[str, Any], field: str, number: int, optional: bool = False) -> str | None:
    value = line.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise EvalFileError(f"line {number}: {field!r} must be a non-empty string")
    return value


def parse(lines: Iterable[str]) -> tuple[list[tuple[str, str, Any]], list[Question]]:
    """Return the entries ``(namespace, key, value)`` and questions of an eval file's lines."""
    entries: list[tuple[str, str, Any]] = []
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
                )
            )
        elif "key" in line:
            if "value" not in line:
                raise EvalFileError(f"line {number}: an entry needs a 'value'")
            entries.append(
                (str(_text(line, "namespace", number)), str(_text(line, "key", number)), line["value"])
            )
        else:
            raise EvalFileError(f"line {number}: neither a question ('message') nor an entry ('key')")
    if not questions:
        raise EvalFileError("the file holds no question")
    return entries, questions


def embed_entries(
    memory: object, entries: Sequence[tuple[str, str, Any]], progress: Callable[[int], None] | None = None
) -> int:
    """Give each ``(namespace, key, value)`` of an eval file held by ``memory`` its vector in the
    process's scorer (the one the ``semantic`` and ``hybrid`` rankers ask), calling
    ``progress`` per batch; return how many were embedded. Raises
    :class:`~clawmem.errors.EmbedderUnavailable` without the ``semantic`` extra."""
    from clawmem.recall.fusion import default_scorer

    texts: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
    for namespace, key, value in entries:
        texts[namespace].append((key, text_of(value)))
    store = default_scorer().store_for(memory)
    return sum(store.embed_missing(namespace, own, on_batch=progress) for namespace, own in texts.items())


def evaluate(
    memory: Readable,
    questions: Sequence[Question],
    scoring: str,
    ranker: Ranker,
    top_k: int,
    default_namespace: str = "default",
    progress: Callable[[int], None] | None = None,
) -> Scores:
    """Return ``scoring``'s recall@1, @3, @``top_k`` and MRR over ``questions``."""
    depth = max(3, top_k)
    hits = dict.fromkeys(sorted({1, 3, top_k}), 0)
    reciprocal = 0.0
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
        for n in hits:
            if question.keys.intersection(injected[:n]):
                hits[n] += 1
        for rank, candidate in enumerate(ranking.first(MRR_DEPTH), 1):
            if candidate.key in question.keys:
                reciprocal += 1 / rank
                break
        if progress is not None:
            progress(1)
    count = len(questions)
    return Scores(scoring, count, {n: hit / count for n, hit in hits.items()}, reciprocal / count)


def table(results: Sequence[Scores], top_k: int) -> str:
    """Return the results side by side, one scoring a row."""
    columns = [f"recall@{n}" for n in sorted({1, 3, top_k})] + ["MRR"]
    lines = ["scoring   " + "  ".join(f"{c:>9}" for c in columns)]
    for result in results:
        values = [result.recall_at[n] for n in sorted({1, 3, top_k})] + [result.mrr]
        lines.append(f"{result.scoring:<10}" + "  ".join(f"{v:>9.3f}" for v in values))
    return "\n".join(lines)
