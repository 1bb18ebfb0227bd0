"""The word index: regressions found along the way, and its packed key table and postings
against plain Python models (the state machines that prove freshness are in tests/conformance/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from clawmem.clock import FakeClock
from clawmem.memory.array import ArrayMemory
from clawmem.recall import MessageAugmenter
from clawmem.recall import keys as keys_module
from clawmem.recall.feeds import fresh_index
from clawmem.recall.keys import KeyTable
from clawmem.recall.postings import FrozenPostings
from clawmem.recall.rankings import scan_ranking
from tests.conformance.test_freshness import (
    test_process_b_recalls_what_a_scan_of_the_backend_gives as process_b_recalls_as_a_scan,
)
from tests.conformance.worlds import report_of

# -- regressions -----------------------------------------------------------------------------------


def test_a_report_read_after_the_index_changed_still_describes_its_turn(clock: FakeClock) -> None:
    # Decisions past top_k are computed when read. Meanwhile other turns may bring the index up
    # to date: entries replaced and removed, ranks renumbered, slots compacted.
    memory = ArrayMemory(clock=clock)
    for number in range(3000):
        memory.set(f"k{number:05d}", f"tea {'green' if number % 3 else 'black'} note", "notes")
    result = MessageAugmenter(memory, top_k=2, namespace="notes", announce=False).augment("green tea")
    expected = MessageAugmenter(memory, top_k=2, namespace="notes", ranker=scan_ranking).augment("green tea")
    for number in range(0, 3000, 2):
        memory.forget(f"k{number:05d}", "notes")
    for number in range(1, 3000, 4):
        memory.set(f"k{number:05d}", "coffee", "notes")
    memory.set("a-first-key", "green tea", "notes")
    assert list(result.decisions) == list(expected.decisions)
    assert len(result.decisions) == 3000 and result.zero_overlap == 0


def test_a_slice_of_the_decisions_computes_only_what_it_shows(clock: FakeClock) -> None:
    # The MCP server lists a recall's first 25 candidates: reading ahead to 50 ranked and
    # matched twice what it shows. Reading on past a slice still gives the scan's decisions.
    memory = ArrayMemory(clock=clock)
    for number in range(300):
        memory.set(f"k{number:05d}", f"tea {'green' if number % 3 else 'black'} w{number % 7}", "notes")
    message = "green tea w2"
    result = MessageAugmenter(memory, top_k=3, namespace="notes", announce=False).augment(message)
    expected = MessageAugmenter(memory, top_k=3, namespace="notes", ranker=scan_ranking).augment(message)
    assert result.decisions[:25] == list(expected.decisions)[:25]
    assert repr(result.decisions) == "Decisions(300 candidates, 25 computed)"
    assert result.decisions[30] == list(expected.decisions)[30]
    assert list(result.decisions) == list(expected.decisions)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["array", "sql-sqlite"])
def test_common_words_scored_from_their_marks_recall_as_a_scan(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At scale a word held by many entries is scored by adding one byte per slot; here every
    # word held by a quarter of a namespace's slots is.
    from clawmem.recall import index as index_module

    monkeypatch.setattr(index_module, "_DENSE_FROM", 1)
    monkeypatch.setattr(index_module, "_DENSE_SHARE", 4)
    process_b_recalls_as_a_scan(backend, tmp_path)


def test_common_words_scored_from_their_marks_stay_exact_through_writes_and_compaction(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clawmem.recall import index as index_module

    monkeypatch.setattr(index_module, "_DENSE_FROM", 256)
    memory = ArrayMemory(clock=clock)
    for number in range(3000):
        memory.set(f"k{number:05d}", f"tea {'green' if number % 3 else 'black'} w{number % 50}", "notes")

    def recall_as_a_scan(message: str) -> None:
        indexed = MessageAugmenter(memory, namespace="notes", announce=False).augment(message)
        scanned = MessageAugmenter(memory, namespace="notes", announce=False, ranker=scan_ranking).augment(
            message
        )
        assert report_of(indexed) == report_of(scanned)
        assert list(indexed.decisions) == list(scanned.decisions)

    recall_as_a_scan("green tea w7")
    assert {"tea", "green"} <= set(fresh_index(memory, "notes").dense)
    for number in range(0, 3000, 2):  # half the slots die: the index compacts
        memory.forget(f"k{number:05d}", "notes")
    recall_as_a_scan("green tea w7")
    for number in range(1, 3000, 4):  # replaced entries: new slots merged into the marks
        memory.set(f"k{number:05d}", "coffee w7", "notes")
    memory.set("a-first-key", "black tea", "notes")
    recall_as_a_scan("green tea w7")
    recall_as_a_scan("black tea coffee")


def test_postings_stay_in_ascending_slot_order() -> None:
    # Candidates.matched binary-searches them: loading, appending and compacting keep the order.
    import numpy as np

    from clawmem.recall.index import WordIndex

    index = WordIndex("notes")
    index.load((f"k{number:04d}", f"tea w{number % 7} w{number % 11}", None) for number in range(3000))
    for number in range(3000):
        if number % 3:
            index.remove(f"k{number:04d}")
    assert index.size < 3000  # compacted
    for number in range(0, 3000, 2):
        index.put(f"k{number:04d}", f"coffee w{number % 5}", None)
    for number in range(2000):
        index.put(f"new{number:04d}", f"tea w{number % 3}", None)
    for word in index.words():
        postings = index.postings_of(word)
        assert postings is not None and bool(np.all(np.diff(postings) > 0)), word


# -- the packed key table and postings, against Python models ------------------------------------

# Few distinct keys, so that keys come back after removal, and code points from every UTF-8 width.
KEY_NAMES = st.text(alphabet="aAzé€😀-", min_size=1, max_size=4)


class KeyTableMachine(RuleBasedStateMachine):
    """A KeyTable against a dict of live keys: which slot holds a key, which key a slot holds,
    and the key order, through additions, replacements, removals, renumbering and compaction.
    Views taken earlier keep reading what they read."""

    def __init__(self) -> None:
        super().__init__()
        self.table = KeyTable()
        self.live: dict[str, int] = {}
        self.views: list[tuple[Any, dict[int, str]]] = []

    @initialize(keys=st.lists(KEY_NAMES, unique=True, max_size=12))
    def reset(self, keys: list[str]) -> None:
        self.table.reset(keys)
        self.live = {key: slot for slot, key in enumerate(keys)}

    @rule(key=KEY_NAMES)
    def add(self, key: str) -> None:
        self.live[key] = self.table.add(key, self.live.get(key))

    @rule(key=KEY_NAMES)
    def discard(self, key: str) -> None:
        assert self.table.discard(key) == self.live.pop(key, None)

    @rule()
    def renumber(self) -> None:
        self.table.renumber()

    @rule()
    def compact(self) -> None:
        old = self.table.compact().tolist()
        self.live = {key: old.index(slot) for key, slot in self.live.items()}

    @rule()
    def take_a_view(self) -> None:
        self.views.append((self.table.view(), {slot: key for key, slot in self.live.items()}))

    @invariant()
    def agrees_with_the_model(self) -> None:
        table = self.table
        assert table.live == len(self.live)
        for key, slot in self.live.items():
            assert table.slot_of(key) == slot and table[slot] == key
        assert table.slot_of("not held") is None
        in_order = [table[slot] for slot in table.live_slots().tolist()]
        assert in_order == sorted(self.live)
        order = table.key_order
        for after in [*self.live, "", "a", "é", "😀😀"]:
            later = {key for key, slot in self.live.items() if order[slot] > table.order_above(after)}
            assert later == {key for key in self.live if key > after}, after
        for view, held in self.views:
            assert all(view[slot] == key for slot, key in held.items())


@pytest.mark.parametrize("rebuilds", ["rarely", "often"])
@pytest.mark.slow
def test_the_key_table_agrees_with_a_dict(rebuilds: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if rebuilds == "often":  # gaps between key orders used up, and new keys past the share, soon
        monkeypatch.setattr(keys_module, "_MIN_ORDER_GAP", 0.2)
        monkeypatch.setattr(keys_module, "_RECENT_FROM", 3)
    run_state_machine_as_test(
        KeyTableMachine, settings=settings(max_examples=80, stateful_step_count=40, deadline=None)
    )


@settings(max_examples=60, deadline=None)
@given(
    held=st.dictionaries(
        st.text(min_size=1, max_size=3), st.sets(st.integers(0, 40), min_size=1), max_size=10
    ),
    dead=st.sets(st.integers(0, 40)),
    shadowed=st.sets(st.text(min_size=1, max_size=3), max_size=3),
)
def test_frozen_postings_agree_with_a_dict_of_sets(
    held: dict[str, set[int]], dead: set[int], shadowed: set[str]
) -> None:
    words = list(held)
    pairs = [(number, slot) for number, word in enumerate(words) for slot in sorted(held[word])]
    word_ids = np.array([number for number, _ in pairs], dtype=np.int32)
    slot_ids = np.array([slot for _, slot in pairs], dtype=np.int32)
    frozen = FrozenPostings.grouped(words, word_ids, slot_ids)
    assert set(frozen.words()) == set(held)
    for word, slots in held.items():
        assert frozen.get(word).tolist() == sorted(slots)  # type: ignore[union-attr]
    assert frozen.get("not a word held") is None
    keep = np.array([slot not in dead for slot in range(41)])
    renumber = np.cumsum(keep) - 1
    compacted = frozen.compact(keep, renumber, shadowed)
    expected = {
        word: sorted(int(renumber[slot]) for slot in slots if slot not in dead)
        for word, slots in held.items()
        if word not in shadowed
    }
    expected = {word: slots for word, slots in expected.items() if slots}
    assert set(compacted.words()) == set(expected)
    for word, slots in expected.items():
        assert compacted.get(word).tolist() == slots  # type: ignore[union-attr]
    for word, slots in held.items():  # postings handed out before are never changed
        assert frozen.get(word).tolist() == sorted(slots)  # type: ignore[union-attr]
