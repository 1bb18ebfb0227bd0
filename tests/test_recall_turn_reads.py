"""What a turn reads, on every driver: no scoring reads a namespace whole once its index is
built, and ``semantic`` answered from the vectors held equals its full-read reference.

A whole read is a call of a driver's ``_all``, ``_records`` or ``entries_in_order``, or a change
feed's batch that starts over (``reset``): what building an index or loading the vectors takes
on a scoring's first turn, and never after.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.clock import FakeClock
from clawmem.recall import MessageAugmenter, fusion, semantic_index
from clawmem.recall.candidates import Ranker
from clawmem.recall.fusion import SemanticScorer
from clawmem.recall.phpclaw import phpclaw_overlap
from clawmem.recall.rankings import scan_ranking, word_overlap
from clawmem.recall.scoring import weighted_scan
from clawmem.recall.semantic_index import MARGIN
from clawmem.recall.weighted_index import weighted
from tests.embedders import HashedWords

WHOLE_READS = ("_all", "_records", "entries_in_order")
SCORINGS = [
    "clawmem",
    pytest.param(
        "phpclaw",
        marks=pytest.mark.xfail(
            strict=True, reason="phpclaw ranks all() of the namespace every turn (its ties need every value)"
        ),
    ),
    "weighted",
    "semantic",
    "hybrid",
]

_namespaces = itertools.count()


@contextmanager
def whole_reads(driver: Any) -> Iterator[list[str]]:
    """Record each whole read of a namespace ``driver`` makes inside the block, by method name."""
    seen: list[str] = []
    patch = pytest.MonkeyPatch()

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return original(*args, **kwargs)

        return counted

    for name in WHOLE_READS:
        original = getattr(driver, name, None)
        if original is not None:
            patch.setattr(driver, name, counting(name, original))
    changes = driver._changes

    def followed(*args: Any, **kwargs: Any) -> Any:
        batch = changes(*args, **kwargs)
        if batch.reset:
            seen.append("a change feed starting over")
        return batch

    patch.setattr(driver, "_changes", followed)
    try:
        yield seen
    finally:
        patch.undo()


def _rankers(scorer: SemanticScorer) -> dict[str, tuple[Ranker, Ranker | None]]:
    """Each scoring's ranker and its full-read reference (none for phpclaw, which is one, and
    hybrid, whose full read embeds on reading)."""
    return {
        "clawmem": (word_overlap, scan_ranking),
        "phpclaw": (phpclaw_overlap, None),
        "weighted": (weighted, weighted_scan),
        "semantic": (scorer.semantic, scorer.semantic_scan),
        "hybrid": (scorer.hybrid, None),
    }


def _embed(scorer: SemanticScorer, driver: Any, namespace: str, keys: list[str] | None = None) -> None:
    entries = [(key, text) for key, text in driver.all(namespace).items() if keys is None or key in keys]
    scorer.store_for(driver).embed_missing(namespace, entries)


def test_the_count_sees_a_full_read(driver_name: str, make_driver: Any) -> None:
    driver = make_driver(driver_name)
    driver.set("tea", "green tea", "notes")
    MessageAugmenter(driver, namespace="notes", announce=False).augment("green tea")
    with whole_reads(driver) as seen:
        MessageAugmenter(driver, namespace="notes", ranker=scan_ranking, announce=False).augment("green")
    assert seen == ["_all"]


@pytest.mark.parametrize("scoring", SCORINGS)
def test_no_scoring_reads_a_namespace_whole_after_its_first_turn(
    driver_name: str, make_driver: Any, clock: FakeClock, scoring: str
) -> None:
    driver = make_driver(driver_name)
    namespace = f"notes{next(_namespaces)}"
    for number in range(10):
        driver.set(f"tea{number:02d}", f"green tea note {number}", namespace)
    driver.set("gone", "oolong brewed once", namespace)
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)
    _embed(scorer, driver, namespace)
    ranker, reference = _rankers(scorer)[scoring]
    augmenter = MessageAugmenter(driver, namespace=namespace, top_k=3, ranker=ranker, announce=False)
    assert augmenter.augment("green tea").error is None  # the first turn builds what it needs
    # What changed since: a new entry, a changed one, a forgotten one, and one that expired.
    driver.set("new", "oolong written after the first turn", namespace)
    driver.set("tea03", "oolong written again", namespace)
    driver.forget("gone", namespace)
    driver.set("brief", "oolong written briefly", namespace, ttl=5)
    _embed(scorer, driver, namespace, ["new", "brief"])
    clock.advance(10)
    with whole_reads(driver) as seen:
        results = [augmenter.augment(message) for message in ("oolong written", "green tea note")]
    assert seen == [], f"{scoring} read {namespace} whole on a later turn: {seen}"
    assert all(result.error is None for result in results)
    injected = results[0].injected_keys
    assert "new" in injected and "gone" not in injected and "brief" not in injected
    if reference is not None:
        expected = MessageAugmenter(driver, namespace=namespace, top_k=3, ranker=reference, announce=False)
        assert [result.text for result in results] == [
            expected.augment(message).text for message in ("oolong written", "green tea note")
        ]


# -- semantic from the vectors held, against its full-read reference -----------------------


def test_semantic_passes_over_a_vector_of_an_old_text_or_of_no_entry(
    driver_name: str, make_driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors the change feed never showed to be stale (another process's, read back late):
    the nearest two are of no entry and of a text its entry does not hold, and neither may be
    injected; the turn injects what the full read does, and so does the report read to its
    end (its candidates read back a few keys a call)."""
    monkeypatch.setattr(semantic_index, "FETCH_BATCH", 5)
    driver = make_driver(driver_name)
    namespace = f"notes{next(_namespaces)}"
    for number in range(30):
        driver.set(f"k{number:02d}", f"filler note {number}", namespace)
    driver.set("bread", "banana bread", namespace)
    driver.set("split", "banana split", namespace)
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)
    _embed(scorer, driver, namespace)

    def turn(ranker: Ranker) -> Any:
        augmenter = MessageAugmenter(driver, namespace=namespace, top_k=2, ranker=ranker, announce=False)
        return augmenter.augment("ripe banana")

    turn(scorer.semantic)  # the store follows the feed from here
    store = scorer.store_for(driver)
    vector = store.embedder.embed(["ripe banana"])[0]
    for key in ("k00", "nobody"):  # k00 holds "filler note 0"; no entry is "nobody"
        store.put(namespace, key, "ripe banana", vector, store.model_id)
    result, expected = turn(scorer.semantic), turn(scorer.semantic_scan)
    assert result.injected_keys == ["bread", "split"]
    assert result.text == expected.text
    assert list(result.decisions) == list(expected.decisions)
    assert result.semantic_coverage == expected.semantic_coverage == "semantic: 31 of 32 entries embedded"


WORDS = st.sampled_from(["apple", "pie", "banana", "toronto", "car", "auto", "red", "green", "tea"])
TEXTS = st.lists(WORDS, min_size=1, max_size=5).map(" ".join)
KEYS = st.sampled_from(["k1", "k2", "k3", "k4", "k5", "zz"])
STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("set"), st.sampled_from([0, 1]), KEYS, TEXTS, st.one_of(st.none(), st.integers(1, 4))
        ),
        st.tuples(st.just("forget"), st.sampled_from([0, 1]), KEYS),
        st.tuples(st.just("embed"), st.sampled_from([0, 1]), st.lists(KEYS, max_size=3)),
        st.tuples(st.just("advance"), st.sampled_from([1, 2, 3])),
        st.tuples(st.just("turn"), TEXTS, st.integers(0, 4)),
    ),
    max_size=20,
)


@pytest.fixture
def driver(driver_name: str, make_driver: Any) -> Any:
    """One driver per backend for the whole test; each example works in namespaces of its own."""
    return make_driver(driver_name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_semantic_from_the_vectors_held_equals_the_full_read(
    driver: Any, clock: FakeClock, steps: list[tuple[Any, ...]]
) -> None:
    """Entries written, changed, forgotten and expiring, some embedded and some not (or of an
    old text): at every turn the ranking, and what a turn injects, are the reference's, over a
    subject's namespace and the recall namespace read together."""
    example = next(_namespaces)
    namespaces = [f"sub{example}", f"main{example}"]
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)

    def compare(message: str, top_k: int) -> None:
        now = math.floor(clock())
        indexed = scorer.semantic(driver, message, namespaces, now)
        scanned = scorer.semantic_scan(driver, message, namespaces, now)
        assert type(indexed).__name__ == "IndexedSemantic"
        got, expected = indexed.first(100), scanned.first(100)
        assert got == expected
        assert (indexed.candidate_count, indexed.zero_overlap) == (
            scanned.candidate_count,
            scanned.zero_overlap,
        )
        assert (indexed.embedded, indexed.total) == (scanned.embedded, scanned.total)  # type: ignore[attr-defined]
        assert indexed.matched(got) == scanned.matched(expected)
        assert indexed.texts(got) == scanned.texts(expected)
        assert [indexed.explain(c).signals["semantic_rank"] for c in got] == list(range(1, len(got) + 1))
        turns = [
            MessageAugmenter(driver, namespace=namespaces[1], top_k=top_k, ranker=ranker, announce=False)
            for ranker in (scorer.semantic, scorer.semantic_scan)
        ]
        results = [turn.augment(message, subject_namespace=namespaces[0]) for turn in turns]
        assert results[0].text == results[1].text
        assert results[0].decisions[:top_k] == results[1].decisions[:top_k]
        assert results[0].semantic_coverage == results[1].semantic_coverage

    for step in steps:
        if step[0] == "set":
            _, which, key, text, ttl = step
            driver.set(key, text, namespaces[which], ttl)
        elif step[0] == "forget":
            driver.forget(step[2], namespaces[step[1]])
        elif step[0] == "embed":
            _embed(scorer, driver, namespaces[step[1]], step[2])
        elif step[0] == "advance":
            clock.advance(step[1])
        else:
            compare(step[1], step[2])
    compare("red apple pie", 3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 3000),
    texts=st.integers(1, 60),
    count=st.sampled_from([1, 3, 40, 5000]),
    stale=st.integers(0, 50),
)
def test_the_first_semantic_candidates_equal_the_full_reads_at_any_cut(size, texts, count, stale):
    """Many entries tie (``texts`` distinct texts) and some vectors are of another text: the
    first ``count`` are the reference's, cut among the ties by key as a sort of all of them is."""
    from clawmem.memory.array import ArrayMemory

    memory = ArrayMemory()
    entries = [(f"k{n:05d}", f"word{n % texts} other{n % 7}") for n in range(size)]
    for key, text in entries:
        memory.set(key, text, "n")
    scorer = SemanticScorer(HashedWords(), embed_on_read=False)
    store = scorer.store_for(memory)
    store.embed_missing("n", entries, batch=1024)
    scorer.semantic(memory, "word1", ["n"], 0)  # the store follows the feed from here
    for key, _ in entries[:stale]:
        store.put("n", key, "word1 other2", store.embedder.embed(["word1 other2"])[0], store.model_id)
    got = scorer.semantic(memory, "word1 other2", ["n"], 0).first(count)
    expected = scorer.semantic_scan(memory, "word1 other2", ["n"], 0).first(count)
    assert got == expected


class _Table:
    """An embedder of three texts, in three dimensions: the message ``q`` along the first axis,
    and two texts at the cosines to it given, each the largest part of its row (so that its
    int8 code is 127, and the cosine held is the one given)."""

    model_id = "table"
    dimension = 3

    def __init__(self, cosines: dict[str, float]) -> None:
        rest = {text: math.sqrt((1 - c * c) / 2) for text, c in cosines.items()}
        self.rows = {"q": (1.0, 0.0, 0.0)} | {
            text: (c, rest[text], rest[text]) for text, c in cosines.items()
        }

    def embed(self, texts: Any) -> Any:
        import numpy as np

        return np.array([self.rows[text] for text in texts], dtype=np.float32)


def test_a_cut_of_the_nearest_vectors_never_drops_a_candidate_pythons_rounding_puts_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float32's rounding puts 0.613894999 at 0.61390 and 0.613894880 at 0.61389, Python's both
    at 0.61389, where the key decides: the vectors' first 30 are all of the higher one, yet the
    first candidate is the other, of the lowest key, in ``semantic`` and in ``hybrid``. (Ties at
    a cut are all taken; a cut by another rounding may still fall between two that tie.)"""
    import numpy as np

    from clawmem.memory.array import ArrayMemory

    memory = ArrayMemory()
    memory.set("a", "lower", "n")
    for number in range(30):
        memory.set(f"c{number:02d}", "higher", "n")
    scorer = SemanticScorer(_Table({"lower": 0.6138948798179626, "higher": 0.6138949990272522}))
    store = scorer.store_for(memory)
    store.embed_missing("n", list(memory.all("n").items()))
    held = store.cosines("n", [("a", "lower"), ("c00", "higher")], store.query("q"))
    assert [round(c, 5) for c in held] == [0.61389, 0.61389]  # the premise, as the vectors are held
    assert np.round(np.float32(held), 5).tolist() == pytest.approx([0.61389, 0.6139])
    nearest = store.nearest("n", store.query("q"), 3 + MARGIN, 5)  # what a first cut of 3 takes
    assert [key for key, _, _ in nearest] == [f"c{n:02d}" for n in range(3 + MARGIN)]
    got = scorer.semantic(memory, "q", ["n"], 0).first(3)
    assert got == scorer.semantic_scan(memory, "q", ["n"], 0).first(3)
    assert [candidate.key for candidate in got] == ["a", "c00", "c01"]
    monkeypatch.setattr(fusion, "DEPTH", 3)  # hybrid fuses semantic's first 3 (the message has no word)
    assert [candidate.key for candidate in scorer.hybrid(memory, "q", ["n"], 0).first(3)] == [
        "a",
        "c00",
        "c01",
    ]
