"""Memory that the conversation writes: the ``remember`` tool a turn offers the model
(``CLAW_MEMORY_WRITES=tool``), and the attribution every such entry carries.

A call is checked in full before the model is told anything: the key rules, a string value
within the size limit, the privacy switch and the PII guard. The model then learns in the tool
result whether the fact will be stored; nothing is written until the turn has its reply and is
saved, so a turn that fails stores no fact either. No tool here deletes or expires anything:
deletion stays in the CLI.

The framework adapters offer the same tool and run the same checks: an Agents SDK session's
``memory_tools()`` (:mod:`clawmem.integrations.openai_agents`) and a LangGraph ``ClawStore``'s
``memory_tools()`` (:mod:`clawmem.integrations.langgraph`). Their runs have
no saved reply to wait for, so :func:`remember_now` writes a call's fact as soon as it is checked.

Attribution is the entry's metadata (on drivers that keep metadata: the sql driver on
clawmem's tables): where the fact came from (``origin`` ``tool``, ``mcp`` for the MCP
server's ``remember``, ``agents`` or ``langgraph`` for the adapters' tool, or ``extract`` for a
turn's extraction, see :mod:`clawmem.turn.extraction`), the conversation and message that wrote it,
the run, and when.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clawmem.clock import Clock
from clawmem.errors import InvalidKey, ValueTooLarge
from clawmem.memory.base import MemoryInterface
from clawmem.memory.wrappers import set_any
from clawmem.prompt import GuardFinding
from clawmem.providers.base import (
    ChatMessage,
    Provider,
    ProviderReply,
    ToolCall,
    ToolSpec,
    read_arguments,
    summed_usage,
)
from clawmem.recall.sources import serving_driver
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, encode_value, validate_key
from clawmem.turn.guards import Guard, PiiGuard

REMEMBER = "remember"
# Rounds of tool calls one turn may run before its reply: each round is one more provider call.
MAX_TOOL_ROUNDS = 3
ORIGINS = ("tool", "mcp", "agents", "langgraph", "extract")

REMEMBER_TOOL = ToolSpec(
    name=REMEMBER,
    description=(
        "Store one fact about the user you are talking to, for later conversations: a short key "
        "naming it (such as favourite_colour) and the fact as text. Storing a key again replaces "
        "its fact. Nothing can be deleted with this tool."
    ),
    parameters={
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "what the fact is about, at most 191 characters"},
            "value": {"type": "string", "description": "the fact itself, as text"},
        },
        "required": ["key", "value"],
        "additionalProperties": False,
    },
)


def attribution(
    origin: str,
    clock: Clock,
    *,
    conversation_id: str | None = None,
    message_id: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Return the metadata that says where a written entry came from: its ``origin`` (one of
    :data:`ORIGINS`), the conversation and message that wrote it (``None`` when there was none), the
    run, and ``written_at`` (ISO 8601, UTC, from ``clock``). Raises ``ValueError`` for an
    unknown origin."""
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {', '.join(ORIGINS)}, got {origin!r}")
    return {
        "origin": origin,
        "conversation_id": conversation_id,
        "message_id": message_id,
        "run_id": run_id,
        "written_at": datetime.fromtimestamp(clock(), UTC).isoformat(),
    }


@dataclass(frozen=True)
class RememberCall:
    """One ``remember`` call checked: what the model asked, what will be stored, and what it is told.

    ``value`` is what will be stored (redacted in ``redact`` mode), ``None`` when the call was
    refused (``error`` then says why); ``result`` is the tool result sent back to the model;
    ``findings`` what the PII guard found in the value (stored anyway in ``warn`` mode).
    """

    call: ToolCall
    call_id: str
    namespace: str
    key: str | None
    value: str | None
    result: str
    error: str | None = None
    findings: tuple[GuardFinding, ...] = ()
    gated: bool = False  # refused by the privacy switch alone: the write is still counted as gated

    @property
    def stores(self) -> bool:
        """Return whether this call's fact is written when the turn is saved."""
        return self.error is None

    @property
    def tool_input(self) -> dict[str, Any]:
        """Return the call as its stored tool row keeps it: the key, and the value only as it
        is stored (a refused value is not kept, so a blocked one never reaches the log)."""
        kept: dict[str, Any] = {}
        if self.key is not None:
            kept["key"] = self.key
        if self.value is not None:
            kept["value"] = self.value
        return kept

    @property
    def record(self) -> dict[str, Any]:
        """Return what the tool row's metadata says of the call: its id, where it wrote (or
        ``None``), why it was refused, and the guard's findings (never the matched text)."""
        return {
            "call_id": self.call_id,
            "wrote": {"namespace": self.namespace, "key": self.key} if self.stores else None,
            "error": self.error,
            "findings": [{"pattern": f.pattern, "source": f.source} for f in self.findings],
        }


def _result(**fields: Any) -> str:
    return json.dumps(fields, ensure_ascii=False)


class RememberTool:
    """Checks the model's ``remember`` calls for one turn, whose subject's facts live in
    ``namespace``.

    ``reaches_storage`` is false when the privacy switch holds writes back; ``guard`` is the
    turn's PII guard (``None``: no scan), whose allowed keys store as they are.
    """

    spec = REMEMBER_TOOL

    def __init__(
        self,
        namespace: str,
        reaches_storage: bool = True,
        guard: PiiGuard | None = None,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.namespace = namespace
        self.reaches_storage = reaches_storage
        self.guard = guard
        self.max_value_bytes = max_value_bytes

    @classmethod
    def over(
        cls,
        memory: MemoryInterface,
        namespace: str,
        guards: Iterable[Guard],
        max_value_bytes: int | None = None,
    ) -> RememberTool:
        """Return the tool that writes into ``namespace`` of ``memory``: held back where the
        privacy switch holds that namespace's writes back, scanned by the first
        :class:`~clawmem.turn.guards.PiiGuard` of ``guards``, values up to ``max_value_bytes``
        (the serving driver's limit when ``None``)."""
        driver, reaches = serving_driver(memory, namespace)
        guard = next((guard for guard in guards if isinstance(guard, PiiGuard)), None)
        if max_value_bytes is None:
            max_value_bytes = getattr(driver, "max_value_bytes", DEFAULT_MAX_VALUE_BYTES)
        return cls(namespace, reaches, guard, max_value_bytes)

    def check(self, call: ToolCall, call_id: str) -> RememberCall:
        """Return the outcome of ``call``: to be stored, or refused with the reason the model is
        told. Never raises for what the model sent."""
        arguments = call.input if isinstance(call.input, Mapping) else {}
        raw_key = arguments.get("key")
        key = raw_key if isinstance(raw_key, str) else None

        def refuse(reason: str, findings: tuple[GuardFinding, ...] = (), gated: bool = False) -> RememberCall:
            text = _result(stored=False, error=f"{reason}; nothing was written")
            safe_key = key if key is not None and _valid_key(key) else None
            return RememberCall(call, call_id, self.namespace, safe_key, None, text, reason, findings, gated)

        if call.arguments_error is not None:
            return refuse(f"bad arguments: {call.arguments_error}")
        unexpected = sorted(set(arguments) - {"key", "value"})
        if unexpected:
            return refuse(f"remember takes only key and value, not {', '.join(map(repr, unexpected))}")
        if "key" not in arguments:
            return refuse("remember needs a key: a short name for the fact")
        try:
            validate_key(raw_key)
        except InvalidKey as exc:
            return refuse(f"bad key: {exc}")
        if "value" not in arguments:
            return refuse("remember needs a value: the fact, as text")
        value = arguments["value"]
        if not isinstance(value, str):
            return refuse(f"value must be text (a string), got {type(value).__name__}")
        if not value.strip():
            return refuse("value must not be blank")
        try:
            encode_value(key or "", value, self.max_value_bytes)
        except ValueTooLarge as exc:
            return refuse(str(exc))
        except ValueError as exc:  # a lone surrogate: not text that can be stored
            return refuse(f"value is not storable text: {exc}")
        if not self.reaches_storage:
            return refuse("not stored: storing is switched off on this site (the privacy switch)", gated=True)
        findings: tuple[GuardFinding, ...] = ()
        stored = value
        guard = self.guard
        if guard is not None and guard.mode != "off" and key not in guard.allow_keys:
            source = f"remember value of key {key}"
            findings = tuple(GuardFinding(f.pattern, source) for f in guard.find(value))
            if findings and guard.mode == "block":
                patterns = ", ".join(dict.fromkeys(f.pattern for f in findings))
                return refuse(
                    f"not stored: the value holds personal data ({patterns}), which is refused", findings
                )
            if findings and guard.mode == "redact":
                stored = guard.redact_text(value)
        assert key is not None  # validate_key passed
        told: dict[str, Any] = {"stored": True, "key": key}
        if stored != value:
            told["note"] = "personal data in the value was replaced by labels such as [email]"
        return RememberCall(call, call_id, self.namespace, key, stored, _result(**told), None, findings)


def _valid_key(key: str) -> bool:
    try:
        validate_key(key)
    except InvalidKey:
        return False
    return True


def store(memory: MemoryInterface, done: RememberCall, origin: Mapping[str, Any]) -> None:
    """Write one checked call's fact into its namespace of ``memory`` with the attribution
    ``origin``; a refused call writes nothing. A call refused by the privacy switch alone is
    still handed to the memory without attribution, so the switch counts it as held back
    (SPEC 4.6) and writes nothing."""
    if done.gated:
        set_any(memory, done.key or "", done.call.input["value"], done.namespace, None, None)
    if done.stores:
        set_any(memory, done.key or "", done.value, done.namespace, None, origin)


def remember_now(
    memory: MemoryInterface, tool: RememberTool, arguments: Any, call_id: str, origin: Mapping[str, Any]
) -> RememberCall:
    """Check one ``remember`` call whose ``arguments`` are the model's JSON text (or an object
    already decoded) and write its fact at once (:func:`store`); return the outcome, whose
    ``result`` is what the model is told. Bad arguments write nothing and never raise."""
    decoded, problem = read_arguments(arguments)
    done = tool.check(ToolCall(REMEMBER, decoded, call_id, problem), call_id)
    store(memory, done, origin)
    return done


# What a remember call past the turn's bound of tool rounds is told (it is never run).
BOUND = f"not stored: a turn runs at most {MAX_TOOL_ROUNDS} rounds of tool calls"
BOUND_RESULT = _result(stored=False, error=f"{BOUND}; nothing was written")


def converse(
    provider: Provider, history: Sequence[ChatMessage], tool: RememberTool | None
) -> tuple[ProviderReply, list[RememberCall], int]:
    """Call the provider on ``history`` and return its final reply, the ``remember`` calls
    it made (each checked, none written yet) and how many calls it took.

    With a ``tool``, a reply whose calls are all ``remember`` is answered with their results
    and the provider is called again, at most :data:`MAX_TOOL_ROUNDS` times. Calls of other
    tools are the host's: they end the rounds, and the ``remember`` calls beside them are
    checked without another call. The final reply's ``usage`` is every call's, summed.
    """
    if tool is None:
        return provider.complete(list(history)), [], 1
    sent = list(history)
    remembered: list[RememberCall] = []
    usages: list[Mapping[str, Any] | None] = []
    rounds = 0
    while True:
        answer = provider.complete(sent, tools=[tool.spec])  # type: ignore[call-arg]
        usages.append(answer.usage)
        asked = [call for call in answer.tool_calls if call.name == REMEMBER]
        if not asked:
            break
        done = [tool.check(call, call.id or f"{REMEMBER}-{rounds}-{n}") for n, call in enumerate(asked)]
        if rounds == MAX_TOOL_ROUNDS:
            # One round more than a turn may run: the calls are refused, and nothing is written.
            done = [
                dataclasses.replace(item, error=BOUND, result=BOUND_RESULT, value=None, gated=False)
                for item in done
            ]
        remembered.extend(done)
        if rounds == MAX_TOOL_ROUNDS or len(asked) < len(answer.tool_calls):
            break
        rounds += 1
        request = [dataclasses.replace(call, id=item.call_id) for call, item in zip(asked, done, strict=True)]
        sent.append({"role": "assistant", "content": answer.text, "tool_calls": tuple(request)})
        sent.extend(
            {"role": "tool", "tool_call_id": item.call_id, "tool_name": REMEMBER, "content": item.result}
            for item in done
        )
    others = tuple(call for call in answer.tool_calls if call.name != REMEMBER)
    final = ProviderReply(answer.text, others, summed_usage(usages))
    return final, remembered, len(usages)
