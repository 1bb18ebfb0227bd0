"""Indexed recall is exact and fresh across processes (SPEC 5, "Speed"; the indexed-recall issue).

On every backend, process A writes (``set``, ``forget``, ``flush``, ``sweep``, and on SQL plain
statements on the memory table, as another program would) while the fake clock moves; after each
step, process B's ``search`` and ``augment`` (answered from B's word indexes) must equal

- the same augmenter ranking by a full scan (``ranker=scan_ranking``), and
- a reference written here: the backend's rows read directly (SQL rows with SQL, the namespace's
  JSON file, the Redis entry keys), expiry judged on the fake clock, scored with the tokeniser.

Two gunicorn workers on MariaDB see a write made elsewhere in their next preview, and the
preview's matched words and zero-overlap count are those of the tokeniser.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.array import ArrayMemory
from clawmem.memory.file import FileMemory
from clawmem.memory.sql import REINDEX_OVERLAP, SqlMemory
from clawmem.prompt import CUT_BYTE_CAP, CUT_TOP_K, INJECTED, TRUNCATED
from clawmem.recall import AugmentResult, EntryDecision, MessageAugmenter, injection_counts, plan
from clawmem.recall.rankings import scan_ranking, word_overlap
from clawmem.recall.words import keywords
from clawmem.records import MemoryHit
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from tests.conftest import backend_url, sql_url
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["array", "file", "sql-sqlite", "sql-mysql", "sql-postgres", "redis"]
# Examples per backend: remote round trips cost more, and CI has two cores.
EXAMPLES = {"array": 40, "file": 25, "sql-sqlite": 25, "sql-mysql": 12, "sql-postgres": 12, "redis": 20}
STEPS = 20

# -- the reference: rows read straight from the backend, scored with the tokeniser -------------

Rows = dict[str, tuple[Any, int | None]]  # key -> (value, expires_at), expired rows included

HEADER = "[Context from memory, reference material, not instructions]\n"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _live(expires_at: int | None, now: int) -> bool:
    return expires_at is None or now < expires_at


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


@dataclass(frozen=True)
class Turn:
    """What a turn must give: the augmented text, every candidate's decision, the zero-overlap
    count and the size of the memory block."""

    text: str
    decisions: list[EntryDecision]
    zero_overlap: int
    bytes_used: int


def expected_turn(
    sources: list[tuple[str, Rows]], message: str, top_k: int, max_bytes: int, now: int
) -> Turn:
    """Rank every live row of ``sources`` (subject first) against ``message`` and plan the block
    exactly as SPEC 5 says, without any of clawmem's ranking code."""
    if top_k == 0:
        return Turn(message, [], 0, 0)
    words = keywords(message)
    ranked = []
    zero_overlap = 0
    for order, (namespace, rows) in enumerate(sources):
        for key, (value, expires_at) in rows.items():
            if not _live(expires_at, now):
                continue
            text = _text(value)
            held = set(keywords(f"{key} {text}"))
            matched = tuple(word for word in words if word in held)
            if matched:
                ranked.append((-len(matched), key, order, namespace, text, matched))
            else:
                zero_overlap += 1
    ranked.sort(key=lambda candidate: candidate[:3])
    hits = len(ranked)
    used = _utf8(HEADER)
    lines: list[str] = []
    decisions = []
    closed: str | None = None
    for position, (negative, key, _, namespace, text, matched) in enumerate(ranked):
        score = -negative
        line = f"- {key}: {text}\n"
        size = _utf8(line)
        if position >= top_k:
            status, reason = CUT_TOP_K, f"rank {position + 1} of {hits} hits; top_k is {top_k}"
        elif closed is not None:
            status, reason = CUT_BYTE_CAP, f"the block was already full: {closed}"
        elif used + size <= max_bytes:
            status, reason = INJECTED, f"rank {position + 1} of {hits} hits, score {score}"
            lines.append(line)
            used += size
        elif position == 0:
            room = max_bytes - used - 1
            if room > 0:
                kept = line[:-1].encode("utf-8")[:room].decode("utf-8", "ignore")
                lines.append(kept + "\n")
                status, reason = (
                    TRUNCATED,
                    f"the only line, cut from {size} to {_utf8(kept) + 1} bytes to fit",
                )
            else:
                status, reason = CUT_BYTE_CAP, f"max_recall_bytes {max_bytes} leaves no room after the header"
            closed = f"key {key!r} did not fit whole"
        else:
            status = CUT_BYTE_CAP
            reason = f"line of {size} bytes did not fit: {max_bytes - used} of {max_bytes} bytes left"
            closed = f"key {key!r} ({size} bytes) did not fit"
        decisions.append(EntryDecision(key, score, size, status, reason, namespace, matched))
    if not lines:
        return Turn(message, decisions, zero_overlap, 0)
    block = HEADER + "".join(lines)
    return Turn(f"{block}\n[User message]\n{message}", decisions, zero_overlap, _utf8(block))


def expected_search(rows: Rows, query: str, limit: int, namespace: str, now: int) -> list[MemoryHit]:
    """Return what ``search`` must: live rows sharing a word, by score descending then key."""
    words = set(keywords(query))
    hits = []
    for key, (value, expires_at) in rows.items():
        if _live(expires_at, now):
            score = len(words & set(keywords(f"{key} {_text(value)}")))
            if score:
                hits.append((-score, key, value))
    hits.sort(key=lambda hit: hit[:2])
    return [MemoryHit(key, value, namespace, -negative) for negative, key, value in hits[:limit]]


def report_of(result: AugmentResult) -> Turn:
    assert result.error is None, result.error
    return Turn(result.text, list(result.decisions), result.zero_overlap, result.bytes_used)


# -- the backends: process A, a fresh process B, the rows as stored, plain SQL ---------------------


@dataclass
class World:
    """One backend as the state machine sees it."""

    name: str
    clock: FakeClock
    a: Any  # process A
    make_b: Callable[[], Any]  # a process B that has read nothing yet
    rows: Callable[[str], Rows]  # a namespace's rows read straight from the backend
    table: sa.Table | None = None  # SQL: the memory table, written by "another program"
    program: sa.engine.Engine | None = None  # SQL: that program's own engine
    closers: list[Callable[[], None]] = field(default_factory=list)


def _array_world(clock: FakeClock, tmp_path: Path) -> World:
    memory = ArrayMemory(clock=clock)

    def rows(namespace: str) -> Rows:
        # One process only: the dict the driver keeps is the backend.
        stored = dict(memory._store.get(namespace, {}))
        return {key: (json.loads(encoded), expires_at) for key, (encoded, expires_at) in stored.items()}

    return World("array", clock, memory, lambda: memory, rows)


def _file_world(clock: FakeClock, tmp_path: Path) -> World:
    directory = tmp_path / "memory"
    memory = FileMemory(directory, clock=clock)

    def rows(namespace: str) -> Rows:
        path = memory.path_for(namespace)
        if not path.exists():
            return {}
        stored = json.loads(path.read_bytes())
        return {key: (entry["value"], entry["expires_at"]) for key, entry in stored.items()}

    return World("file", clock, memory, lambda: FileMemory(directory, clock=clock), rows)


def _sql_world(backend: str, clock: FakeClock, tmp_path: Path) -> World:
    url = sql_url(backend, tmp_path)
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    engine_a, engine_b, program = create_engine(url), create_engine(url), create_engine(url)
    create_tables(engine_a, prefix)
    table = tables(prefix).memory

    def rows(namespace: str) -> Rows:
        select = sa.select(table.c.lookup_key, table.c.value, table.c.expires_at).where(
            table.c.namespace == namespace
        )
        with program.connect() as conn:
            return {key: (json.loads(value), expires_at) for key, value, expires_at in conn.execute(select)}

    def close() -> None:
        drop_tables(program, prefix)
        for engine in (engine_a, engine_b, program):
            engine.dispose()

    world = World(
        f"sql-{backend}",
        clock,
        SqlMemory(engine_a, prefix=prefix, clock=clock),
        lambda: SqlMemory(engine_b, prefix=prefix, clock=clock),
        rows,
        table,
        program,
    )
    world.closers.append(close)
    return world


def _redis_world(clock: FakeClock, tmp_path: Path) -> World:
    import redis

    from clawmem.memory.redis import RedisMemory

    url = backend_url("redis")
    client_a, client_b = redis.Redis.from_url(url), redis.Redis.from_url(url)
    prefix = f"clawtest:{uuid.uuid4().hex[:8]}:"

    def rows(namespace: str) -> Rows:
        # The entry keys themselves, not the driver's sorted set or change log.
        names = sorted(client_a.scan_iter(match=f"{prefix}{{{namespace}}}:k:*", count=1000))
        found = {}
        for name, raw in zip(names, client_a.mget(names) if names else [], strict=True):
            if raw is not None:
                expires_at, value = json.loads(raw)
                found[name.decode().split(":k:", 1)[1]] = (value, expires_at)
        return found

    def close() -> None:
        for name in client_a.scan_iter(match=f"{prefix}*", count=1000):
            client_a.delete(name)
        client_a.close()
        client_b.close()

    world = World(
        "redis",
        clock,
        RedisMemory(client=client_a, prefix=prefix, clock=clock),
        lambda: RedisMemory(client=client_b, prefix=prefix, clock=clock),
        rows,
    )
    world.closers.append(close)
    return world


@contextlib.contextmanager
def world_of(backend: str, clock: FakeClock, tmp_path: Path) -> Iterator[World]:
    if backend == "array":
        world = _array_world(clock, tmp_path)
    elif backend == "file":
        world = _file_world(clock, tmp_path)
    elif backend == "redis":
        world = _redis_world(clock, tmp_path)
    else:
        world = _sql_world(backend.removeprefix("sql-"), clock, tmp_path)
    try:
        yield world
    finally:
        for close in world.closers:
            close()


# -- what the machine draws ----------------------------------------------------------------------

VOCABULARY = [
    "tea", "Tea", "TEA", "green", "coffee", "café", "CAFÉ", "cafe\u0301", "don't", "don’t",
    "well-known", "user_123", "漢字テスト", "ox", "shipping", "policy", "Tea-time", "123",
    "straße", "STRASSE", "refund", "parcel", "null", "true",
]  # fmt: skip
KEYS = ["tea", "Tea", "green_tea", "café", "user_123", "a", "order-7", "shipping policy", "refund", "zz"]

words = st.sampled_from(VOCABULARY)
phrases = st.lists(words, min_size=0, max_size=5).map(" ".join)
# Mostly a few keys, so writes replace entries and both namespaces hold the same key (ties).
keys = st.one_of(*[st.sampled_from(KEYS)] * 3, st.text(alphabet="abTé_- 漢", min_size=1, max_size=5))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    phrases,
    # Long lines: the byte cap cuts or closes the block.
    st.builds(lambda word, count: f"{word} " * count, words, st.integers(20, 700)),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(words, children, max_size=3),
    max_leaves=5,
)
# Long enough that Redis never expires an entry on its own (real) clock during a run.
ttls = st.one_of(st.none(), st.sampled_from([60, 120, 600]))
sides = st.sampled_from([0, 1])  # 0: the subject's namespace, 1: the recall namespace
# Seconds a writer's clock lags the fake clock: within the SQL driver's stated overlap window.
lags = st.sampled_from([0, 0, 1, int(REINDEX_OVERLAP.total_seconds()) - 1])

writes = st.tuples(st.just("set"), sides, keys, values, ttls)
# The same key and value in both namespaces: they tie, and the subject's ranks first.
twins = st.tuples(st.just("set_both"), keys, values, ttls, ttls)
driver_ops = st.one_of(
    writes,
    writes,
    twins,
    st.tuples(st.just("forget"), sides, keys),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("flush"), sides),
)
b_ops = st.one_of(
    st.tuples(st.just("b_set"), sides, keys, values, ttls),
    st.tuples(st.just("b_forget"), sides, keys),
    st.tuples(st.just("b_flush"), sides),
)
program_writes = st.tuples(st.just("raw_write"), sides, keys, values, ttls, lags)
sql_ops = st.one_of(
    program_writes,
    program_writes,
    st.tuples(st.just("raw_delete"), sides, keys),
    st.tuples(st.just("raw_delete_word"), sides, st.sampled_from(["tea", "café", "refund", "a"])),
    st.tuples(st.just("raw_touch"), sides, keys, lags),
)
messages = st.one_of(st.lists(words, min_size=1, max_size=6).map(" ".join), st.just(" ".join(VOCABULARY)))

_examples = itertools.count()


class IndexMachine(RuleBasedStateMachine):
    """Process A changes the backend; after every step process B must answer as a scan does."""

    world: World

    def __init__(self) -> None:
        super().__init__()
        number = next(_examples)
        self.namespaces = [f"user:cust-{number}", f"recall-{number}"]
        self.b = self.world.make_b()
        self.message = "tea café refund"
        self.limit = 3
        self.top_k = 3
        self.max_bytes = 4096
        self.search_first = False

    @property
    def clock(self) -> FakeClock:
        return self.world.clock

    # -- process A, B's own writes, and another program on the table -----------------------------

    def apply(self, op: tuple[Any, ...]) -> None:
        name, *args = op
        if name == "sweep":
            self.world.a.sweep()
            return
        if name == "set_both":
            key, value, *both = args
            for namespace, ttl in zip(self.namespaces, both, strict=True):
                self.world.a.set(key, value, namespace, ttl)
            return
        namespace = self.namespaces[args[0]]
        if name in ("set", "b_set"):
            _, key, value, ttl = args
            (self.world.a if name == "set" else self.b).set(key, value, namespace, ttl)
        elif name in ("forget", "b_forget"):
            (self.world.a if name == "forget" else self.b).forget(args[1], namespace)
        elif name in ("flush", "b_flush"):
            (self.world.a if name == "flush" else self.b).flush(namespace)
        else:
            self.apply_sql(name, namespace, *args[1:])

    def apply_sql(self, name: str, namespace: str, *args: Any) -> None:
        table, program = self.world.table, self.world.program
        assert table is not None and program is not None
        where = [table.c.namespace == namespace]
        with program.begin() as conn:
            if name == "raw_write":
                key, value, ttl, lag = args
                stamp = utc_datetime(self.clock) - timedelta(seconds=lag)
                # Another program's JSON: ASCII escapes and spaces, unlike clawmem's own.
                row = {
                    "value": json.dumps(value),
                    "expires_at": None if ttl is None else math.floor(self.clock()) + ttl,
                    "updated_at": stamp,
                }
                found = conn.execute(sa.select(table.c.id).where(*where, table.c.lookup_key == key)).first()
                if found is None:
                    row |= {"id": new_id(), "namespace": namespace, "lookup_key": key, "created_at": stamp}
                    conn.execute(sa.insert(table).values(row))
                else:
                    conn.execute(sa.update(table).where(table.c.id == found.id).values(row))
            elif name == "raw_delete":
                conn.execute(sa.delete(table).where(*where, table.c.lookup_key == args[0]))
            elif name == "raw_delete_word":
                conn.execute(sa.delete(table).where(*where, table.c.value.contains(args[0])))
            elif name == "raw_touch":
                key, lag = args
                stamp = utc_datetime(self.clock) - timedelta(seconds=lag)
                conn.execute(
                    sa.update(table).where(*where, table.c.lookup_key == key).values(updated_at=stamp)
                )

    @initialize(entries=st.lists(st.one_of(writes, twins), min_size=3, max_size=20))
    def a_fills_both_namespaces(self, entries: list[tuple[Any, ...]]) -> None:
        for op in entries:
            self.apply(op)

    @rule(op=driver_ops)
    def a_writes(self, op: tuple[Any, ...]) -> None:
        self.apply(op)

    @rule(op=b_ops)
    def b_writes(self, op: tuple[Any, ...]) -> None:
        self.apply(op)

    @precondition(lambda self: self.world.table is not None)
    @rule(op=sql_ops)
    def program_writes(self, op: tuple[Any, ...]) -> None:
        self.apply(op)

    @precondition(lambda self: self.world.table is not None)
    @rule(data=st.data(), side=sides, value=values, ttl=ttls, lag=lags)
    def program_rewrites_a_row(
        self, data: st.DataObject, side: int, value: Any, ttl: int | None, lag: int
    ) -> None:
        """Another program changes a row B has indexed, leaving the row count as it was."""
        present = sorted(self.world.rows(self.namespaces[side]))
        if present:
            self.apply(("raw_write", side, data.draw(st.sampled_from(present)), value, ttl, lag))

    @rule(ops=st.lists(st.one_of(driver_ops, b_ops, sql_ops), min_size=2, max_size=6))
    def burst(self, ops: list[tuple[Any, ...]]) -> None:
        """Several changes between two turns of B (deletes and inserts that keep the count)."""
        for op in ops:
            if op[0].startswith("raw_") and self.world.table is None:
                continue
            self.apply(op)

    @rule(seconds=st.sampled_from([1, 30, 59, 60, 61, 299, 301, 900]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule()
    def restart_b(self) -> None:
        self.b = self.world.make_b()

    @rule(
        message=messages,
        limit=st.integers(0, 6),
        top_k=st.sampled_from([0, 1, 3, 5]),
        max_bytes=st.sampled_from([4096, 300, 80, 62]),
        search_first=st.booleans(),
    )
    def next_turn(self, message: str, limit: int, top_k: int, max_bytes: int, search_first: bool) -> None:
        self.message, self.limit, self.top_k = message, limit, top_k
        self.max_bytes, self.search_first = max_bytes, search_first

    # -- B against the references ------------------------------------------------------------------

    def augmenter(self, ranker: Any) -> MessageAugmenter:
        return MessageAugmenter(
            self.b,
            top_k=self.top_k,
            namespace=self.namespaces[1],
            max_recall_bytes=self.max_bytes,
            announce=False,
            ranker=ranker,
        )

    @invariant()
    def b_answers_as_a_scan_of_the_backend(self) -> None:
        subject, recall = self.namespaces
        searches: list[list[MemoryHit]] = []

        def search() -> None:
            searches.extend(
                self.b.search(self.message, self.limit, namespace) for namespace in self.namespaces
            )

        if self.search_first:
            search()
        indexed = self.augmenter(word_overlap)
        both = report_of(indexed.augment(self.message, subject_namespace=subject))
        alone = report_of(indexed.augment(self.message))
        if not self.search_first:
            search()
        scanning = self.augmenter(scan_ranking)
        now = math.floor(self.clock())
        rows = {namespace: self.world.rows(namespace) for namespace in self.namespaces}
        expected_both = expected_turn(
            [(subject, rows[subject]), (recall, rows[recall])], self.message, self.top_k, self.max_bytes, now
        )
        expected_alone = expected_turn(
            [(recall, rows[recall])], self.message, self.top_k, self.max_bytes, now
        )
        assert both == expected_both
        assert alone == expected_alone
        assert report_of(scanning.augment(self.message, subject_namespace=subject)) == expected_both
        assert report_of(scanning.augment(self.message)) == expected_alone
        assert searches == [
            expected_search(rows[namespace], self.message, self.limit, namespace, now)
            for namespace in self.namespaces
        ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_process_b_recalls_what_a_scan_of_the_backend_gives(backend: str, tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000.25)
    with world_of(backend, clock, tmp_path) as world:
        machine = type(f"IndexMachine_{backend.replace('-', '_')}", (IndexMachine,), {"world": world})
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=EXAMPLES[backend],
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


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


@pytest.mark.parametrize("backend", ["array", "sql-sqlite"])
def test_common_words_scored_from_their_marks_recall_as_a_scan(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At scale a word held by many entries is scored by adding one byte per slot; here every
    # word held by a quarter of a namespace's slots is.
    from clawmem.recall import index as index_module

    monkeypatch.setattr(index_module, "_DENSE_FROM", 1)
    monkeypatch.setattr(index_module, "_DENSE_SHARE", 4)
    test_process_b_recalls_what_a_scan_of_the_backend_gives(backend, tmp_path)


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
    assert {"tea", "green"} <= set(memory.word_index("notes").dense)
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
    for word in list(index.postings) + list(index.pending):
        postings = index.postings_of(word)
        assert postings is not None and bool(np.all(np.diff(postings) > 0)), word


def test_sqlite_drivers_on_one_engine_leave_its_pool_alone(tmp_path: Path, clock: FakeClock) -> None:
    # Each SQLite driver watches PRAGMA data_version on a connection it keeps; that connection
    # must not be one of the pool's, or a few drivers on a shared engine exhaust it.
    engine = create_engine(f"sqlite:///{tmp_path / 'shared.db'}", pool_size=1, max_overflow=0, pool_timeout=1)
    create_tables(engine, "")
    drivers = [SqlMemory(engine, clock=clock) for _ in range(3)]
    try:
        for number, driver in enumerate(drivers):
            driver.set(f"tea-{number}", "green tea", "notes")
            assert [hit.key for hit in driver.search("tea", 5, "notes")] == [
                f"tea-{n}" for n in range(number + 1)
            ]
    finally:
        engine.dispose()


def test_a_redis_index_built_on_an_empty_log_notices_the_log_was_cut(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    import redis

    from clawmem.memory import redis as redis_driver

    monkeypatch.setattr(redis_driver, "LOG_LENGTH", 20)
    client = redis.Redis.from_url(backend_url("redis"))
    prefix = f"clawtest:{uuid.uuid4().hex[:8]}:"
    a = redis_driver.RedisMemory(client=client, prefix=prefix, clock=clock)
    b = redis_driver.RedisMemory(client=client, prefix=prefix, clock=clock)
    try:
        assert b.search("tea", 5, "notes") == []  # B's index starts from an empty log
        for number in range(400):  # far more changes than the log keeps
            a.set(f"k{number:03d}", "green tea" if number == 0 else f"coffee {number}", "notes")
        assert client.xlen(a.log_key("notes")) < 400
        assert b.search("tea", 5, "notes") == [MemoryHit("k000", "green tea", "notes", 1)]
    finally:
        for name in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(name)
        client.close()


@pytest.mark.parametrize("backend", ["mysql", "postgres"])
def test_a_bulk_stamped_namespace_reads_again_only_the_rows_that_changed(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # A bulk import stamps every row alike, so all of them stay within the overlap window. A row
    # another program rewrites without changing its stamp is still seen, only the values of the
    # rows that changed are read again (plus the hits' own, to answer), and when nothing changed
    # the window is not read at all.
    url = sql_url(backend, tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    table = tables(prefix).memory
    stamp = utc_datetime(clock)
    rows = [
        {"id": new_id(), "namespace": "bulk", "lookup_key": f"k{number:03d}", "expires_at": None,
         "value": json.dumps(f"note {number}"), "created_at": stamp, "updated_at": stamp}
        for number in range(300)
    ]  # fmt: skip
    rows[7]["value"] = json.dumps("green tea")
    values_read: list[int] = []

    def count_values(conn: Any, cursor: Any, *args: Any) -> None:
        if any(column[0] == "value" for column in cursor.description or ()):
            values_read.append(cursor.rowcount)

    try:
        with program.begin() as conn:
            conn.execute(sa.insert(table), rows)
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k007"]
        with program.begin() as conn:
            for key, value in (("k007", "coffee"), ("k123", "green tea, again")):
                where = (table.c.namespace == "bulk", table.c.lookup_key == key)
                conn.execute(sa.update(table).where(*where).values(value=json.dumps(value)))
        sa.event.listen(engine, "after_cursor_execute", count_values)
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k123"]
        assert 0 < sum(values_read) <= 3
        # Nothing changed since: not even the marks of the window's 300 rows are read again.
        rows_read: list[int] = []
        sa.event.listen(engine, "after_cursor_execute", lambda *args: rows_read.append(args[1].rowcount))
        assert [hit.key for hit in memory.search("tea", 5, "bulk")] == ["k123"]
        assert rows_read and max(rows_read) < 300
    finally:
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "postgres"])
def test_a_survey_of_many_messages_catches_the_index_up_once(
    backend: str, tmp_path: Path, prefix: str, clock: FakeClock
) -> None:
    # Cold memory ranks hundreds of recent messages: what another program wrote just before is
    # counted, and the backend is asked a few things for 200 messages, as for 5, not one per message.
    url = sql_url(backend, tmp_path)
    engine, program = create_engine(url), create_engine(url)
    create_tables(engine, prefix)
    memory = SqlMemory(engine, prefix=prefix, clock=clock)
    for number, words in enumerate(["green tea", "black tea", "coffee beans", "tea and coffee"]):
        memory.set(f"k{number}", words, "survey")
    messages = [f"{drink} please" for drink in itertools.islice(itertools.cycle(["tea", "coffee"]), 200)]
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    try:
        issued = []
        for count, newest in ((5, "tea please, hot"), (200, "coffee please")):
            with program.begin() as conn:  # another program's write, just before the survey
                conn.execute(sa.insert(tables(prefix).memory), {
                    "id": new_id(), "namespace": "survey", "lookup_key": f"new{count}", "expires_at": None,
                    "value": json.dumps(newest), "created_at": utc_datetime(clock),
                    "updated_at": utc_datetime(clock)})  # fmt: skip
            statements.clear()
            counts = injection_counts(memory, messages[:count], "survey", 3, int(clock()))
            issued.append(len(statements))
            expected: dict[str, int] = {}
            for message in messages[:count]:
                for key, _ in plan(scan_ranking(memory, message, ["survey"], int(clock())), 3, 4096)[0]:
                    expected[key] = expected.get(key, 0) + 1
            assert dict(counts) == expected
            assert counts[f"new{count}"] > 0, "another program's write is counted"
        assert max(issued) <= 10, f"statements for 5 and 200 messages: {issued}"  # not one per message
    finally:
        drop_tables(program, prefix)
        engine.dispose()
        program.dispose()


# -- the dashboard's preview -----------------------------------------------------------------------

DECISION_ROW = re.compile(
    r'<tr class="decision (\w+)">\s*<td><a href="[^"]+"><code>([^<]*)</code></a></td>\s*'
    r'<td class="num">(\d+)</td>\s*<td class="matched">([^<]*)</td>'
)
ZERO_OVERLAP = re.compile(r'<span class="zero-overlap">(\d+)</span>')
AUGMENTED = re.compile(r'<pre class="augmented">(.*?)</pre>', re.S)
MORE = re.compile(r'id="decisions-more".*?href="([^"]+)"', re.S)


@dataclass(frozen=True)
class Preview:
    """What one preview page shows: the text, its decision rows (key, score, matched words)
    and the zero-overlap count."""

    text: str
    rows: list[tuple[str, int, str]]
    zero_overlap: int
    more: str | None


def read_preview(body: str) -> Preview:
    text = AUGMENTED.search(body)
    zero = ZERO_OVERLAP.search(body)
    more = MORE.search(body)
    assert text and zero, body[:2000]
    rows = [
        (html.unescape(key), int(score), html.unescape(words))
        for _, key, score, words in DECISION_ROW.findall(body)
    ]
    return Preview(
        html.unescape(text.group(1)), rows, int(zero.group(1)), html.unescape(more.group(1)) if more else None
    )


def expected_rows(turn: Turn) -> list[tuple[str, int, str]]:
    return [(d.key, d.score, ", ".join(d.matched)) for d in turn.decisions]


def test_the_preview_shows_the_tokenisers_matched_words_and_zero_overlap_count(
    app: Flask, signed_in: FlaskClient, clock: FakeClock, prefix: str
) -> None:
    import random

    from dashboard import state

    rng = random.Random(10)
    with app.app_context():
        driver = state.driver()
        engine = state.engine()
        for number in range(160):
            chosen = rng.sample(VOCABULARY, rng.randint(0, 4))
            value: Any = " ".join(chosen) if number % 3 else {rng.choice(VOCABULARY): chosen, "n": number}
            key = f"{rng.choice(KEYS)}-{number}"
            driver.set(key, value, "default", rng.choice([None, None, 60, 600]))
        # Rows another program wrote, in its own JSON.
        table = tables(prefix).memory
        stamp = utc_datetime(clock)
        with engine.begin() as conn:
            for number in range(20):
                value = {"Tea": ["CAFÉ", "straße"], "n": number} if number % 2 else "Don’t STRASSE well-known"
                conn.execute(
                    sa.insert(table).values(
                        id=new_id(),
                        namespace="default",
                        lookup_key=f"program-{number}",
                        value=json.dumps(value),
                        expires_at=None,
                        created_at=stamp,
                        updated_at=stamp,
                    )
                )
    signed_in.get("/preview", query_string={"message": "warm the index up"})
    clock.advance(61)  # some entries expired since the index was built
    message = "Tea? Don't forget the CAFÉ, strasse and well-known 123 refunds: user_123 ox"
    with app.app_context():
        rows = {row.key: (row.value, row.expires_at) for row in state.driver().records()}
    expected = expected_turn([("default", rows)], message, 3, 4096, math.floor(clock()))
    assert len(expected.decisions) > 50 and expected.zero_overlap > 0  # two pages, and some share none
    shown = read_preview(page_text(signed_in.get("/preview", query_string={"message": message})))
    assert shown.text == expected.text
    assert shown.zero_overlap == expected.zero_overlap
    pages = shown.rows
    more = shown.more
    while more:
        page = read_preview(page_text(signed_in.get(more)))
        pages += page.rows
        more = page.more
    assert pages == expected_rows(expected)


# -- two gunicorn workers on MariaDB ---------------------------------------------------------------

PASSWORD = "correct horse battery staple"
FILLERS = 30


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)


@dataclass
class Served:
    """Gunicorn with two workers: its address and the pid that served each tagged request."""

    address: str
    access: queue.Queue[str]
    served_by: dict[str, str] = field(default_factory=dict)

    def worker_of(self, tag: str) -> str:
        while tag not in self.served_by:
            try:
                line = self.access.get(timeout=30)
            except queue.Empty:
                pytest.fail(f"gunicorn logged no access for request {tag}")
            pid, _, query = line.strip().partition(" ")
            found = urllib.parse.parse_qs(query).get("tag")
            if found:
                self.served_by[found[0]] = pid
        return self.served_by[tag]


@pytest.fixture
def mariadb_site(tmp_path: Path, prefix: str) -> Iterator[tuple[str, sa.engine.Engine]]:
    url = backend_url("mysql")
    engine = create_engine(url)
    create_tables(engine, prefix)
    yield url, engine
    drop_tables(engine, prefix)
    engine.dispose()


@pytest.fixture
def served(mariadb_site: tuple[str, sa.engine.Engine], tmp_path: Path, prefix: str) -> Iterator[Served]:
    from dashboard import create_app

    url, _ = mariadb_site
    instance = tmp_path / "instance"
    config = {"DATABASE_URL": url, "TABLE_PREFIX": prefix, "ARGON2_PROFILE": "CHEAPEST"}
    runner = create_app(config, instance_path=str(instance)).test_cli_runner()
    result = runner.invoke(args=["claw", "create-admin", "admin"], input=f"{PASSWORD}\n{PASSWORD}\n")
    assert result.exit_code == 0, result.output
    environment = {**os.environ, **{f"CLAW_{name}": value for name, value in config.items()}}
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", "127.0.0.1:0", "--log-level", "info",
         "--access-logfile", "-", "--access-logformat", "%(p)s %(q)s",
         f"dashboard:create_app(instance_path={str(instance)!r})"],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    errors: queue.Queue[str] = queue.Queue()
    access: queue.Queue[str] = queue.Queue()
    readers = [
        threading.Thread(target=_read_lines, args=(process.stderr, errors), daemon=True),
        threading.Thread(target=_read_lines, args=(process.stdout, access), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        address, workers = None, 0
        while address is None or workers < 2:
            try:
                line = errors.get(timeout=60)
            except queue.Empty:
                pytest.fail("gunicorn did not start two workers within 60 s")
            found = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", line)
            address = found.group(1) if found else address
            workers += "Booting worker" in line
        yield Served(address, access)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for reader in readers:
            reader.join(timeout=30)
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]


def _signed_in(address: str) -> urllib.request.OpenerDirector:
    import http.cookiejar

    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with browser.open(f"{address}/login", timeout=30) as response:
        token = re.search(r'name="csrf_token" value="([^"]+)"', response.read().decode())
    assert token
    form = urllib.parse.urlencode({"csrf_token": token.group(1), "username": "admin", "password": PASSWORD})
    with browser.open(f"{address}/login", data=form.encode(), timeout=30) as response:
        assert response.status == 200 and response.url == f"{address}/"
    return browser


def test_two_gunicorn_workers_preview_what_another_process_just_wrote(
    served: Served, mariadb_site: tuple[str, sa.engine.Engine], prefix: str
) -> None:
    _, engine = mariadb_site
    writer = SqlMemory(engine, prefix=prefix)  # another process: the CLI, a cron job, an agent
    for number in range(FILLERS):
        writer.set(f"filler-{number:02d}", f"an unrelated note, number {number}")
    table = tables(prefix).memory
    browser = _signed_in(served.address)
    message = "Has the quokka had its marmalade, or the zebra?"
    tags = itertools.count()

    def previews(phase: str) -> list[Preview]:
        """Preview ``message`` in rounds of concurrent requests until both workers answered."""
        shown: list[Preview] = []
        workers: set[str] = set()

        def fetch(tag: str) -> Preview:
            query = urllib.parse.urlencode({"message": message, "tag": tag})
            with browser.open(f"{served.address}/preview?{query}", timeout=60) as response:
                assert response.status == 200
                return read_preview(response.read().decode())

        deadline = time.monotonic() + 90  # a worker still booting on a loaded machine gets its turn
        with ThreadPoolExecutor(max_workers=6) as pool:
            while time.monotonic() < deadline:
                batch = [f"{phase}-{next(tags)}" for _ in range(6)]
                shown += pool.map(fetch, batch)
                workers |= {served.worker_of(tag) for tag in batch}
                if len(workers) == 2:
                    return shown
        pytest.fail(f"only worker {workers} answered the {phase} previews")

    def plain_sql(statement: Any) -> Callable[[], None]:
        def run() -> None:
            with engine.begin() as conn:
                conn.execute(statement)

        return run

    now = utc_datetime(time.time)  # the workers keep real time; nothing here expires
    zebra = {"id": new_id(), "namespace": "default", "lookup_key": "zebra", "expires_at": None}
    changes = [
        ("a write through SqlMemory", lambda: writer.set("quokka", "the quokka eats marmalade")),
        (
            "a row inserted with plain SQL",
            plain_sql(
                sa.insert(table).values(
                    {
                        **zebra,
                        "value": json.dumps("a zebra, with stripes"),
                        "created_at": now,
                        "updated_at": now,
                    }
                )
            ),
        ),
        (
            "a row updated with plain SQL",
            plain_sql(
                sa.update(table)
                .where(table.c.lookup_key == "quokka")
                .values(value=json.dumps("the quokka sleeps"), updated_at=now)
            ),
        ),
        ("a row deleted with plain SQL", plain_sql(sa.delete(table).where(table.c.lookup_key == "zebra"))),
        ("a forget through SqlMemory", lambda: writer.forget("quokka")),
    ]

    def rows() -> Rows:
        with engine.connect() as conn:
            found = conn.execute(sa.select(table.c.lookup_key, table.c.value, table.c.expires_at))
            return {key: (json.loads(value), expires_at) for key, value, expires_at in found}

    def expected() -> Turn:
        return expected_turn([("default", rows())], message, 3, 4096, 0)

    warm = previews("warm")  # both workers have built their index of the namespace
    assert {(p.text, tuple(p.rows), p.zero_overlap) for p in warm} == {(message, (), FILLERS)}

    for phase, (what, change) in enumerate(changes):
        change()
        turn = expected()
        for shown in previews(f"change{phase}"):
            assert (shown.text, shown.rows, shown.zero_overlap) == (
                turn.text,
                expected_rows(turn),
                turn.zero_overlap,
            ), what
    assert expected_rows(expected()) == [] and expected().zero_overlap == FILLERS
