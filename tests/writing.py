"""What the tests of memory the conversation writes share (the remember tool's and extraction's):
a Claw over real HTTP to the local chat-completions server, on this test's tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.memory.sql import SqlMemory
from clawmem.providers import OpenAICompatibleProvider
from clawmem.recall.sources import serving_driver
from clawmem.settings import Settings
from clawmem.turn.pipeline import Claw

USER = "ana-7"
SUBJECT = f"user:{USER}"


def make_claw(
    engine: sa.engine.Engine,
    prefix: str,
    tmp_path: Path,
    clock: FakeClock,
    server: Any,
    timeout: float = 10,
    **settings: Any,
) -> Claw:
    """Return a Claw from settings on this test's tables, with ``memory_writes=tool`` unless told
    otherwise, talking to ``server`` over HTTP."""
    url = engine.url.render_as_string(hide_password=False)
    chosen = {"memory_writes": "tool", **settings}
    configured = Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix, **chosen)
    provider = OpenAICompatibleProvider(server.url, "local-model", timeout=timeout)
    return Claw.from_settings(configured, provider, clock=clock)


def driver_of(claw: Claw) -> SqlMemory:
    driver, _ = serving_driver(claw.memory, SUBJECT)
    assert isinstance(driver, SqlMemory)
    return driver
