"""Site: everything one site (one ``CLAW_TABLE_PREFIX``) holds, opened once from its settings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from clawmem.clock import Clock
from clawmem.crypto import Cipher
from clawmem.encryption.ciphers import cipher_for
from clawmem.errors import ConfigError, redact
from clawmem.memory.base import BaseMemory
from clawmem.memory.registry import open_memory
from clawmem.memory.vector_writes import embed_writes
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.sizes import present_tables
from clawmem.turn.conversations import ConversationLog

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
    def cipher(self) -> Cipher:
        """Return the site's cipher (SPEC 13), shared by its memory and conversation log: off
        without keys. Raises :class:`ConfigError` for a malformed key list or key file."""
        return cipher_for(self.settings)

    @cached_property
    def memory(self) -> PrivacyAwareMemory:
        """Return the key/value memory an agent uses: the driver behind the privacy switch,
        embedding what it stores when the scoring is semantic or hybrid."""
        return embed_writes(open_memory(self.settings, self.clock, cipher=self.cipher), self.settings)

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
        return ConversationLog.from_settings(self.settings, self.clock, self.cipher)

    @property
    def audit_path(self) -> Path:
        """Return the audit log of deleting and exporting commands, ``<instance>/audit.log``."""
        return Path(self.settings.instance_path) / AUDIT_FILE

    def missing_database(self, memory_only: bool = False, tables: bool = True) -> str | None:
        """Return, without creating anything, why the site's database cannot be read: a SQLite
        file that does not exist, or a database without this prefix's tables; ``None`` when it
        can. With ``memory_only``, a memory driver other than ``sql`` needs no database; without
        ``tables``, an existing database without the prefix's tables is not missing.

        The message names the URL (password hidden) and path tried, and the settings to fix.
        """
        if memory_only and self.settings.memory_driver != "sql":
            return None
        url = make_url(self.settings.database_url)
        shown = redact(url.render_as_string(hide_password=True))
        fix = (
            "point CLAW_DATABASE_URL at the database, or CLAW_INSTANCE_PATH at the instance folder "
            "that holds clawmem.db"
        )
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            path = Path(url.database).resolve()
            if not path.is_file():
                return f"no clawmem database at {shown} (the file {path} does not exist): {fix}"
        if not tables:
            return None
        try:
            found = present_tables(self.engine, self.prefix)
        except sa.exc.SQLAlchemyError:
            return None  # unreachable: the command reports the database error itself
        if not found:
            return (
                f"no clawmem tables with prefix {self.prefix!r} in {shown}: {fix} "
                "(and CLAW_TABLE_PREFIX at the site's prefix), or run init-db to create them"
            )
        return None
