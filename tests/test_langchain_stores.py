"""What LangChain's standard tests do not ask of ClawStore and ClawByteStore: bad input refused
whole, the privacy switch, one namespace only, and async calls that leave the loop free.
(The standard tests themselves run in their own lane: tests/langchain_standard.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clawmem.clock import FakeClock
from clawmem.errors import InvalidKey, InvalidNamespace, StorageError, ValueTooLarge
from clawmem.integrations.langchain import ClawByteStore, ClawStore
from clawmem.memory.array import ArrayMemory
from clawmem.memory.wrappers import PrivacyAwareMemory
from tests.held_memory import HeldMemory


@pytest.fixture
def memory(clock: FakeClock) -> ArrayMemory:
    return ArrayMemory(clock=clock, max_value_bytes=1000)


@pytest.mark.parametrize(
    ("pairs", "error"),
    [
        ([("ok", 1), ("", 2)], InvalidKey),
        ([("ok", 1), ("k" * 192, 2)], InvalidKey),
        ([("ok", 1), ("tab\tkey", 2)], InvalidKey),
        ([("ok", 1), ("nan", float("nan"))], ValueError),
        ([("ok", 1), ("set", {1, 2})], TypeError),
        ([("ok", 1), ("big", "x" * 2000)], ValueTooLarge),
    ],
)
def test_a_bad_pair_refuses_the_whole_mset(
    memory: ArrayMemory, pairs: list[Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        ClawStore(memory, "lc").mset(pairs)
    assert memory.namespaces() == []


def test_a_byte_store_holds_only_bytes_and_refuses_whole(memory: ArrayMemory) -> None:
    store = ClawByteStore(memory, "cache")
    with pytest.raises(TypeError, match="bytes"):
        store.mset([("a", b"fine"), ("b", "text is not bytes")])
    assert memory.namespaces() == []
    store.mset([("a", b"\x00\xff"), ("b", bytearray(b"xy"))])
    assert store.mget(["a", "b", "c"]) == [b"\x00\xff", b"xy", None]


def test_a_byte_store_says_so_when_an_entry_is_not_its_own(memory: ArrayMemory) -> None:
    memory.set("a", {"not": "base64"}, "cache")
    with pytest.raises(StorageError, match="base64"):
        ClawByteStore(memory, "cache").mget(["a"])


def test_a_store_sees_only_its_namespace(memory: ArrayMemory) -> None:
    ClawStore(memory, "one").mset([("k", 1), ("key2", 2)])
    ClawStore(memory, "two").mset([("k", 3)])
    assert ClawStore(memory, "one").mget(["k"]) == [1]
    assert list(ClawStore(memory, "two").yield_keys()) == ["k"]
    assert list(ClawStore(memory, "one").yield_keys(prefix="ke")) == ["key2"]
    with pytest.raises(InvalidNamespace):
        ClawStore(memory, "no spaces")


def test_with_the_privacy_switch_off_nothing_is_stored_and_deletes_still_work(memory: ArrayMemory) -> None:
    ClawStore(memory, "lc").mset([("old", 1)])
    private = ClawStore(PrivacyAwareMemory(memory, store_messages=False), "lc")
    private.mset([("new", 2)])
    assert private.mget(["old", "new"]) == [1, None]
    private.mdelete(["old"])
    assert memory.namespaces() == []


@pytest.mark.parametrize("store_class", [ClawStore, ClawByteStore])
def test_async_reads_leave_the_event_loop_free(clock: FakeClock, store_class: type[ClawStore]) -> None:
    memory = HeldMemory(clock)
    store = store_class(memory, "lc")

    async def main() -> list[Any]:
        reading = asyncio.create_task(store.amget(["k"]))
        while not memory.entered.is_set():
            await asyncio.sleep(0)  # this coroutine keeps running while the read is held
        memory.release.set()
        return await reading

    assert asyncio.run(main()) == [None]
