"""Every driver has every public method of the contract, and every wrapper every method of the
key/value interface, with the same signature (names, kinds, defaults and annotations of the
parameters): an application can swap one for another. A driver may narrow what a method returns
(SQL always answers ``rows_per_day``), never what it takes."""

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


def taking(signature: inspect.Signature) -> inspect.Signature:
    """Return ``signature`` without its return annotation: what a caller passes."""
    return signature.replace(return_annotation=inspect.Signature.empty)


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda cls: cls.__name__)
def test_every_driver_has_every_method_of_the_contract_with_its_parameters(driver: type) -> None:
    expected = public_methods(FeedingMemory)
    found = public_methods(driver)
    for name, signature in expected.items():
        assert name in found, f"{driver.__name__} lacks {name}"
        assert taking(found[name]) == taking(signature), f"{driver.__name__}.{name}{found[name]}"
    assert issubclass(driver, ChangeFeed)
    assert not getattr(driver, "__abstractmethods__", None)


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda cls: cls.__name__)
def test_every_wrapper_has_the_key_value_interface_and_names_its_driver(wrapper: type) -> None:
    found = public_methods(wrapper)
    for name, signature in public_methods(SearchableMemory).items():
        assert found[name] == signature, f"{wrapper.__name__}.{name}{found[name]}"
    assert issubclass(wrapper, Wrapper)
    assert issubclass(wrapper, MemoryInterface)


def test_a_driver_without_a_feed_is_not_followed() -> None:
    # A custom driver that implements only BaseMemory's primitives is scanned by recall.
    assert not issubclass(BaseMemory, ChangeFeed)


def test_a_driver_whose_method_takes_other_parameters_is_told_apart() -> None:
    # The check above must see a default, a keyword or an annotation that differs, not only a name.
    class Narrower(ArrayMemory):
        def search(self, query: str, limit: int = 3, namespace: str = "default") -> list:  # type: ignore[override]
            return super().search(query, limit, namespace)

    expected = taking(public_methods(FeedingMemory)["search"])
    assert taking(public_methods(Narrower)["search"]) != expected
    assert taking(public_methods(ArrayMemory)["search"]) == expected
