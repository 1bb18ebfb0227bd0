"""Every driver's search() returns exactly what ranking a full scan returns (SPEC 5, "Rank").

Random writes, forgets and clock advances run against each driver and a dict model; after
each search the driver must agree with ``rank()`` over the model and over its own ``all()``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem.clock import FakeClock
from clawmem.recall.rankings import rank
from clawmem.records import MemoryHit

VOCABULARY = [
    "tea",
    "Tea",
    "green",
    "coffee",
    "café",
    "CAFÉ",
    "cafe\u0301",
    "don't",
    "well-known",
    "user_123",
    "漢字テスト",
    "ox",
    "shipping",
    "policy",
    "Tea-time",
    "123",
]

words = st.sampled_from(VOCABULARY)
phrases = st.lists(words, min_size=0, max_size=5).map(" ".join)
keys = st.one_of(
    st.sampled_from(["tea", "Tea", "tea ", "green_tea", "café", "cafe\u0301", "user_123", "a", "order-7"]),
    st.text(alphabet="abTé_- 漢", min_size=1, max_size=8),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    phrases,
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(words, children, max_size=3),
    max_leaves=6,
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values, st.one_of(st.none(), st.integers(1, 5))),
        st.tuples(st.just("forget"), keys),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 1, 2, 3])),
        st.tuples(st.just("search"), phrases, st.integers(0, 6)),
    ),
    max_size=25,
)

_namespaces = itertools.count()


@pytest.fixture
def driver(driver_name: str, make_driver: Callable[[str], Any]) -> Any:
    """One driver per backend for the whole test; each example works in a namespace of its own."""
    return make_driver(driver_name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations, final_queries=st.lists(phrases, min_size=1, max_size=3))
@pytest.mark.slow
def test_search_equals_rank_of_a_full_scan(
    driver: Any, clock: FakeClock, steps: list[tuple[Any, ...]], final_queries: list[str]
) -> None:
    namespace = f"diff{next(_namespaces)}"
    model: dict[str, tuple[Any, int | None]] = {}

    def live() -> dict[str, Any]:
        now = math.floor(clock())
        return {k: v for k, (v, expires) in sorted(model.items()) if expires is None or now < expires}

    def check(query: str, limit: int) -> None:
        expected = [MemoryHit(k, v, namespace, s) for k, v, s in rank(query, live(), limit)]
        scanned = [MemoryHit(k, v, namespace, s) for k, v, s in rank(query, driver.all(namespace), limit)]
        assert driver.search(query, limit, namespace) == expected == scanned

    for step in steps:
        if step[0] == "set":
            _, key, value, ttl = step
            driver.set(key, value, namespace, ttl)
            model[key] = (value, None if ttl is None else math.floor(clock()) + ttl)
        elif step[0] == "forget":
            driver.forget(step[1], namespace)
            model.pop(step[1], None)
        elif step[0] == "advance":
            clock.advance(step[1])
        else:
            check(step[1], step[2])
    assert driver.all(namespace) == live()
    for query in final_queries:
        check(query, 5)
