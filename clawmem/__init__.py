"""clawmem: agent memory for Python.

Key/value facts with TTL in namespaces, conversations in SQL tables, per-turn recall,
history compaction, and the events that make all of it observable. Names are imported
lazily, so ``import clawmem`` stays cheap and never pulls in an optional backend.
"""

from __future__ import annotations

import importlib
from typing import Any

from clawmem import events
from clawmem.errors import ConfigError, InvalidKey, InvalidNamespace, StorageError, ValueTooLarge
from clawmem.events import run_context

__version__ = "0.1.0"  # the package's version: pyproject.toml reads it from here

_LAZY = {
    "ArrayMemory": "clawmem.memory.array",
    "AugmentResult": "clawmem.recall",
    "BaseMemory": "clawmem.memory.base",
    "Claw": "clawmem.turn.pipeline",
    "CompactionResult": "clawmem.turn.compaction",
    "Conversation": "clawmem.turn.conversations",
    "ConversationLog": "clawmem.turn.conversations",
    "EchoProvider": "clawmem.providers",
    "EntryDecision": "clawmem.recall",
    "ExtractiveSummarizer": "clawmem.turn.compaction",
    "FakeClock": "clawmem.clock",
    "FileMemory": "clawmem.memory.file",
    "GuardBlocked": "clawmem.errors",
    "GuardFinding": "clawmem.turn.guards",
    "HistoryCompactor": "clawmem.turn.compaction",
    "MemoryHit": "clawmem.records",
    "MemoryInterface": "clawmem.memory.base",
    "MemoryRegistry": "clawmem.memory.registry",
    "Message": "clawmem.turn.conversations",
    "MessageAugmenter": "clawmem.recall",
    "OpenAICompatibleProvider": "clawmem.providers",
    "PiiGuard": "clawmem.turn.guards",
    "PrivacyAwareMemory": "clawmem.memory.wrappers",
    "ProviderError": "clawmem.errors",
    "ProviderSummarizer": "clawmem.turn.compaction",
    "RedisMemory": "clawmem.memory.redis",
    "Reply": "clawmem.turn.pipeline",
    "RouterMemory": "clawmem.memory.wrappers",
    "SearchableMemory": "clawmem.memory.base",
    "Settings": "clawmem.settings",
    "Site": "clawmem.sites.site",
    "Skill": "clawmem.turn.skills",
    "Subject": "clawmem.privacy.subjects",
    "SkillRegistry": "clawmem.turn.skills",
    "SqlMemory": "clawmem.memory.sql",
    "new_id": "clawmem.ids",
    "subject_namespace": "clawmem.rules",
    "open_memory": "clawmem.memory.registry",
}

# Modules offered as names of the package (``from clawmem import operations``).
_MODULES = {"operations": "clawmem.sites.operations"}

__all__ = [
    "ConfigError",
    "InvalidKey",
    "InvalidNamespace",
    "StorageError",
    "ValueTooLarge",
    "events",
    "run_context",
    *sorted(_LAZY),
    *sorted(_MODULES),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None and name in _MODULES:
        value: Any = importlib.import_module(_MODULES[name])
    elif module is None:
        raise AttributeError(f"module 'clawmem' has no attribute {name!r}")
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
