"""EchoProvider: a deterministic stand-in for demos and tests; it never touches the network."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from clawmem.providers.base import ChatMessage, ProviderReply, ToolCall, ToolSpec


class EchoProvider:
    """Replies ``"echo: <last user message>"``; counts calls and keeps what each call was sent.

    ``tool_calls`` are returned with every reply, so tests can exercise tool rows.
    """

    name = "echo"

    def __init__(self, model: str = "echo", tool_calls: Iterable[ToolCall] = ()) -> None:
        self.model = model
        self.tool_calls = tuple(tool_calls)
        self.calls = 0
        self.requests: list[list[dict[str, Any]]] = []

    def __repr__(self) -> str:
        return f"EchoProvider(model={self.model!r}, calls={self.calls})"

    def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None
    ) -> ProviderReply:
        """Return the echo of the last ``user`` message (empty text when there is none); the
        ``tools`` offered are not used."""
        self.calls += 1
        sent = [dict(message) for message in messages]
        self.requests.append(sent)
        last_user = next((m.get("content") or "" for m in reversed(sent) if m.get("role") == "user"), "")
        return ProviderReply(f"echo: {last_user}", self.tool_calls, {"messages": len(sent)})
