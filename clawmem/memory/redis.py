"""RedisMemory: one Redis string per entry plus a sorted-set index per namespace.

Layout under ``prefix`` (``P``) for namespace ``N``::

    P{N}:k:<key>   the entry, JSON ``[expires_at, value]``; a Redis TTL when it has a ttl
    P{N}:i         sorted set of the namespace's keys, scored by expires_at (+inf: never)
    P{N}:log       stream of the namespace's changes (a key written or deleted, a flush, a
                   sweep), capped at about 10,000, from which recall indexes catch up
    P{N}:v         hash of the entries' vectors, derived (see :mod:`clawmem.memory.redis_vectors`)
    Pnamespaces    set of namespaces that have an index, for the sweeper
    Pvectors       set of namespaces that have a vectors hash

Neither namespaces nor prefixes contain braces, so the layout is injective: ``a`` never sees
``a:b``, and two prefixes never share a key, even when one is a string prefix of the other
(every key is ``P`` followed by ``{``, or ``P`` followed by exactly ``namespaces`` or
``vectors``). The
registry gives each site the prefix ``{table_prefix}phpclaw:``, and that keeps sites apart.
Every command touches one namespace's keys of one prefix only; ``KEYS`` and ``SCAN`` are never
used.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Collection, Iterator
from typing import Any

import redis

from clawmem.clock import Clock
from clawmem.codecs import decode_json_value, warn_unreadable
from clawmem.crypto.stored import StoredValues, warn_undecryptable
from clawmem.errors import ConfigError, CorruptEntryError, Undecryptable, redact
from clawmem.loop import installed, on_async_path
from clawmem.memory.base import FeedingMemory
from clawmem.memory.redis_loop import can_await, client_on_loop
from clawmem.memory.redis_vectors import RedisVectorBacking, drop_vector_fields
from clawmem.records import Changes, MemoryRow
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, is_expired, problem_in
from clawmem.settings import CONNECT_TIMEOUT_SECONDS, REDIS_READ_TIMEOUT_SECONDS

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "phpclaw:"
_BATCH = 1000  # keys per MGET/DEL/EXISTS, so no single command grows with the namespace
LOG_LENGTH = 10_000  # changes kept per namespace; an index further behind reads it again whole


def _text(raw: bytes | str) -> str:
    # A caller's client may or may not decode responses.
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


def _shown(raw: bytes | str) -> str:
    """Return what a key holds as text a page can show: bytes that are not UTF-8 as U+FFFD."""
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw


class UnreadableEntry(CorruptEntryError):
    """An entry another program wrote that clawmem cannot read: not strict JSON, not in its
    layout, or holding a value no page can show safely. The message names the Redis key, never
    the value; ``reason`` is what the operator's pages and the export say of it."""

    def __init__(self, message: str, reason: str = "value cannot be decoded") -> None:
        super().__init__(message)
        self.reason = reason


def _batches(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), _BATCH):
        yield items[start : start + _BATCH]


def encode_entry(encoded: str, expires_at: int | None) -> str:
    """Return the stored form of an entry: JSON ``[expires_at, value]``."""
    return f"[{'null' if expires_at is None else expires_at},{encoded}]"


def encode_sealed(sealed: str, expires_at: int | None) -> str:
    """Return the stored form of a sealed entry: JSON ``[expires_at, null, envelope]``, three
    items so it is never read as a plain ``[expires_at, value]`` whose value looks sealed."""
    return f"[{'null' if expires_at is None else expires_at},null,{json.dumps(sealed)}]"


def _layout(raw: bytes | str) -> list[Any] | None:
    """Return the items of an entry in the layout (``[expires_at, value]`` or ``[expires_at,
    null, envelope]``, strict JSON), or ``None`` for anything else."""
    try:
        data = decode_json_value(_text(raw))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not (isinstance(data, list) and len(data) in (2, 3) and (data[0] is None or type(data[0]) is int)):
        return None
    if len(data) == 3 and (data[1] is not None or not isinstance(data[2], str)):
        return None
    return data


def decode_entry(
    raw: bytes | str, redis_key: str, values: StoredValues | None = None, place: tuple[str, str] = ("", "")
) -> tuple[int | None, Any]:
    """Return ``(expires_at, value)`` of a stored entry. Raises :class:`UnreadableEntry` (a
    :class:`CorruptEntryError`) naming the key when it is not strict JSON (``NaN``, ``1e999``
    and text that is not UTF-8 are not), not in the layout, or its value cannot be shown safely
    (see :func:`~clawmem.rules.problem_in`); and :class:`~clawmem.errors.Undecryptable`
    when a sealed one (or, in strict mode, a plain one) cannot be opened with ``values``' cipher
    for ``place`` (namespace, key)."""
    data = _layout(raw)
    if data is None:
        raise UnreadableEntry(f"Redis key {redis_key!r} does not hold [expires_at, value] as JSON")
    text = _text(raw)
    if len(data) == 3:
        values = values or StoredValues()
        text = values.open(*place, data[2])
        try:
            value = decode_json_value(text)
        except (ValueError, RecursionError):
            raise UnreadableEntry(f"Redis key {redis_key!r}: its sealed value is not JSON") from None
    else:
        if values is not None and values.cipher.strict:
            values.open(*place, "")  # strict mode refuses plaintext: raises PlaintextRefused
        value = data[1]
    problem = problem_in(value, text)
    if problem is not None:
        raise UnreadableEntry(f"the value of Redis key {redis_key!r} {problem}", f"value {problem}")
    return data[0], value


def _stream_id(raw: bytes | str) -> tuple[int, int]:
    milliseconds, _, sequence = _text(raw).partition("-")
    return int(milliseconds), int(sequence or 0)


class RedisMemory(FeedingMemory):
    """Keeps entries in Redis with server-side expiry and an exact expiry check on every read.

    Give a ``url`` (default ``redis://127.0.0.1:6379/0``) or a ready ``client``, not both.
    Every key it touches starts with ``prefix``, which must not contain ``{`` or ``}``
    (``ValueError``). ``ttl=None`` never expires.
    Failures raise ``StorageError`` without the URL's password.
    """

    name = "redis"
    backend_errors = (redis.RedisError, CorruptEntryError)

    def __init__(
        self,
        url: str | None = None,
        client: redis.Redis | None = None,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock = time.time,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        super().__init__(clock, max_value_bytes)
        if url is not None and client is not None:
            raise ValueError("give RedisMemory a url or a client, not both")
        if not isinstance(prefix, str):
            raise TypeError(f"the Redis key prefix must be a str, got {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            # A brace in the prefix would let one prefix's keys parse as another's.
            raise ValueError(f"the Redis key prefix must not contain '{{' or '}}', got {prefix!r}")
        self.prefix = prefix
        if client is None:
            try:
                client = redis.Redis.from_url(
                    url or DEFAULT_URL,
                    socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    socket_timeout=REDIS_READ_TIMEOUT_SECONDS,
                )
            except ValueError as exc:
                raise ConfigError(f"invalid Redis URL {redact(url or DEFAULT_URL)!r}: {exc}") from None
        self._client = client

    @property
    def client(self) -> Any:
        """The Redis client: the one given or made, or on the async path its twin on the loop
        (:mod:`clawmem.memory.redis_loop`)."""
        if on_async_path() and can_await(self._client):
            return client_on_loop(self._client)
        return self._client

    @property
    def async_ready(self) -> bool:
        """Whether this driver's calls take the async path
        (:func:`clawmem.integrations.aio.driver_on_loop`)."""
        return can_await(self._client) and installed("redis")

    # -- key layout ------------------------------------------------------------------------

    def entry_key(self, key: str, namespace: str) -> str:
        """Return the Redis key that holds ``key`` of ``namespace``."""
        return f"{self.prefix}{{{namespace}}}:k:{key}"

    def index_key(self, namespace: str) -> str:
        """Return the Redis key of the sorted set that indexes ``namespace``."""
        return f"{self.prefix}{{{namespace}}}:i"

    def log_key(self, namespace: str) -> str:
        """Return the Redis key of the stream of ``namespace``'s changes."""
        return f"{self.prefix}{{{namespace}}}:log"

    def _log(self, pipe: Any, namespace: str, **change: Any) -> None:
        pipe.xadd(self.log_key(namespace), change, maxlen=LOG_LENGTH, approximate=True)

    @property
    def namespaces_key(self) -> str:
        """Return the Redis key of the set of namespaces that have an index."""
        return f"{self.prefix}namespaces"

    def vector_key(self, namespace: str) -> str:
        """Return the Redis key of the hash of ``namespace``'s vectors."""
        return f"{self.prefix}{{{namespace}}}:v"

    @property
    def vectors_key(self) -> str:
        """Return the Redis key of the set of namespaces that have a vectors hash."""
        return f"{self.prefix}vectors"

    def vector_backing(self) -> RedisVectorBacking:
        """Return the vectors hashes as recall's persisted vectors keep them."""
        return RedisVectorBacking(self)

    # -- primitives ------------------------------------------------------------------------

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        redis_key = self.entry_key(key, namespace)
        raw = self.client.get(redis_key)
        if raw is None:
            return False, None
        expires_at, value = decode_entry(raw, redis_key, self.values, (namespace, key))
        # Redis may not have dropped the key yet; the injected clock decides, as on every driver.
        return (True, value) if not is_expired(expires_at, now) else (False, None)

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        pipe = self.client.pipeline(transaction=True)
        # A plain SET (no EX) also clears a TTL left by an earlier set.
        ttl = None if expires_at is None else expires_at - now
        if self.encrypted:
            stored = encode_sealed(self.values.seal(namespace, key, encoded), expires_at)
        else:
            stored = encode_entry(encoded, expires_at)
        pipe.set(self.entry_key(key, namespace), stored, ex=ttl)
        pipe.zadd(self.index_key(namespace), {key: math.inf if expires_at is None else expires_at})
        pipe.sadd(self.namespaces_key, namespace)
        self._log(pipe, namespace, k=key)
        pipe.execute()

    def _forget(self, key: str, namespace: str, now: int) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.entry_key(key, namespace))
        pipe.zrem(self.index_key(namespace), key)
        # The entry's vector goes with it: it would tell what the entry said.
        pipe.hdel(self.vector_key(namespace), key)
        self._log(pipe, namespace, k=key)
        pipe.execute()

    def _flush(self, namespace: str) -> int:
        index = self.index_key(namespace)

        batches = 0

        def clear(pipe: Any) -> None:
            nonlocal batches
            keys = [self.entry_key(_text(member), namespace) for member in pipe.zrange(index, 0, -1)]
            pipe.multi()
            batches = 0
            for batch in _batches(keys):
                pipe.delete(*batch)
                batches += 1
            pipe.delete(index, self.vector_key(namespace))  # the vectors go with the entries
            pipe.srem(self.namespaces_key, namespace)
            self._log(pipe, namespace, flush=1)

        # WATCH the index: a concurrent set of a new key retries the flush instead of orphaning it.
        results = self.client.transaction(clear, index)
        return sum(results[:batches])

    def _entry(
        self, raw: bytes | str, key: str, namespace: str, recalling: bool = False
    ) -> tuple[int, int | None, Any, str | None]:
        """Return ``(value bytes, expires_at, value, unreadable)`` of a stored entry: one that
        cannot be decrypted has the value ``None`` and says why, and one another program wrote
        that cannot be read has what the key holds as its value and says why, so a list shows
        each marked. With ``recalling``, the latter is logged as skipped by recall (its key)."""
        redis_key = self.entry_key(key, namespace)
        try:
            expires_at, value = decode_entry(raw, redis_key, self.values, (namespace, key))
        except Undecryptable as exc:
            warn_undecryptable(exc)
            return len(_text(raw).encode("utf-8")), None, None, f"value cannot be decrypted ({exc.reason})"
        except UnreadableEntry as exc:
            if recalling:
                warn_unreadable(namespace, key)
            shown = _shown(raw)
            return len(shown.encode("utf-8")), None, shown, exc.reason
        # The stored form wraps the value's JSON in "[expires_at," and "]".
        size = len(_text(raw).encode("utf-8")) - len(encode_entry("", expires_at))
        return size, expires_at, value, None

    def _stored(
        self, namespace: str, low: str, recalling: bool = False
    ) -> list[tuple[str, int, int | None, Any, str | None]]:
        """Return ``(key, value bytes, expires_at, value, unreadable)`` of the indexed entries
        scored above ``low`` that Redis still holds, dropping index members whose entry it
        already expired (``recalling`` as :meth:`_entry` takes it)."""
        members = [
            _text(member) for member in self.client.zrangebyscore(self.index_key(namespace), low, "+inf")
        ]
        pipe = self.client.pipeline(transaction=False)
        for batch in _batches(members):
            pipe.mget([self.entry_key(key, namespace) for key in batch])
        raws = [raw for batch in pipe.execute() for raw in batch]
        found = []
        vanished: list[str] = []
        for key, raw in zip(members, raws, strict=True):
            if raw is None:
                vanished.append(key)
                continue
            found.append((key, *self._entry(raw, key, namespace, recalling)))
        if vanished:
            self._drop_vanished(namespace, vanished)
        return found

    def _redis_expiries(self, namespace: str, keys: list[str]) -> dict[str, int]:
        """Return ``expires_at`` of the ``keys`` stored without one that Redis itself will expire
        (another program's ``SET … EX``): the operator sees the TTL Redis holds, not "never".
        Only the operator's read API asks; a turn's recall never pays for it."""
        if not keys:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(self.entry_key(key, namespace))
        now = self._now()
        return {
            key: now + math.ceil(left / 1000)
            for key, left in zip(keys, pipe.execute(), strict=True)
            if left is not None and left > 0
        }

    def _all(self, namespace: str, now: int) -> dict[str, Any]:
        # Scored by expires_at, so "score > now" is exactly the live members.
        stored = self._stored(namespace, f"({now}", recalling=True)
        live = (entry for entry in stored if not entry[4] and not is_expired(entry[2], now))
        return {key: value for key, _, _, value, _ in live}

    def _records(self, namespace: str, recalling: bool = False) -> list[MemoryRow]:
        stored = self._stored(namespace, "-inf", recalling)
        timed = self._redis_expiries(namespace, [key for key, _, expiry, _, _ in stored if expiry is None])
        return [
            MemoryRow(
                namespace,
                key,
                value,
                expires_at if expires_at is not None else timed.get(key),
                size,
                unreadable=bad,
                raw_value=bad is not None,
            )
            for key, size, expires_at, value, bad in stored
        ]

    def _drop_vanished(self, namespace: str, keys: list[str]) -> None:
        """Remove index members whose entry Redis already dropped (its own expiry or eviction)."""
        index = self.index_key(namespace)
        entry_keys = [self.entry_key(key, namespace) for key in keys]

        def remove(pipe: Any) -> None:
            # One MGET per batch instead of one EXISTS round trip per key.
            raws = [raw for batch in _batches(entry_keys) for raw in pipe.mget(batch)]
            gone = [key for key, raw in zip(keys, raws, strict=True) if raw is None]
            pipe.multi()
            if gone:
                pipe.zrem(index, *gone)
                drop_vector_fields(pipe, self.vector_key(namespace), gone)
                for key in gone:
                    self._log(pipe, namespace, k=key)

        # Watching the entries too: a concurrent set revives one without changing its index score.
        self.client.transaction(remove, index, *entry_keys)

    def _indexed_namespaces(self) -> list[str]:
        """Return the members of the namespaces set (indexes that may since have emptied)."""
        return [_text(name) for name in self.client.smembers(self.namespaces_key)]

    def _namespaces(self) -> list[str]:
        names = self._indexed_namespaces()
        pipe = self.client.pipeline(transaction=False)
        for namespace in names:
            pipe.zcard(self.index_key(namespace))
        return [namespace for namespace, size in zip(names, pipe.execute(), strict=True) if size]

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        counts: dict[str, int] = {}
        for namespace in sorted(self._indexed_namespaces()):
            expired = self._sweep_namespace(namespace, now, dry_run)
            if expired:
                counts[namespace] = expired
        return counts

    def _sweep_namespace(self, namespace: str, now: int, dry_run: bool) -> int:
        """Delete (or with ``dry_run`` count) the namespace's entries expired at ``now``.

        Counts only entries still in Redis; an index member whose key Redis already dropped is
        removed from the index without being counted.
        """
        index = self.index_key(namespace)
        if dry_run:
            expired = self.client.zrangebyscore(index, "-inf", now)
            keys = [self.entry_key(_text(member), namespace) for member in expired]
            return sum(self.client.exists(*batch) for batch in _batches(keys))

        deletes = 0

        def prune(pipe: Any) -> None:
            nonlocal deletes
            expired = pipe.zrangebyscore(index, "-inf", now)
            emptied = len(expired) == pipe.zcard(index)
            keys = [self.entry_key(_text(member), namespace) for member in expired]
            pipe.multi()
            deletes = 0
            for batch in _batches(keys):
                pipe.delete(*batch)
                deletes += 1
            pipe.zremrangebyscore(index, "-inf", now)
            drop_vector_fields(pipe, self.vector_key(namespace), [_text(member) for member in expired])
            if emptied:
                pipe.srem(self.namespaces_key, namespace)
            self._log(pipe, namespace, sweep=now)

        # WATCH the index: a concurrent set that renews an expired key retries the sweep.
        results = self.client.transaction(prune, index)
        return sum(results[:deletes])

    # -- the recall index -----------------------------------------------------------------------

    def _changes(self, namespace: str, cursor: Any, held: Collection[str] | None = None) -> Changes:
        """Follow the namespace's change stream: a cursor is the id of the last change read."""
        if cursor is None:
            return self._everything(namespace)
        log = self.log_key(namespace)
        changes = self.client.xrange(log, f"({cursor}", "+")
        if not changes:
            return Changes(cursor)
        if cursor == "0-0":
            # The log was empty when the copy was made, so no id tells whether it was cut
            # since; approximate trimming never cuts it below LOG_LENGTH, so a shorter log
            # still holds every change.
            cut = len(changes) >= LOG_LENGTH
        else:
            oldest = self.client.xrange(log, "-", "+", count=1)
            cut = _stream_id(oldest[0][0]) > _stream_id(cursor)
        if cut:
            return self._everything(namespace)  # the log was cut past what the copy had seen
        changed: set[str] = set()
        reset, swept_at = False, None
        for change_id, fields in changes:
            change = {_text(name): _text(value) for name, value in fields.items()}
            if "flush" in change:
                reset, swept_at = True, None
                changed.clear()
            elif "sweep" in change:
                swept_at = max(int(change["sweep"]), swept_at or 0)
            else:
                changed.add(change["k"])
            cursor = _text(change_id)
        found = {row.key: row for row in self._stored_keys(namespace, sorted(changed), recalling=True)}
        entries = [(row.key, row.value, row.expires_at) for row in found.values() if not row.unreadable]
        # A key another program overwrote with what recall cannot read leaves the copy too.
        gone = [key for key in changed if key not in found or found[key].unreadable]
        return Changes(cursor, entries, gone, reset=reset, swept_at=None if reset else swept_at)

    def _everything(self, namespace: str) -> Changes:
        newest = self.client.xrevrange(self.log_key(namespace), "+", "-", count=1)
        cursor = _text(newest[0][0]) if newest else "0-0"
        rows = self._records(namespace, recalling=True)
        entries = [(row.key, row.value, row.expires_at) for row in rows if not row.unreadable]
        return Changes(cursor, entries, reset=True)

    def _stored_keys(self, namespace: str, keys: list[str], recalling: bool = False) -> list[MemoryRow]:
        rows = []
        for batch in _batches(keys):
            raws = self.client.mget([self.entry_key(key, namespace) for key in batch])
            for key, raw in zip(batch, raws, strict=True):
                if raw is not None:
                    size, expires_at, value, bad = self._entry(raw, key, namespace, recalling)
                    unread = {"unreadable": bad, "raw_value": bad is not None}
                    rows.append(MemoryRow(namespace, key, value, expires_at, size, **unread))
        return rows

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return self._stored_keys(namespace, sorted(keys))

    # -- stored text, for a key rotation (SPEC 13) --------------------------------------------

    def stored_texts(self, namespace: str) -> list[tuple[str, str, str]]:
        """Return ``(key, text, raw)`` of every entry of ``namespace`` Redis holds, expired ones
        included: ``text`` is a sealed entry's envelope, or a plain entry's value as JSON; ``raw``
        is what the key holds. Opens nothing. An entry another program wrote that is not in the
        layout (see :func:`decode_entry`) is left out: no key of the site sealed it."""
        members = [_text(member) for member in self.client.zrange(self.index_key(namespace), 0, -1)]
        found = []
        for batch in _batches(members):
            for key, raw in zip(
                batch, self.client.mget([self.entry_key(key, namespace) for key in batch]), strict=True
            ):
                data = None if raw is None else _layout(raw)
                if data is None:
                    continue
                text = data[2] if len(data) == 3 else json.dumps(data[1], ensure_ascii=False)
                found.append((key, text, _text(raw)))
        return found

    def replace_texts(self, namespace: str, changes: list[tuple[str, str, str]]) -> int:
        """Store each ``(key, raw read, new envelope)`` as the entry's sealed value, keeping its
        expiry and TTL, only where the key still holds ``raw``; return how many changed."""
        pipe = self.client.pipeline(transaction=False)
        for key, raw, sealed in changes:
            expires_at = json.loads(raw)[0]
            pipe.eval(_REPLACE_LUA, 1, self.entry_key(key, namespace), raw, encode_sealed(sealed, expires_at))
        return sum(int(done) for done in pipe.execute())


_REPLACE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""
