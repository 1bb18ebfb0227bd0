"""Every driver behaves like a plain dict model under random operations and clock advances."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from clawmem.clock import FakeClock
from clawmem.memory.wrappers import search_any
from clawmem.words import rank

NAMESPACES = st.sampled_from(["default", "a", "a:b", "a.b", "a_b"])
KEYS = st.sampled_from(["a", "A", "a ", "é", "e\u0301", "shipping", "ship_days", "k" * 191])
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)
TTLS = st.none() | st.integers(min_value=1, max_value=30)
QUERIES = st.sampled_from(["shipping days", "a", "true false", "ship", "null"])


def machine_for(memory: Any, clock: FakeClock) -> type[RuleBasedStateMachine]:
    class DictModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            # namespace -> key -> (value, expires_at)
            self.model: dict[str, dict[str, tuple[Any, int | None]]] = {}

        @initialize()
        def empty(self) -> None:
            for namespace in ["default", "a", "a:b", "a.b", "a_b"]:
                memory.flush(namespace)

        def live(self, namespace: str) -> dict[str, Any]:
            now = int(clock.now // 1)
            entries = self.model.get(namespace, {})
            return {k: v for k, (v, exp) in sorted(entries.items()) if exp is None or now < exp}

        @rule(key=KEYS, value=JSON_VALUES, namespace=NAMESPACES, ttl=TTLS)
        def set(self, key: str, value: Any, namespace: str, ttl: int | None) -> None:
            memory.set(key, value, namespace, ttl)
            expires_at = None if ttl is None else int(clock.now // 1) + ttl
            self.model.setdefault(namespace, {})[key] = (value, expires_at)

        @rule(key=KEYS, namespace=NAMESPACES)
        def get(self, key: str, namespace: str) -> None:
            live = self.live(namespace)
            assert memory.get(key, namespace) == live.get(key)
            assert memory.has(key, namespace) == (key in live)

        @rule(key=KEYS, namespace=NAMESPACES)
        def forget(self, key: str, namespace: str) -> None:
            memory.forget(key, namespace)
            self.model.get(namespace, {}).pop(key, None)

        @rule(namespace=NAMESPACES)
        def flush(self, namespace: str) -> None:
            memory.flush(namespace)
            self.model.pop(namespace, None)

        @rule(seconds=st.floats(min_value=0, max_value=20))
        def tick(self, seconds: float) -> None:
            clock.advance(seconds)

        @rule(query=QUERIES, namespace=NAMESPACES, limit=st.integers(0, 4))
        def search(self, query: str, namespace: str, limit: int) -> None:
            hits = search_any(memory, query, limit, namespace)
            assert [(h.key, h.value, h.score) for h in hits] == rank(query, self.live(namespace), limit)

        @invariant()
        def all_matches(self) -> None:
            for namespace in ["default", "a:b"]:
                assert memory.all(namespace) == self.live(namespace)
                assert list(memory.all(namespace)) == list(self.live(namespace))

    return DictModel


@pytest.mark.parametrize("driver", ["array", "file", "sql-sqlite", "sql-mysql", "sql-postgres", "redis"])
def test_driver_matches_dict_model(driver: str, make_driver: Any, clock: FakeClock) -> None:
    memory = make_driver(driver)
    remote = driver in {"sql-mysql", "sql-postgres", "redis"}
    run_state_machine_as_test(
        machine_for(memory, clock),
        settings=settings(max_examples=25 if remote else 60, stateful_step_count=25, deadline=None),
    )
