"""OpenAICompatibleProvider: the chat-completions HTTP API over the standard library only.

Serves OpenAI and every local server that speaks the same API. The API key is sent in the
``Authorization`` header and nowhere else: no error message, repr or log line contains it.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from clawmem.errors import ProviderError, redact
from clawmem.providers.base import ChatMessage, ProviderReply, ToolCall, ToolSpec, read_arguments, token_usage

log = logging.getLogger(__name__)

_BODY_EXCERPT_CHARS = 200
_WIRE_ROLES = ("system", "user", "assistant")


def wire_call(call: ToolCall) -> dict[str, Any]:
    """Return a tool call as a chat-completions ``tool_calls`` item (its arguments as JSON text)."""
    arguments = json.dumps(call.input, ensure_ascii=False)
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def wire_tool(spec: ToolSpec) -> dict[str, Any]:
    """Return a tool offered to the model as a chat-completions ``tools`` item."""
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description, "parameters": dict(spec.parameters)},
    }


def to_wire(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Return ``messages`` as chat-completions messages.

    Within a turn's tool rounds, an assistant message with ``tool_calls`` is sent as the call it
    was, and a ``tool`` message with a ``tool_call_id`` as its result. A stored ``tool`` row has
    no call id to answer, so it is sent as an assistant note that names the tool and its input,
    followed by its content. Raises ``ValueError`` for an unknown role.
    """
    wire: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = [wire_call(call) for call in message["tool_calls"]]
            wire.append({"role": "assistant", "content": content or None, "tool_calls": calls})
        elif role == "tool" and message.get("tool_call_id"):
            wire.append({"role": "tool", "tool_call_id": message["tool_call_id"], "content": content})
        elif role in _WIRE_ROLES:
            wire.append({"role": role, "content": content})
        elif role == "tool":
            call = json.dumps(message.get("tool_input") or {}, ensure_ascii=False, sort_keys=True)
            note = f"[tool {message.get('tool_name') or '?'} called with {call}]"
            wire.append({"role": "assistant", "content": f"{note}\n{content}" if content else note})
        else:
            raise ValueError(f"message {index} has role {role!r}; expected system, user, assistant or tool")
    return wire


def parse_reply(data: Any) -> ProviderReply:
    """Return the reply in a decoded chat-completions response; raises ``ValueError`` naming
    the missing or malformed field."""
    try:
        message = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("the response has no choices[0].message") from None
    if not isinstance(message, dict):
        raise ValueError("choices[0].message is not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError("choices[0].message.content is not a string")
    calls: list[ToolCall] = []
    for position, call in enumerate(message.get("tool_calls") or []):
        where = f"choices[0].message.tool_calls[{position}]"
        try:
            function = call["function"]
            name = function["name"]
            arguments = function.get("arguments") or "{}"
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{where} has no function name") from None
        if not isinstance(name, str):
            raise ValueError(f"{where} needs a string name")
        # A model's arguments that cannot be read are the model's mistake, not the reply's:
        # the call is kept with the reason, so the tool can tell the model.
        tool_input, problem = read_arguments(arguments)
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        calls.append(ToolCall(name, tool_input, call_id, problem))
    return ProviderReply(content or "", tuple(calls), token_usage(data.get("usage")))


class OpenAICompatibleProvider:
    """POSTs ``{base_url}/chat/completions`` with ``{"model", "messages"}`` (and ``"tools"`` when
    a turn offers any).

    :meth:`complete` raises :class:`clawmem.errors.ProviderError` on an HTTP error status, a
    timeout, a connection failure, or a body that is not a chat-completions reply.
    """

    name = "openai-compatible"

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {redact(str(base_url))!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty str")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self._url = f"{self.base_url}/chat/completions"
        self.model = model
        self.timeout = float(timeout)
        self._api_key = api_key or None

    @property
    def endpoint(self) -> str:
        """Return the URL requests go to, with any password in it masked."""
        return redact(self._url)

    def __repr__(self) -> str:
        key = "'***'" if self._api_key else "None"
        return (
            f"OpenAICompatibleProvider(base_url={redact(self.base_url)!r}, model={self.model!r}, "
            f"api_key={key}, timeout={self.timeout!r})"
        )

    def _scrub(self, text: str) -> str:
        # A server may echo request headers in an error body; the key must not travel on.
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return redact(text)

    def _fail(self, what: str) -> ProviderError:
        return ProviderError(self._scrub(f"provider {self.endpoint} (model {self.model}): {what}"))

    def _timed_out(self) -> ProviderError:
        return self._fail(f"no response within {self.timeout:g} s (timeout)")

    def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None
    ) -> ProviderReply:
        """Return the model's reply to ``messages``, offering it ``tools`` when given; raises
        :class:`ProviderError` on any failure."""
        request_body: dict[str, Any] = {"model": self.model, "messages": to_wire(messages)}
        if tools:
            request_body["tools"] = [wire_tool(spec) for spec in tools]
        body = json.dumps(request_body, ensure_ascii=False)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self._url, data=body.encode("utf-8"), headers=headers, method="POST")
        log.debug("POST %s model=%s messages=%d", self.endpoint, self.model, len(messages))
        raw = self._send(request)
        try:
            return parse_reply(json.loads(raw))
        except json.JSONDecodeError:
            raise self._fail(f"the response body is not JSON: {self._excerpt(raw)}") from None
        except ValueError as exc:
            raise self._fail(f"malformed reply: {exc}") from None

    def _send(self, request: urllib.request.Request) -> bytes:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                excerpt = self._excerpt(exc.read())
            raise self._fail(f"HTTP {exc.code} {exc.reason}: {excerpt}") from None
        except TimeoutError:
            raise self._timed_out() from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise self._timed_out() from None
            raise self._fail(f"connection failed: {exc.reason}") from None
        except OSError as exc:
            raise self._fail(f"connection failed: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _excerpt(raw: bytes) -> str:
        text = raw.decode("utf-8", "replace").strip()
        if not text:
            return "(empty body)"
        return text if len(text) <= _BODY_EXCERPT_CHARS else text[:_BODY_EXCERPT_CHARS] + "…"
