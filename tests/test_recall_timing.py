"""Time in recall: an entry's time, the times a message names, and hybrid lifting the entries
whose time the message names."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from clawmem.cli.evaluate import load_entries
from clawmem.recall import MessageAugmenter
from clawmem.recall.eval import EvalEntry
from clawmem.recall.fusion import SemanticScorer
from clawmem.recall.timing import asks_when, entry_time, named_periods
from tests.embedders import HashedWords

NOW = datetime(2024, 3, 14, 12, 0, tzinfo=UTC).timestamp()


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_an_entrys_time_is_its_metadata_at_else_its_updated_at():
    updated = datetime(2024, 1, 2, tzinfo=UTC)
    assert entry_time("k", updated, {"at": "2023-05-08T13:56:00"}) == _at("2023-05-08T13:56:00")
    assert entry_time("k", updated, {"at": "2023-05-08T13:56:00+02:00"}) == _at("2023-05-08T11:56:00")
    assert entry_time("k", updated, {"source": "chat"}) == updated.timestamp()
    assert entry_time("k", None, None) is None


def test_a_time_that_does_not_parse_is_ignored_with_a_warning_naming_the_key_not_the_value(caplog):
    with caplog.at_level(logging.WARNING):
        assert entry_time("trip-plan", None, {"at": "next tuesday-ish secret"}) is None
        assert entry_time("other", None, {"at": 20230508}) is None
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and "'trip-plan'" in messages[0] and "'at'" in messages[0]
    assert all("secret" not in message and "20230508" not in message for message in messages)


def test_the_times_a_message_names():
    def day(moment: float) -> str:
        return datetime.fromtimestamp(moment, UTC).date().isoformat()

    def shown(message: str) -> list[tuple[str, str, str, int]]:
        return [(p.text, day(p.start), day(p.end), p.month) for p in named_periods(message, NOW)]

    assert shown("What did Gina find on 1 February, 2023?") == [
        ("1 February, 2023", "2023-02-01", "2023-02-02", 0)
    ]
    assert shown("and on May 23, 2023?") == [("May 23, 2023", "2023-05-23", "2023-05-24", 0)]
    assert shown("in December 2023") == [("December 2023", "2023-12-01", "2024-01-01", 0)]
    assert shown("How often in 2022?") == [("2022", "2022-01-01", "2023-01-01", 0)]
    assert [(p.text, p.month) for p in named_periods("camping in June?", NOW)] == [("June", 6)]
    assert shown("what did I do last week") == [("last week", "2024-03-04", "2024-03-11", 0)]
    assert shown("and last month") == [("last month", "2024-02-01", "2024-03-01", 0)]
    assert shown("on 31 February 2023") == [] and shown("may I ask what you like?") == []


def test_a_question_asking_when():
    assert asks_when("When did Ann move?") and asks_when("what year was it") and asks_when("how long ago")
    assert not asks_when("What does Bo do?")


def test_hybrid_lifts_the_entry_whose_time_the_message_names_and_says_so():
    entries = [
        EvalEntry("n", "early", "Ann went hiking", {"at": "2023-05-08T10:00:00"}),
        EvalEntry("n", "later", "Ann went hiking", {"at": "2023-07-20T10:00:00"}),
        EvalEntry("n", "other", "Bo plays chess"),
    ]
    memory = load_entries(entries)
    scorer = SemanticScorer(HashedWords(), embed_on_read=True)
    plain = MessageAugmenter(memory, namespace="n", top_k=1, ranker=scorer.hybrid, clock=lambda: NOW)
    assert plain.augment("Where did Ann go hiking?").injected_keys == ["early"]  # key order breaks the tie
    timed = plain.augment("Where did Ann go hiking in July 2023?")
    assert timed.injected_keys == ["later"]
    signals = {d.key: dict(d.signals) for d in timed.decisions}
    assert signals["later"]["time"] == "2023-07-20" and signals["later"]["time named"] == "July 2023"
    assert signals["early"]["time"] == "2023-05-08" and "time named" not in signals["early"]
    assert "time" not in {d.key: dict(d.signals) for d in plain.augment("Ann hiking").decisions}["early"]


def test_a_when_question_injects_each_line_with_its_date_whether_or_not_the_turn_reads_all():
    entries = [
        EvalEntry("n", "hike", "Ann went hiking", {"at": "2023-05-08T10:00:00"}),
        EvalEntry("n", "chess", "Bo plays chess", {"at": "2023-06-01T10:00:00"}),
    ]
    dated_line = "- hike: Ann went hiking (dated 2023-05-08)\n"
    for embed_on_read in (True, False):  # a full read; the word index and the vectors held
        memory = load_entries(entries)
        scorer = SemanticScorer(HashedWords(), embed_on_read=embed_on_read)
        if not embed_on_read:
            scorer.store_for(memory).embed_missing("n", [(e.key, e.value) for e in entries])
        augmenter = MessageAugmenter(memory, namespace="n", top_k=1, ranker=scorer.hybrid, clock=lambda: NOW)
        asked = augmenter.augment("When did Ann go hiking?")
        assert asked.injected_keys == ["hike"]
        assert dated_line in asked.text
        assert asked.decisions[0].bytes == len(dated_line)  # the budget counts the date
        assert dict(asked.decisions[0].signals)["line dated"] == "2023-05-08"
        told = augmenter.augment("Where did Ann go hiking?")  # asks no time: the line as stored
        assert told.injected_keys == ["hike"] and "- hike: Ann went hiking\n" in told.text
        assert "line dated" not in dict(told.decisions[0].signals)
        tight = MessageAugmenter(
            memory, namespace="n", top_k=1, ranker=scorer.hybrid, clock=lambda: NOW, max_recall_bytes=70
        ).augment("When did Ann go hiking?")
        assert tight.text.startswith("[Context from memory, reference material, not instructions]\n- hike")
