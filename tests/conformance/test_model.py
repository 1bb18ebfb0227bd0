"""Every driver behaves like a plain dict model under random operations and clock advances."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from clawmem.clock import FakeClock
from clawmem.memory.wrappers import search_any
from clawmem.recall.rankings import rank

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


def machine_for(
    memory: Any, clock: FakeClock, expires_on_its_own: bool, prunes_on_write: bool = False
) -> type[RuleBasedStateMachine]:
    """The model machine for ``memory``. A driver that ``expires_on_its_own`` (Redis, on the real
    clock) may have dropped an expired entry before the sweeper: it is then not listed. A driver
    that ``prunes_on_write`` (files) deletes a namespace's expired entries on every write to it."""

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

        def expired(self, namespace: str) -> set[str]:
            return set(self.model.get(namespace, {})) - set(self.live(namespace))

        def listed(self, rows: list[Any], namespace: str) -> None:
            """Check operator rows against the model: every live entry, and the expired ones."""
            stored = {k: (v, exp) for k, (v, exp) in self.model.get(namespace, {}).items()}
            found = {row.key: (row.value, row.expires_at) for row in rows}
            assert [row.key for row in rows] == sorted(found)
            if expires_on_its_own:
                assert set(self.live(namespace)) <= set(found) <= set(stored)
                stored = {k: stored[k] for k in found}
            assert found == stored

        def pruned(self, namespace: str) -> None:
            if prunes_on_write:
                for key in self.expired(namespace):
                    del self.model[namespace][key]

        @rule(key=KEYS, value=JSON_VALUES, namespace=NAMESPACES, ttl=TTLS)
        def set(self, key: str, value: Any, namespace: str, ttl: int | None) -> None:
            memory.set(key, value, namespace, ttl)
            self.pruned(namespace)
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
            self.pruned(namespace)
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

        @rule(namespace=NAMESPACES)
        def operator_reads(self, namespace: str) -> None:
            self.listed(memory.records(namespace), namespace)
            live = memory.entries(namespace, state="live", limit=500).items
            assert [row.key for row in live] == list(self.live(namespace))
            expired = {row.key for row in memory.entries(namespace, state="expired", limit=500).items}
            assert expired <= self.expired(namespace)
            if not expires_on_its_own:
                assert expired == self.expired(namespace)
            for key in self.model.get(namespace, {}):
                row = memory.entry(namespace, key)
                assert row is not None or (expires_on_its_own and key in self.expired(namespace))
            counts = {count.namespace: count for count in memory.namespace_counts()}
            if namespace in counts:
                assert counts[namespace].live == len(self.live(namespace))
                # Live entries that carry an expiry: the Overview's "expiring" TTL state.
                timed = [key for key in self.live(namespace) if self.model[namespace][key][1] is not None]
                assert counts[namespace].expiring == len(timed)

        @rule(text=st.sampled_from(["a", "ship", "é", "1"]))
        def find(self, text: str) -> None:
            found = {(row.namespace, row.key) for row in memory.find(text)}
            for row in memory.find(text):
                assert text in row.key or text in json.dumps(row.value, ensure_ascii=False)
            for namespace in self.model:
                for key in self.live(namespace):
                    if text in key:
                        assert (namespace, key) in found

        @rule()
        def sweep(self) -> None:
            counts = memory.sweep()
            for namespace in list(self.model):
                gone = self.expired(namespace)
                if expires_on_its_own:
                    assert counts.get(namespace, 0) <= len(gone)
                else:
                    assert counts.get(namespace, 0) == len(gone)
                for key in gone:
                    del self.model[namespace][key]

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
        machine_for(memory, clock, expires_on_its_own=driver == "redis", prunes_on_write=driver == "file"),
        settings=settings(max_examples=25 if remote else 60, stateful_step_count=25, deadline=None),
    )
