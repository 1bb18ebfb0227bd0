"""LangChain's own standard tests, unmodified, against ClawStore and ClawByteStore on every
memory driver (array, file, SQL on SQLite, MariaDB and PostgreSQL, Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import BaseStoreAsyncTests, BaseStoreSyncTests

from clawmem.clock import FakeClock
from clawmem.integrations.langchain import ClawByteStore, ClawStore
from tests.conftest import DRIVERS


@pytest.fixture(params=list(DRIVERS))
def memory(request: pytest.FixtureRequest, clock: FakeClock) -> Any:
    """An empty memory of each driver in turn."""
    return DRIVERS[request.param](request, clock)


JSON_VALUES = ({"name": "Ada", "langs": ["en", "fr"]}, [1, 2.5, None, True], "plain text")
BYTE_VALUES = (b"\x00\x01binary", "é".encode(), bytes(range(256)))


class TestClawStoreSync(BaseStoreSyncTests[Any]):
    @pytest.fixture
    def kv_store(self, memory: Any) -> ClawStore:
        return ClawStore(memory, namespace="langchain-test")

    @pytest.fixture
    def three_values(self) -> tuple[Any, Any, Any]:
        return JSON_VALUES


class TestClawStoreAsync(BaseStoreAsyncTests[Any]):
    @pytest.fixture
    async def kv_store(self, memory: Any) -> ClawStore:
        return ClawStore(memory, namespace="langchain-test")

    @pytest.fixture
    def three_values(self) -> tuple[Any, Any, Any]:
        return JSON_VALUES


class TestClawByteStoreSync(BaseStoreSyncTests[bytes]):
    @pytest.fixture
    def kv_store(self, memory: Any) -> ClawByteStore:
        return ClawByteStore(memory, namespace="langchain-bytes")

    @pytest.fixture
    def three_values(self) -> tuple[bytes, bytes, bytes]:
        return BYTE_VALUES


class TestClawByteStoreAsync(BaseStoreAsyncTests[bytes]):
    @pytest.fixture
    async def kv_store(self, memory: Any) -> ClawByteStore:
        return ClawByteStore(memory, namespace="langchain-bytes")

    @pytest.fixture
    def three_values(self) -> tuple[bytes, bytes, bytes]:
        return BYTE_VALUES
