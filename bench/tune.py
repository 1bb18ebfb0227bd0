"""Choose the constants of ``hybrid`` and ``weighted`` by leave-one-conversation-out on LoCoMo's dev split.

Each of the five development conversations (0-4; 5-9 are held out and never read here) is a
fold: a setting is chosen on the other four and scored on it. A setting's worth on the four is
its recall@3 averaged with its neighbours' on the grid (a flat optimum beats a sharp one), ties
going to the setting listed first. What is printed per family: each fold's choice and its
recall@3 and MRR on the conversation left out, then the mean, worst and best fold; and the
setting the same rule picks on all five, with its pooled figures.

Every question's ``weighted`` scores and cosines are computed once (as the scorings compute
them, under ``--stemming``), then each setting is ranked offline (score descending, then key),
so a grid of hundreds of settings costs seconds; ``clawmem eval`` on the file confirms the
chosen ones.

    python -m bench.locomo --split dev --output /tmp/locomo-dev.jsonl
    python -m bench.tune /tmp/locomo-dev.jsonl --stemming english
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clawmem.cli.evaluate import load_entries
from clawmem.recall.eval import embed_entries, parse
from clawmem.recall.fusion import default_scorer
from clawmem.recall.scoring import read_entries, weighted_scores
from clawmem.recall.timing import asks_when, entry_time, named_periods
from clawmem.recall.words import QUESTION_WORDS, keywords
from clawmem.settings import RECALL_STEMMINGS

DEV = {f"locomo-{n}" for n in range(5)}

# What a text telling when something happened holds (a trial: a when-question lifting such
# entries, which leave-one-out did not choose): a weekday, a month, a year, a relative time.
_TELLS_TIME = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|recently|ago|last|next|this|since|weekend|week|month|year"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march|april|may"
    r"|june|july|august|september|october|november|december|(?:19|20)\d\d)\b",
    re.IGNORECASE,
)


def tells_time(text: str) -> bool:
    """Return whether ``text`` says when something happened."""
    return _TELLS_TIME.search(text) is not None


@dataclass
class Asked:
    """One question's signals over its conversation's entries (in key order)."""

    conversation: str
    category: str
    wanted: np.ndarray  # bool per entry
    idf: list[np.ndarray]  # per message word: its idf on the entries holding it, else 0
    cosine: np.ndarray
    size: np.ndarray  # words per entry
    time: np.ndarray  # the entry's time (seconds), nan without one
    named: np.ndarray  # bool per entry: its time falls in one the message names
    words: tuple[str, ...] = ()  # the message's words (stems), one per ``idf`` column
    tells_time: np.ndarray | None = None  # bool per entry: its text says when (tells_time)
    asks_when: bool = False  # the message asks when (timing.asks_when)


def collect(path: Path, stemming: str, embedder: str = "") -> list[Asked]:
    """Return every dev question of the eval file at ``path`` with its signals, the cosines
    those of ``embedder`` (``CLAW_RECALL_EMBEDDER``'s form)."""
    with path.open(encoding="utf-8") as lines:
        entries, questions = parse(lines)
    entries = [entry for entry in entries if entry.namespace in DEV]
    questions = [question for question in questions if question.namespace in DEV]
    memory = load_entries(entries)
    embed_entries(memory, entries, embedder=embedder)
    now = time.time()
    times = {(e.namespace, e.key): entry_time(e.key, None, e.metadata) for e in entries}
    scorer = default_scorer(embedder)
    store = scorer.store_for(memory)
    held = {}
    for namespace in sorted(DEV):
        read = sorted(read_entries(memory, [namespace], stemming), key=lambda entry: entry.key)
        when = np.array([times.get((namespace, e.key)) or math.nan for e in read], dtype=float)
        size = np.array([len(e.words) for e in read], dtype=float)
        held[namespace] = (read, when, size)
    out = []
    for question in questions:
        read, when, size = held[question.namespace]
        words = keywords(question.message, stemming)
        scored = {item.key: item for item in weighted_scores(words, read)}
        idf = []
        for word in words:
            column = np.zeros(len(read))
            for position, entry in enumerate(read):
                item = scored.get(entry.key)
                if item is not None and word in item.matched:
                    column[position] = item.weights[item.matched.index(word)]
            idf.append(column)
        query = scorer.store.query(question.message)
        cosines = store.cosines(question.namespace, [(e.key, e.text) for e in read], query)
        cosine = np.array([c if c is not None else math.nan for c in cosines], dtype=float)
        wanted = np.array([e.key in question.keys for e in read])
        periods = named_periods(question.message, now)
        named = np.array([any(p.holds(t) for p in periods) if not math.isnan(t) else False for t in when])
        conversation, category = question.namespace or "", question.category or ""
        tells = np.array([tells_time(e.text) for e in read])
        out.append(
            Asked(
                conversation,
                category,
                wanted,
                idf,
                cosine,
                size,
                when,
                named,
                tuple(words),
                tells,
                asks_when(question.message),
            )
        )
    return out


# -- rankings of one question under one setting ------------------------------------------------


def first_wanted(scores: np.ndarray, wanted: np.ndarray) -> int | None:
    """Return the 1-based rank of the first wanted entry by ``scores`` (descending, then key:
    the entries are in key order), ``None`` when none scores above minus infinity."""
    order = np.lexsort((np.arange(scores.size), -np.round(scores, 9)))
    ranked = wanted[order] & np.isfinite(scores[order])
    hits = np.flatnonzero(ranked)
    return int(hits[0]) + 1 if hits.size else None


# Words a question is built with, dropped from its words in ``weighted`` (an ordered axis: each
# list holds the one before): none; the interrogatives and auxiliaries alone;
# clawmem.recall.words.QUESTION_WORDS (those and the commonest function words); a longer list.
INTERROGATIVES = "what when where who whom whose which why how did does was were are has have had"
DROPPED = [
    "",
    INTERROGATIVES,
    " ".join(sorted(QUESTION_WORDS)),
    " ".join(sorted(QUESTION_WORDS)) + " been being doing done having not nor but because while"
    " until after before over under again further once both each few own same only just too myself"
    " ours yourself himself hers herself itself theirs themselves kind type sort thing things one ever",
]
_DROPPED_STEMS: dict[tuple[int, str], frozenset[str]] = {}


def dropped_stems(level: int, stemming: str) -> frozenset[str]:
    """Return the words (under ``stemming``) of :data:`DROPPED`'s list ``level``."""
    found = _DROPPED_STEMS.get((level, stemming))
    if found is None:
        found = _DROPPED_STEMS[level, stemming] = frozenset(keywords(DROPPED[level], stemming))
    return found


def weighted_of(asked: Asked, floor: float = 0.0, dropped: frozenset[str] = frozenset()) -> np.ndarray:
    """``weighted``: the sum of the matched words' idf; ``floor`` drops a word weighing less,
    ``dropped`` the words it holds."""
    total = np.zeros(asked.cosine.size)
    for at, column in enumerate(asked.idf):
        if at < len(asked.words) and asked.words[at] in dropped:
            continue
        if column.max(initial=0.0) >= floor:
            total += column
    return np.where(total > 0, total, -np.inf)


def _list(scores: np.ndarray, depth: int) -> np.ndarray:
    """Return the indexes of the first ``depth`` entries by ``scores`` (finite ones only)."""
    order = np.lexsort((np.arange(scores.size), -np.round(scores, 9)))
    order = order[np.isfinite(scores[order])]
    return order[:depth]


def rrf(keyword: np.ndarray, meaning: np.ndarray, share: float, k: float, depth: int) -> np.ndarray:
    """The earlier fusion: weighted reciprocal ranks over each list's first ``depth``."""
    fused = np.zeros(keyword.size)
    for rank, at in enumerate(_list(keyword, depth), 1):
        fused[at] += share / (k + rank)
    for rank, at in enumerate(_list(meaning, depth), 1):
        fused[at] += (1 - share) / (k + rank)
    return np.where(fused > 0, fused, -np.inf)


def zscore(keyword: np.ndarray, meaning: np.ndarray, share: float, depth: int) -> np.ndarray:
    """z-score fusion: each list's first ``depth`` scores standardised over that list, an entry
    absent from a list given the lowest score it could hold there (0 for weighted when the list
    holds every candidate, else the list's last), then ``share``·z_weighted + (1-share)·z_cosine
    over the union."""
    fused = np.full(keyword.size, -np.inf)
    chosen = [(_list(keyword, depth), keyword), (_list(meaning, depth), meaning)]
    union = np.union1d(chosen[0][0], chosen[1][0])
    if not union.size:
        return fused
    total = np.zeros(union.size)
    for (listed, scores), weight in zip(chosen, (share, 1 - share), strict=True):
        if not listed.size:
            continue
        values = scores[listed]
        mean, spread = values.mean(), values.std()
        absent = values[-1] if listed.size == depth else 0.0
        own = np.full(union.size, absent)
        own[np.searchsorted(union, listed)] = values
        total += weight * ((own - mean) / spread if spread > 0 else 0.0)
    fused[union] = total
    return fused


# -- leave one conversation out ----------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    name: str
    grid: dict[str, list[float]]
    scores: Callable[[Asked, dict[str, float]], np.ndarray]


def _outcomes(family: Family, asked: Sequence[Asked]) -> dict[tuple[float, ...], list[int | None]]:
    names = list(family.grid)
    out = {}
    for values in itertools.product(*family.grid.values()):
        setting = dict(zip(names, values, strict=True))
        out[values] = [first_wanted(family.scores(a, setting), a.wanted) for a in asked]
    return out


def _recall(ranks: Iterable[int | None], at: int = 3) -> float:
    ranks = list(ranks)
    return sum(1 for r in ranks if r is not None and r <= at) / len(ranks) if ranks else 0.0


def _mrr(ranks: Iterable[int | None]) -> float:
    ranks = list(ranks)
    return sum(1 / r for r in ranks if r is not None and r <= 100) / len(ranks) if ranks else 0.0


def _smoothed(family: Family, worth: dict[tuple[float, ...], float]) -> dict[tuple[float, ...], float]:
    """Each setting's worth averaged with its grid neighbours' (one step along one constant)."""
    axes = list(family.grid.values())
    out = {}
    for values in worth:
        near = [values]
        for axis, value in enumerate(values):
            at = axes[axis].index(value)
            for step in (-1, 1):
                if 0 <= at + step < len(axes[axis]):
                    near.append(values[:axis] + (axes[axis][at + step],) + values[axis + 1 :])
        out[values] = sum(worth[v] for v in near) / len(near)
    return out


def _pick(family: Family, outcomes: dict, keep: np.ndarray) -> tuple[float, ...]:
    worth = {values: _recall(np.array(ranks, dtype=object)[keep]) for values, ranks in outcomes.items()}
    smoothed = _smoothed(family, worth)
    return max(smoothed, key=lambda values: smoothed[values])  # first listed wins a tie


def leave_one_out(family: Family, asked: Sequence[Asked]) -> list[str]:
    """Return the report lines of ``family``'s leave-one-conversation-out."""
    outcomes = _outcomes(family, asked)
    of = np.array([a.conversation for a in asked])
    lines = [f"{family.name}: {len(outcomes)} settings of {', '.join(family.grid)}"]
    folds, pooled = [], np.empty(len(asked), dtype=object)
    for conversation in sorted(set(of)):
        chosen = _pick(family, outcomes, of != conversation)
        ranks = np.array(outcomes[chosen], dtype=object)[of == conversation]
        pooled[of == conversation] = ranks
        folds.append((_recall(ranks), _mrr(ranks)))
        shown = ", ".join(f"{n}={v:g}" for n, v in zip(family.grid, chosen, strict=True))
        lines.append(
            f"  left out {conversation}: chose {shown}: recall@3 {folds[-1][0]:.3f}  MRR {folds[-1][1]:.3f}"
        )
    recalls = [r for r, _ in folds]
    lines.append(
        f"  LOO recall@3 mean {np.mean(recalls):.3f} (pooled {_recall(pooled):.3f}), worst fold "
        f"{min(recalls):.3f}, best {max(recalls):.3f}; MRR mean {np.mean([m for _, m in folds]):.3f}"
    )
    chosen = _pick(family, outcomes, np.ones(len(asked), dtype=bool))
    ranks = outcomes[chosen]
    shown = ", ".join(f"{n}={v:g}" for n, v in zip(family.grid, chosen, strict=True))
    lines.append(f"  on all five: {shown}: recall@3 {_recall(ranks):.3f}  MRR {_mrr(ranks):.3f}")
    by: defaultdict[str, list[int | None]] = defaultdict(list)
    for a, r in zip(asked, ranks, strict=True):
        by[a.category].append(r)
    lines.append("  by category: " + ", ".join(f"{c} {_recall(by[c]):.3f}" for c in sorted(by)))
    return lines


def families(stemming: str = "english") -> list[Family]:
    """The settings tried: today's fusion's constants, z-score fusion's, and weighted's."""
    depths = [25.0, 50.0, 100.0, 200.0]
    shares = [0.3, 0.4, 0.5, 0.6, 0.7]

    def dropped(setting: dict[str, float]) -> frozenset[str]:
        return dropped_stems(int(setting["dropped"]), stemming)

    def fused(a: Asked, s: dict[str, float]) -> np.ndarray:
        keyword = weighted_of(a, dropped=dropped(s))
        told = s.get("told", 0.0) * a.asks_when * (a.tells_time if a.tells_time is not None else 0.0)
        return zscore(keyword, a.cosine, s["share"], int(s["depth"])) + s["time"] * a.named + told

    return [
        Family(
            "weighted (idf floor: a word weighing less counts for nothing)",
            {"floor": [0.0, 0.5, 1.0, 1.5]},
            lambda a, s: weighted_of(a, s["floor"]),
        ),
        Family(
            "weighted, a question's own words dropped (0 none, 1 interrogatives, 2 QUESTION_WORDS, 3 more)",
            {"dropped": [0.0, 1.0, 2.0, 3.0]},
            lambda a, s: weighted_of(a, dropped=dropped(s)),
        ),
        Family(
            "hybrid, weighted reciprocal rank fusion",
            {"share": shares, "k": [1.0, 3.0, 10.0, 30.0, 60.0], "depth": depths},
            lambda a, s: rrf(weighted_of(a), a.cosine, s["share"], s["k"], int(s["depth"])),
        ),
        Family(
            "hybrid, z-score fusion",
            {"share": shares, "depth": depths},
            lambda a, s: zscore(weighted_of(a), a.cosine, s["share"], int(s["depth"])),
        ),
        Family(
            "hybrid, z-score fusion and the time a question names",
            {"share": shares, "depth": depths, "time": [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]},
            lambda a, s: zscore(weighted_of(a), a.cosine, s["share"], int(s["depth"])) + s["time"] * a.named,
        ),
        Family(
            "hybrid, z-score fusion, the time named, a question's own words dropped",
            {
                "share": [0.4, 0.5, 0.6],
                "depth": [50.0, 100.0, 200.0],
                "time": [2.0, 3.0, 4.0, 6.0],
                "dropped": [0.0, 1.0, 2.0, 3.0],
            },
            fused,
        ),
        Family(
            "hybrid as built: z-score fusion, the time named, weighted without QUESTION_WORDS",
            {"share": shares, "depth": depths, "time": [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0], "dropped": [2.0]},
            fused,
        ),
        Family(
            "hybrid as built, and a when-question (timing.asks_when) lifting the entries that tell a time",
            {
                "share": [0.4, 0.5, 0.6],
                "depth": [50.0, 100.0, 200.0],
                "time": [2.0, 3.0, 4.0, 6.0],
                "dropped": [2.0],
                "told": [0.0, 0.25, 0.5, 1.0],
            },
            fused,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="bench.locomo --split dev's output")
    parser.add_argument("--stemming", choices=RECALL_STEMMINGS, default="english")
    parser.add_argument(
        "--embedder", default="", help="as CLAW_RECALL_EMBEDDER: '' (default), minilm, module:callable"
    )
    options = parser.parse_args(argv)
    asked = collect(options.file, options.stemming, options.embedder)
    if not asked:
        print(f"{options.file}: no question of conversations 0-4", file=sys.stderr)
        return 2
    print(f"{len(asked)} questions of conversations 0-4, stemming {options.stemming}")
    for family in families(options.stemming):
        print("\n".join(leave_one_out(family, asked)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
