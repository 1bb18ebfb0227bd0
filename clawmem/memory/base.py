"""The memory contract: :class:`MemoryInterface`'s six methods (SPEC 2) and search, and
:class:`BaseMemory`, the front every driver shares (validation, events, errors, the operator's
read API and deletion of rows as stored); :class:`FeedingMemory` adds the change feed.

Rules (every driver, identically): keys are non-empty str of at most 191 characters with no
control characters; namespaces follow :func:`~clawmem.rules.validate_namespace`; values
are JSON-representable and round-trip exactly; ``ttl=None`` never expires, a positive int (or a
``timedelta`` of whole seconds) expires at ``floor(now) + ttl``; an entry is expired when
``now >= expires_at``. Backend failures raise :class:`clawmem.StorageError`.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from clawmem import events
from clawmem.clock import Clock, now_seconds
from clawmem.crypto import Cipher
from clawmem.crypto.stored import StoredValues, SubjectOf
from clawmem.errors import StorageError
from clawmem.paging import Page, check_limit, check_sort, cursor_key, page_of, sort_start, sorted_page
from clawmem.recall.feeds import fresh_index
from clawmem.recall.rankings import ATTEMPTS, rank
from clawmem.recall.words import keywords
from clawmem.records import Changes, MemoryHit, MemoryRow, NamespaceCount
from clawmem.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    Ttl,
    encode_value,
    is_expired,
    validate_count,
    validate_key,
    validate_namespace,
    validate_ttl,
)

DEFAULT_NAMESPACE = "default"

# Called after each write a driver stored: (driver, namespace, key, value). What stands above
# the drivers registers one (embedding on write, :mod:`clawmem.memory.vector_writes`); a driver never
# knows what it does.
WriteHook = Callable[["BaseMemory", str, str, Any], None]


# The filters of a namespace listing: "live" is every entry that is not expired; the others
# are the TTL states of :func:`clawmem.rules.ttl_state`.
FILTERS = ("live", "permanent", "expiring", "expired")


def check_filter(state: str | None) -> str | None:
    """Return ``state`` if it is ``None`` or one of :data:`FILTERS`, else raise ``ValueError``."""
    if state is not None and state not in FILTERS:
        raise ValueError(f"state must be one of {', '.join(FILTERS)}, got {state!r}")
    return state


def passes_filter(state: str | None, expires_at: int | None, now: int) -> bool:
    """Return whether an entry expiring at ``expires_at`` passes the listing filter ``state``."""
    expired = is_expired(expires_at, now)
    return {
        None: True,
        "live": not expired,
        "permanent": expires_at is None,
        "expiring": expires_at is not None and not expired,
        "expired": expired,
    }[state]


def contains_text(row: MemoryRow, text: str) -> bool:
    """Return whether a row's key, or its value as compact JSON, contains ``text`` exactly."""
    encoded = json.dumps(row.value, ensure_ascii=False, separators=(",", ":"))
    escaped = {json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]}
    return text in row.key or any(needle in encoded for needle in escaped)


def emit_write(driver: str, namespace: str, key: str, encoded: str, ttl: Ttl, gated: bool = False) -> None:
    """Emit ``memory.write`` for a write of ``encoded`` (its size only; never the value)."""
    events.emit(
        "memory.write",
        driver=driver,
        namespace=namespace,
        key=key,
        bytes=len(encoded.encode("utf-8")),
        ttl=validate_ttl(ttl),  # in seconds, a timedelta's too
        gated=gated,
    )


def encode_metadata(key: str, metadata: Mapping[str, Any], max_bytes: int) -> str:
    """Return an entry's metadata as its JSON text; raises ``TypeError`` unless it is a mapping
    with ``str`` keys JSON can hold, and ``ValueError`` as a value of that size would."""
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata of key {key!r} must be a dict, got {type(metadata).__name__}")
    return encode_value(key, dict(metadata), max_bytes)


class MemoryInterface(abc.ABC):
    """The six-method key/value contract."""

    @abc.abstractmethod
    def get(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> Any:
        """Return the value, or ``None`` when the key is missing or expired."""

    @abc.abstractmethod
    def set(
        self,
        key: str,
        value: Any,
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Create or replace the entry; ``ttl=None`` clears any earlier TTL. ``metadata`` (a
        JSON object saying where the entry came from) is kept by drivers that keep metadata and
        replaces what the entry held; others keep none."""

    @abc.abstractmethod
    def forget(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Delete one key; a missing key is not an error."""

    @abc.abstractmethod
    def flush(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Delete every key of the namespace."""

    @abc.abstractmethod
    def all(self, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        """Return every live entry of the namespace, sorted by key in code-point order."""

    @abc.abstractmethod
    def has(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Return whether a live entry exists, even one whose value is ``None``."""


class SearchableMemory(MemoryInterface):
    """A memory that can rank its entries against a query (see :mod:`clawmem.recall`)."""

    @abc.abstractmethod
    def search(self, query: str, limit: int = 5, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryHit]:
        """Return up to ``limit`` hits with score > 0, by score descending then key ascending."""


class BaseMemory(SearchableMemory):
    """Shared front of every storage driver: validation, events and error wrapping.

    Subclasses set ``name`` and ``backend_errors`` and implement the ``_get``, ``_set``,
    ``_forget``, ``_flush``, ``_all``, ``_sweep`` and ``_records`` primitives, which receive
    validated input; ``_fetch``, ``_fetch_across`` and ``_namespaces`` have defaults to
    override, as have ``_call``, ``_describe`` and ``_encode`` (how a backend error is wrapped
    and described, and a value encoded); a driver that publishes a change feed adds
    ``_changes`` (:class:`FeedingMemory`).
    ``_get`` returns a ``(found, value)`` pair so that a stored ``None`` is not a miss.
    """

    name = "base"
    backend_errors: tuple[type[BaseException], ...] = (OSError,)
    # How values become stored text: plain JSON until :meth:`use_cipher` (SPEC 13).
    values: StoredValues = StoredValues()
    # Whether the driver keeps values at rest (a database, Redis, files), so they are sealed
    # when keys are set; the in-process array driver keeps nothing beyond the process.
    at_rest = True
    write_hooks: tuple[WriteHook, ...] = ()
    # Whether ``set(..., metadata=...)`` stores the metadata (then ``_set`` takes it as a sixth
    # argument, ``None`` for a write without any).
    keeps_metadata = False

    def __init__(self, clock: Clock = time.time, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        self.clock = clock
        self.max_value_bytes = max_value_bytes

    def use_cipher(self, cipher: Cipher, site: str = "", subject_of: SubjectOf | None = None) -> None:
        """Seal every value written from now on with ``cipher`` for the site whose table prefix is
        ``site``, and open sealed values with it (``subject_of`` names a namespace's subject)."""
        extra = {} if subject_of is None else {"subject_of": subject_of}
        self.values = StoredValues(self.values.codec, cipher, site, **extra)

    def on_write(self, hook: WriteHook) -> None:
        """Call ``hook(driver, namespace, key, value)`` after every write this driver stores
        (``set``, and ``update`` where a driver has it), in the writer's thread."""
        self.write_hooks = (*self.write_hooks, hook)

    def _written(self, namespace: str, key: str, value: Any) -> None:
        for hook in self.write_hooks:
            hook(self, namespace, key, value)

    @property
    def encrypted(self) -> bool:
        """Return whether this driver seals the values it writes."""
        return self.values.cipher.enabled

    # -- primitives -----------------------------------------------------------------------

    @abc.abstractmethod
    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]: ...

    @abc.abstractmethod
    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None: ...

    @abc.abstractmethod
    def _forget(self, key: str, namespace: str, now: int) -> None: ...

    @abc.abstractmethod
    def _flush(self, namespace: str) -> int: ...

    @abc.abstractmethod
    def _all(self, namespace: str, now: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]: ...

    @abc.abstractmethod
    def _records(self, namespace: str) -> list[MemoryRow]: ...

    def _encode(self, key: str, value: Any) -> str:
        return encode_value(key, value, self.max_value_bytes)

    def _search(self, query: str, limit: int, namespace: str, now: int) -> list[MemoryHit]:
        words = keywords(query)
        if not words or limit <= 0:
            return []
        if isinstance(self, FeedingMemory):
            for _ in range(ATTEMPTS):  # a candidate found changed corrects the index; look again
                index = fresh_index(self, namespace, self._changes)
                found = index.query(words, now).first(limit)
                rows = {row.key: row for row in self._fetch(namespace, {key for key, _, _ in found})}
                if index.confirm([key for key, _, _ in found], rows, now):
                    return [MemoryHit(key, rows[key].value, namespace, score) for key, score, _ in found]
        return [
            MemoryHit(key, value, namespace, points)
            for key, value, points in rank(query, self._all(namespace, now), limit)
        ]

    # -- the contract -----------------------------------------------------------------------

    def _call(self, operation: str, function: Any, *args: Any) -> Any:
        try:
            with self.values.cipher.reading():  # an erasure is asked about once, not once a value
                return function(*args)
        except StorageError:
            raise
        except self.backend_errors as exc:
            raise StorageError(self.name, operation, self._describe(exc)) from exc

    def _describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def _now(self) -> int:
        return now_seconds(self.clock)

    def get(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> Any:
        validate_key(key)
        validate_namespace(namespace)
        found, value = self._call("get", self._get, key, namespace, self._now())
        events.emit("memory.read", driver=self.name, namespace=namespace, key=key, hit=found)
        return value if found else None

    def has(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
        validate_key(key)
        validate_namespace(namespace)
        found, _ = self._call("has", self._get, key, namespace, self._now())
        events.emit("memory.read", driver=self.name, namespace=namespace, key=key, hit=found)
        return found

    def _prepare_write(self, key: str, namespace: str, ttl: Ttl) -> tuple[int, int | None]:
        """Validate a write's key, namespace and TTL; return ``(now, expires_at)`` for it."""
        validate_key(key)
        validate_namespace(namespace)
        seconds = validate_ttl(ttl)
        now = self._now()
        return now, None if seconds is None else now + seconds

    def set(
        self,
        key: str,
        value: Any,
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Create or replace the entry. ``metadata`` (a JSON object: where the entry came from)
        is stored beside it by a driver that :attr:`keeps_metadata`, and a write without it
        clears what an earlier write left; other drivers keep none. Raises as the value does."""
        now, expires_at = self._prepare_write(key, namespace, ttl)
        encoded = self._encode(key, value)
        described = None if metadata is None else encode_metadata(key, metadata, self.max_value_bytes)
        if self.keeps_metadata:
            self._call("set", self._set, key, encoded, namespace, expires_at, now, described)
        else:
            self._call("set", self._set, key, encoded, namespace, expires_at, now)
        emit_write(self.name, namespace, key, encoded, ttl)
        self._written(namespace, key, value)

    def update(
        self,
        key: str,
        function: Callable[[Any], Any],
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
    ) -> Any:
        """Store ``function(current)`` and return it; ``current`` is ``None`` when the key is
        missing or expired, and ``ttl`` works as in :meth:`set` (without metadata). The file and
        SQL drivers read and write under one lock or in one transaction, so no update is lost
        (SQL may call ``function`` again when the database retries the transaction); others read,
        then write. Raises what ``set`` raises; an exception from ``function`` writes nothing."""
        value = function(self.get(key, namespace))
        self.set(key, value, namespace, ttl)
        return value

    def forget(self, key: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        validate_key(key)
        validate_namespace(namespace)
        self._call("forget", self._forget, key, namespace, self._now())
        events.emit("memory.forget", driver=self.name, namespace=namespace, key=key)

    def flush(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        validate_namespace(namespace)
        count = self._call("flush", self._flush, namespace)
        events.emit("memory.flush", driver=self.name, namespace=namespace, count=count)

    def all(self, namespace: str = DEFAULT_NAMESPACE) -> dict[str, Any]:
        validate_namespace(namespace)
        entries = self._call("all", self._all, namespace, self._now())
        events.emit("memory.read", driver=self.name, namespace=namespace, key=None, count=len(entries))
        return dict(sorted(entries.items()))

    def search(self, query: str, limit: int = 5, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryHit]:
        validate_namespace(namespace)
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        validate_count("limit", limit)
        hits = self._call("search", self._search, query, limit, namespace, self._now())
        events.emit("memory.search", driver=self.name, namespace=namespace, hits=len(hits), limit=limit)
        return hits

    def namespaces(self) -> list[str]:
        """Return every namespace that holds at least one entry (live or expired), sorted."""
        return sorted(self._call("namespaces", self._namespaces))

    def _namespaces(self) -> list[str]:
        raise NotImplementedError(f"the {self.name} driver cannot list its namespaces")

    def sweep(self, dry_run: bool = False) -> dict[str, int]:
        """Delete expired entries in every namespace; return the count per namespace.

        With ``dry_run`` nothing is deleted and the counts say what would go.
        """
        return self._call("sweep", self._sweep, self._now(), dry_run)

    # -- the operator's read API: expired entries included ---------------------------------
    # Every driver answers these from ``_records``; a driver with an index of its own (SQL)
    # overrides them with queries that give the same answers.

    def records(self, namespace: str = DEFAULT_NAMESPACE) -> list[MemoryRow]:
        """Return every entry of ``namespace``, expired-but-unswept ones included, by key."""
        validate_namespace(namespace)
        rows = self._call("records", self._records, namespace)
        return sorted(rows, key=lambda row: row.key)

    def namespace_counts(self) -> list[NamespaceCount]:
        """Return every namespace with its total, live and expired counts, sorted by name."""
        now = self._now()
        return [self._namespace_count(namespace, now) for namespace in self.namespaces()]

    def _namespace_count(self, namespace: str, now: int) -> NamespaceCount:
        rows = self.stored_records(namespace)
        expired = sum(1 for row in rows if is_expired(row.expires_at, now))
        expiring = sum(1 for row in rows if row.expires_at is not None) - expired
        return NamespaceCount(namespace, len(rows), len(rows) - expired, expired, expiring)

    def rows_per_day(self, edges: Sequence[datetime]) -> list[int] | None:
        """Return how many entries were first written in each interval of ``edges`` (UTC
        midnights, oldest first), or ``None`` from a driver that keeps no write times."""
        return None

    def counts_and_rows_per_day(
        self, edges: Sequence[datetime]
    ) -> tuple[list[NamespaceCount], list[int] | None]:
        """Return :meth:`namespace_counts` and :meth:`rows_per_day` of ``edges`` together (what
        the Overview shows of memory; one statement on a SQL server)."""
        return self.namespace_counts(), self.rows_per_day(edges)

    def newest_write(self) -> datetime | None:
        """Return when any entry was last written, or ``None`` (no entries, or a driver that
        keeps no write times)."""
        moments = [
            row.updated_at for ns in self.namespaces() for row in self.stored_records(ns) if row.updated_at
        ]
        return max(moments, default=None)

    def count(self, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Return how many entries ``namespace`` holds, expired-but-unswept ones included."""
        return len(self.records(namespace))

    def entries(
        self,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        state: str | None = None,
        query: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        sort: str = "key",
        descending: bool | None = None,
    ) -> Page[MemoryRow]:
        """Return a page of a namespace's entries in ``sort`` order (see :data:`SORTS`), the
        other way round than the sort's own when ``descending`` says so. ``state`` is one of
        :data:`FILTERS`, ``query`` matches key or value text (case-insensitive). Raises
        ``ValueError`` for a bad state, sort or limit and ``InvalidCursor`` for a bad cursor,
        or one of another sort or direction."""
        check_filter(state)
        check_sort(sort)
        check_limit(limit)
        start = sort_start(cursor, sort, descending=descending) if cursor else None
        rows = sorted_page(self._matching(namespace, state, query), sort, start, limit + 1, descending)
        return page_of(rows, limit, lambda row: cursor_key(row, sort, descending))

    def count_entries(
        self, namespace: str = DEFAULT_NAMESPACE, *, state: str | None = None, query: str | None = None
    ) -> int:
        """Return how many entries :meth:`entries` lists under the same filters."""
        check_filter(state)
        return len(self._matching(namespace, state, query))

    def _matching(self, namespace: str, state: str | None, query: str | None) -> list[MemoryRow]:
        needle = query.casefold() if query else None
        now = self._now()
        return [
            row
            for row in self.records(namespace)
            if passes_filter(state, row.expires_at, now)
            and (needle is None or needle in row.key.casefold() or needle in _json(row.value).casefold())
        ]

    def entry(self, namespace: str, key: str) -> MemoryRow | None:
        """Return one entry, expired or not, or ``None``."""
        validate_key(key)
        return next((row for row in self.records(namespace) if row.key == key), None)

    # -- operator deletion of rows exactly as stored -----------------------------------------
    # Other programs write these tables too, under namespaces and keys today's rules refuse.
    # An operator must still be able to see and delete such rows; nothing is ever written
    # under such a name.

    def stored_records(self, namespace: str) -> list[MemoryRow]:
        """Return every entry stored under exactly ``namespace`` (expired ones included, by key),
        even a namespace today's rule refuses. Raises ``ValueError`` for text no backend can hold
        (not a str, a NUL, a lone surrogate)."""
        check_stored_name(namespace, "namespace")
        rows = self._call("records", self._records, namespace)
        return sorted(rows, key=lambda row: row.key)

    def delete_stored(self, namespace: str, keys: Sequence[str] | None = None) -> int:
        """Delete ``keys`` of exactly ``namespace`` (every entry of it when ``keys`` is ``None``),
        even names today's rules refuse; a key that is not there is not an error. Returns how
        many entries went for a whole namespace, else how many keys were asked for. Raises
        ``ValueError`` as :meth:`stored_records` does."""
        check_stored_name(namespace, "namespace")
        if keys is None:
            count = self._call("flush", self._flush, namespace)
            events.emit("memory.flush", driver=self.name, namespace=namespace, count=count)
            return count
        now = self._now()
        for key in keys:
            check_stored_name(key, "key")
            self._call("forget", self._forget, key, namespace, now)
            events.emit("memory.forget", driver=self.name, namespace=namespace, key=key)
        return len(keys)

    def fetch(self, namespace: str, keys: Sequence[str]) -> dict[str, MemoryRow]:
        """Return the stored rows of ``keys`` that exist (expired ones included), by key."""
        validate_namespace(namespace)
        wanted = set(keys)
        if not wanted:
            return {}
        found = {row.key: row for row in self._call("fetch", self._fetch, namespace, wanted)}
        events.emit("memory.read", driver=self.name, namespace=namespace, key=None, count=len(found))
        return found

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return [row for row in self._records(namespace) if row.key in keys]

    def fetch_across(self, wanted: Mapping[str, Iterable[str]]) -> dict[tuple[str, str], MemoryRow]:
        """Return the stored rows (expired ones included) of the keys ``wanted`` names in each
        namespace that exist, by ``(namespace, key)``, in one read where the backend can.
        Raises ``InvalidNamespace`` for a namespace the rules refuse, before reading any."""
        asked = {namespace: set(keys) for namespace, keys in wanted.items()}
        for namespace in asked:
            validate_namespace(namespace)
        asked = {namespace: keys for namespace, keys in asked.items() if keys}
        if not asked:
            return {}
        rows = self._call("fetch", self._fetch_across, asked)
        found = {(row.namespace, row.key): row for row in rows}
        for namespace in asked:
            count = sum(1 for row in rows if row.namespace == namespace)
            events.emit("memory.read", driver=self.name, namespace=namespace, key=None, count=count)
        return found

    def _fetch_across(self, wanted: dict[str, set[str]]) -> list[MemoryRow]:
        return [row for namespace, keys in wanted.items() for row in self._fetch(namespace, keys)]

    def find(self, text: str, *, whole: bool = False) -> Iterator[MemoryRow]:
        """Yield every entry, in any namespace and expired ones included, whose key or JSON value
        contains ``text`` exactly (case-sensitive), by namespace then key. ``whole`` says the
        caller reads every match (export, erasure), so a driver may find them all before the first."""
        for namespace in self.namespaces():  # rows another program wrote under any name included
            yield from (row for row in self.stored_records(namespace) if contains_text(row, text))


class FeedingMemory(BaseMemory):
    """A driver that publishes each namespace's change feed, which recall follows in an index
    (:mod:`clawmem.recall.feeds`). A driver that does not subclass it is scanned by recall."""

    def changes(
        self, namespace: str = DEFAULT_NAMESPACE, cursor: Any = None, held: Collection[str] | None = None
    ) -> Changes:
        """Return what changed in ``namespace`` since ``cursor`` (a full read for ``None``): see
        :class:`clawmem.records.Changes`. Pass the returned cursor to the next call, and
        ``held``, the keys the copy holds, with every call or with none: a driver may then ask
        the copy rather than keep every key itself."""
        validate_namespace(namespace)
        return self._call("changes", self._changes, namespace, cursor, held)

    @abc.abstractmethod
    def _changes(self, namespace: str, cursor: Any, held: Collection[str] | None = None) -> Changes: ...


def check_stored_name(name: object, what: str) -> str:
    """Return ``name`` if it is text a backend can have stored (a str without NUL or lone
    surrogates), whatever today's naming rules say; else raise ``ValueError`` naming ``what``."""
    if not isinstance(name, str) or "\x00" in name:
        raise ValueError(f"a stored {what} is a str without NUL characters, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"a stored {what} holds no lone surrogates, got {name!r}") from None
    return name


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


__all__ = [
    "DEFAULT_NAMESPACE",
    "FILTERS",
    "BaseMemory",
    "FeedingMemory",
    "MemoryInterface",
    "SearchableMemory",
]
