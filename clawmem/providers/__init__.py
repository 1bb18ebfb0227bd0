"""LLM providers: the protocol, an OpenAI-compatible HTTP client and a local echo for demos."""

from __future__ import annotations

from clawmem.errors import ProviderError
from clawmem.providers.base import (
    ChatMessage,
    Provider,
    ProviderReply,
    ToolCall,
    ToolCallingProvider,
    ToolSpec,
)
from clawmem.providers.echo import EchoProvider
from clawmem.providers.openai import OpenAICompatibleProvider

__all__ = [
    "EchoProvider",
    "ChatMessage",
    "OpenAICompatibleProvider",
    "Provider",
    "ProviderError",
    "ProviderReply",
    "ToolCall",
    "ToolCallingProvider",
    "ToolSpec",
]
