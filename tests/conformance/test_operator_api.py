"""The operator's read API of every driver (:class:`~clawmem.memory.base.BaseMemory`): the
namespace counts, the key list in each order with its filters and cursors, as the dashboard and
the CLI read them (SPEC 2, "Operator API").

Run it against one backend with, for example: ``pytest tests/conformance -k sql-mysql``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from clawmem.clock import FakeClock
from clawmem.errors import InvalidCursor
from clawmem.paging import SORTS as KEY_SORTS
from clawmem.paging import encode_cursor
from clawmem.records import MemoryRow


@pytest.fixture
def memory(driver_name: str, make_driver: Callable[[str], Any]) -> Any:
    """Each storage driver in turn, empty."""
    return make_driver(driver_name)


def walk(fetch: Callable[[str | None], Any]) -> Iterator[Any]:
    """Yield every row of the pages ``fetch(cursor)`` gives, following each next cursor."""
    cursor = None
    while True:
        page = fetch(cursor)
        yield from page.items
        if page.next_cursor is None:
            return
        assert page.items, "a page with a next cursor holds rows"
        cursor = page.next_cursor


def fill_sorted(memory: Any, clock: FakeClock) -> None:
    """Write nine entries of namespace ``sorted``, 10 s of the clock apart in three groups."""
    # Keys written at three moments (ties within each), expiring at four moments or never;
    # "c" expires after a minute.
    for keys in (["m", "b", "x"], ["a", "k", "z", "c"], ["q", "d"]):
        for index, key in enumerate(keys):
            ttl = [None, 600, 600, 60][index % 4]
            memory.set(key, {"note": f"value of {key}"}, "sorted", ttl=ttl)
        clock.advance(10)


def _expected_keys(rows: list[MemoryRow], sort: str, descending: bool | None = None) -> list[str]:
    newest_first = KEY_SORTS[sort] if descending is None else descending
    if sort == "key":
        return sorted((row.key for row in rows), reverse=newest_first)
    value = {"updated": lambda row: row.updated_at, "expires": lambda row: row.expires_at}[sort]
    present = sorted(
        (r for r in rows if value(r) is not None), key=lambda r: (value(r), r.key), reverse=newest_first
    )
    missing = sorted((r for r in rows if value(r) is None), key=lambda r: r.key, reverse=newest_first)
    return [row.key for row in present + missing]


@pytest.mark.parametrize("sort", list(KEY_SORTS))
def test_every_key_order_pages_each_entry_once_in_order(memory: Any, clock: FakeClock, sort: str) -> None:
    fill_sorted(memory, clock)
    clock.advance(100)  # the 60-second entries are now expired, not yet swept
    rows = memory.records("sorted")

    def keys(**filters: Any) -> list[str]:
        pages = walk(lambda cursor: memory.entries("sorted", limit=2, sort=sort, cursor=cursor, **filters))
        return [row.key for row in pages]

    listed = keys()
    assert listed == _expected_keys(rows, sort)
    assert len(listed) == 9
    live = keys(state="live")
    assert live == [key for key in _expected_keys(rows, sort) if key != "c"]
    assert memory.count_entries("sorted", state="live") == len(live) == 8
    assert memory.count_entries("sorted", query="VALUE OF Q") == 1
    assert memory.count_entries("sorted") == memory.count("sorted") == 9
    for descending in (True, False):
        turned = [
            row.key
            for row in walk(
                lambda cursor, d=descending: memory.entries(
                    "sorted", limit=2, sort=sort, descending=d, cursor=cursor
                )
            )
        ]
        assert turned == _expected_keys(rows, sort, descending), descending
    if sort == "expires":  # what never expires comes last either way
        never = {row.key for row in rows if row.expires_at is None}
        for descending in (True, False):
            assert set(_expected_keys(rows, sort, descending)[-len(never) :]) == never


def test_a_key_cursor_of_another_order_is_refused(memory: Any, clock: FakeClock, driver_name: str) -> None:
    fill_sorted(memory, clock)
    for sort in KEY_SORTS:
        cursor = memory.entries("sorted", limit=2, sort=sort).next_cursor
        for other in KEY_SORTS:
            if other != sort:
                with pytest.raises(InvalidCursor):
                    memory.entries("sorted", limit=2, sort=other, cursor=cursor)
        turned = memory.entries("sorted", limit=2, sort=sort, descending=not KEY_SORTS[sort]).next_cursor
        with pytest.raises(InvalidCursor):  # the same sort the other way round
            memory.entries("sorted", limit=2, sort=sort, cursor=turned)
        with pytest.raises(InvalidCursor):
            memory.entries("sorted", limit=2, sort=sort, descending=not KEY_SORTS[sort], cursor=cursor)
    with pytest.raises(ValueError, match="sort must be one of key, updated, expires"):
        memory.entries("sorted", sort="size")
    forged = [
        ["expires", str(2**63), "a"],
        ["expires", "soon", "a"],
        ["updated", "yesterday", "a"],
        ["key", "a", "b"],
        ["key", None, "a"],
    ]
    if not driver_name.startswith("sql-"):  # SQL pages past a stored time it cannot read by its raw text
        forged.append(["updated", 'raw:"soon"', "a"])
    for values in forged:
        with pytest.raises(InvalidCursor):
            memory.entries("sorted", limit=2, sort=values[0], cursor=encode_cursor(values))


def test_counts_of_one_namespace_agree_with_the_namespace_listing(memory: Any, clock: FakeClock) -> None:
    for n in range(4):
        memory.set(f"k{n}", n, "crm", ttl=None if n else 1)
    memory.set("k", 1, "crm.archive")
    clock.advance(10)
    listed = {row.namespace: row.total for row in memory.namespace_counts()}
    assert memory.count("crm") == listed["crm"] == 4  # the expired, unswept row counts
    assert memory.count("crm.archive") == 1 and memory.count("empty") == 0
    assert len(memory.records("crm")) == 4


def test_update_stores_what_its_function_makes_of_the_entry(memory: Any, clock: FakeClock) -> None:
    seen: list[Any] = []

    def count(current: Any) -> dict[str, int]:
        seen.append(current)
        return {"runs": (current or {"runs": 0})["runs"] + 1}

    assert memory.update("job", count, "jobs", ttl=60) == {"runs": 1}
    assert memory.update("job", count, "jobs", ttl=60) == {"runs": 2}
    assert seen == [None, {"runs": 1}] and memory.get("job", "jobs") == {"runs": 2}
    clock.advance(61)  # the TTL counts from the last update; an expired entry reads as missing
    assert memory.update("job", count, "jobs") == {"runs": 1} and seen[-1] is None
    clock.advance(10_000)
    assert memory.get("job", "jobs") == {"runs": 1}  # ttl=None: no expiry


def test_update_writes_nothing_when_its_function_raises(memory: Any) -> None:
    memory.set("job", {"runs": 1}, "jobs")

    def refuse(current: Any) -> Any:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        memory.update("job", refuse, "jobs")
    assert memory.get("job", "jobs") == {"runs": 1}
