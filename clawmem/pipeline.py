"""The turn pipeline: one user message in, one reply out, every step inside one run context.

Order: load the conversation, augment the message with memory and skills, run the guards on
the augmented text, compact (stored history + augmented message), call the provider, then
save the stored history + the ORIGINAL user message + the reply (+ tool rows).

What is saved is the un-compacted history plus the new messages: compaction only shapes what
is sent to the provider, so a summary never replaces stored messages. The augmented text is
never saved either; recall happens afresh each turn. Nothing is saved when a guard blocks or
the provider fails.

``conversation.saved`` fires once per saved turn: from the conversations store when it emits
the event itself (SqlConversationMemory does), otherwise from the pipeline. A write held back
by the privacy switch saved nothing and is announced only as ``memory.write`` with ``gated``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from clawmem import events
from clawmem.clock import Clock, utc_datetime
from clawmem.compaction import CompactionResult, ExtractiveSummarizer, HistoryCompactor
from clawmem.guards import Guard, GuardFinding, PiiGuard
from clawmem.ids import new_id
from clawmem.memory.conversations import validate_conversation_id
from clawmem.memory.registry import open_memory
from clawmem.memory.wrappers import serving_driver
from clawmem.providers.base import Provider, ToolCall
from clawmem.recall import AugmentResult, MessageAugmenter, driver_name
from clawmem.settings import Settings
from clawmem.words import clip

CONVERSATIONS = "conversations"
TITLE_CHARS = 80


@dataclass(frozen=True)
class Reply:
    """The outcome of one turn: the reply text, where it was saved, and how the prompt was built.

    ``augment.findings`` holds what non-blocking guards found.
    """

    text: str
    conversation_id: str
    run_id: str
    augment: AugmentResult
    compaction: CompactionResult
    tool_calls: tuple[ToolCall, ...] = ()


def title_from(message: str) -> str | None:
    """Return a conversation title: the message's first non-blank line, at most 80 characters."""
    line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    if not line:
        return None
    return clip(line, TITLE_CHARS)


def tool_rows(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """Return the stored ``tool`` messages for the provider's tool calls.

    clawmem records the calls; running the tools is the host's job, so the content is empty.
    """
    return [
        {"role": "tool", "content": "", "tool_name": call.name, "tool_input": call.input} for call in calls
    ]


class Claw:
    """Runs turns against a memory and a provider.

    ``augmenter`` defaults to recall from namespace ``default`` with top 3, ``compactor`` to
    one whose thresholds are off, and ``guards`` to ``[PiiGuard()]`` (pass ``[]`` for none).
    """

    def __init__(
        self,
        memory: Any,
        provider: Provider,
        augmenter: MessageAugmenter | None = None,
        compactor: HistoryCompactor | None = None,
        guards: Iterable[Guard] | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.memory = memory
        self.provider = provider
        self.augmenter = augmenter if augmenter is not None else MessageAugmenter(memory)
        self.compactor = compactor if compactor is not None else HistoryCompactor(ExtractiveSummarizer())
        self.guards: list[Guard] = [PiiGuard()] if guards is None else list(guards)
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: Settings, provider: Provider, clock: Clock = time.time) -> Claw:
        """Return a Claw on :func:`clawmem.open_memory` with recall and compaction as configured.

        Compaction summarises locally (:class:`ExtractiveSummarizer`), so no content leaves the host.
        """
        memory = open_memory(settings, clock)
        augmenter = MessageAugmenter(memory, settings.recall_top_k, settings.recall_namespace)
        compactor = HistoryCompactor(
            ExtractiveSummarizer(), settings.compact_max_messages, settings.compact_max_tokens
        )
        return cls(memory, provider, augmenter, compactor, clock=clock)

    def send(self, message: str, conversation_id: str | None = None, user_id: str = "") -> Reply:
        """Run one turn and return the reply.

        Raises :class:`clawmem.errors.GuardBlocked` when a blocking guard objects and
        :class:`clawmem.errors.ProviderError` when the provider fails; nothing is saved then.
        An unknown ``conversation_id`` starts a new conversation under that id.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        if conversation_id is not None:
            validate_conversation_id(conversation_id)  # before the provider is paid for a turn
        run_id = new_id()
        with events.run_context(run_id):
            conversation_id = conversation_id or new_id()
            payload = self._load(conversation_id, user_id, message)
            history: list[dict[str, Any]] = list(payload["history"])
            augment = self.augmenter.augment(message)
            findings: list[GuardFinding] = []
            for guard in self.guards:
                findings.extend(guard.check(augment))
            augment = dataclasses.replace(augment, findings=tuple(findings))
            compaction = self.compactor.apply([*history, {"role": "user", "content": augment.text}])
            answer = self.provider.complete(list(compaction.history))
            added = [
                {"role": "user", "content": message},
                {"role": "assistant", "content": answer.text},
                *tool_rows(answer.tool_calls),
            ]
            self._save(conversation_id, {**payload, "history": history + added}, len(added))
        return Reply(answer.text, conversation_id, run_id, augment, compaction, answer.tool_calls)

    def _save(self, conversation_id: str, payload: dict[str, Any], added: int) -> None:
        # conversation.saved fires once per saved turn: from the store when it announces its
        # own saves (the SQL one does), else from here; a write held back by a privacy switch
        # saved nothing, so nothing is announced.
        self.memory.set(conversation_id, payload, CONVERSATIONS)
        driver, written = serving_driver(self.memory, CONVERSATIONS)
        if written and not getattr(driver, "announces_saves", False):
            events.emit(
                "conversation.saved",
                driver=driver_name(self.memory, CONVERSATIONS),
                namespace=CONVERSATIONS,
                key=conversation_id,
                messages=len(payload["history"]),
                inserted=added,
            )

    def _load(self, conversation_id: str, user_id: str, message: str) -> dict[str, Any]:
        stored = self.memory.get(conversation_id, CONVERSATIONS)
        if stored is None:
            return {
                "title": title_from(message),
                "user_id": user_id,
                "metadata": {},
                "created_at": utc_datetime(self.clock).replace(tzinfo=UTC).isoformat(),
                "history": [],
            }
        if not isinstance(stored, dict) or not isinstance(stored.get("history"), list):
            raise ValueError(
                f"conversation {conversation_id} is not a conversation payload (a dict with a history list)"
            )
        return {**stored, "user_id": stored.get("user_id") or user_id}
