"""Memory that a turn's extraction writes (``CLAW_MEMORY_WRITES=extract``).

After a turn with a subject, the configured provider is called once more: it is sent the turn
(the user message as the model saw it, redacted where a guard redacted it, and the reply) and
the subject's nearest existing entries, and answers JSON, a list of facts ``{"key": ...,
"value": ...}`` to add or to replace by key. Nothing else is possible: no fact is deleted.

The answer is checked in full before anything is written. An answer that is not JSON, holds
anything but such facts, more than :data:`MAX_FACTS` of them, a value over the size limit or a
key that breaks the key rules writes nothing: one warning is logged, naming what was wrong and
never the text. A provider that fails or times out writes nothing either, and the turn keeps
its reply. Each fact passes the same PII guard as the ``remember`` tool (block refuses that
fact, redact stores it redacted, warn stores it and records what was found).

A replaced value keeps the values it replaced, with when each was written, in the entry's
metadata (``history``, the last :data:`HISTORY` of them, oldest first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clawmem.errors import ProviderError
from clawmem.prompt import GuardFinding
from clawmem.providers.base import Provider, ProviderReply, ToolCall
from clawmem.records import MemoryHit
from clawmem.turn.writes import REMEMBER, RememberCall, RememberTool

log = logging.getLogger(__name__)

EXTRACT = "extract"
MAX_FACTS = 20
# How many of the subject's nearest entries the extraction is shown, and how many replaced
# values an entry keeps.
NEAREST = 5
HISTORY = 5

INSTRUCTIONS = (
    "You keep a memory of durable facts about the user of a conversation. You are given the "
    "facts already known and one turn of the conversation. Answer with JSON only, no prose: "
    '{"facts": [{"key": "...", "value": "..."}]}, listing each fact the turn adds or changes. '
    "A key is a short name such as favourite_colour (at most 191 characters); reuse a known "
    "key to replace its fact; a value is the fact as text. Facts cannot be deleted. Answer "
    f'{{"facts": []}} when the turn holds nothing new. At most {MAX_FACTS} facts.'
)


class BadAnswer(ValueError):
    """An extraction answer that cannot be written; its message names what was wrong, never
    the text."""


@dataclass(frozen=True)
class Extraction:
    """One turn's extraction: what will be written, what was refused, and what it cost.

    ``namespace`` is the subject's, where the facts go; ``facts`` are the checked facts to
    write (a value redacted in ``redact`` mode); ``refused`` the facts the PII guard blocked;
    ``error`` why nothing was written (a bad answer or a failed call), else ``None``;
    ``usage`` the call's token usage when reported; ``findings`` what the guard found.
    """

    namespace: str
    facts: tuple[RememberCall, ...] = ()
    refused: tuple[RememberCall, ...] = ()
    error: str | None = None
    usage: Mapping[str, int] | None = None
    findings: tuple[GuardFinding, ...] = ()

    @property
    def record(self) -> dict[str, Any]:
        """Return what the turn's assistant row says of the extraction, its fields but the
        ``namespace`` only when they hold something: the call's ``usage``, the keys it
        ``wrote`` (in the ``namespace``), the keys ``refused`` and why, what the guard found
        (never the text), and the ``error`` for which nothing was written."""
        kept: dict[str, Any] = {
            "usage": dict(self.usage) if self.usage else None,
            "wrote": [fact.key for fact in self.facts],
            "refused": [{"key": fact.key, "error": fact.error} for fact in self.refused],
            "findings": [{"pattern": f.pattern, "source": f.source} for f in self.findings],
            "error": self.error,
        }
        return {"namespace": self.namespace, **{name: value for name, value in kept.items() if value}}


def request(user: str, reply: str, known: Sequence[MemoryHit]) -> list[dict[str, str]]:
    """Return the messages of the extraction call: the instructions, then the known facts and
    the turn as one JSON object."""
    shown = [
        {"key": hit.key, "value": hit.value if isinstance(hit.value, str) else json.dumps(hit.value)}
        for hit in known
    ]
    turn = {"known_facts": shown, "turn": {"user": user, "assistant": reply}}
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": json.dumps(turn, ensure_ascii=False)},
    ]


def _unfenced(text: str) -> str:
    """Return ``text`` without one Markdown code fence around it, as models often add."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and len(stripped) >= 6:
        inner = stripped[3:-3]
        first, _, rest = inner.partition("\n")
        return rest if first.strip().isalpha() or not first.strip() else inner
    return stripped


def parse(text: str) -> list[tuple[str, str]]:
    """Return the ``(key, value)`` pairs of an extraction answer: a JSON list of facts, or an
    object whose ``facts`` is one. Raises :class:`BadAnswer` for anything else (the key rules
    and the size limit are checked by :func:`check`)."""
    try:
        answer = json.loads(_unfenced(text))
    except (json.JSONDecodeError, RecursionError):
        raise BadAnswer("the answer is not JSON") from None
    if isinstance(answer, Mapping):
        if set(answer) != {"facts"}:
            raise BadAnswer("the answer is an object without exactly one field, facts")
        answer = answer["facts"]
    if not isinstance(answer, list):
        raise BadAnswer(f"the facts are a {type(answer).__name__}, not a list")
    if len(answer) > MAX_FACTS:
        raise BadAnswer(f"the answer holds {len(answer)} facts, more than {MAX_FACTS}")
    pairs = []
    for number, fact in enumerate(answer, 1):
        if not isinstance(fact, Mapping) or set(fact) != {"key", "value"}:
            raise BadAnswer(f"fact {number} is not an object of exactly key and value")
        key, value = fact["key"], fact["value"]
        if not isinstance(key, str):
            raise BadAnswer(f"fact {number} has a key that is a {type(key).__name__}, not text")
        if not isinstance(value, str):
            raise BadAnswer(f"fact {number} has a value that is a {type(value).__name__}, not text")
        pairs.append((key, value))
    return pairs


def check(
    pairs: Sequence[tuple[str, str]], tool: RememberTool
) -> tuple[list[RememberCall], list[RememberCall]]:
    """Return the facts to write and those the PII guard blocked, each checked as a
    ``remember`` call would be (key rules, size limit, guard). Raises :class:`BadAnswer` when
    any fact breaks a rule other than the guard's: then nothing is written."""
    kept: dict[str, RememberCall] = {}
    refused: list[RememberCall] = []
    for number, (key, value) in enumerate(pairs, 1):
        done = tool.check(ToolCall(REMEMBER, {"key": key, "value": value}), f"{EXTRACT}-{number}")
        if done.stores:
            kept[key] = done  # a key named twice: the later fact stands
        elif done.findings:
            refused.append(done)
        else:
            raise BadAnswer(f"fact {number} breaks a rule: {_rule(done.error)}")
    return list(kept.values()), refused


def _rule(error: str | None) -> str:
    """Return which rule a refused fact broke, without the key or value it held."""
    reason = error or ""
    if reason.startswith("bad key"):
        return "the key rules"
    if "over the limit" in reason:
        return "the value size limit"
    if "blank" in reason:
        return "a blank value"
    if "privacy switch" in reason:
        return "the privacy switch"
    return "the value is not storable text"


def extract(
    provider: Provider, user: str, reply: str, known: Sequence[MemoryHit], tool: RememberTool
) -> Extraction:
    """Make the one extraction call of a turn and return its checked facts; never raises for
    what the provider did or answered (a failure is logged as one warning and writes nothing)."""
    try:
        answer: ProviderReply = provider.complete(request(user, reply, known))
    except ProviderError as exc:
        reason = "the provider timed out" if "timeout" in str(exc) else "the provider call failed"
        log.warning("memory extraction wrote nothing: %s", reason)
        return Extraction(tool.namespace, error=reason)
    except Exception as exc:  # the extraction's boundary: a provider is the caller's code
        reason = f"the provider call failed ({type(exc).__name__})"
        log.warning("memory extraction wrote nothing: %s", reason)
        return Extraction(tool.namespace, error=reason)
    usage = dict(answer.usage) if answer.usage else None
    try:
        facts, refused = check(parse(answer.text), tool)
    except BadAnswer as exc:
        log.warning("memory extraction wrote nothing: %s", exc)
        return Extraction(tool.namespace, error=str(exc), usage=usage)
    findings = tuple(f for done in [*facts, *refused] for f in done.findings)
    return Extraction(tool.namespace, tuple(facts), tuple(refused), None, usage, findings)


def history(previous: Any, at: datetime | None, metadata: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Return the ``history`` an entry keeps once its value ``previous`` (written ``at``) is
    replaced: what its metadata held before, then it, the last :data:`HISTORY` of them."""
    earlier = metadata if isinstance(metadata, Mapping) else {}
    kept = [item for item in earlier.get("history") or [] if isinstance(item, Mapping)]
    written = earlier.get("written_at")
    if written is None and at is not None:
        stamp = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        written = stamp.isoformat()
    kept.append({"value": previous, "written_at": written})
    return [dict(item) for item in kept[-HISTORY:]]
