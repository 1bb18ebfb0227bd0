"""The backends as the freshness and feed state machines see them: a process A, a fresh process
B, the rows as stored read straight from the backend, and on SQL another program's engine; and
:class:`IndexMachine`, where after every step process B must answer as a scan of the backend does.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
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
from clawmem.memory.sql import SqlMemory
from clawmem.memory.sql_feed import REINDEX_OVERLAP
from clawmem.prompt import CUT_BYTE_CAP, CUT_TOP_K, INJECTED, TRUNCATED
from clawmem.recall import AugmentResult, EntryDecision, MessageAugmenter
from clawmem.recall.rankings import scan_ranking, word_overlap
from clawmem.recall.words import keywords
from clawmem.records import MemoryHit
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from tests.conftest import backend_url, sql_url

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


def run_machine(machine: type, backend: str, tmp_path: Path) -> None:
    """Run the state machine ``machine`` (a subclass of :class:`IndexMachine`) against a fresh
    world of ``backend`` on a fake clock, with the examples and steps that backend affords."""
    clock = FakeClock(1_700_000_000.25)
    with world_of(backend, clock, tmp_path) as world:
        named = type(f"{machine.__name__}_{backend.replace('-', '_')}", (machine,), {"world": world})
        run_state_machine_as_test(
            named,
            settings=settings(
                max_examples=EXAMPLES[backend],
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
