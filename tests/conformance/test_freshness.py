"""Indexed recall is exact and fresh across processes (SPEC 5, "Speed"), on every backend.

Process A writes (``set``, ``forget``, ``flush``, ``sweep``, and on SQL plain statements on the
memory table, as another program would) while the fake clock moves; after each step, process
B's ``search`` and ``augment`` (answered from B's word indexes) must equal

- the same augmenter ranking by a full scan (``ranker=scan_ranking``), and
- a reference written in :mod:`tests.conformance.worlds`: the backend's rows read directly (SQL
  rows with SQL, the namespace's JSON file, the Redis entry keys), expiry judged on the fake
  clock, scored with the tokeniser.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.worlds import BACKENDS, IndexMachine, run_machine


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_process_b_recalls_what_a_scan_of_the_backend_gives(backend: str, tmp_path: Path) -> None:
    run_machine(IndexMachine, backend, tmp_path)
