"""The memory contract (SPEC section 2), run against every driver, plain and wrapped.

Run it against one backend with, for example: ``pytest tests/conformance -k sql-mysql``.
"""

from __future__ import annotations

import itertools
import unicodedata
from datetime import timedelta
from typing import Any

import pytest

import clawmem
from clawmem.memory.wrappers import search_any, sweep_any
from clawmem.recall.rankings import rank
from tests.conftest import DRIVERS, WRAPPERS

COMBINATIONS = [f"{driver}-{wrapper}" for driver, wrapper in itertools.product(DRIVERS, WRAPPERS)]


@pytest.fixture(params=COMBINATIONS)
def memory(request: pytest.FixtureRequest, make_driver: Any) -> Any:
    driver, wrapper = request.param.rsplit("-", 1)
    return WRAPPERS[wrapper](make_driver(driver))


VALUES = [
    None,
    True,
    False,
    0,
    -7,
    2**70,
    1.0,
    -0.5,
    1e300,
    "",
    "plain text",
    "emoji 🦀 and ünïcödé and 中文",
    [],
    {},
    [1, "two", 3.0, None, [True]],
    {"nested": {"list": [1, 2, {"deep": "yes"}]}, "float": 2.5, "none": None},
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:20] for v in VALUES])
def test_values_round_trip_exactly(memory: Any, value: Any) -> None:
    memory.set("k", value)
    got = memory.get("k")
    assert got == value
    assert type(got) is type(value)
    assert memory.has("k")


def test_float_stays_float_and_tuple_becomes_list(memory: Any) -> None:
    memory.set("k", {"one": 1.0, "pair": (1, 2)})
    got = memory.get("k")
    assert type(got["one"]) is float
    assert got["pair"] == [1, 2]


def test_missing_key_reads_as_none(memory: Any) -> None:
    assert memory.get("nope") is None
    assert memory.has("nope") is False
    assert memory.all() == {}


def test_stored_none_exists(memory: Any) -> None:
    memory.set("k", None)
    assert memory.has("k") is True
    assert memory.all() == {"k": None}


def test_set_replaces(memory: Any) -> None:
    memory.set("k", 1)
    memory.set("k", "two")
    assert memory.get("k") == "two"
    assert memory.all() == {"k": "two"}


def test_all_is_sorted_by_code_point(memory: Any) -> None:
    for key in ["b", "a", "B", "é", "Z", "aa", "_", "10", "9"]:
        memory.set(key, key)
    assert list(memory.all()) == sorted(["b", "a", "B", "é", "Z", "aa", "_", "10", "9"])


def test_forget_and_flush(memory: Any) -> None:
    memory.set("a", 1)
    memory.set("b", 2)
    memory.set("a", 1, namespace="other")
    memory.forget("a")
    memory.forget("never-there")
    assert memory.all() == {"b": 2}
    memory.flush()
    assert memory.all() == {}
    assert memory.all("other") == {"a": 1}


def test_returned_values_are_copies(memory: Any) -> None:
    stored = {"list": [1, 2]}
    memory.set("k", stored)
    stored["list"].append(3)
    got = memory.get("k")
    got["list"].append(4)
    assert memory.get("k") == {"list": [1, 2]}


def test_keys_are_exact(memory: Any) -> None:
    nfc = unicodedata.normalize("NFC", "é")
    nfd = unicodedata.normalize("NFD", "é")
    keys = ["a", "A", "a ", " a", nfc, nfd, "ß", "ss"]
    for index, key in enumerate(keys):
        memory.set(key, index)
    assert len(memory.all()) == len(keys)
    for index, key in enumerate(keys):
        assert memory.get(key) == index
    memory.forget("a ")
    assert memory.get("a") == 0
    assert not memory.has("a ")


def test_namespaces_never_share_storage(memory: Any) -> None:
    namespaces = ["a", "a:b", "a.b", "a_b", "a-b", "A"]
    for namespace in namespaces:
        memory.set("shared", namespace, namespace=namespace)
        memory.set(f"only-{namespace}", 1, namespace=namespace)
    for namespace in namespaces:
        assert memory.all(namespace) == {"shared": namespace, f"only-{namespace}": 1}
    memory.flush("a")
    assert memory.all("a") == {}
    for namespace in namespaces[1:]:
        assert memory.get("shared", namespace) == namespace


def test_longest_key_and_namespace(memory: Any) -> None:
    key, namespace = "k" * 191, "n" * 100
    memory.set(key, "v", namespace=namespace)
    assert memory.all(namespace) == {key: "v"}


# -- TTL -------------------------------------------------------------------------------------


def test_ttl_expires_at_floor_now_plus_ttl(memory: Any, clock: Any) -> None:
    clock.now = 1000.75  # floor(now) + 10 = 1010
    memory.set("k", "v", ttl=10)
    clock.now = 1009.999
    assert memory.get("k") == "v"
    assert memory.has("k")
    clock.now = 1010.0
    assert memory.get("k") is None
    assert not memory.has("k")
    assert memory.all() == {}
    assert search_any(memory, "v k", 5, "default") == []


def test_later_set_replaces_ttl(memory: Any, clock: Any) -> None:
    memory.set("k", 1, ttl=5)
    memory.set("k", 2, ttl=100)
    clock.advance(50)
    assert memory.get("k") == 2
    memory.set("k", 3)
    clock.advance(10_000)
    assert memory.get("k") == 3


def test_expired_entry_can_be_set_again(memory: Any, clock: Any) -> None:
    memory.set("k", 1, ttl=1)
    clock.advance(2)
    memory.set("k", 2)
    assert memory.all() == {"k": 2}


def test_a_timedelta_ttl_of_whole_seconds_counts_its_seconds(memory: Any, clock: Any, recorded: Any) -> None:
    clock.now = 1000.75  # floor(now) + 3600 = 4600
    memory.set("k", "v", ttl=timedelta(hours=1))
    clock.now = 4599.999
    assert memory.get("k") == "v"
    clock.now = 4600.0
    assert memory.get("k") is None
    written = [event for event in recorded if event["event"] == "memory.write"]
    assert written and all(event["ttl"] == 3600 for event in written), written


@pytest.mark.parametrize(
    "ttl",
    [
        0,
        -1,
        True,
        False,
        1.5,
        "10",
        10.0,
        float("nan"),
        timedelta(0),
        timedelta(seconds=-5),
        timedelta(seconds=1.5),
        timedelta(microseconds=1),
    ],
    ids=repr,
)
def test_bad_ttl_raises_and_writes_nothing(memory: Any, ttl: Any) -> None:
    memory.set("k", "old")
    with pytest.raises(ValueError, match="ttl"):
        memory.set("k", "new", ttl=ttl)
    assert memory.get("k") == "old"


def test_sweep_removes_only_expired(memory: Any, clock: Any) -> None:
    memory.set("old", 1, ttl=5)
    memory.set("fresh", 2, ttl=500)
    memory.set("forever", 3)
    memory.set("old", 1, namespace="other", ttl=5)
    clock.advance(10)
    counts = sweep_any(memory, dry_run=True)
    if counts:  # drivers that keep their own expiry (every one but Redis) report counts
        assert counts == {"default": 1, "other": 1}
        assert sweep_any(memory) == {"default": 1, "other": 1}
        assert sweep_any(memory) == {}
    assert memory.all() == {"fresh": 2, "forever": 3}
    assert memory.all("other") == {}


# -- bad input -------------------------------------------------------------------------------

BAD_KEYS = ["", "k" * 192, "a\x00b", "line\nbreak", "tab\there", "del\x7f", "\x85", 5, None, b"bytes"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=[repr(k)[:12] for k in BAD_KEYS])
def test_bad_keys_raise_invalid_key(memory: Any, key: Any) -> None:
    for call in (
        lambda: memory.set(key, 1),
        lambda: memory.get(key),
        lambda: memory.has(key),
        lambda: memory.forget(key),
    ):
        with pytest.raises(clawmem.InvalidKey):
            call()
    assert memory.all() == {}


BAD_NAMESPACES = ["", "n" * 101, "a..b", "..", "a/b", "a\\b", "a b", "é", "a\x00", "tag#1", "user@x", 3, None]


@pytest.mark.parametrize("namespace", BAD_NAMESPACES, ids=[repr(n)[:12] for n in BAD_NAMESPACES])
def test_bad_namespaces_raise_invalid_namespace(memory: Any, namespace: Any) -> None:
    calls = [
        lambda: memory.set("k", 1, namespace=namespace),
        lambda: memory.get("k", namespace),
        lambda: memory.has("k", namespace),
        lambda: memory.forget("k", namespace),
        lambda: memory.flush(namespace),
        lambda: memory.all(namespace),
        lambda: memory.search("anything", 5, namespace),
    ]
    for call in calls:
        with pytest.raises(clawmem.InvalidNamespace) as raised:
            call()
        assert "namespace" in str(raised.value)
    assert issubclass(clawmem.InvalidNamespace, ValueError)


class Opaque:
    pass


BAD_VALUES = [
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    ({"deep": [1, float("-inf")]}, ValueError),
    (Opaque(), TypeError),
    ({1: "int key"}, TypeError),
    ({"a": {1, 2}}, TypeError),
    (b"bytes", TypeError),
    ("lone \ud800 surrogate", ValueError),
]


@pytest.mark.parametrize("value,error", BAD_VALUES, ids=[repr(v)[:16] for v, _ in BAD_VALUES])
def test_bad_values_name_the_key_and_write_nothing(memory: Any, value: Any, error: type) -> None:
    memory.set("precious", "old")
    with pytest.raises(error, match="precious"):
        memory.set("precious", value)
    with pytest.raises(error, match="fresh"):
        memory.set("fresh", value)
    assert memory.all() == {"precious": "old"}


def test_self_referencing_value_is_refused(memory: Any) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="loop"):
        memory.set("loop", loop)
    assert memory.all() == {}


def test_value_over_the_size_limit_is_refused(memory: Any) -> None:
    with pytest.raises(clawmem.ValueTooLarge, match="huge"):
        memory.set("huge", "x" * (16 * 1024 * 1024 + 1))
    assert memory.all() == {}


# -- search ----------------------------------------------------------------------------------


def test_search_ranks_by_score_then_key(memory: Any) -> None:
    memory.set("shipping_policy", "Orders ship within two days")
    memory.set("returns", "Returns accepted within thirty days of shipping")
    memory.set("brand_voice", "Friendly and concise")
    memory.set("b_ship", "orders")
    memory.set("a_ship", "orders")
    hits = search_any(memory, "How fast do orders ship? shipping days", 10, "default")
    expected = rank("How fast do orders ship? shipping days", memory.all(), 10)
    assert [(h.key, h.value, h.score) for h in hits] == expected
    # 4 shared words first; then three entries with 2 each, in key order.
    assert [(h.key, h.score) for h in hits] == [
        ("shipping_policy", 4),
        ("a_ship", 2),
        ("b_ship", 2),
        ("returns", 2),
    ]
    assert all(h.namespace == "default" for h in hits)


# -- events ----------------------------------------------------------------------------------


def test_events_carry_run_id_and_never_values(memory: Any) -> None:
    seen: list[dict[str, Any]] = []
    clawmem.events.on("*", seen.append)
    try:
        with clawmem.run_context("R"):
            memory.set("k", "secret-value-text")
            memory.get("k")
            memory.has("k")
            memory.all()
            search_any(memory, "secret", 3, "default")
            memory.forget("k")
            memory.flush()
    finally:
        clawmem.events.off("*", seen.append)
    names = {event["event"] for event in seen}
    assert {"memory.write", "memory.read", "memory.forget", "memory.flush", "memory.search"} <= names
    for event in seen:
        assert event["run_id"] == "R"
        assert "secret-value-text" not in repr(event)
        assert event.get("driver")
