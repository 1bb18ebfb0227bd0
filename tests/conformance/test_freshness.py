"""Indexed recall is exact and fresh across processes (SPEC 5, "Speed"), on every backend.

Process A writes (``set``, ``forget``, ``flush``, ``sweep``, and on SQL plain statements on the
memory table, as another program would) while the fake clock moves; after each step, process
B's ``search`` and ``augment`` (answered from B's word indexes) must equal

- the same augmenter ranking by a full scan (``ranker=scan_ranking``), and
- a reference written in :mod:`tests.conformance.worlds`: the backend's rows read directly (SQL
  rows with SQL, the namespace's JSON file, the Redis entry keys), expiry judged on the fake
  clock, scored with the tokeniser.

The state machine draws the steps; the tests before it take a few fixed ones, fast enough for
every run.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.recall import injection_counts, plan
from clawmem.recall.rankings import scan_ranking
from tests.conformance.worlds import BACKENDS, IndexMachine, World, expected_search, run_machine, world_of


def another_process_writes(world: World, key: str, value: str, namespace: str) -> None:
    """Store ``key`` as another process would: on SQL a plain INSERT, elsewhere process A."""
    if world.table is None or world.program is None:
        world.a.set(key, value, namespace)
        return
    stamp = utc_datetime(world.clock)
    with world.program.begin() as conn:
        conn.execute(sa.insert(world.table), {
            "id": new_id(), "namespace": namespace, "lookup_key": key, "expires_at": None,
            "value": json.dumps(value), "created_at": stamp, "updated_at": stamp})  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_process_b_sees_each_committed_change_at_its_next_search(
    backend: str, tmp_path: Path, clock: FakeClock
) -> None:
    with world_of(backend, clock, tmp_path) as world:
        b = world.make_b()

        def b_answers_as_stored() -> list[str]:
            found = b.search("green tea", 5, "notes")
            assert found == expected_search(world.rows("notes"), "green tea", 5, "notes", int(clock()))
            return [hit.key for hit in found]

        assert b_answers_as_stored() == []
        world.a.set("sencha", "green tea", "notes")
        world.a.set("oolong", "tea", "notes", ttl=30)
        assert b_answers_as_stored() == ["sencha", "oolong"]
        clock.advance(30)
        assert b_answers_as_stored() == ["sencha"]
        world.a.forget("sencha", "notes")
        another_process_writes(world, "matcha", "green tea, whisked", "notes")
        assert b_answers_as_stored() == ["matcha"]
        world.a.sweep()
        world.a.flush("notes")
        assert b_answers_as_stored() == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_survey_of_many_messages_catches_the_index_up_once(
    backend: str, tmp_path: Path, clock: FakeClock
) -> None:
    # Cold memory ranks hundreds of recent messages: what another process wrote just before is
    # counted, and a SQL backend is asked a few things for 200 messages, as for 5, not one per message.
    with world_of(backend, clock, tmp_path) as world:
        for number, words in enumerate(["green tea", "black tea", "coffee beans", "tea and coffee"]):
            world.a.set(f"k{number}", words, "survey")
        b = world.make_b()
        messages = [f"{drink} please" for drink in itertools.islice(itertools.cycle(["tea", "coffee"]), 200)]
        statements: list[Any] = []
        engine = getattr(b, "engine", None)
        if engine is not None:
            sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        issued = []
        for count, newest in ((5, "tea please, hot"), (200, "coffee please")):
            another_process_writes(world, f"new{count}", newest, "survey")  # just before the survey
            statements.clear()
            counts = injection_counts(b, messages[:count], "survey", 3, int(clock()))
            issued.append(len(statements))
            expected: dict[str, int] = {}
            for message in messages[:count]:
                for key, _ in plan(scan_ranking(b, message, ["survey"], int(clock())), 3, 4096)[0]:
                    expected[key] = expected.get(key, 0) + 1
            assert dict(counts) == expected
            assert counts[f"new{count}"] > 0, "another process's write is counted"
        assert max(issued) <= 10, f"statements for 5 and 200 messages: {issued}"  # not one per message


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_process_b_recalls_what_a_scan_of_the_backend_gives(backend: str, tmp_path: Path) -> None:
    run_machine(IndexMachine, backend, tmp_path)
