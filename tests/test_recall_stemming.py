"""``CLAW_RECALL_STEMMING``: stemmed words in the index and every scoring but ``phpclaw``, one
index per stemming, the preview's ``shipped → ship``, ``clawmem stats`` and a bad value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.cli import main
from clawmem.errors import ConfigError, StaleIndex
from clawmem.memory.array import ArrayMemory
from clawmem.recall import MessageAugmenter
from clawmem.recall.candidates import Stemmed
from clawmem.recall.feeds import fresh_index, warm
from clawmem.recall.phpclaw import phpclaw_overlap, ranker_for
from clawmem.recall.rankings import scan_ranking, word_overlap
from clawmem.recall.survey import injection_counts, unmatched_entries
from clawmem.recall.words import keywords, stems_of
from clawmem.settings import Settings
from tests.dashboard_helpers import page_text
from tests.stemming import reference_entry_words, reference_keywords

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent

# -- the words -------------------------------------------------------------------------------


def test_stemmed_words_are_the_distinct_stems_of_the_plain_ones() -> None:
    message = "Which kids shipped the parcels? The kid is shipping them, don't ask"
    assert keywords(message) == [
        "which",
        "kids",
        "shipped",
        "the",
        "parcels",
        "kid",
        "shipping",
        "them",
        "don't",
        "ask",
    ]
    assert keywords(message, "english") == ["which", "kid", "ship", "the", "parcel", "them", "don't", "ask"]
    assert stems_of(message, "english")["ship"] == ("shipped", "shipping")
    with pytest.raises(ValueError, match="stemming must be one of off, english, got 'french'"):
        keywords(message, "french")


# -- every scoring but phpclaw, stemmed ---------------------------------------------------------

VOCABULARY = ["ship", "shipped", "shipping", "kid", "kids", "parcel", "parcels", "run", "running", "refund"]
WRITES = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e", "f"]),
        st.none() | st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=4).map(" ".join),
    ),
    max_size=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=WRITES, after=WRITES, message=st.lists(st.sampled_from(VOCABULARY), max_size=4).map(" ".join))
def test_stemmed_word_overlap_from_the_index_equals_a_brute_force_count(
    before: list[tuple[str, str | None]], after: list[tuple[str, str | None]], message: str
) -> None:
    """Writes and deletes after the index was built reach it with their stems, too."""
    memory = ArrayMemory(clock=lambda: 0)

    def write(steps: list[tuple[str, str | None]]) -> None:
        for key, text in steps:
            if text is None:
                memory.forget(key)
            else:
                memory.set(key, text)

    write(before)
    word_overlap(memory, "warm", ["default"], 0, stemming="english")  # builds the stemmed index
    write(after)
    words = reference_keywords(message, "english")
    expected = sorted(
        (
            (-len(set(words) & reference_entry_words(key, text, "english")), key)
            for key, text in memory.all().items()
            if set(words) & reference_entry_words(key, text, "english")
        ),
    )
    for ranking in (
        word_overlap(memory, message, ["default"], 0, stemming="english"),
        scan_ranking(memory, message, ["default"], 0, stemming="english"),
    ):
        first = ranking.first(100)
        assert [(-c.score, c.key) for c in first] == expected
        assert ranking.zero_overlap == len(memory.all()) - len(expected)
        assert ranking.matched(first) == [
            tuple(w for w in words if w in reference_entry_words(c.key, memory.get(c.key), "english"))
            for c in first
        ]


@pytest.mark.parametrize("scoring", ["clawmem", "weighted"])
def test_a_stemmed_turn_recalls_what_the_plain_words_miss(scoring: str) -> None:
    memory = ArrayMemory()
    memory.set("order", "the parcel shipped on Monday")
    memory.set("other", "a note about tea")
    plain = MessageAugmenter(memory, ranker=ranker_for(scoring)).augment("when is it shipping")
    stemmed = MessageAugmenter(memory, ranker=ranker_for(scoring, stemming="english")).augment(
        "when is it shipping"
    )
    assert plain.injected_keys == []
    assert stemmed.injected_keys == ["order"]
    (decision,) = stemmed.decisions
    assert decision.matched == ("ship",)
    assert stemmed.matched_words(decision) == ("shipping → ship",)


def test_phpclaw_never_stems() -> None:
    assert ranker_for("phpclaw", stemming="english") is phpclaw_overlap
    assert ranker_for("weighted", stemming="english") == Stemmed(ranker_for("weighted"), "english")
    memory = ArrayMemory()
    memory.set("order", "the parcel shipped on Monday")
    result = MessageAugmenter(memory, ranker=ranker_for("phpclaw", stemming="english")).augment("shipping")
    assert result.injected_keys == [] and result.stemming == "off"


def test_the_survey_and_the_unmatched_list_count_with_the_stems() -> None:
    memory = ArrayMemory(clock=lambda: 0)
    memory.set("order", "the parcel shipped")
    memory.set("tea", "green tea")
    stemmed = ranker_for("clawmem", stemming="english")
    counts = injection_counts(memory, ["shipping?", "parcels"], "default", 3, 0, ranker=stemmed)
    assert dict(counts) == {"order": 2}
    assert dict(injection_counts(memory, ["shipping?", "parcels"], "default", 3, 0)) == {}
    count, found = unmatched_entries(memory, "shipping", "default", 0, None, 10, stemmed)
    assert (count, [key for key, _, _ in found]) == (1, ["tea"])


# -- one index per stemming --------------------------------------------------------------------


def test_each_stemming_has_its_own_index_built_once_and_never_mixed(
    make_driver: Callable[[str], Any], driver_name: str
) -> None:
    driver = make_driver(driver_name)
    driver.set("order", "the parcel shipped")
    plain = fresh_index(driver, "default")
    stemmed = fresh_index(driver, "default", stemming="english")
    assert stemmed is not plain and (plain.stemming, stemmed.stemming) == ("off", "english")
    assert {"shipped", "parcel"} <= plain.words() and "ship" not in plain.words()
    assert {"ship", "parcel"} <= stemmed.words() and "shipped" not in stemmed.words()
    driver.set("note", "kids running")  # each index follows the feed with its own words
    assert fresh_index(driver, "default", stemming="english") is stemmed  # built once, then followed
    assert {"kid", "run"} <= stemmed.words() and not {"kids", "running"} & stemmed.words()
    assert {"kids", "running"} <= fresh_index(driver, "default").words()
    # A search (SPEC 2) keeps the words as written, whatever recall stems.
    assert [hit.key for hit in driver.search("shipping")] == []
    assert [hit.key for hit in driver.search("shipped")] == ["order"]


# -- the setting -------------------------------------------------------------------------------


def test_the_setting_defaults_to_off_and_reads_english() -> None:
    assert Settings().recall_stemming == "off"
    assert Settings.from_env({"CLAW_RECALL_STEMMING": " English "}).recall_stemming == "english"
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"CLAW_RECALL_STEMMING": "porter"})
    assert str(raised.value) == "CLAW_RECALL_STEMMING must be one of off, english, got 'porter'"


def test_an_unknown_stemming_fails_at_start_up_in_one_line(tmp_path: Path) -> None:
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("CLAW_")},
        "CLAW_DATABASE_URL": f"sqlite:///{tmp_path}/x.db",
        "CLAW_RECALL_STEMMING": "snowball",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from clawmem.cli import main; main()", "stats"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip() == "Error: CLAW_RECALL_STEMMING must be one of off, english, got 'snowball'"


@pytest.mark.parametrize(
    ("scoring", "stemming", "used", "line"),
    [
        ("clawmem", "off", "off", "recall: scoring clawmem, stemming off"),
        ("weighted", "english", "english", "recall: scoring weighted, stemming english"),
        ("phpclaw", "english", "off", "recall: scoring phpclaw, stemming off (phpclaw never stems)"),
    ],
)
def test_stats_says_which_stemming_recall_uses(
    make_app: Callable[..., Flask], scoring: str, stemming: str, used: str, line: str
) -> None:
    app = make_app(RECALL_SCORING=scoring, RECALL_STEMMING=stemming)
    shown = app.test_cli_runner().invoke(args=["claw", "stats"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[-1] == line
    document = app.test_cli_runner().invoke(args=["claw", "stats", "--json"])
    assert json.loads(document.output)["recall"] == {"scoring": scoring, "stemming": used}


# -- the preview -------------------------------------------------------------------------------


@pytest.mark.parametrize("stemming", ["off", "english"])
def test_the_preview_shows_the_stem_that_matched(
    make_app: Callable[..., Flask], admin: tuple[str, str], stemming: str
) -> None:
    from dashboard import state
    from tests.dashboard_helpers import sign_in

    app = make_app(RECALL_STEMMING=stemming)
    with app.app_context():
        state.driver().set("order-7", "the parcel shipped on Monday")
        state.driver().set("parcel-rules", "parcels over 2 kg")
    client = app.test_client()
    sign_in(client, *admin)
    body = page_text(client.get("/preview", query_string={"message": "Was my parcel shipped?"}))
    if stemming == "off":
        assert "shipped → ship" not in body and "CLAW_RECALL_STEMMING" not in body
        assert '<td class="matched">parcel, shipped</td>' in body
    else:
        assert "CLAW_RECALL_STEMMING=english" in body
        assert '<td class="matched">parcel, shipped → ship</td>' in body
        assert '<td class="matched">parcel</td>' in body  # "parcels" is held as its stem


# -- clawmem eval ------------------------------------------------------------------------------


def test_eval_measures_with_the_stemming_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [
        {"namespace": "n", "key": "order", "value": "the parcel shipped on Monday"},
        {"namespace": "n", "key": "tea", "value": "green tea at noon"},
        {"namespace": "n", "message": "when is it shipping", "keys": ["order"]},
    ]
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")

    def recall_at_1(*options: str) -> tuple[str, str]:
        done = CliRunner().invoke(main, ["eval", str(path), "--scoring", "weighted", *options])
        assert done.exit_code == 0, done.output
        header, _, row = done.stdout.splitlines()
        return header, row.split()[1]

    monkeypatch.setenv("CLAW_RECALL_STEMMING", "english")  # the default, unless asked otherwise
    assert recall_at_1() == ("1 questions, 2 entries, stemming english", "1.000")
    assert recall_at_1("--stemming", "off") == ("1 questions, 2 entries, stemming off", "0.000")


def test_a_turn_that_falls_back_to_the_scan_keeps_the_stems() -> None:
    """After an index found stale again and again, a turn is answered by the reference scan:
    with the stems the ranker takes, not the words as written."""
    memory = ArrayMemory()
    memory.set("order", "the parcel shipped on Monday")

    class Stale:
        candidate_count, zero_overlap = 1, 0

        def first(self, count: int) -> list[Any]:
            return word_overlap(memory, "shipping", ["default"], 0, stemming="english").first(count)

        def matched(self, candidates: Any) -> list[tuple[str, ...]]:
            return [("ship",)]

        def texts(self, candidates: Any) -> list[str]:
            raise StaleIndex()

    def always_stale(memory: Any, message: str, namespaces: Any, now: int, stemming: str) -> Any:
        return Stale()

    result = MessageAugmenter(memory, ranker=Stemmed(always_stale, "english")).augment("shipping")
    assert result.injected_keys == ["order"]
    assert [d.matched for d in result.decisions] == [("ship",)]


def test_warm_builds_the_index_of_the_stemming_asked() -> None:
    """A preloading master (gunicorn ``--preload``) builds the index its workers' turns ask."""
    memory = ArrayMemory(clock=lambda: 0)
    memory.set("order", "the parcel shipped")
    asked: list[Any] = []
    changes = memory.changes

    def recorded(namespace: str, cursor: Any = None, held: Any = None) -> Any:
        asked.append(cursor)
        return changes(namespace, cursor, held)

    memory.changes = recorded  # type: ignore[method-assign]
    assert warm(memory, ["default"], stemming="english") == 1
    assert asked == [None]  # read whole once
    ranking = word_overlap(memory, "shipping", ["default"], 0, stemming="english")
    assert [candidate.key for candidate in ranking.first(3)] == ["order"]
    assert len(asked) == 2 and asked[1] is not None  # the turn only caught up
