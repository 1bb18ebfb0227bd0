"""LangChain's key/value stores and chat message history over clawmem.

``ClawStore(memory, namespace)`` is a ``BaseStore[str, Any]`` of JSON values and
``ClawByteStore(memory, namespace)`` a ``ByteStore`` (what ``CacheBackedEmbeddings`` caches
in), both entries of one clawmem namespace; ``ClawChatMessageHistory`` keeps a LangChain chat
as a clawmem conversation. Keys follow clawmem's rules (non-empty, at most 191 characters, no
control characters); a bad key raises :class:`clawmem.InvalidKey`. The async methods are
LangChain's own, which run these in a worker thread, so none blocks the event loop.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Sequence
from typing import Any

from clawmem.integrations import require

require("langchain_core.stores", "langchain")

from langchain_core.stores import BaseStore  # noqa: E402

from clawmem.errors import StorageError  # noqa: E402
from clawmem.memory.base import DEFAULT_NAMESPACE, MemoryInterface  # noqa: E402
from clawmem.memory.rules import (  # noqa: E402
    DEFAULT_MAX_VALUE_BYTES,
    encode_value,
    validate_key,
    validate_namespace,
)
from clawmem.memory.wrappers import serving_driver  # noqa: E402


class ClawStore(BaseStore[str, Any]):
    """A LangChain ``BaseStore`` of JSON values, the entries of one clawmem ``namespace``.

    Values follow clawmem's contract: anything JSON holds round-trips exactly (a tuple comes
    back a list); NaN raises ``ValueError``, anything else JSON cannot hold ``TypeError``, and a
    value over ``CLAW_MAX_VALUE_BYTES`` :class:`clawmem.ValueTooLarge`, with nothing written.
    """

    def __init__(self, memory: MemoryInterface, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.memory = memory
        self.namespace = validate_namespace(namespace)

    @classmethod
    def from_settings(cls, settings: Any, namespace: str = DEFAULT_NAMESPACE, **options: Any) -> ClawStore:
        """Return a store over the memory ``settings`` open, behind their privacy switch."""
        from clawmem.memory.registry import open_memory

        return cls(open_memory(settings, **options), namespace)

    def _stored(self, value: Any) -> Any:
        return value

    def _loaded(self, key: str, stored: Any) -> Any:
        return stored

    def mget(self, keys: Sequence[str]) -> list[Any | None]:
        """Return the value of each key, ``None`` where it is missing or expired."""
        for key in keys:
            validate_key(key)
        return [self._loaded(key, self.memory.get(key, self.namespace)) for key in keys]

    def mset(self, key_value_pairs: Sequence[tuple[str, Any]]) -> None:
        """Store each pair. Every key and value is checked before the first is written."""
        driver, _ = serving_driver(self.memory, self.namespace)
        limit = getattr(driver, "max_value_bytes", DEFAULT_MAX_VALUE_BYTES)
        pairs = [(validate_key(key), self._stored(value)) for key, value in key_value_pairs]
        for key, value in pairs:
            encode_value(key, value, limit)
        for key, value in pairs:
            self.memory.set(key, value, self.namespace)

    def mdelete(self, keys: Sequence[str]) -> None:
        """Delete each key; a missing key is not an error."""
        for key in keys:
            validate_key(key)
        for key in keys:
            self.memory.forget(key, self.namespace)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """Yield the namespace's live keys in code-point order, those starting with ``prefix`` only
        when it is given."""
        for key in self.memory.all(self.namespace):
            if prefix is None or key.startswith(prefix):
                yield key


class ClawByteStore(ClawStore):
    """A LangChain ``ByteStore``: ``bytes`` values, stored in clawmem as base64 text."""

    def _stored(self, value: Any) -> Any:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"a byte store holds bytes, got {type(value).__name__}")
        return base64.b64encode(bytes(value)).decode("ascii")

    def _loaded(self, key: str, stored: Any) -> Any:
        if stored is None:
            return None
        try:
            return base64.b64decode(stored, validate=True)
        except (TypeError, binascii.Error) as exc:
            raise StorageError(
                "langchain", "mget", f"{self.namespace}/{key} does not hold base64 bytes: {exc}"
            ) from exc
