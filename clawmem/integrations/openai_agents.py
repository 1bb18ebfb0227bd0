"""clawmem as an OpenAI Agents SDK session: :class:`ClawSession`.

Every item an agent's run adds is one stored message of a :class:`clawmem.ConversationLog`
conversation, so the dashboard, search, export, erase and prune see it: user and assistant
messages as ``user`` and ``assistant`` rows holding their text, function calls and their outputs
as ``tool`` rows, and items with no text (reasoning, for example) as ``assistant`` rows with no
content. The item itself is kept exactly in the message's metadata, so :meth:`ClawSession.get_items`
gives back items equal to those added. ``recall`` and ``summary`` rows are never items.

Recall in a run: :meth:`ClawSession.run_config` wires two hooks of the SDK's ``RunConfig``.
``session_input_callback`` sees the turn's new input before the SDK stores it: it recalls memory
for the user message from the recall namespace and the subject's, and runs the guards (a blocking
guard stops the run before anything is stored). ``call_model_input_filter`` then sends the
augmented text in place of that message, and the turn's ``recall`` record is stored just before
the user message, as :meth:`clawmem.Claw.send` stores it.

Memory the model writes: :meth:`ClawSession.memory_tools` returns the SDK function tool
``remember``, the one :meth:`clawmem.Claw.send` offers with ``CLAW_MEMORY_WRITES=tool``. A call
is checked as a turn's is (:mod:`clawmem.turn.writes`: the key rules, the size limit, the privacy
switch, the PII guard) and its fact is written at once into the session's subject namespace,
attributed to origin ``agents``, the session's conversation, the run and the time. A refused
call writes nothing and tells the model why. An anonymous session offers no tool, and no tool
deletes or expires anything. The tool is offered when the host passes it to its ``Agent``;
``CLAW_MEMORY_WRITES`` governs :class:`clawmem.Claw`'s own turns.

The SDK is imported only when a session is made; without it, one line names the extra. The
async methods run the synchronous core on the async path (:mod:`clawmem.integrations.aio`): on the event
loop over asyncio drivers on PostgreSQL, MariaDB/MySQL and Redis, in a worker thread on SQLite
and the file driver, so the loop is never blocked.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from clawmem import events
from clawmem.errors import InvalidKey
from clawmem.ids import new_id
from clawmem.integrations import aio, require
from clawmem.recall import AugmentResult, MessageAugmenter
from clawmem.recall.sources import Readable, serving_driver
from clawmem.rules import (
    DEFAULT_SUBJECT_NAMESPACE,
    check_size,
    encode_value,
    subject_namespace,
    validate_template,
)
from clawmem.settings import Settings
from clawmem.turn.conversations import ConversationLog, Message, StoredMessage
from clawmem.turn.guards import Guard, PiiGuard, RedactingGuard
from clawmem.turn.pipeline import recall_record, title_from
from clawmem.turn.writes import RememberTool, attribution, remember_now

SESSION_ID_KEY = "agents_session_id"  # in the conversation's metadata: the session id it belongs to
ITEM_KEY = "agents_item"  # in a message's metadata: the SDK item, kept exactly
ITEM_ROLES = ("system", "user", "assistant", "tool")  # the rows that are items (never recall, summary)
MAX_SESSION_ID_CHARS = 1000
_ID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # the ids' own (Crockford base32) alphabet
_T = TypeVar("_T")


def conversation_id_for(session_id: object) -> str:
    """Return the conversation id that holds session ``session_id``: the id itself when it is a
    valid conversation id, else 26 characters of the id alphabet derived from its SHA-256, the
    same in every process. Raises ``TypeError``/``ValueError`` for a bad session id."""
    from clawmem.turn.messages import validate_conversation_id

    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS or "\x00" in session_id:
        raise ValueError(
            f"session_id must be 1-{MAX_SESSION_ID_CHARS} characters without NUL, got {session_id[:40]!r}"
        )
    check_size("session_id", session_id, 4 * MAX_SESSION_ID_CHARS)  # refuses lone surrogates
    try:
        return validate_conversation_id(session_id)
    except InvalidKey:
        number = int.from_bytes(hashlib.sha256(session_id.encode("utf-8")).digest()[:17], "big") >> 6
        return "".join(_ID_ALPHABET[(number >> (5 * place)) & 31] for place in reversed(range(26)))


def session_id_of(metadata: Any) -> str | None:
    """Return the Agents SDK session id recorded in a conversation's metadata, or ``None``."""
    found = metadata.get(SESSION_ID_KEY) if isinstance(metadata, dict) else None
    return found if isinstance(found, str) else None


def item_text(content: Any) -> str | None:
    """Return the text of an item's content: the string itself, or its text parts joined by
    newlines; ``None`` when it has none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        texts = [text for text in texts if isinstance(text, str)]
        return "\n".join(texts) if texts else None
    return None


def message_for(item: Any, max_bytes: int, index: int = 0) -> Message:
    """Return the stored message of one SDK item (see the module docstring); raise ``TypeError``
    or ``ValueError`` for an item that is not a JSON object or is over ``max_bytes``."""
    if not isinstance(item, dict):
        raise TypeError(f"session item {index} must be a dict, got {type(item).__name__}")
    encode_value(f"session item {index}", item, max_bytes)
    kind, role = item.get("type"), item.get("role")
    keep = {ITEM_KEY: item}
    if kind in (None, "message") and role in ("user", "assistant", "system", "developer"):
        text = item_text(item.get("content"))
        return Message("system" if role == "developer" else role, text, metadata=keep)
    if kind == "function_call":
        call = _arguments(item.get("arguments"))
        return Message("tool", None, _name(item.get("name")), call, metadata=keep)
    if isinstance(kind, str) and (kind.endswith("_call") or kind.endswith("_call_output")):
        output = item.get("output")
        text = output if isinstance(output, str) else item_text(output)
        return Message("tool", text, None if kind == "function_call_output" else kind, metadata=keep)
    return Message("assistant", None, metadata=keep)  # reasoning and the like: stored, nothing said


def _name(name: Any) -> str | None:
    return name[:255] if isinstance(name, str) else None


def _arguments(arguments: Any) -> Any:
    import json

    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def item_of(message: StoredMessage) -> dict[str, Any] | None:
    """Return the SDK item a stored message holds; a message another writer stored without one
    becomes a plain ``{"role", "content"}`` message, and a tool row without one gives ``None``."""
    metadata = getattr(message, "metadata", None)
    if isinstance(metadata, dict) and isinstance(metadata.get(ITEM_KEY), dict):
        return metadata[ITEM_KEY]
    if message.role in ("user", "assistant", "system") and message.content is not None:
        return {"role": message.role, "content": message.content}
    return None


@dataclass
class _Turn:
    """The turn a run is in: its run id, the user message's text and what it was given."""

    run_id: str
    text: str
    augment: AugmentResult
    recorded: bool = False


class ClawSession:
    """An OpenAI Agents SDK ``Session`` over a :class:`clawmem.ConversationLog` conversation.

    ``session_id`` names the session; a conversation id is derived from it
    (:func:`conversation_id_for`) and the original is kept in the conversation's metadata and
    checked on every open, so two session ids never share a conversation (``ValueError``).
    ``memory`` (or an ``augmenter``) turns on recall for runs made with :meth:`run_config`;
    ``guards`` default to ``[PiiGuard()]`` as in :class:`clawmem.Claw`.
    """

    def __init__(
        self,
        session_id: str,
        conversations: ConversationLog,
        *,
        user_id: str = "",
        memory: Readable | None = None,
        augmenter: MessageAugmenter | None = None,
        guards: Iterable[Guard] | None = None,
        subject_template: str = DEFAULT_SUBJECT_NAMESPACE,
        record_recall: bool = True,
        session_settings: Any = None,
    ) -> None:
        memory_module = require("agents.memory", "openai-agents")
        self.conversation_id = conversation_id_for(session_id)
        if not getattr(conversations, "stores_metadata", True):
            raise ValueError(
                "ClawSession keeps each item in its message's metadata, which phpClaw's WordPress "
                "tables have no column for: use a database of the clawmem schema"
            )
        if not isinstance(user_id, str):
            raise TypeError(f"user_id must be a str, got {type(user_id).__name__}")
        self.session_id = session_id
        self.session_settings = (
            memory_module.SessionSettings() if session_settings is None else session_settings
        )
        self.conversations = conversations
        self.user_id = user_id
        self.memory = memory
        self.augmenter = augmenter if augmenter is not None or memory is None else MessageAugmenter(memory)
        self.guards: list[Guard] = [PiiGuard()] if guards is None else list(guards)
        self.subject_template = validate_template(subject_template)
        self.record_recall = record_recall and "recall" in getattr(conversations, "roles", ("recall",))
        self._owned = False  # set once the conversation is seen to be this session's
        self._turn: _Turn | None = None
        self._written: dict[str, dict[str, str]] = {}  # remember calls' writes, by the SDK's call id

    @classmethod
    def from_settings(cls, session_id: str, settings: Settings, user_id: str = "") -> ClawSession:
        """Return a session on the settings' database and site, with recall, subjects and the PII
        guard as configured (what :meth:`clawmem.Claw.from_settings` builds for its own turns)."""
        from clawmem.memory.registry import open_memory
        from clawmem.memory.vector_writes import embed_writes

        memory = embed_writes(open_memory(settings, time.time), settings)
        augmenter = MessageAugmenter.from_settings(memory, settings)
        return cls(
            session_id,
            ConversationLog.from_settings(settings),
            user_id=user_id,
            memory=memory,
            augmenter=augmenter,
            guards=[PiiGuard(settings.pii_guard, settings.allowed_pii_keys)],
            subject_template=settings.subject_namespace,
            record_recall=settings.record_recall,
        )

    # -- the Session protocol ---------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """Return the session's items in order, the newest ``limit`` only when given (or set in
        ``session_settings``), reading only those rows."""
        from agents.memory.session_settings import resolve_session_limit

        effective = resolve_session_limit(limit, self.session_settings)
        return await self._on_log(self._get_items, effective)

    async def add_items(self, items: list[Any]) -> None:
        """Store ``items`` after the existing ones, in one transaction; raise ``TypeError`` or
        ``ValueError`` for a bad item before anything is written. Gated by the privacy switch."""
        if not isinstance(items, list):
            raise TypeError(f"items must be a list, got {type(items).__name__}")
        max_bytes = self.conversations.max_value_bytes
        messages = [message_for(item, max_bytes, index) for index, item in enumerate(items)]
        for item, message in zip(items, messages, strict=True):
            # A remember call's row says what it wrote, as a Claw turn's does (the page links it).
            call_id = item.get("call_id") if item.get("type") == "function_call" else None
            if isinstance(call_id, str) and call_id in self._written and message.metadata is not None:
                message.metadata["wrote"] = self._written.pop(call_id)
        if messages:
            await self._on_log(self._add, copy.deepcopy(messages), run_id=self._turn_run_id(messages))

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item (``None`` when there is none), with the ``recall``
        record of its turn when it is a user message. Emits ``memory.forget``."""
        return await self._on_log(self._pop)

    async def clear_session(self) -> None:
        """Delete the session's conversation with every message. Emits ``memory.forget``."""
        await self._on_log(self._clear)

    # -- recall in a run ----------------------------------------------------------------------

    def run_config(self, **options: Any) -> Any:
        """Return an ``agents.RunConfig`` with ``options`` whose hooks give each turn its recalled
        memory (see the module docstring); pass it to ``Runner.run(..., session=self)``."""
        agents = require("agents", "openai-agents")
        return agents.RunConfig(
            session_input_callback=self.session_input_callback,
            call_model_input_filter=self.call_model_input_filter,
            **options,
        )

    async def session_input_callback(self, history: list[Any], new_items: list[Any]) -> list[Any]:
        """The SDK's ``session_input_callback``: recall and guard the turn's user message before
        the SDK stores it; return ``history + new_items`` unchanged. Raises
        :class:`clawmem.errors.GuardBlocked` when a blocking guard objects (nothing is stored)."""
        self._turn = None
        text = next((t for t in map(_user_text, reversed(new_items)) if t is not None), None)
        if text is not None and self.augmenter is not None:
            self._turn = await aio.run(self._memory_on_loop(), self._augment, text, run_id=new_id())
        return [*history, *new_items]

    def call_model_input_filter(self, data: Any) -> Any:
        """The SDK's ``call_model_input_filter``: send the turn's user message augmented with its
        recalled memory (and, with a redacting guard, earlier messages redacted)."""
        turn = self._turn
        model_data = data.model_data
        if turn is None:
            return model_data
        # Only the items replaced below are new (``_with_text`` and ``_redacted`` build new ones
        # and change none in place): the others are passed on as the SDK gave them.
        items = list(model_data.input)
        for index in reversed(range(len(items))):
            if _user_text(items[index]) == turn.text:
                items[index] = _with_text(items[index], turn.augment.text)
                break
        else:
            index = len(items)
        for guard in self.guards:
            if isinstance(guard, RedactingGuard):
                items[:index] = [_redacted(item, guard.redact_history) for item in items[:index]]
        return type(model_data)(input=items, instructions=model_data.instructions)

    # -- memory the model writes -------------------------------------------------------------

    def memory_tools(self) -> list[Any]:
        """Return the SDK function tools that let the model write memory: ``remember`` (a key
        and a text value) into the subject's namespace, or none for an anonymous session (no
        ``user_id``). Raises ``ValueError`` for a session made without ``memory``."""
        agents = require("agents", "openai-agents")
        if not self.user_id:
            return []
        if self.memory is None:
            raise ValueError("a session without memory cannot offer remember: pass memory=...")
        memory = self.memory
        namespace = subject_namespace(self.user_id, self.subject_template)
        tool = RememberTool.over(memory, namespace, self.guards)  # type: ignore[arg-type]
        driver, _ = serving_driver(memory, namespace)
        clock = getattr(driver, "clock", time.time)

        def write(arguments: str, call_id: str) -> str:
            run_id = events.current_run_id()  # the turn's, set by aio.run
            origin = attribution("agents", clock, conversation_id=self.conversation_id, run_id=run_id)
            done = remember_now(memory, tool, arguments, call_id, origin)  # type: ignore[arg-type]
            if done.stores and done.key is not None:
                self._written[call_id] = {"namespace": namespace, "key": done.key}
            return done.result

        async def invoke(context: Any, arguments: str) -> str:
            call_id = getattr(context, "tool_call_id", None) or new_id()
            turn = self._turn
            on_loop = aio.memory_on_loop(memory, [namespace])
            return await aio.run(on_loop, write, arguments, call_id, run_id=turn.run_id if turn else None)

        spec = RememberTool.spec
        return [
            agents.FunctionTool(
                name=spec.name,
                description=spec.description,
                params_json_schema=dict(spec.parameters),
                on_invoke_tool=invoke,
                strict_json_schema=True,
            )
        ]

    # -- the synchronous core, on the async path ------------------------------------------------

    async def _on_log(self, function: Callable[..., _T], *args: Any, run_id: str | None = None) -> _T:
        on_loop = aio.engine_on_loop(getattr(self.conversations, "engine", None))
        return await aio.run(on_loop, function, *args, run_id=run_id)

    def _memory_on_loop(self) -> bool:
        if self.augmenter is None:
            return False
        namespaces = [self.augmenter.namespace]
        if self.user_id:
            namespaces.append(subject_namespace(self.user_id, self.subject_template))
        return aio.memory_on_loop(self.augmenter.memory, namespaces)

    def _check_owner(self) -> None:
        if self._owned:
            return
        found = self.conversations.find(self.conversation_id)
        if found is None:
            return
        owner = session_id_of(found.metadata)
        mapped = self.conversation_id != self.session_id
        if owner != self.session_id and (mapped or owner is not None):
            raise ValueError(
                f"session id {self.session_id[:40]!r} maps to conversation {self.conversation_id}, "
                f"which belongs to {'session ' + repr(owner[:40]) if owner else 'another writer'}"
            )
        self._owned = True

    def _get_items(self, limit: int | None) -> list[Any]:
        if limit is not None and limit <= 0:
            return [] if limit == 0 else self._get_items(None)
        self._check_owner()
        rows = self.conversations.newest_messages(self.conversation_id, ITEM_ROLES, limit)
        return [item for item in map(item_of, rows) if item is not None]

    def _add(self, messages: list[Message]) -> None:
        self._check_owner()
        turn = self._turn
        if turn is not None and not turn.recorded and self.record_recall:
            for index, message in enumerate(messages):
                if message.role == "user" and message.content == turn.text:
                    messages.insert(index, recall_record(turn.augment))
                    turn.recorded = True
                    break
        title = next((title_from(m.content) for m in messages if m.role == "user" and m.content), None)
        self.conversations.append(
            self.conversation_id,
            messages,
            user_id=self.user_id,
            title=title,
            metadata={SESSION_ID_KEY: self.session_id},
        )

    def _pop(self) -> Any | None:
        self._check_owner()
        popped = self.conversations.pop_newest(self.conversation_id, ITEM_ROLES)
        return None if popped is None else item_of(popped)

    def _clear(self) -> None:
        self._check_owner()
        self.conversations.delete(self.conversation_id)
        self._owned = False

    def _augment(self, text: str) -> _Turn:
        subject = subject_namespace(self.user_id, self.subject_template) if self.user_id else None
        assert self.augmenter is not None
        augment = self.augmenter.augment(text, subject)
        for guard in self.guards:
            augment = guard.apply(augment)
        run_id = events.current_run_id()
        assert run_id is not None
        return _Turn(run_id, text, augment)

    def _turn_run_id(self, messages: Sequence[Message]) -> str | None:
        turn = self._turn
        if turn is not None and not turn.recorded and any(m.content == turn.text for m in messages):
            return turn.run_id
        return None


def _user_text(item: Any) -> str | None:
    if isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message":
        return item_text(item.get("content"))
    return None


def _with_text(item: dict[str, Any], text: str) -> dict[str, Any]:
    content = item.get("content")
    if isinstance(content, list):
        others = [part for part in content if not (isinstance(part, dict) and "text" in part)]
        return {**item, "content": [{"type": "input_text", "text": text}, *others]}
    return {**item, "content": text}


def _redacted(item: Any, redact_history: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Any:
    if not isinstance(item, dict):
        return item
    content = item.get("content")
    if isinstance(content, str):
        return {**item, "content": redact_history([{"role": "user", "content": content}])[0]["content"]}
    if isinstance(content, list):
        parts = [
            {**part, "text": redact_history([{"role": "user", "content": part["text"]}])[0]["content"]}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
        return {**item, "content": parts}
    return item
