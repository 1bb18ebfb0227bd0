"""Every driver has every public method of the contract, and every wrapper every method of the
key/value interface, with the same parameters: an application can swap one for another."""

from __future__ import annotations

import inspect

import pytest

from clawmem.memory.array import ArrayMemory
from clawmem.memory.base import BaseMemory, FeedingMemory, MemoryInterface, SearchableMemory
from clawmem.memory.file import FileMemory
from clawmem.memory.redis import RedisMemory
from clawmem.memory.sql import SqlMemory
from clawmem.memory.wrappers import PrivacyAwareMemory, RouterMemory
from clawmem.recall.feeds import ChangeFeed
from clawmem.recall.sources import Wrapper

DRIVERS = [ArrayMemory, FileMemory, SqlMemory, RedisMemory]
WRAPPERS = [RouterMemory, PrivacyAwareMemory]


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda cls: cls.__name__)
def test_every_driver_has_every_method_of_the_contract_with_its_parameters(driver: type) -> None:
    expected = public_methods(FeedingMemory)
    found = public_methods(driver)
    for name, signature in expected.items():
        assert name in found, f"{driver.__name__} lacks {name}"
        assert list(found[name].parameters) == list(signature.parameters), f"{driver.__name__}.{name}"
    assert issubclass(driver, ChangeFeed)
    assert not getattr(driver, "__abstractmethods__", None)


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda cls: cls.__name__)
def test_every_wrapper_has_the_key_value_interface_and_names_its_driver(wrapper: type) -> None:
    for name, signature in public_methods(SearchableMemory).items():
        assert list(public_methods(wrapper)[name].parameters) == list(signature.parameters)
    assert issubclass(wrapper, Wrapper)
    assert issubclass(wrapper, MemoryInterface)


def test_a_driver_without_a_feed_is_not_followed() -> None:
    # A custom driver that implements only BaseMemory's primitives is scanned by recall.
    assert not issubclass(BaseMemory, ChangeFeed)
