"""Every driver's change feed: changes applied to a copy equal a full read of the backend.

The freshness machine's backends and operations run (writes, deletes, flushes, expiry and
sweeps by process A and by a second process B, and on SQL plain statements from another
program's engine); after every step a copy fed only by ``changes(namespace, cursor, held)`` of A,
and another of B, must equal the namespace's rows read straight from the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis.stateful import invariant, rule

from clawmem.records import Changes
from tests.conformance.worlds import BACKENDS, IndexMachine, Rows, run_machine


def applied(copy: Rows, batch: Changes) -> Rows:
    """Return ``copy`` with one batch of a change feed applied, in the documented order."""
    if batch.reset:
        copy = {}
    elif batch.swept_at is not None:
        copy = {key: entry for key, entry in copy.items() if entry[1] is None or entry[1] > batch.swept_at}
    copy = dict(copy)
    for key, value, expires_at in batch.entries:
        copy[key] = (value, expires_at)
    for key in batch.gone:
        copy.pop(key, None)
    return copy


class Follower:
    """A copy of each namespace kept only from a driver's change feed; with ``tells``, each call
    says which keys the copy holds (as recall's index does)."""

    def __init__(self, driver: Any, tells: bool) -> None:
        self.driver, self.tells = driver, tells
        self.copies: dict[str, Rows] = {}
        self.cursors: dict[str, Any] = {}

    def follow(self, namespace: str) -> Rows:
        held = self.copies.get(namespace, {}).keys() if self.tells else None
        batch = self.driver.changes(namespace, self.cursors.get(namespace), held)
        assert isinstance(batch, Changes)
        self.copies[namespace] = applied(self.copies.get(namespace, {}), batch)
        self.cursors[namespace] = batch.cursor
        return self.copies[namespace]


class FeedMachine(IndexMachine):
    """Process A and process B follow both namespaces while everyone writes."""

    def __init__(self) -> None:
        super().__init__()
        # A's copy says which keys it holds, B's does not: both ways of following are checked.
        self.followers = [Follower(self.world.a, tells=True), Follower(self.b, tells=False)]

    @rule()
    def restart_b(self) -> None:
        self.b = self.world.make_b()
        self.followers[1] = Follower(self.b, tells=False)

    @invariant()
    def b_answers_as_a_scan_of_the_backend(self) -> None:
        """Replaced: this machine checks the feeds, not the turns."""

    @invariant()
    def each_copy_equals_a_full_read(self) -> None:
        for namespace in self.namespaces:
            stored = self.world.rows(namespace)
            for follower in self.followers:
                assert follower.follow(namespace) == stored
                assert follower.follow(namespace) == stored  # nothing changed: the same again


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_changes_applied_to_a_copy_equal_a_full_read(backend: str, tmp_path: Path) -> None:
    run_machine(FeedMachine, backend, tmp_path)


def test_a_batch_that_changes_nothing_says_so() -> None:
    assert Changes("cursor").empty
    assert not Changes("cursor", gone=["k"]).empty
    assert not Changes("cursor", swept_at=5).empty
