"""The turn pipeline: one user message in, one reply out, every step inside one run context.

1. Load the conversation from the log (its newest checkpoint and what follows).
2. Augment the message from the recall namespace and the subject's own namespace.
3. Run the guards on the augmented text (a redacting guard redacts the earlier messages too).
4. Compact the history plus the augmented message.
5. Call the provider. With ``memory_writes="tool"`` and a subject, it is offered ``remember``:
   each round of its calls is checked and answered, and it is called again for its reply
   (:func:`clawmem.turn.writes.converse`; every call's tokens count for the turn). With
   ``memory_writes="extract"`` and a subject, one extraction call follows the reply
   (:mod:`clawmem.turn.extraction`); its tokens count for the turn apart, as memory writing.
6. Append the turn's ``recall`` record (which entries it was given), the ORIGINAL user message,
   the reply, any tool rows and, when compaction fired, its summary as a checkpoint, in one
   :meth:`ConversationLog.append`, which the privacy switch gates.

Stored messages are never rewritten: a checkpoint is a new ``summary`` row that the next turn
loads in place of the messages it covers. The augmented text is never stored (recall happens
afresh each turn). Nothing is stored when a guard blocks or the provider fails. The facts the
model asked to remember are written after the append, each attributed to its ``tool`` row;
the facts an extraction found, each attributed to the turn's ``assistant`` row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clawmem import events
from clawmem.clock import Clock
from clawmem.encryption.ciphers import cipher_for
from clawmem.encryption.state import check_keys
from clawmem.errors import ConfigError
from clawmem.ids import new_id
from clawmem.memory.registry import open_memory
from clawmem.memory.vector_writes import embed_writes
from clawmem.memory.wrappers import search_any, set_any
from clawmem.providers.base import Provider, ToolCall, takes_tools
from clawmem.recall import AugmentResult, MessageAugmenter
from clawmem.recall.sources import Readable, serving_driver
from clawmem.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_SUBJECT_NAMESPACE,
    subject_namespace,
    validate_template,
)
from clawmem.settings import ENV_PREFIX, PHPCLAW_SCHEMA, Settings, check_memory_writes
from clawmem.text import clip
from clawmem.turn.compaction import SUMMARY_PREFIX, CompactionResult, ExtractiveSummarizer, HistoryCompactor
from clawmem.turn.conversations import ConversationLog, Message, StoredMessage
from clawmem.turn.extraction import NEAREST, Extraction, extract, history
from clawmem.turn.guards import Guard, PiiGuard, RedactingGuard
from clawmem.turn.messages import validate_conversation_id, wordpress_user_id
from clawmem.turn.writes import REMEMBER, RememberCall, RememberTool, attribution, converse, store

TITLE_CHARS = 80


@dataclass(frozen=True)
class Reply:
    """The outcome of one turn: the reply text, where it was saved, and how the prompt was built.

    ``augment`` is what was sent (redacted when a guard redacted it) and its ``findings`` what
    non-blocking guards found; ``usage`` is the provider's token usage for the turn's calls
    (summed over its tool rounds), when it reports one (the compaction's own call is in
    ``compaction.usage``). ``tool_calls`` are the calls left for the host to run; ``remembered``
    the model's ``remember`` calls, each stored or refused, and ``provider_calls`` how many
    calls the turn made for its reply. ``extraction`` is the turn's extraction call
    (``memory_writes="extract"``), ``None`` when none was made.
    """

    text: str
    conversation_id: str
    run_id: str
    augment: AugmentResult
    compaction: CompactionResult
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Mapping[str, int] | None = None
    remembered: tuple[RememberCall, ...] = ()
    provider_calls: int = 1
    extraction: Extraction | None = None


def title_from(message: str) -> str | None:
    """Return a conversation title: the message's first non-blank line, at most 80 characters."""
    line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    if not line:
        return None
    return clip(line, TITLE_CHARS)


def billed_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """Return the tokens a provider call was billed: its ``total_tokens``, else prompt plus
    completion; ``None`` when it reported neither ("not reported", never 0)."""
    if not usage:
        return None
    counted = {name: value for name, value in usage.items() if type(value) is int and value >= 0}
    if "total_tokens" in counted:
        return counted["total_tokens"]
    parts = [counted[name] for name in ("prompt_tokens", "completion_tokens") if name in counted]
    return sum(parts) if parts else None


def remember_rows(remembered: Iterable[RememberCall]) -> list[Message]:
    """Return the stored ``tool`` rows of a turn's ``remember`` calls: the key and the value as
    stored, the result the model was told, and the call's record in the metadata."""
    return [Message("tool", done.result, REMEMBER, done.tool_input, done.record) for done in remembered]


def tool_rows(calls: Iterable[ToolCall]) -> list[Message]:
    """Return the stored ``tool`` messages for the provider's tool calls.

    clawmem records the calls; running the tools is the host's job, so the content is empty.
    """
    return [Message("tool", "", call.name, call.input) for call in calls]


def provider_history(messages: Iterable[StoredMessage]) -> list[dict[str, Any]]:
    """Return stored messages as the provider sees them: role and content, plus the tool call
    of a tool row. ``recall`` records are never sent; a ``summary`` checkpoint is sent as the
    assistant's summary, its text only (what it covers and cost is the operator's, not the
    model's, and must not count towards the token threshold)."""
    history = []
    for message in messages:
        if message.role == "recall":
            continue
        if message.role == "summary":
            history.append({"role": "assistant", "content": message.content})
            continue
        item: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_name is not None:
            item["tool_name"] = message.tool_name
        if message.tool_input is not None:
            item["tool_input"] = message.tool_input
        history.append(item)
    return history


def recall_record(augment: AugmentResult) -> Message:
    """Return the ``recall`` message that records which entries a turn was given: for each
    injected or truncated entry its namespace, key, score, line bytes and status, never its
    value (an empty list when nothing was injected)."""
    given = [
        {
            "namespace": decision.namespace,
            "key": decision.key,
            "score": decision.score,
            "bytes": decision.bytes,
            "status": decision.status,
        }
        for decision in augment.decisions[: augment.top_k]
        if decision.injected
    ]
    return Message("recall", json.dumps(given, ensure_ascii=False))


def checkpoint(compaction: CompactionResult, covered: Sequence[StoredMessage]) -> Message:
    """Return the ``summary`` message that stores a fired compaction as a checkpoint.

    Its content is what the provider was sent in place of the ``covered`` messages; its
    ``tool_input`` says which messages it covers (the first and last id, and how many, counting
    those an earlier checkpoint in ``covered`` stood for) and what the summary cost.
    """
    first, count = covered[0].id, 0
    for message in covered:
        covers = (
            message.tool_input.get("covers") if message.role == "summary" and message.tool_input else None
        )
        if covers and message is covered[0]:
            first = covers.get("from", first)
        count += covers.get("messages", 1) if covers else 1
    record = {
        "covers": {"from": first, "to": covered[-1].id, "messages": count},
        "provider_calls": compaction.provider_calls,
        "usage": dict(compaction.usage) if compaction.usage else None,
    }
    return Message("summary", SUMMARY_PREFIX + (compaction.summary or ""), None, record)


class Claw:
    """Runs turns against a key/value memory, a conversation log and a provider.

    ``augmenter`` defaults to recall from namespace ``default`` with top 3, ``compactor`` to
    one whose thresholds are off, ``guards`` to ``[PiiGuard()]`` (pass ``[]`` for none), and
    ``subject_template`` to ``user:{user_id}`` (where a subject's own facts live). With
    ``record_recall`` (the default) each turn stores a ``recall`` row, just before the user
    message, naming the entries it was given (never their values). With
    ``checkpoints`` (the default) a compaction's summary is stored as a ``summary`` message, so
    the next turn starts from it and no message is summarised twice; without, compaction is
    transient and summarises again on every turn. A log on phpClaw's WordPress tables stores
    neither (phpClaw could not read the conversation back), so there both are off.

    ``memory_writes`` is ``off`` (only code writes memory) or ``tool``: a turn with a subject
    offers the model ``remember`` into the subject's namespace (values up to
    ``max_value_bytes``), which needs a provider whose ``complete`` takes ``tools``; raises
    :class:`ConfigError` otherwise. ``extract``: a turn with a subject is followed by one
    extraction call whose facts are written into the subject's namespace; a failed or bad
    extraction writes nothing and never fails the turn.
    """

    def __init__(
        self,
        memory: Readable,
        conversations: ConversationLog,
        provider: Provider,
        augmenter: MessageAugmenter | None = None,
        compactor: HistoryCompactor | None = None,
        guards: Iterable[Guard] | None = None,
        clock: Clock = time.time,
        subject_template: str = DEFAULT_SUBJECT_NAMESPACE,
        checkpoints: bool = True,
        record_recall: bool = True,
        memory_writes: str = "off",
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.memory = memory
        self.conversations = conversations
        self.provider = provider
        self.augmenter = augmenter if augmenter is not None else MessageAugmenter(memory)
        self.compactor = compactor if compactor is not None else HistoryCompactor(ExtractiveSummarizer())
        self.guards: list[Guard] = [PiiGuard()] if guards is None else list(guards)
        self.clock = clock
        self.subject_template = validate_template(subject_template)
        # phpClaw's tables hold only the roles phpClaw reads (see ConversationLog.roles).
        self.checkpoints = checkpoints and "summary" in conversations.roles
        self.record_recall = record_recall and "recall" in conversations.roles
        self.memory_writes = check_memory_writes(memory_writes)
        self.max_value_bytes = max_value_bytes
        if memory_writes == "tool" and not takes_tools(provider):
            raise ConfigError(
                f"{ENV_PREFIX}MEMORY_WRITES=tool needs a provider that offers tools (complete(messages, "
                f"tools=...)); {type(provider).__name__} does not"
            )

    @classmethod
    def from_settings(
        cls, settings: Settings, provider: Provider, clock: Clock = time.time, guards: Iterable[Guard] = ()
    ) -> Claw:
        """Return a Claw on the site's memory and conversation log, with recall, subjects,
        compaction and the PII guard as configured, followed by any other ``guards``.

        Compaction summarises locally (:class:`ExtractiveSummarizer`), so no content leaves the host.
        With encryption keys set, the newest rows under each key id are decrypted first: raises
        :class:`clawmem.errors.Undecryptable` for a missing or wrong key (SPEC 13).
        """
        cipher = cipher_for(settings)
        memory = embed_writes(open_memory(settings, clock, cipher=cipher), settings)
        augmenter = MessageAugmenter.from_settings(memory, settings)
        compactor = HistoryCompactor(
            ExtractiveSummarizer(), settings.compact_max_messages, settings.compact_max_tokens
        )
        conversations = ConversationLog.from_settings(settings, clock, cipher)
        if cipher.enabled:
            # A missing or wrong key fails here, at start-up, not at a customer's first turn.
            check_keys(conversations.engine, settings.table_prefix, cipher)
        return cls(
            memory,
            conversations,
            provider,
            augmenter,
            compactor,
            [PiiGuard(settings.pii_guard, settings.allowed_pii_keys), *guards],
            clock=clock,
            subject_template=settings.subject_namespace,
            checkpoints=settings.compact_persist,
            record_recall=settings.record_recall,
            memory_writes=settings.memory_writes,
            max_value_bytes=settings.max_value_bytes,
        )

    def remember_tool(self, subject: str | None) -> RememberTool | None:
        """Return the ``remember`` tool a turn for ``subject`` (its namespace) offers, or ``None``
        when memory writes are not ``tool`` or the turn is anonymous."""
        if self.memory_writes != "tool" or subject is None:
            return None
        return RememberTool.over(self.memory, subject, self.guards, self.max_value_bytes)

    def extraction(self, subject: str | None, user: str, reply: str) -> Extraction | None:
        """Return the turn's extraction for ``subject``: the one call made and its facts
        checked, or ``None`` when memory writes are not ``extract``, the turn is anonymous, or
        the privacy switch holds writes back (nothing could be stored, so nothing is sent)."""
        if self.memory_writes != "extract" or subject is None:
            return None
        _, reaches = serving_driver(self.memory, subject)
        if not reaches:
            return None
        guard = next((guard for guard in self.guards if isinstance(guard, PiiGuard)), None)
        tool = RememberTool(subject, reaches, guard, self.max_value_bytes)
        # The model is sent the user message as the turn sent it: redacted where a guard redacts.
        said = [{"role": "user", "content": user}]
        for each in self.guards:
            if isinstance(each, RedactingGuard):
                said = each.redact_history(said)
        with self.conversations.cipher.reading():
            known = search_any(self.memory, f"{user}\n{reply}", NEAREST, subject)  # type: ignore[arg-type]
        return extract(self.provider, said[0]["content"], reply, known, tool)

    def write_extracted(
        self, extraction: Extraction, conversation_id: str, message_id: str | None, run_id: str
    ) -> None:
        """Write each fact of ``extraction`` into its namespace, attributed to the conversation,
        the turn's assistant row and the run; a replaced value is kept in ``history``."""
        for fact in extraction.facts:
            driver, _ = serving_driver(self.memory, fact.namespace)
            entry = getattr(driver, "entry", None)
            before = entry(fact.namespace, fact.key) if entry is not None else None
            if before is not None and before.value == fact.value:
                continue  # already known as it stands: nothing changes, nothing to keep
            origin = attribution(
                "extract", self.clock, conversation_id=conversation_id, message_id=message_id, run_id=run_id
            )
            if before is not None:
                origin["history"] = history(before.value, before.updated_at, before.metadata)
            set_any(self.memory, fact.key or "", fact.value, fact.namespace, None, origin)

    def write_remembered(
        self,
        remembered: Sequence[RememberCall],
        conversation_id: str,
        message_ids: Sequence[str | None],
        run_id: str,
    ) -> None:
        """Write each stored ``remember`` call's fact into its namespace, attributed to the
        conversation, its ``tool`` row (``message_ids``, one per call) and the run."""
        for done, message_id in zip(remembered, message_ids, strict=True):
            origin = attribution(
                "tool", self.clock, conversation_id=conversation_id, message_id=message_id, run_id=run_id
            )
            store(self.memory, done, origin)

    def send(
        self,
        message: str,
        conversation_id: str | None = None,
        user_id: str = "",
        *,
        job_id: str | None = None,
    ) -> Reply:
        """Run one turn and return the reply.

        Raises :class:`clawmem.errors.GuardBlocked` when a blocking guard objects and
        :class:`clawmem.errors.ProviderError` when the provider fails; nothing is stored then.
        An unknown ``conversation_id`` starts a new conversation under that id. A queued turn
        passes its ``job_id``: it goes into the user message's metadata, and a conversation that
        already holds that job's turn is not appended to again (see ``ConversationLog.append``).
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        if conversation_id is not None:
            validate_conversation_id(conversation_id)  # before the provider is paid for a turn
        if not isinstance(user_id, str):
            raise TypeError(f"user_id must be a str, got {type(user_id).__name__}")
        if getattr(self.conversations, "shape", None) == PHPCLAW_SCHEMA:
            wordpress_user_id(conversation_id or "(new)", user_id)  # a WordPress user id, or ''
        run_id = new_id()
        with events.run_context(run_id):
            # The turn's reads ask the key store once whether a key was erased, not once a value.
            with self.conversations.cipher.reading():
                stored = self.conversations.load(conversation_id) if conversation_id else None
                subject = subject_namespace(user_id, self.subject_template) if user_id else None
                augment = self.augmenter.augment(message, subject)
            conversation_id = conversation_id or new_id()
            rows = [row for row in stored.messages if row.role != "recall"] if stored else []
            earlier = provider_history(rows)
            for guard in self.guards:
                augment = guard.apply(augment)
                # A redacting guard redacts what earlier turns stored as said, too.
                if isinstance(guard, RedactingGuard):
                    earlier = guard.redact_history(earlier)
            compaction = self.compactor.apply([*earlier, {"role": "user", "content": augment.text}])
            answer, remembered, calls = converse(
                self.provider, compaction.history, self.remember_tool(subject)
            )
            extraction = self.extraction(subject, message, answer.text)
            # The turn's own calls are billed on its assistant row; a compaction's call stays with
            # its checkpoint's record, so neither is counted twice. An extraction's tokens are
            # billed there too, apart, as memory writing.
            usage = dict(answer.usage) if answer.usage else None
            tokens = billed_tokens(usage)
            billed: dict[str, Any] = {"usage": usage} if usage else {}
            if calls > 1:
                billed["provider_calls"] = calls
            if extraction is not None:
                billed["memory_writing"] = extraction.record
                writing = billed_tokens(extraction.usage)
                if writing is not None:
                    billed["memory_writing_tokens"] = writing
                    tokens = writing + (tokens or 0)
            added = [
                *([recall_record(augment)] if self.record_recall else []),
                Message("user", message, metadata={"job_id": job_id, "run_id": run_id} if job_id else None),
                Message("assistant", answer.text, metadata=billed or None),
                *remember_rows(remembered),
                *tool_rows(answer.tool_calls),
            ]
            first_remembered = len(added) - len(answer.tool_calls) - len(remembered)
            reply_at = first_remembered - 1
            append_options: dict[str, Any] = {}
            if self.checkpoints and compaction.fired and compaction.error is None:
                added.append(checkpoint(compaction, rows[compaction.start : compaction.boundary]))
                # Stored only if no other agent stored a checkpoint on this conversation since
                # it was loaded: two side by side would each summarise the same messages.
                loaded = [row.id for row in rows if row.role == "summary"]
                append_options["checkpoint_after"] = loaded[-1] if loaded else None
            if job_id:
                append_options["job_id"] = job_id
            ids = self.conversations.append(
                conversation_id,
                added,
                user_id=user_id,
                title=title_from(message),
                tokens=tokens,
                **append_options,
            )
            if remembered:
                # An append the privacy switch held back returns no ids: the entries say so.
                rows = ids[first_remembered : first_remembered + len(remembered)]
                self.write_remembered(remembered, conversation_id, _padded(rows, len(remembered)), run_id)
            if extraction is not None and extraction.facts:
                reply_id = ids[reply_at] if len(ids) > reply_at else None
                self.write_extracted(extraction, conversation_id, reply_id, run_id)
        return Reply(
            answer.text,
            conversation_id,
            run_id,
            augment,
            compaction,
            answer.tool_calls,
            answer.usage,
            tuple(remembered),
            calls,
            extraction,
        )


def _padded(ids: Sequence[str], count: int) -> list[str | None]:
    return [*ids, *[None] * (count - len(ids))][:count]
