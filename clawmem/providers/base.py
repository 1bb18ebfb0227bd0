"""What every provider speaks: a list of chat messages in, one reply out."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from clawmem.errors import ProviderError

# A chat message as providers are sent it and compaction reads it: "role", "content", and on
# tool rows "tool_name" and "tool_input". What ConversationLog.append takes is clawmem.Message.
ChatMessage = Mapping[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asked to run: its name, its JSON input and the provider's call id.

    ``arguments_error`` says why the model's arguments could not be read (not JSON, not an
    object); ``input`` is then empty, and the tool answers the model with the error.
    """

    name: str
    input: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    arguments_error: str | None = None


def read_arguments(arguments: Any) -> tuple[dict[str, Any], str | None]:
    """Return a tool call's arguments as a JSON object and ``None``, or ``{}`` and why they
    cannot be read (not JSON, not an object), as :attr:`ToolCall.arguments_error` says it.
    ``arguments`` is the model's JSON text, or an object already decoded."""
    if arguments is None or arguments == "":
        arguments = "{}"
    try:
        decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return {}, "the arguments are not valid JSON"
    if not isinstance(decoded, dict):
        return {}, "the arguments are not a JSON object"
    return decoded, None


@dataclass(frozen=True)
class ToolSpec:
    """A tool a turn offers the model: its name, what it does, and its arguments as a JSON
    Schema object."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ProviderReply:
    """The model's answer: text (may be empty when it only calls tools), tool calls and usage."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Mapping[str, int] | None = None


def token_usage(usage: Any) -> dict[str, int] | None:
    """Return the whole-number counts of a provider's usage block (``prompt_tokens``,
    ``completion_tokens``, ``total_tokens``...), or ``None`` when it reports none."""
    if not isinstance(usage, Mapping):
        return None
    counts = {
        str(name): value
        for name, value in usage.items()
        if isinstance(value, int) and not isinstance(value, bool)
    }
    return counts or None


def summed_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int] | None:
    """Return the usage of several provider calls added up field by field (whole counts only),
    or ``None`` when none of them reported any."""
    total: dict[str, int] = {}
    for usage in usages:
        for name, value in (usage or {}).items():
            if type(value) is int and value >= 0:
                total[name] = total.get(name, 0) + value
    return total or None


@runtime_checkable
class Provider(Protocol):
    """An LLM endpoint. ``complete`` returns the reply or raises :class:`ProviderError`."""

    name: str
    model: str

    def complete(self, messages: Sequence[ChatMessage]) -> ProviderReply: ...


@runtime_checkable
class ToolCallingProvider(Provider, Protocol):
    """A provider that can offer the model tools: ``complete(messages, tools=...)``.

    Within a turn's tool rounds, ``messages`` also hold the assistant's request (``role``
    ``assistant`` with ``tool_calls``, a tuple of :class:`ToolCall`) and each result (``role``
    ``tool`` with ``tool_call_id``, ``tool_name`` and the result as ``content``).
    """

    def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None
    ) -> ProviderReply: ...


def takes_tools(provider: Provider) -> bool:
    """Return whether ``provider.complete`` accepts a ``tools`` argument."""
    try:
        parameters = inspect.signature(provider.complete).parameters
    except (TypeError, ValueError):
        return False
    return "tools" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


__all__ = [
    "ChatMessage",
    "Provider",
    "ProviderError",
    "ProviderReply",
    "ToolCall",
    "ToolCallingProvider",
    "ToolSpec",
    "read_arguments",
    "summed_usage",
    "takes_tools",
    "token_usage",
]
