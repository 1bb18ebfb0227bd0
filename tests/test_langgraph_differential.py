"""ClawStore against LangGraph's own InMemoryStore, and against a reference scan where
InMemoryStore has nothing to say (a query, TTL), on every memory driver.

Random put, get, delete, search without a query (filters, limits, offsets) and
list_namespaces must give the same answers, up to what differs by design (see
:mod:`clawmem.integrations.langgraph`): search lists by namespace then key, so the reference's
full answer is put in that order before it is paged; list_namespaces is compared with a
reference rebuilt from the live items, since InMemoryStore also lists namespaces it has only
been asked about or emptied.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from langgraph.store.memory import InMemoryStore

from clawmem.clock import FakeClock
from clawmem.integrations import aio
from clawmem.integrations.langgraph import ClawStore
from clawmem.recall.words import keywords, score

EVERYTHING = 10_000
NAMESPACES = [
    ("docs",),
    ("docs", "a"),
    ("docs", "b c"),
    ("docs", "a", "deep"),
    ("users", "u1"),
    ("users", "u1", "notes"),
    ("users", "ü-2", "notes"),
    ("users",),
    ("mixed:case", "Ünï"),
]
KEYS = ["k1", "k2", "K1", "é", "a b"]
WORDS = ["apple", "pear", "plum", "fig", "kiwi"]
VALUES = st.fixed_dictionaries(
    {"n": st.integers(0, 5), "tag": st.sampled_from(["red", "blue"])},
    optional={
        "nested": st.fixed_dictionaries({"a": st.integers(0, 2)}),
        "text": st.lists(st.sampled_from(WORDS), max_size=3).map(" ".join),
        "f": st.floats(-2, 2, allow_nan=False),
    },
)
FILTERS = st.sampled_from(
    [
        None,
        {"tag": "red"},
        {"n": {"$gt": 2}},
        {"n": {"$gte": 2, "$lt": 5}},
        {"n": {"$lte": 3, "$ne": 1}},
        {"tag": {"$eq": "blue"}, "n": 0},
        {"nested": {"a": 1}},
        {"tag": {"$ne": "red"}},
    ]
)
PREFIXES = st.sampled_from([(), ("docs",), ("docs", "a"), ("users",), ("users", "u1"), ("nothing",)])
CONDITIONS = st.sampled_from([None, ("docs",), ("users", "*"), ("*", "notes"), ("*",), ("docs", "a", "*")])


class OnLoop:
    """A ClawStore called through its async methods (``aput``, ``asearch``, ...), each run on
    one event loop: the path an async graph takes."""

    def __init__(self, store: ClawStore, run: Callable[[Any], Any]) -> None:
        self.store, self.run = store, run

    def put(self, *args: Any, **options: Any) -> None:
        self.run(self.store.aput(*args, **options))

    def delete(self, *args: Any) -> None:
        self.run(self.store.adelete(*args))

    def get(self, *args: Any, **options: Any) -> Any:
        return self.run(self.store.aget(*args, **options))

    def search(self, *args: Any, **options: Any) -> Any:
        return self.run(self.store.asearch(*args, **options))

    def list_namespaces(self, **options: Any) -> Any:
        return self.run(self.store.alist_namespaces(**options))


Calls = Callable[[ClawStore], Any]


@pytest.fixture(params=["sync", "async"])
def calls(request: pytest.FixtureRequest) -> Iterator[Calls]:
    """The store as the test calls it: its own methods, or its async twins on one loop (the
    asyncio drivers on MariaDB, PostgreSQL and Redis, a worker thread elsewhere)."""
    if request.param == "sync":
        yield lambda store: store
        return
    with asyncio.Runner() as runner:
        yield lambda store: OnLoop(store, runner.run)
        runner.run(aio.close_engines())


def wipe(memory: Any) -> None:
    for namespace in memory.namespaces():
        memory.flush(namespace)


def triples(items: list[Any]) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    return [(tuple(item.namespace), item.key, item.value) for item in items]


class AgreesWithInMemoryStore(RuleBasedStateMachine):
    memory: Any = None
    calls: Calls = staticmethod(lambda store: store)  # type: ignore[assignment]

    @initialize()
    def start(self) -> None:
        wipe(self.memory)
        self.ours = type(self).calls(ClawStore(self.memory))
        self.reference = InMemoryStore()

    @rule(namespace=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS), value=VALUES)
    def put(self, namespace: tuple[str, ...], key: str, value: dict[str, Any]) -> None:
        self.ours.put(namespace, key, value)
        self.reference.put(namespace, key, value)

    @rule(namespace=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS))
    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        self.ours.delete(namespace, key)
        self.reference.delete(namespace, key)

    @rule(namespace=st.sampled_from(NAMESPACES), key=st.sampled_from(KEYS))
    def get(self, namespace: tuple[str, ...], key: str) -> None:
        ours, reference = self.ours.get(namespace, key), self.reference.get(namespace, key)
        assert (ours is None) == (reference is None)
        if ours is not None:
            assert triples([ours]) == triples([reference])

    @rule(prefix=PREFIXES, wanted=FILTERS, limit=st.integers(0, 6), offset=st.integers(0, 4))
    def search(self, prefix: tuple[str, ...], wanted: Any, limit: int, offset: int) -> None:
        everything = self.reference.search(prefix, filter=wanted, limit=EVERYTHING)
        expected = sorted(triples(everything), key=lambda t: (t[0], t[1]))[offset : offset + limit]
        found = self.ours.search(prefix, filter=wanted, limit=limit, offset=offset)
        assert triples(found) == expected
        assert all(item.score is None for item in found)

    @rule(
        prefix=CONDITIONS,
        suffix=CONDITIONS,
        max_depth=st.none() | st.integers(1, 3),
        limit=st.integers(1, 8),
        offset=st.integers(0, 3),
    )
    def list_namespaces(self, prefix: Any, suffix: Any, max_depth: Any, limit: int, offset: int) -> None:
        live = InMemoryStore()
        for item in self.reference.search((), limit=EVERYTHING):
            live.put(item.namespace, item.key, item.value)
        options = {
            "prefix": prefix,
            "suffix": suffix,
            "max_depth": max_depth,
            "limit": limit,
            "offset": offset,
        }
        assert self.ours.list_namespaces(**options) == live.list_namespaces(**options)


STEPS = {"array": 60, "file": 25, "sql-sqlite": 20, "sql-mysql": 12, "sql-postgres": 12, "redis": 20}


def test_clawstore_agrees_with_inmemorystore(driver_name: str, make_driver: Any, calls: Calls) -> None:
    AgreesWithInMemoryStore.memory = make_driver(driver_name)
    AgreesWithInMemoryStore.calls = staticmethod(calls)  # type: ignore[assignment]
    run_state_machine_as_test(
        AgreesWithInMemoryStore,
        settings=settings(
            max_examples=STEPS[driver_name],
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- what InMemoryStore cannot answer: a query, and TTL ----------------------------------------


def stored_key(namespace: tuple[str, ...], key: str) -> str:
    """The key the reference scores, as the module's docstring states it is stored."""
    if len(namespace) >= 2 and namespace[0] == "users":
        return json.dumps([*namespace[2:], key], ensure_ascii=False, separators=(",", ":"))
    return key


# Few items and TTLs around whole seconds, so that renewals and expiries meet often.
FEW_NAMESPACES = [("docs",), ("docs", "a"), ("users", "u1", "notes")]
FEW_KEYS = ["k1", "k2"]


class AgreesWithAScan(RuleBasedStateMachine):
    """A plain model (a dict of item -> value, TTL seconds, expiry) scanned for each answer."""

    memory: Any = None
    clock: FakeClock | None = None
    calls: Calls = staticmethod(lambda store: store)  # type: ignore[assignment]

    @initialize()
    def start(self) -> None:
        wipe(self.memory)
        self.ours = type(self).calls(ClawStore(self.memory, clock=self.clock))
        self.model: dict[tuple[tuple[str, ...], str], tuple[dict[str, Any], int | None, int | None]] = {}

    def now(self) -> int:
        return int(self.clock())

    def live(self) -> dict[tuple[tuple[str, ...], str], tuple[dict[str, Any], int | None, int | None]]:
        return {
            where: entry for where, entry in self.model.items() if entry[2] is None or self.now() < entry[2]
        }

    def renew(self, where: tuple[tuple[str, ...], str]) -> None:
        value, ttl, _ = self.model[where]
        if ttl is not None:
            self.model[where] = (value, ttl, self.now() + ttl)

    @rule(
        namespace=st.sampled_from(FEW_NAMESPACES),
        key=st.sampled_from(FEW_KEYS),
        value=VALUES,
        minutes=st.none() | st.sampled_from([0.01, 0.505, 1, 1.999]),
    )
    def put(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], minutes: Any) -> None:
        self.ours.put(namespace, key, value, ttl=minutes)
        ttl = None if minutes is None else math.ceil(minutes * 60)
        self.model[(namespace, key)] = (value, ttl, None if ttl is None else self.now() + ttl)

    @rule(seconds=st.sampled_from([1, 29, 30, 31, 60, 120]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(namespace=st.sampled_from(FEW_NAMESPACES), key=st.sampled_from(FEW_KEYS), refresh=st.booleans())
    def get(self, namespace: tuple[str, ...], key: str, refresh: bool) -> None:
        found = self.ours.get(namespace, key, refresh_ttl=refresh)
        expected = self.live().get((namespace, key))
        assert (None if found is None else found.value) == (None if expected is None else expected[0])
        if expected is not None and refresh:
            self.renew((namespace, key))

    @rule(
        prefix=PREFIXES,
        query=st.lists(st.sampled_from([*WORDS, "k1", "notes"]), min_size=1, max_size=3),
        limit=st.integers(0, 6),
        offset=st.integers(0, 3),
        refresh=st.booleans(),
    )
    def search_with_a_query(
        self, prefix: Any, query: list[str], limit: int, offset: int, refresh: bool
    ) -> None:
        text = " ".join(query)
        words = set(keywords(text))
        scored = []
        for (namespace, key), (value, _, _) in self.live().items():
            points = score(words, stored_key(namespace, key), value)
            if namespace[: len(prefix)] == prefix and points > 0:
                scored.append((-points, namespace, key))
        expected = sorted(scored)[offset : offset + limit]
        found = self.ours.search(prefix, query=text, limit=limit, offset=offset, refresh_ttl=refresh)
        assert [(-item.score, tuple(item.namespace), item.key) for item in found] == expected
        if refresh:
            for _, namespace, key in expected:
                self.renew((namespace, key))


@pytest.mark.slow
def test_query_and_ttl_agree_with_a_scan(
    driver_name: str, make_driver: Any, clock: FakeClock, calls: Calls
) -> None:
    AgreesWithAScan.memory = make_driver(driver_name)
    AgreesWithAScan.calls = staticmethod(calls)  # type: ignore[assignment]
    AgreesWithAScan.clock = clock
    run_state_machine_as_test(
        AgreesWithAScan,
        settings=settings(
            max_examples=STEPS[driver_name],
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
