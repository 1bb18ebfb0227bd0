"""Site: everything one site (one ``CLAW_TABLE_PREFIX``) holds, opened once from its settings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.conversations import ConversationLog
from clawmem.errors import ConfigError
from clawmem.memory.base import BaseMemory
from clawmem.memory.registry import open_memory
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for

AUDIT_FILE = "audit.log"


@dataclass
class Site:
    """One site's stores, built lazily from ``settings`` on ``clock``: the database engine, the
    key/value memory behind the privacy switch, its storage driver and the conversation log.

    Every store of a site reads and writes that site's data only (SPEC 4.2).
    """

    settings: Settings
    clock: Clock = field(default=time.time)

    @property
    def prefix(self) -> str:
        """Return the site's table prefix (``""``, ``wp_``, ``wp_2_``...)."""
        return self.settings.table_prefix

    @cached_property
    def engine(self) -> Engine:
        """Return the shared engine of the site's database."""
        return engine_for(self.settings.database_url)

    @cached_property
    def memory(self) -> PrivacyAwareMemory:
        """Return the key/value memory an agent uses: the driver behind the privacy switch."""
        return open_memory(self.settings, self.clock)

    @property
    def driver(self) -> BaseMemory:
        """Return the storage driver behind the switch, for operations that read expired
        entries or delete. Raises :class:`ConfigError` for a driver not built on BaseMemory."""
        driver = self.memory.inner
        if not isinstance(driver, BaseMemory):
            raise ConfigError(
                f"the {self.settings.memory_driver!r} driver is not a clawmem.BaseMemory, so it cannot "
                "list expired entries, sweep or report sizes"
            )
        return driver

    @cached_property
    def conversations(self) -> ConversationLog:
        """Return the site's conversation log."""
        return ConversationLog.from_settings(self.settings, self.clock)

    @property
    def audit_path(self) -> Path:
        """Return the audit log of deleting and exporting commands, ``<instance>/audit.log``."""
        return Path(self.settings.instance_path) / AUDIT_FILE
