"""Build memory drivers by name, and the memory an app normally uses."""

from __future__ import annotations

import time
from collections.abc import Callable

from clawmem.clock import Clock
from clawmem.crypto import Cipher
from clawmem.encryption.ciphers import cipher_for
from clawmem.errors import ConfigError
from clawmem.memory.base import BaseMemory, MemoryInterface
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.rules import subject_of_namespace
from clawmem.settings import PHPCLAW_SCHEMA, Settings, refuse_phpclaw_encryption

DriverFactory = Callable[[Settings, Clock], MemoryInterface]


def _array(settings: Settings, clock: Clock) -> MemoryInterface:
    from clawmem.memory.array import ArrayMemory

    return ArrayMemory(clock=clock, max_value_bytes=settings.max_value_bytes)


def _file(settings: Settings, clock: Clock) -> MemoryInterface:
    from clawmem.memory.file import FileMemory

    return FileMemory(
        settings.file_dir,
        clock=clock,
        max_value_bytes=settings.max_value_bytes,
        site=settings.table_prefix,
    )


def _sql(settings: Settings, clock: Clock) -> MemoryInterface:
    from clawmem.memory.sql import SqlMemory
    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import check_shape

    engine = engine_for(settings.database_url)
    # Existing tables of the other shape refuse to open, in one line (SPEC 4.8).
    shape = check_shape(engine, settings.table_prefix, settings.schema)
    if shape == PHPCLAW_SCHEMA and settings.encrypts:
        raise ConfigError(refuse_phpclaw_encryption())
    return SqlMemory(
        engine,
        prefix=settings.table_prefix,
        clock=clock,
        max_value_bytes=settings.max_value_bytes,
        shape=shape,
    )


def _redis(settings: Settings, clock: Clock) -> MemoryInterface:
    try:
        import redis  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the redis memory driver needs the redis module, which is not installed: "
            "pip install 'clawmem[redis]'"
        ) from None
    from clawmem.memory.redis import RedisMemory

    # Each site keeps its own keys (SPEC 4.2), as SQL keeps its own tables.
    return RedisMemory(
        url=settings.redis_url,
        prefix=f"{settings.table_prefix}phpclaw:",
        clock=clock,
        max_value_bytes=settings.max_value_bytes,
    )


class MemoryRegistry:
    """Maps driver names to factories ``factory(settings, clock) -> MemoryInterface``.

    ``array``, ``file``, ``sql`` and ``redis`` are registered out of the box.
    """

    def __init__(self) -> None:
        self._factories: dict[str, DriverFactory] = {
            "array": _array,
            "file": _file,
            "sql": _sql,
            "redis": _redis,
        }

    def register(self, name: str, factory: DriverFactory) -> None:
        """Add or replace the driver ``name`` (case-insensitive)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError("a driver name must be a non-empty str")
        if not callable(factory):
            raise TypeError(f"the factory for driver {name!r} must be callable")
        self._factories[name.strip().lower()] = factory

    def names(self) -> list[str]:
        """Return the registered driver names, in registration order."""
        return list(self._factories)

    def build(self, name: str, settings: Settings | None = None, clock: Clock = time.time) -> MemoryInterface:
        """Return a new driver ``name``; raises ``ValueError`` listing the available names."""
        factory = self._factories.get(str(name).strip().lower())
        if factory is None:
            raise ValueError(
                f"no memory driver registered as {name!r}; available: {', '.join(self._factories)}"
            )
        memory = factory(settings or Settings(), clock)
        if not isinstance(memory, MemoryInterface):
            raise TypeError(f"the factory for driver {name!r} must return a MemoryInterface")
        return memory


registry = MemoryRegistry()


def open_memory(
    settings: Settings,
    clock: Clock = time.time,
    drivers: MemoryRegistry | None = None,
    cipher: Cipher | None = None,
) -> PrivacyAwareMemory:
    """Return the key/value memory an app uses: the configured driver for the settings' site,
    behind the privacy switch, sealing values at rest with ``cipher`` (default: the one the
    settings' keys make; SPEC 13). Conversations are not key/value entries: see
    :class:`clawmem.ConversationLog`. Raises :class:`ConfigError` for a bad key setting."""
    cipher = cipher_for(settings) if cipher is None else cipher
    driver = (drivers or registry).build(settings.memory_driver, settings, clock)
    if isinstance(driver, BaseMemory) and driver.at_rest and (cipher.enabled or cipher.key_source):
        template = settings.subject_namespace
        driver.use_cipher(
            cipher, settings.table_prefix, lambda namespace: subject_of_namespace(namespace, template)
        )
    return PrivacyAwareMemory(driver, settings.store_messages)
