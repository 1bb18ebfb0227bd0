"""ConversationLog: conversations and their messages, a first-class append-only log.

A turn loads a conversation once and appends its new messages once: one transaction, one
insert of the new rows, nothing re-read and nothing rewritten, so message ids never change.
The same object is the read API the dashboard and the CLI use (keyset-paginated listing,
search, one conversation's messages, counts) and deletes a conversation with its messages.
Every statement lives in :mod:`clawmem.sql.conversations`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from clawmem import events
from clawmem.clock import Clock, utc_datetime
from clawmem.crypto import PLAIN, Cipher
from clawmem.encryption.ciphers import cipher_for
from clawmem.errors import ConfigError
from clawmem.paging import Page, check_limit, page_of
from clawmem.php import json_encode as php_json_encode
from clawmem.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    encode_value,
    validate_namespace,
    validate_prefix,
)
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA, Settings, refuse_phpclaw_encryption
from clawmem.sql import conversation_list as listing
from clawmem.sql import conversations as sql
from clawmem.sql import sealing
from clawmem.sql.conversations import (
    Conversation,
    ConversationRow,
    ConversationSummary,
    Message,
    MessageSize,
    StoredMessage,
)
from clawmem.sql.engine import connect, engine_for, retry_deadlocks, write_transaction
from clawmem.turn.messages import (
    DEFAULT_CONVERSATION_NAMESPACE,
    PHPCLAW_ROLES,
    ROLES,
    check_messages,
    checked_text,
    message_page_of,
    sizes_of,
    validate_conversation_id,
    wordpress_user_id,
)
from clawmem.turn.search import SCAN_LIMIT, SealedSearch, TextScan

ANY_CHECKPOINT = object()  # append's default: a summary is stored whatever checkpoint is newest


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_read(method: Callable[_P, _R]) -> Callable[_P, _R]:
    # A method that opens or seals several values: the key store is asked once whether a key it
    # kept was erased (by any process), not once a value (see Cipher.reading).
    @functools.wraps(method)
    def within(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        log: ConversationLog = args[0]  # type: ignore[assignment]
        with log.cipher.reading():
            return method(*args, **kwargs)

    return within


class _JobStored(Exception):
    """Raised inside an append's transaction to roll it back: the job's turn is already stored."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__("the job's turn is already stored")
        self.ids = ids


class ConversationLog:
    """The conversations and messages tables of one site (``prefix``), for writing and reading.

    With ``store_messages=False`` (the privacy switch) :meth:`append` writes nothing and emits
    ``conversation.saved`` with ``gated=True``; reads and deletions are never gated.

    On phpClaw's WordPress tables (``shape="phpclaw-wordpress"``) it writes rows as phpClaw
    reads them: ``user_id`` a WordPress user id (``NULL`` for anonymous), metadata as
    ``json_encode`` writes it (``[]`` when empty), whole-second times, and only the roles
    phpClaw's messages have (:data:`PHPCLAW_ROLES`: no ``summary`` or ``recall`` rows). It
    reads what phpClaw wrote, including conversations phpClaw rewrote with new message ids.
    """

    name = "sql"

    def __init__(
        self,
        engine: Engine,
        prefix: str = "",
        clock: Clock = time.time,
        store_messages: bool = True,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        shape: str = CLAWMEM_SCHEMA,
        cipher: Cipher = PLAIN,
    ) -> None:
        self.engine = engine
        self.prefix = validate_prefix(prefix)
        self.clock = clock
        self.store_messages = store_messages
        self.max_value_bytes = max_value_bytes
        self.shape = shape
        if cipher.enabled and shape == PHPCLAW_SCHEMA:
            raise ConfigError(refuse_phpclaw_encryption())
        # Seals titles, metadata, contents and tool input (SPEC 13); PLAIN seals nothing.
        self.cipher = cipher
        self.search = SealedSearch(engine, self.prefix, cipher)

    @property
    def encrypted(self) -> bool:
        """Return whether this log seals what it writes."""
        return self.cipher.enabled

    def _message(self, message: StoredMessage, raising: bool = False) -> StoredMessage:
        return sealing.open_message(self.cipher, self.prefix, message, raising)

    def _messages(self, messages: Iterable[StoredMessage], raising: bool = False) -> list[StoredMessage]:
        return sealing.open_messages(self.cipher, self.prefix, list(messages), raising)

    @_one_read
    def opened(self, conversation: Conversation) -> Conversation:
        """Return a conversation read as stored (an export's, see :mod:`clawmem.privacy.erasure`) with
        its sealed columns opened; what cannot be opened is marked unreadable, never dropped."""
        parts = [conversation.title, conversation.metadata]
        parts += [part for message in conversation.messages for part in (message.content, message.tool_input)]
        if not sealing.needs_opening(self.cipher, *parts):
            return conversation
        names = ("id", "title", "metadata", "unreadable")
        fields = {name: getattr(conversation, name) for name in names}
        fields = sealing.open_fields(self.cipher, self.prefix, fields)
        return dataclasses.replace(
            conversation,
            title=fields["title"],
            metadata=fields["metadata"],
            unreadable=fields["unreadable"],
            messages=tuple(self._messages(conversation.messages)),
        )

    def _job_opener(self) -> Any:
        # A job's messages are found by the job id in their metadata, sealed with the rest.
        if not self.encrypted:
            return None
        return lambda messages: self._messages(messages, raising=True)

    def _fields(self, row: Any, raising: bool = False) -> dict[str, Any]:
        return sealing.open_fields(self.cipher, self.prefix, sql.conversation_fields(row), raising)

    @property
    def stores_metadata(self) -> bool:
        """Return whether messages keep their ``metadata`` and conversations their
        ``total_tokens``: not on phpClaw's tables, which have no column for them."""
        return self.shape != PHPCLAW_SCHEMA

    @property
    def roles(self) -> tuple[str, ...]:
        """Return the roles this log stores: all of :data:`ROLES`, or phpClaw's on its tables."""
        return PHPCLAW_ROLES if self.shape == PHPCLAW_SCHEMA else ROLES

    @classmethod
    def from_settings(
        cls, settings: Settings, clock: Clock = time.time, cipher: Cipher | None = None
    ) -> ConversationLog:
        """Return the log of the settings' database and site, behind their privacy switch,
        sealing with ``cipher`` (default: the one the settings' keys make).
        Raises :class:`clawmem.ConfigError` when the tables have the other shape (SPEC 4.8), or
        for encryption on phpClaw's shape."""
        from clawmem.sql.schema import check_shape

        engine = engine_for(settings.database_url)
        shape = check_shape(engine, settings.table_prefix, settings.schema)
        if shape == PHPCLAW_SCHEMA and settings.encrypts:
            raise ConfigError(refuse_phpclaw_encryption())
        return cls(
            engine,
            settings.table_prefix,
            clock,
            settings.store_messages,
            settings.max_value_bytes,
            shape,
            cipher_for(settings) if cipher is None else cipher,
        )

    # -- writing ----------------------------------------------------------------------------

    @_one_read
    def append(
        self,
        conversation_id: str,
        messages: Sequence[Any],
        *,
        user_id: str = "",
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
        namespace: str = DEFAULT_CONVERSATION_NAMESPACE,
        tokens: int | None = None,
        job_id: str | None = None,
        checkpoint_after: str | None | object = ANY_CHECKPOINT,
    ) -> list[str]:
        """Add ``messages`` to the conversation, creating it on first use; return the new ids.

        ``checkpoint_after`` names the checkpoint (``None``: none) a new ``summary`` among
        ``messages`` was made on top of. When another writer stored a newer checkpoint
        meanwhile, the summary is left out (the rest is stored), so no message is covered by
        two checkpoints made side by side.

        One transaction: the conversation row is touched (or inserted with ``user_id``,
        ``title``, ``metadata`` and ``namespace``, which an existing conversation keeps as they
        are), ``tokens`` (the turn's provider-reported usage) is added to its ``total_tokens``,
        and the new rows are inserted in one statement, in order. On phpClaw's shape message
        metadata and tokens have no column and are not stored (see :attr:`stores_metadata`).
        Raises ``TypeError`` or ``ValueError`` for bad input before anything is written.

        ``job_id`` names the queued job whose turn this is (its id is in a message's metadata):
        when the conversation already holds a message of that job, the transaction is rolled
        back (nothing written, no tokens added) and the stored messages' ids are returned, so a
        retried job never stores its turn twice.
        """
        validate_conversation_id(conversation_id)
        validate_namespace(namespace)
        records = check_messages(conversation_id, messages, self.max_value_bytes)
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
            raise ValueError(
                f"conversation {conversation_id!r}: tokens must be a whole number >= 0, got {tokens!r}"
            )
        fields: dict[str, Any] = {
            "user_id": checked_text(conversation_id, "user_id", user_id) or "",
            "title": checked_text(conversation_id, "title", title),
            "metadata": None,
        }
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise TypeError(f"conversation {conversation_id!r}: metadata must be a dict or None")
            encode_value(conversation_id, metadata, self.max_value_bytes)
            fields["metadata"] = sql.json_text(metadata)
        phpclaw = self.shape == PHPCLAW_SCHEMA
        if phpclaw:
            for index, record in enumerate(records):
                if record.role not in PHPCLAW_ROLES:
                    raise ValueError(
                        f"conversation {conversation_id!r}: message {index} role {record.role!r} is not "
                        f"one phpClaw reads ({', '.join(PHPCLAW_ROLES)}); the {PHPCLAW_SCHEMA} schema "
                        "stores no recall records or checkpoints"
                    )
            fields["user_id"] = wordpress_user_id(conversation_id, fields["user_id"])
            fields["metadata"] = php_json_encode(metadata or [])
            tokens = None
        if not self.store_messages:
            self._saved(conversation_id, namespace, records, gated=True)
            return []
        seal = None
        if self.encrypted:
            subject, dialect = fields["user_id"], self.engine.dialect.name
            if fields["title"] is not None:
                fields["title"] = sealing.clip_title(fields["title"], self.cipher)
            for column in ("title", "metadata"):
                fields[column] = sealing.seal_column(
                    self.cipher,
                    self.prefix,
                    sealing.CONVERSATIONS,
                    conversation_id,
                    column,
                    fields[column],
                    subject,
                    dialect,
                )

            def seal(row_id: str, column: str, text: str | None) -> str | None:
                return sealing.seal_column(
                    self.cipher, self.prefix, sealing.MESSAGES, row_id, column, text, subject, dialect
                )

        ids: list[str] = []

        def write() -> None:
            stamp = utc_datetime(self.clock)
            if phpclaw:
                stamp = stamp.replace(microsecond=0)  # phpClaw's gmdate('Y-m-d H:i:s')
            with write_transaction(self.engine) as conn:
                if not sql.touch_conversation(conn, self.prefix, conversation_id, stamp, tokens):
                    row = {"id": conversation_id, "namespace": namespace, "created_at": stamp, **fields}
                    if tokens is not None:
                        row["total_tokens"] = tokens
                    sql.insert_conversation(conn, self.prefix, {**row, "updated_at": stamp}, self.shape)
                elif job_id is not None and self.stores_metadata:
                    # The touch locked the conversation's row, so a second run of the job waits
                    # here; finding its turn stored, it rolls its touch back.
                    opener = self._job_opener()
                    stored = sql.messages_of_job(conn, self.prefix, conversation_id, job_id, opener)
                    if stored:
                        raise _JobStored([message.id for message in stored])
                written = records
                if checkpoint_after is not ANY_CHECKPOINT and any(r.role == "summary" for r in records):
                    # The touch above locked the conversation row: this read sees every writer
                    # that committed before us, and none can commit a checkpoint until we do.
                    newest = sql.newest_checkpoint_id(conn, self.prefix, conversation_id)
                    if newest != checkpoint_after:
                        written = [record for record in records if record.role != "summary"]
                ids[:] = sql.insert_messages(
                    conn, self.prefix, conversation_id, written, stamp, self.shape, seal
                )

        try:
            try:
                retry_deadlocks(write)
            except sa.exc.IntegrityError:
                # Two first appends of one new id raced; the loser now finds the row and touches it.
                retry_deadlocks(write)
        except _JobStored as already:
            return already.ids
        self._saved(conversation_id, namespace, records, gated=False)
        return list(ids)

    def _saved(self, conversation_id: str, namespace: str, records: list[Message], gated: bool) -> None:
        events.emit(
            "conversation.saved",
            driver=self.name,
            namespace=namespace,
            key=conversation_id,
            messages=len(records),
            inserted=0 if gated else len(records),
            gated=gated,
        )

    def delete(self, conversation_id: str) -> tuple[int, int]:
        """Delete one conversation with its messages (messages first) in one transaction;
        return ``(conversations, messages)`` deleted. A missing id deletes nothing.

        Emits ``memory.forget`` naming the conversation and the counts when something went.
        """
        validate_conversation_id(conversation_id)
        with write_transaction(self.engine) as conn:
            row = sql.load_conversation(conn, self.prefix, conversation_id, self.shape)
            conversations, messages = sql.delete_conversations(conn, self.prefix, [conversation_id])
        if conversations or messages:
            namespace = row.namespace if row is not None else None
            self._forgotten(conversation_id, namespace, conversations, messages)
        return conversations, messages

    def pop_newest(self, conversation_id: str, roles: Sequence[str]) -> StoredMessage | None:
        """Delete and return the newest message of one conversation whose role is among
        ``roles`` (``None`` when it has none), in one transaction; a ``recall`` record just
        before it goes with it, since it belongs to that turn. Emits ``memory.forget`` as
        :meth:`delete` does."""
        validate_conversation_id(conversation_id)
        with write_transaction(self.engine) as conn:
            row = sql.load_conversation(conn, self.prefix, conversation_id, self.shape)
            if row is None:
                return None
            deleted = sql.pop_newest_message(conn, self.prefix, conversation_id, roles, "recall", self.shape)
            # Opened inside the transaction: a message that cannot be decrypted raises, which
            # rolls the delete back, so nothing is lost for a missing or wrong key.
            deleted = self._messages(deleted, raising=True)
        if not deleted:
            return None
        self._forgotten(conversation_id, row.namespace, 0, len(deleted))
        return deleted[-1]

    def _forgotten(
        self, conversation_id: str, namespace: str | None, conversations: int, messages: int
    ) -> None:
        events.emit(
            "memory.forget",
            driver=self.name,
            namespace=namespace,
            key=conversation_id,
            conversations=conversations,
            messages=messages,
        )

    # -- reading a conversation -------------------------------------------------------------

    def job_messages(self, conversation_id: str, job_id: str) -> list[StoredMessage]:
        """Return the messages of the conversation that a queued job's turn stored (the job id
        in their metadata), in order; ``[]`` when it stored none, and always on phpClaw's
        tables, which keep no message metadata."""
        validate_conversation_id(conversation_id)
        if not self.stores_metadata:
            return []
        with connect(self.engine) as conn:
            found = sql.messages_of_job(conn, self.prefix, conversation_id, job_id, self._job_opener())
        return self._messages(found, raising=True)

    @_one_read
    def load(self, conversation_id: str) -> Conversation | None:
        """Return the conversation with its messages from the newest checkpoint on, or ``None``."""
        validate_conversation_id(conversation_id)
        with connect(self.engine) as conn:
            row = sql.load_conversation(conn, self.prefix, conversation_id, self.shape)
            if row is None:
                return None
            messages = sql.messages_since_checkpoint(conn, self.prefix, conversation_id, self.shape)
        # One conversation read for a turn: what cannot be decrypted raises, never reads as empty.
        return Conversation(**self._fields(row, raising=True), messages=tuple(self._messages(messages, True)))

    # -- the read API -----------------------------------------------------------------------

    @_one_read
    def list(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        sort: str = "created",
        user_id: str | None = None,
        namespace: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        query: str | None = None,
        descending: bool | None = None,
        counted: bool = False,
        count_at_most: int | None = None,
    ) -> Page[ConversationSummary]:
        """Return a page of conversations in ``sort`` order: ``created`` or ``updated`` (newest
        first), ``title`` (A to Z, untitled last), ``tokens`` (most billed first, not reported
        last) or ``messages`` (most said first), ties by id; ``descending`` turns any of them
        the other way (not reported stays last).

        Filters: exact ``user_id`` and ``namespace``, ``since <= created_at < until``, and
        ``query`` contained in the title or any message's content (case-insensitive).
        With ``counted``, the page's ``total`` is what :meth:`count` gives under the same
        filters and ``count_at_most``, read in the page's own query.
        Raises ``ValueError`` for a bad limit, sort or namespace and ``InvalidCursor`` for a bad
        cursor, or one of another sort.
        """
        check_limit(limit)
        listing.check_sort(sort)
        if count_at_most is not None:
            check_limit(count_at_most, 1_000_000)
        filters = self._scanned_filters(self._filters(user_id, namespace, since, until, query))
        with connect(self.engine) as conn:
            found, total = listing.summaries(
                conn,
                self.prefix,
                limit=limit + 1,
                sort=sort,
                cursor=cursor,
                shape=self.shape,
                descending=descending,
                counted=counted,
                at_most=count_at_most,
                **filters,
            )
        found = [sealing.open_summary(self.cipher, self.prefix, summary) for summary in found]
        return page_of(found, limit, lambda row: listing.cursor_key(row, sort, descending), total)

    def count(
        self,
        *,
        user_id: str | None = None,
        namespace: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        query: str | None = None,
        at_most: int | None = None,
    ) -> int:
        """Return how many conversations :meth:`list` gives under the same filters (one query),
        or ``at_most`` when there are at least that many."""
        if at_most is not None:
            check_limit(at_most, 1_000_000)
        filters = self._scanned_filters(self._filters(user_id, namespace, since, until, query))
        with connect(self.engine) as conn:
            return listing.count_summaries(conn, self.prefix, at_most, **filters)

    def _scanned_filters(self, filters: dict[str, Any]) -> dict[str, Any]:
        # Sealed titles and contents cannot be matched in SQL: the text search becomes the ids
        # a bounded scan of the decrypted newest rows found (see :meth:`scan`).
        if not self.encrypted or not filters.get("query"):
            return filters
        found = self.scan(filters["query"], **{k: v for k, v in filters.items() if k != "query"})
        return {**filters, "query": None, "conversation_ids": list(found.matches)}

    @_one_read
    def scan(self, query: str, limit: int = SCAN_LIMIT, **filters: Any) -> TextScan:
        """Return which conversations passing ``filters`` hold ``query`` (case-insensitive) in
        their title or a message, decrypting the newest ``limit`` titles and messages: the
        search of an encrypted site, bounded, saying how far it looked (see
        :class:`~clawmem.turn.search.SealedSearch`)."""
        return self.search.scan(query, limit, **filters)

    @staticmethod
    def _filters(
        user_id: str | None,
        namespace: str | None,
        since: datetime | None,
        until: datetime | None,
        query: str | None,
    ) -> dict[str, Any]:
        if namespace is not None:
            validate_namespace(namespace)
        return {"user_id": user_id, "namespace": namespace, "since": since, "until": until, "query": query}

    @_one_read
    def first_matches(
        self, conversation_ids: Sequence[str], query: str, max_chars: int = 100_000
    ) -> dict[str, str]:
        """Return, by conversation id, the start (``max_chars`` characters) of the first message
        of each of ``conversation_ids`` whose content holds ``query`` as :meth:`list` matches it."""
        found = self.search.last_matches(conversation_ids, query, max_chars) if self.encrypted else None
        if found is not None:
            return found
        with connect(self.engine) as conn:
            return listing.first_matches(conn, self.prefix, conversation_ids, query, max_chars)

    def find(self, conversation_id: str) -> ConversationRow | None:
        """Return the conversation's own row (no messages, no count: one indexed read), or ``None``."""
        validate_conversation_id(conversation_id)
        with connect(self.engine) as conn:
            row = sql.load_conversation(conn, self.prefix, conversation_id, self.shape)
        if row is None:
            return None
        fields = self._fields(row, raising=True)
        fields.pop("unreadable")
        return ConversationRow(**fields)

    def subjects(self, limit: int = 100) -> list[str]:
        """Return up to ``limit`` user ids that have a conversation, sorted (anonymous left out)."""
        check_limit(limit, 10_000)
        with connect(self.engine) as conn:
            return listing.subjects(conn, self.prefix, limit)

    def subject_totals(self, user_id: str) -> listing.SubjectTotals:
        """Return how many conversations, messages said, recall records and checkpoints the
        subject ``user_id`` has, the tokens their turns were billed and, of those, the tokens of
        the turns' extraction calls ("memory writing", read from the turns' opened metadata)."""
        with connect(self.engine) as conn:
            totals = listing.subject_totals(conn, self.prefix, user_id, self.shape)
            if self.shape != CLAWMEM_SCHEMA or not totals.conversations:
                return totals
            reported = sql.subject_reported_messages(conn, self.prefix, user_id, self.shape)
        tokens = [
            found
            for message in self._messages(reported)
            if isinstance(message.metadata, dict)
            and type(found := message.metadata.get("memory_writing_tokens")) is int
            and found >= 0
        ]
        return dataclasses.replace(totals, memory_writing_tokens=sum(tokens) if tokens else None)

    def get(self, conversation_id: str) -> ConversationSummary | None:
        """Return one conversation with its message count, or ``None``."""
        with connect(self.engine) as conn:
            found, _ = listing.summaries(
                conn, self.prefix, limit=1, conversation_id=conversation_id, shape=self.shape
            )
        return sealing.open_summary(self.cipher, self.prefix, found[0]) if found else None

    def newest_messages(
        self, conversation_id: str, roles: Sequence[str] = ROLES, limit: int | None = None
    ) -> list[StoredMessage]:
        """Return the newest ``limit`` messages of one conversation whose role is among
        ``roles`` (all of them with ``None``), oldest first, reading only those rows."""
        validate_conversation_id(conversation_id)
        if limit is not None:
            check_limit(limit, 1_000_000)
        with connect(self.engine) as conn:
            found = sql.newest_messages(conn, self.prefix, conversation_id, roles, limit, self.shape)
        return self._messages(found, raising=True)  # a session's history: never silently shorter

    def messages(
        self, conversation_id: str, *, limit: int = 200, cursor: str | None = None, descending: bool = False
    ) -> Page[StoredMessage]:
        """Return a page of one conversation's messages, oldest first (by created_at, then id),
        or newest first when ``descending``. Raises ``InvalidCursor`` for a cursor of the other
        direction."""
        check_limit(limit, 1000)
        with connect(self.engine) as conn:
            rows = sql.message_page(
                conn, self.prefix, conversation_id, limit + 1, cursor, self.shape, descending
            )
        return message_page_of(self._messages(rows), limit, descending)

    def message_sizes(self, conversation_id: str, limit: int = 5000) -> list[MessageSize]:
        """Return the id, role, content size and ``tool_input`` of up to ``limit`` of one
        conversation's messages, oldest first: what the compaction analysis needs, without the
        content (see :func:`clawmem.turn.compaction.analyse_sizes`)."""
        check_limit(limit, 100_000)
        with connect(self.engine) as conn:
            if not self.encrypted:
                return sql.message_sizes(conn, self.prefix, conversation_id, limit)
            # An envelope's size is not its plaintext's: measure the opened messages instead.
            stored = sql.message_page(conn, self.prefix, conversation_id, limit, None, self.shape)
        return sizes_of(self._messages(stored))

    def messages_with_ids(self, conversation_id: str, message_ids: Sequence[str]) -> dict[str, StoredMessage]:
        """Return the messages of one conversation among ``message_ids``, by id; ids of no
        message of it are left out."""
        with connect(self.engine) as conn:
            found = sql.messages_with_ids(conn, self.prefix, conversation_id, message_ids, self.shape)
        return {message_id: self._message(message) for message_id, message in found.items()}

    def turn(
        self, conversation_id: str, message_id: str
    ) -> tuple[StoredMessage | None, StoredMessage] | None:
        """Return a user message of the conversation with its ``recall`` record (``None`` when the
        turn recorded none), or ``None`` when the conversation has no such user message."""
        with connect(self.engine) as conn:
            found = self._messages(sql.turn(conn, self.prefix, conversation_id, message_id, self.shape))
        if not found:
            return None
        return (found[0], found[1]) if len(found) == 2 else (None, found[0])

    def recent_user_messages(self, limit: int = 50) -> list[StoredMessage]:
        """Return the newest ``limit`` messages with role ``user``, newest first."""
        check_limit(limit, 1000)
        with connect(self.engine) as conn:
            return self._messages(sql.recent_messages(conn, self.prefix, "user", limit, self.shape))

    def counts(self) -> dict[str, int]:
        """Return ``{"conversations": n, "messages": n}``."""
        with connect(self.engine) as conn:
            return listing.table_counts(conn, self.prefix)

    def role_counts(self) -> dict[str, int]:
        """Return how many messages each role has (``user``, ``assistant``, ``recall``...)."""
        with connect(self.engine) as conn:
            return listing.role_counts(conn, self.prefix)

    def _edge(self, function: Any, by: str) -> datetime | None:
        with connect(self.engine) as conn:
            return listing.edge(conn, self.prefix, function, by)

    def oldest(self, by: str = "created_at") -> datetime | None:
        """Return the earliest ``created_at`` (or ``updated_at``) of any conversation, or ``None``."""
        return self._edge(sa.func.min, by)

    def newest(self, by: str = "created_at") -> datetime | None:
        """Return the latest ``created_at`` (or ``updated_at``) of any conversation, or ``None``."""
        return self._edge(sa.func.max, by)

    def namespaces(self) -> list[str]:
        """Return every namespace that holds a conversation, sorted."""
        with connect(self.engine) as conn:
            return sorted(listing.conversation_namespaces(conn, self.prefix))
