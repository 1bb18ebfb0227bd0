"""LangChain's key/value stores and chat message history over clawmem.

``ClawStore(memory, namespace)`` is a ``BaseStore[str, Any]`` of JSON values and
``ClawByteStore(memory, namespace)`` a ``ByteStore`` (what ``CacheBackedEmbeddings`` caches
in), both entries of one clawmem namespace; ``ClawChatMessageHistory`` keeps a LangChain chat
as a clawmem conversation. Keys follow clawmem's rules (non-empty, at most 191 characters, no
control characters); a bad key raises :class:`clawmem.InvalidKey`. The async methods are
LangChain's own, which run these in a worker thread, so none blocks the event loop.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Sequence
from typing import Any

from clawmem.integrations import require

require("langchain_core.stores", "langchain")

from langchain_core.chat_history import BaseChatMessageHistory  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.stores import BaseStore  # noqa: E402

from clawmem.errors import StorageError  # noqa: E402
from clawmem.memory.base import DEFAULT_NAMESPACE, MemoryInterface  # noqa: E402
from clawmem.recall.sources import serving_driver  # noqa: E402
from clawmem.rules import (  # noqa: E402
    DEFAULT_MAX_VALUE_BYTES,
    encode_value,
    validate_key,
    validate_namespace,
)
from clawmem.sql.conversations import StoredMessage  # noqa: E402
from clawmem.turn.conversations import ConversationLog  # noqa: E402
from clawmem.turn.messages import validate_conversation_id  # noqa: E402


class ClawStore(BaseStore[str, Any]):
    """A LangChain ``BaseStore`` of JSON values, the entries of one clawmem ``namespace``.

    Values follow clawmem's contract: anything JSON holds round-trips exactly (a tuple comes
    back a list); NaN raises ``ValueError``, anything else JSON cannot hold ``TypeError``, and a
    value over ``CLAW_MAX_VALUE_BYTES`` :class:`clawmem.ValueTooLarge`, with nothing written.
    """

    def __init__(self, memory: MemoryInterface, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.memory = memory
        self.namespace = validate_namespace(namespace)

    @classmethod
    def from_settings(cls, settings: Any, namespace: str = DEFAULT_NAMESPACE, **options: Any) -> ClawStore:
        """Return a store over the memory ``settings`` open, behind their privacy switch."""
        from clawmem.memory.registry import open_memory
        from clawmem.memory.vector_writes import embed_writes

        return cls(embed_writes(open_memory(settings, **options), settings), namespace)

    def _stored(self, value: Any) -> Any:
        return value

    def _loaded(self, key: str, stored: Any) -> Any:
        return stored

    def mget(self, keys: Sequence[str]) -> list[Any | None]:
        """Return the value of each key, ``None`` where it is missing or expired."""
        for key in keys:
            validate_key(key)
        return [self._loaded(key, self.memory.get(key, self.namespace)) for key in keys]

    def mset(self, key_value_pairs: Sequence[tuple[str, Any]]) -> None:
        """Store each pair. Every key and value is checked before the first is written."""
        driver, _ = serving_driver(self.memory, self.namespace)
        limit = getattr(driver, "max_value_bytes", DEFAULT_MAX_VALUE_BYTES)
        pairs = [(validate_key(key), self._stored(value)) for key, value in key_value_pairs]
        for key, value in pairs:
            encode_value(key, value, limit)
        for key, value in pairs:
            self.memory.set(key, value, self.namespace)

    def mdelete(self, keys: Sequence[str]) -> None:
        """Delete each key; a missing key is not an error."""
        for key in keys:
            validate_key(key)
        for key in keys:
            self.memory.forget(key, self.namespace)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """Yield the namespace's live keys in code-point order, those starting with ``prefix`` only
        when it is given."""
        for key in self.memory.all(self.namespace):
            if prefix is None or key.startswith(prefix):
                yield key


class ClawByteStore(ClawStore):
    """A LangChain ``ByteStore``: ``bytes`` values, stored in clawmem as base64 text."""

    def _stored(self, value: Any) -> Any:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"a byte store holds bytes, got {type(value).__name__}")
        return base64.b64encode(bytes(value)).decode("ascii")

    def _loaded(self, key: str, stored: Any) -> Any:
        if stored is None:
            return None
        try:
            return base64.b64decode(stored, validate=True)
        except (TypeError, binascii.Error) as exc:
            raise StorageError(
                "langchain", "mget", f"{self.namespace}/{key} does not hold base64 bytes: {exc}"
            ) from exc


# LangChain's message types and the conversation roles they are stored under.
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_PAGE = 1000


class ClawChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history kept as the clawmem conversation ``conversation_id``.

    Each message is one stored row: system, human, AI and tool messages become ``system``,
    ``user``, ``assistant`` and ``tool`` rows whose content is their text (an AI message's tool
    calls fill ``tool_name``/``tool_input``), so the dashboard, search, export, erase and prune
    see them. ``conversation_id`` follows clawmem's rule (1-26 of ``[0-9A-Za-z_-]``, e.g.
    :func:`clawmem.new_id`); another id raises ``ValueError``. With the privacy switch off
    nothing new is stored. ``recall`` and ``summary`` rows are not chat messages and are skipped.
    """

    def __init__(self, conversations: ConversationLog, conversation_id: str, user_id: str = "") -> None:
        self.conversations = conversations
        self.conversation_id = validate_conversation_id(conversation_id)
        self.user_id = user_id

    @classmethod
    def from_settings(
        cls, settings: Any, conversation_id: str, user_id: str = "", **options: Any
    ) -> ClawChatMessageHistory:
        """Return the history over the conversations of ``settings`` (privacy switch included)."""
        return cls(ConversationLog.from_settings(settings, **options), conversation_id, user_id)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Return the conversation's chat messages, oldest first."""
        found: list[BaseMessage] = []
        cursor = None
        while True:
            page = self.conversations.messages(self.conversation_id, limit=_PAGE, cursor=cursor)
            found.extend(message for row in page.items if (message := message_of(row)) is not None)
            cursor = page.next_cursor
            if cursor is None:
                return found

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` in one transaction. A message of another type raises ``TypeError``,
        and anything the conversation log refuses ``TypeError``/``ValueError``; then nothing is
        written."""
        rows = [row_of(message) for message in messages]
        if rows:
            self.conversations.append(self.conversation_id, rows, user_id=self.user_id)

    def clear(self) -> None:
        """Delete the conversation with its messages."""
        self.conversations.delete(self.conversation_id)


def row_of(message: BaseMessage) -> dict[str, Any]:
    """Return the conversation row that stores ``message``; raise ``TypeError`` for a message
    type with no conversation role."""
    role = _ROLES.get(getattr(message, "type", None)) if isinstance(message, BaseMessage) else None
    if role is None:
        raise TypeError(
            f"a chat history stores system, human, AI and tool messages, got {type(message).__name__}"
        )
    row: dict[str, Any] = {
        "role": role,
        "content": message.text,
        "metadata": {"langchain": message_to_dict(message)},
    }
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = message.tool_calls
        if len(calls) == 1:
            row.update(tool_name=calls[0]["name"], tool_input=calls[0]["args"])
        else:
            row["tool_input"] = [{"name": call["name"], "args": call["args"]} for call in calls]
    elif isinstance(message, ToolMessage):
        row["tool_name"] = message.name
    return row


def message_of(row: StoredMessage) -> BaseMessage | None:
    """Return the LangChain message a stored row holds (``None`` for ``recall`` and ``summary``):
    exactly the one added when the row keeps it, else one made from the row's columns."""
    metadata = row.metadata
    kept = metadata.get("langchain") if isinstance(metadata, dict) else None
    if kept is not None:
        return messages_from_dict([kept])[0]
    content = row.content or ""
    if row.role == "system":
        return SystemMessage(content, id=row.id)
    if row.role == "user":
        return HumanMessage(content, id=row.id)
    if row.role == "assistant":
        calls = []
        if row.tool_name:
            args = row.tool_input if isinstance(row.tool_input, dict) else {}
            calls = [{"name": row.tool_name, "args": args, "id": None}]
        return AIMessage(content, id=row.id, tool_calls=calls)
    if row.role == "tool":
        return ToolMessage(content, id=row.id, tool_call_id=row.id, name=row.tool_name)
    return None
