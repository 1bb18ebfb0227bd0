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
from clawmem.privacy.subjects import mention_pattern, mentions
from clawmem.rules import subject_of_namespace
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
        "from clawmem.errors import ConfigError\n"
        "from clawmem.memory.registry import registry\n"
        "try:\n    registry.build('redis')\nexcept ConfigError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'clawmem[redis]'" in result.stdout


def test_open_memory_is_the_configured_driver_behind_the_switch(tmp_path: Any) -> None:
    settings = Settings(instance_path=str(tmp_path), memory_driver="array", store_messages=False)
    memory = open_memory(settings)
    assert isinstance(memory, clawmem.PrivacyAwareMemory)
    assert memory.store_messages is False
    assert isinstance(memory.inner, clawmem.ArrayMemory)
    memory.set("k", "v")
    assert memory.get("k") is None


@pytest.mark.parametrize(
    ("user_id", "namespace"),
    [
        ("cust-42", "user:cust-42"),
        ("cust_42", "user:cust_42"),
        ("Cust-42", "user:Cust-42"),
        ("jane@example.com", "user:.amFuZUBleGFtcGxlLmNvbQ"),
        ("42", "user:42"),
        ("é", "user:.w6k"),
    ],
)
def test_subject_namespaces_use_plain_ids_as_they_are_and_encode_the_rest(
    user_id: str, namespace: str
) -> None:
    assert clawmem.subject_namespace(user_id) == namespace
    assert subject_of_namespace(namespace) == user_id


def test_subject_namespaces_are_injective_and_always_valid() -> None:
    ids = [
        "a",
        "A",
        "a.b",
        "a:b",
        "a_b",
        "a-b",
        ".YQ",
        "x" * 95,
        "x" * 96,
        "é" * 180,
        "é" * 179 + "e",
        " ",
        "\x00",
    ]
    namespaces = [clawmem.subject_namespace(user_id) for user_id in ids]
    assert len(set(namespaces)) == len(ids)
    assert all(len(namespace) <= 100 and ".." not in namespace for namespace in namespaces)
    # Too long for base64 too: a hash, which cannot be read back but never collides in practice.
    assert subject_of_namespace(clawmem.subject_namespace("é" * 180)) is None


def test_subject_template_is_checked_and_followed() -> None:
    assert clawmem.subject_namespace("cust-42", "tenant-a.people.{user_id}") == "tenant-a.people.cust-42"
    for template in ("user", "{user_id}{user_id}", "bad space {user_id}", "x..{user_id}"):
        with pytest.raises(ConfigError, match="CLAW_SUBJECT_NAMESPACE"):
            clawmem.subject_namespace("cust-42", template)
    with pytest.raises(ConfigError, match="CLAW_SUBJECT_NAMESPACE"):
        Settings.from_env({"CLAW_SUBJECT_NAMESPACE": "people"})
    with pytest.raises(ValueError, match="non-empty"):
        clawmem.subject_namespace("")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("ticket for cust-42", True),
        ("cust-42's order", True),
        ('{"customer":"cust-42"}', True),
        ("cust-420", False),
        ("xcust-42", False),
        ("cust-42b", False),
        ("cust-42_", True),
        ("acust-42é", False),
    ],
)
def test_a_mention_is_the_id_as_a_whole_token(text: str, found: bool) -> None:
    assert mentions(mention_pattern("cust-42"), "key", text) is found


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
