"""The core's public surface: import hygiene, settings, ids, events, errors and the registry."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

import clawmem
from clawmem.errors import ConfigError, redact
from clawmem.ids import new_id
from clawmem.memory.registry import MemoryRegistry, open_memory
from clawmem.settings import Settings


def test_import_clawmem_does_not_import_flask() -> None:
    code = (
        "import sys, clawmem; clawmem.open_memory; clawmem.Settings; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'dashboard', 'redis')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_every_public_name_resolves() -> None:
    missing = [name for name in clawmem.__all__ if not hasattr(clawmem, name)]
    assert missing == []


def test_ids_are_ulids_in_creation_order() -> None:
    ids = [new_id() for _ in range(2000)]
    assert all(len(i) == 26 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_settings_from_env(tmp_path: Any) -> None:
    settings = Settings.from_env(
        {
            "CLAW_TABLE_PREFIX": "wp_2_",
            "CLAW_MEMORY_DRIVER": "Redis",
            "CLAW_STORE_MESSAGES": "false",
            "CLAW_RECALL_TOP_K": "0",
            "CLAW_COMPACT_MAX_TOKENS": "8000",
            "CLAW_RETENTION_DAYS": "90",
            "UNRELATED": "x",
        },
        instance_path=tmp_path,
    )
    assert settings.table_prefix == "wp_2_"
    assert settings.memory_driver == "redis"
    assert settings.store_messages is False
    assert settings.recall_top_k == 0
    assert settings.compact_max_tokens == 8000
    assert settings.retention_days == 90
    assert settings.database_url == f"sqlite:///{tmp_path / 'clawmem.db'}"
    assert settings.file_dir == str(tmp_path / "memory")
    assert Settings.from_env({}).recall_namespace == "default"


@pytest.mark.parametrize(
    "variable,value,fragment",
    [
        ("CLAW_STORE_MESSAGES", "maybe", "CLAW_STORE_MESSAGES must be true or false"),
        ("CLAW_RECALL_TOP_K", "three", "CLAW_RECALL_TOP_K must be a whole number"),
        ("CLAW_COMPACT_MAX_MESSAGES", "-1", "at least 0"),
        ("CLAW_RETENTION_DAYS", "0", "CLAW_RETENTION_DAYS must be at least 1"),
        ("CLAW_TABLE_PREFIX", "wp-; DROP", "table prefix"),
    ],
)
def test_malformed_settings_name_the_variable(variable: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Settings.from_env({variable: value})


def test_registry_builds_all_four_and_lists_names(tmp_path: Any) -> None:
    registry = MemoryRegistry()
    assert registry.names() == ["array", "file", "sql", "redis"]
    settings = Settings(instance_path=str(tmp_path))
    assert isinstance(registry.build("array", settings), clawmem.ArrayMemory)
    assert isinstance(registry.build("FILE", settings), clawmem.FileMemory)
    assert isinstance(registry.build("sql", settings), clawmem.SqlMemory)
    assert isinstance(registry.build("redis", settings), clawmem.RedisMemory)
    with pytest.raises(ValueError, match="available: array, file, sql, redis"):
        registry.build("mongo", settings)
    custom = clawmem.ArrayMemory()
    registry.register("mine", lambda settings, clock: custom)
    assert registry.build("mine") is custom
    registry.register("broken", lambda settings, clock: object())
    with pytest.raises(TypeError, match="must return a MemoryInterface"):
        registry.build("broken")


def test_redis_driver_names_the_missing_package(tmp_path: Any) -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from clawmem.memory.registry import registry\n"
        "try:\n    registry.build('redis')\nexcept RuntimeError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install redis" in result.stdout


def test_open_memory_routes_conversations_to_sql_behind_the_switch(tmp_path: Any) -> None:
    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import create_tables

    settings = Settings(instance_path=str(tmp_path), memory_driver="array", store_messages=False)
    create_tables(engine_for(settings.database_url))
    memory = open_memory(settings)
    assert isinstance(memory, clawmem.PrivacyAwareMemory)
    assert memory.store_messages is False
    router = memory.inner
    assert isinstance(router.default, clawmem.ArrayMemory)
    assert isinstance(router.driver_for("conversations"), clawmem.SqlConversationMemory)
    memory.set("k", "v")
    assert memory.get("k") is None


def test_listener_errors_are_logged_and_never_break_the_operation(caplog: Any) -> None:
    def broken(payload: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    memory = clawmem.ArrayMemory()
    clawmem.events.on("memory.write", broken)
    try:
        with caplog.at_level(logging.ERROR, logger="clawmem.events"):
            memory.set("k", "v")
    finally:
        clawmem.events.off("memory.write", broken)
    assert memory.get("k") == "v"
    assert "memory.write" in caplog.text


def test_unknown_events_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown event"):
        clawmem.events.on("memory.wrote", print)


def test_run_context_tags_events_and_resets() -> None:
    seen: list[dict[str, Any]] = []
    clawmem.events.on("memory.read", seen.append)
    memory = clawmem.ArrayMemory()
    try:
        with clawmem.run_context("outer"):
            memory.get("a")
        memory.get("b")
    finally:
        clawmem.events.off("memory.read", seen.append)
    assert [(e["key"], e["run_id"]) for e in seen] == [("a", "outer"), ("b", None)]


def test_memory_error_redacts_passwords() -> None:
    error = clawmem.StorageError(
        "redis", "get", "Error connecting to redis://:hunter2@db:6379/0 and mysql+pymysql://u:pw@h/x"
    )
    assert "hunter2" not in str(error) and ":pw@" not in str(error)
    assert redact("postgresql://user:pa:ss@host/db") == "postgresql://user:***@host/db"
    assert error.driver == "redis" and error.operation == "get"
