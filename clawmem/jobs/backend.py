"""The queue's own storage: Huey on SQLite (one machine) or Redis (many), chosen by CLAW_QUEUE_URL.

What clawmem keeps there beside Huey's tasks, all under the queue's name (one per site):

- a queued turn's payload, ``clawmem.turn.<conversation id>.<n>`` for the conversation's n-th
  queued turn, sealed by :class:`PayloadSeal` (encrypted when encryption at rest is on),
  deleted when the job ends: while it is there, the turn after it waits;
- each conversation's turn counter ``clawmem.seq.<conversation id>``, which numbers its turns;
- expiring locks (:class:`ExpiringLock`), whose expiry is read on the injected clock: the
  reaper's and retention's, and each job's claim ``clawmem.lock.job.<job id>``, held by the one
  worker that runs it (its lease).

None of it is one of the three tables.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from clawmem.clock import Clock
from clawmem.crypto import PLAIN, Cipher, Context
from clawmem.errors import ConfigError, StorageError, Undecryptable, redact
from clawmem.settings import CONNECT_TIMEOUT_SECONDS, ENV_PREFIX, REDIS_READ_TIMEOUT_SECONDS, Settings

QUEUE_SCHEMES = ("sqlite", "redis", "rediss")
QUEUE_NAMESPACE = "clawmem.queue"  # where a payload's associated data says it lives
_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_]")

# Takes the claim (KEYS[1]) for ARGV[1] unless another token (ARGV[3]) holds it unexpired at
# ARGV[2], when it returns REFUSED: the one check both scripts below begin with.
_CLAIM_LUA = """
local held = redis.call('GET', KEYS[1])
if held then
  local ok, current = pcall(cjson.decode, held)
  if ok and type(current) == 'table' and tonumber(current['expires_at']) and
     tonumber(current['expires_at']) > tonumber(ARGV[2]) and current['token'] ~= ARGV[3] then
    return REFUSED
  end
end
redis.call('SET', KEYS[1], ARGV[1])
"""
_ACQUIRE_LUA = _CLAIM_LUA.replace("REFUSED", "0") + "return 1\n"
# The same, then the payload (field ARGV[4] of KEYS[2]) read in the same step.
_READ_PAYLOAD_LUA = """local data = redis.call('HGET', KEYS[2], ARGV[4])
if data then
  return {1, data}
end
return {1}
"""
_ACQUIRE_READING_LUA = _CLAIM_LUA.replace("REFUSED", "{0}") + _READ_PAYLOAD_LUA
_RELEASE_DROPPING_LUA = """
local dropped = redis.call('HDEL', KEYS[2], ARGV[2])
local held = redis.call('GET', KEYS[1])
if held then
  local ok, current = pcall(cjson.decode, held)
  if ok and type(current) == 'table' and current['token'] == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
end
return dropped
"""
_RELEASE_LUA = """
local held = redis.call('GET', KEYS[1])
if held then
  local ok, current = pcall(cjson.decode, held)
  if ok and type(current) == 'table' and current['token'] == ARGV[1] then
    return redis.call('DEL', KEYS[1])
  end
end
return 0
"""
_RENEW_LUA = """
local held = redis.call('GET', KEYS[1])
if held then
  local ok, current = pcall(cjson.decode, held)
  if ok and type(current) == 'table' and current['token'] == ARGV[2] then
    redis.call('SET', KEYS[1], ARGV[1])
    return 1
  end
end
return 0
"""


@dataclass(frozen=True)
class QueueLocation:
    """Where a queue lives: ``sqlite`` and the file, or ``redis`` and the URL (password masked)."""

    kind: str
    where: str
    name: str


def queue_name(settings: Settings) -> str:
    """Return the Huey queue name of the settings' site: ``clawmem`` and the table prefix, so two
    sites on one Redis never share a queue."""
    return (
        "clawmem_" + _NAME_CHARACTERS.sub("_", settings.table_prefix) if settings.table_prefix else "clawmem"
    )


def queue_location(settings: Settings) -> QueueLocation:
    """Return where the settings' queue lives; raises :class:`ConfigError` in one line for a
    ``CLAW_QUEUE_URL`` of another scheme, or a SQLite URL without a file."""
    url = settings.queue_url
    scheme = urlsplit(url).scheme.lower()
    if scheme not in QUEUE_SCHEMES:
        raise ConfigError(
            f"{ENV_PREFIX}QUEUE_URL must start with sqlite:/// (a file) or redis:// (rediss://), "
            f"got {redact(url)!r}"
        )
    if scheme == "sqlite":
        path = url.split(":///", 1)[1] if ":///" in url else ""
        if not path:
            raise ConfigError(f"{ENV_PREFIX}QUEUE_URL sqlite:/// needs a file path, got {redact(url)!r}")
        return QueueLocation("sqlite", path, queue_name(settings))
    return QueueLocation("redis", redact(url), queue_name(settings))


def queue_errors() -> tuple[type[Exception], ...]:
    """Return what a queue raises when it cannot be reached or read: the job records'
    :class:`StorageError`, the file system's and SQLite's errors and, when the redis module is
    installed, Redis's."""
    errors: list[type[Exception]] = [StorageError, OSError, sqlite3.Error]
    try:
        import redis
    except ImportError:
        pass
    else:
        errors.append(redis.RedisError)
    return tuple(errors)


def open_huey(settings: Settings) -> Any:
    """Return the Huey instance of the settings' queue (results off: a job's outcome is its record
    in ``phpclaw_jobs``, so Huey's result store never accumulates). Raises :class:`ConfigError`
    when Huey (extra ``clawmem[worker]``) or, for Redis, the redis module is not installed."""
    location = queue_location(settings)
    try:
        from huey import RedisHuey, SqliteHuey
    except ImportError:
        raise ConfigError(
            "background work needs the huey module, which is not installed: pip install 'clawmem[worker]'"
        ) from None
    if location.kind == "sqlite":
        from huey.storage import SqliteStorage

        class QueueFile(SqliteStorage):
            """Huey's SQLite storage with clawmem's own SQLite settings: commits durable in WAL
            mode short of a power cut, and deleted payloads overwritten, not left in free pages."""

            def _create_connection(self) -> Any:
                connection = super()._create_connection()
                connection.execute("pragma synchronous = NORMAL")
                connection.execute("pragma secure_delete = ON")
                return connection

        Path(location.where).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return SqliteHuey(
            location.name, filename=location.where, results=False, utc=True, storage_class=QueueFile
        )
    try:
        import redis
    except ImportError:
        raise ConfigError("a redis:// queue needs the redis module: pip install 'clawmem[redis]'") from None
    # The pool is built here, not by Huey from the URL, so its connections get the timeouts.
    pool = redis.ConnectionPool.from_url(
        settings.queue_url,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=REDIS_READ_TIMEOUT_SECONDS,
    )
    return RedisHuey(location.name, connection_pool=pool, results=False, utc=True, clean_name=False)


class PayloadSeal:
    """Turns a queued turn's payload into the bytes the queue stores, and back.

    With encryption on (a ``cipher`` with keys), the payload's JSON, which holds the customer's
    message, is sealed as the tables' columns are, bound to the queue key it is stored under
    (and the site), so the queue's storage never holds the message in plain and a payload moved
    to another key does not open. Without keys the bytes are the JSON.
    """

    def __init__(self, cipher: Cipher | None = None, site: str = "") -> None:
        self.cipher = cipher if cipher is not None else PLAIN
        self.site = site

    def _context(self, key: str) -> Context:
        return Context.entry(self.site, QUEUE_NAMESPACE, key, "payload")

    def seal(self, key: str, payload: dict[str, Any]) -> bytes:
        """Return ``payload`` as the bytes stored under ``key`` (sealed when encryption is on)."""
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return self.cipher.seal(text, self._context(key)).encode("utf-8")

    def open(self, key: str, sealed: bytes) -> dict[str, Any]:
        """Return the payload :meth:`seal` made for ``key``; raises ``ValueError`` if damaged,
        and :class:`clawmem.errors.Undecryptable` (naming the key, never the payload) when it is
        sealed and cannot be opened."""
        try:
            text = bytes(sealed).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{key}: the queued payload is damaged") from None
        text = self.cipher.open(text, self._context(key))
        try:
            payload = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"{key}: the queued payload is damaged") from None
        if not isinstance(payload, dict):
            raise ValueError(f"{key}: the queued payload is not an object")
        return payload


class QueueStore:
    """clawmem's own keys in the queue's storage (see the module docstring)."""

    def __init__(self, huey: Any, seal: PayloadSeal | None = None) -> None:
        self.huey = huey
        self.storage = huey.storage
        self.seal = seal or PayloadSeal()

    def _get(self, key: str) -> bytes | None:
        from huey.constants import EmptyData

        found = self.storage.peek_data(key)
        return None if found is EmptyData else bytes(found)

    # payloads, one per queued turn, at its place in its conversation
    @staticmethod
    def _turn_key(conversation_id: str, position: int) -> str:
        return f"clawmem.turn.{conversation_id}.{position}"

    def put_turn(self, job_id: str, conversation_id: str, payload: dict[str, Any]) -> int:
        """Number a new turn of the conversation (1, 2, ...), store its payload there and return
        the number."""
        counter = f"clawmem.seq.{conversation_id}"
        if _on_redis(self.storage):
            position = int(self.storage.incr(counter))
            key = self._turn_key(conversation_id, position)
            self.storage.put_data(key, self._sealed_turn(key, job_id, conversation_id, position, payload))
            return position
        # On SQLite the number and the payload are written in one transaction: one commit, and
        # no moment when the conversation's turn n is numbered but not yet stored.
        storage = self.storage
        with storage.db(commit=True) as cursor:
            cursor.execute(
                "insert into counter (queue, key, value) values (?, ?, 1) "
                "on conflict (queue, key) do update set value = value + 1",
                (storage.name, counter),
            )
            cursor.execute("select value from counter where queue = ? and key = ?", (storage.name, counter))
            position = int(cursor.fetchone()[0])
            key = self._turn_key(conversation_id, position)
            sealed = self._sealed_turn(key, job_id, conversation_id, position, payload)
            cursor.execute(
                "insert or replace into kv (queue, key, value) values (?, ?, ?)", (storage.name, key, sealed)
            )
        return position

    def _sealed_turn(
        self, key: str, job_id: str, conversation_id: str, position: int, payload: dict[str, Any]
    ) -> bytes:
        value = {**payload, "job_id": job_id, "conversation_id": conversation_id, "position": position}
        return self.seal.seal(key, value)

    def turn(self, job_id: str, conversation_id: str, position: int) -> dict[str, Any] | None:
        """Return the payload of job ``job_id``, the conversation's turn ``position``, or
        ``None`` once that job ended or was cancelled."""
        key = self._turn_key(conversation_id, position)
        return self.job_payload(job_id, key, self._get(key))

    def claim_turn(
        self, job_id: str, conversation_id: str, position: int, ttl: float, clock: Clock = time.time
    ) -> tuple[ExpiringLock | None, dict[str, Any] | None]:
        """Take job ``job_id``'s claim for ``ttl`` seconds and read its payload (the
        conversation's turn ``position``) in one atomic step; return the claim, or ``None``
        when another holds it, and the payload as :meth:`turn` gives it."""
        claim = self.claim(job_id, clock)
        key = self._turn_key(conversation_id, position)
        taken, found = claim.acquire_reading(ttl, key)
        if not taken:
            return None, None
        try:
            return claim, self.job_payload(job_id, key, found)
        except BaseException:
            claim.release()
            raise

    def job_payload(self, job_id: str, key: str, found: bytes | None) -> dict[str, Any] | None:
        """Return the payload stored as ``found`` under ``key`` if it is job ``job_id``'s, else
        ``None``; raises as :meth:`PayloadSeal.open` does."""
        if found is None:
            return None
        payload = self.seal.open(key, found)
        return payload if payload.get("job_id") == job_id else None

    def end_turn(self, claim: ExpiringLock, conversation_id: str, position: int) -> bool:
        """Delete a turn's payload and give up its job's ``claim``, in one atomic step; return
        whether the payload was there."""
        return claim.release_dropping(self._turn_key(conversation_id, position))

    def turn_at(self, conversation_id: str, position: int) -> dict[str, Any] | None:
        """Return the payload of the conversation's turn ``position``, whichever job it is, or
        ``None``; raises as :meth:`PayloadSeal.open` does."""
        key = self._turn_key(conversation_id, position)
        found = self._get(key)
        return None if found is None else self.seal.open(key, found)

    def turn_waiting(self, conversation_id: str, position: int) -> bool:
        """Return whether the conversation's turn ``position`` is still queued or running."""
        return self._get(self._turn_key(conversation_id, position)) is not None

    def drop_turn(self, conversation_id: str, position: int) -> bool:
        """Delete a turn's payload; return whether it was there (atomic: one caller wins)."""
        from huey.constants import EmptyData

        return self.storage.pop_data(self._turn_key(conversation_id, position)) is not EmptyData

    def turns(self) -> list[dict[str, Any]]:
        """Return every queued turn's payload (for erasure: rare, reads them all)."""
        found = []
        for key, value in self.storage.result_items().items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            if name.startswith("clawmem.turn."):
                try:
                    found.append(self.seal.open(name, value))
                except (ValueError, Undecryptable):
                    continue
        return found

    # scheduled retention
    def last_retention_tick(self) -> float | None:
        """Return the tick (Unix seconds) of the site's last scheduled retention run, or ``None``."""
        found = self._get("clawmem.retention.tick")
        try:
            return None if found is None else float(found.decode())
        except ValueError:
            return None

    def set_last_retention_tick(self, tick: float) -> None:
        """Record that the retention run of ``tick`` has started."""
        self.storage.put_data("clawmem.retention.tick", repr(float(tick)).encode())

    def lock(self, name: str, clock: Clock = time.time) -> ExpiringLock:
        """Return the site-wide expiring lock ``name``."""
        return ExpiringLock(self.huey, name, clock)

    def claim(self, job_id: str, clock: Clock = time.time) -> ExpiringLock:
        """Return the claim of job ``job_id``: whoever holds it (a worker running the job, the
        reaper or an erasure settling it) is the only one that may change the job."""
        return ExpiringLock(self.huey, f"job.{job_id}", clock)

    def handed_over(self, task_name: str) -> set[str]:
        """Return the job ids of the tasks named ``task_name`` that wait in the queue or in its
        schedule (a deferred or retried turn): reads both whole, so the reaper asks only when a
        job's hand-over lease has run out. A task that cannot be read is left out."""
        found: set[str] = set()
        for data in [*self.storage.enqueued_items(), *self.storage.scheduled_items()]:
            try:
                message = self.huey.serializer.deserialize(data)
            except Exception:  # another program's or another version's task: not one of ours
                continue
            name, arguments = getattr(message, "name", ""), getattr(message, "args", None)
            if (name == task_name or str(name).endswith("." + task_name)) and arguments:
                found.add(str(arguments[0]))
        return found


class ExpiringLock:
    """A lock shared by every worker of a site, on every host, that lapses at its expiry.

    Huey's own task lock never expires, so a worker killed while holding it would hold it for
    ever; this one holds ``{"token", "expires_at"}`` (Unix seconds on the injected clock) and is
    taken atomically: in one exclusive SQLite transaction, or one Redis script.
    """

    def __init__(self, huey: Any, name: str, clock: Clock = time.time) -> None:
        self.huey = huey
        self.name = name
        self.clock = clock
        self.key = f"clawmem.lock.{name}"
        self.token: str | None = None

    def acquire(self, ttl: float) -> bool:
        """Take the lock for ``ttl`` seconds (or extend it, when held by this object); return
        whether it is now held."""
        return self._acquire(ttl, None)[0]

    def acquire_reading(self, ttl: float, data_key: str) -> tuple[bool, bytes | None]:
        """Take the lock as :meth:`acquire` does and, in the same atomic step (one Redis script,
        one SQLite transaction), read the queue's data ``data_key``; return whether the lock is
        now held, and the data (``None`` when absent or when the lock was not taken)."""
        return self._acquire(ttl, data_key)

    def _acquire(self, ttl: float, data_key: str | None) -> tuple[bool, bytes | None]:
        token = self.token or uuid.uuid4().hex
        now = self.clock()
        value = json.dumps({"token": token, "expires_at": now + ttl})
        storage = self.huey.storage
        data: bytes | None = None
        if _on_redis(storage):
            key = f"huey.{storage.name}.{self.key}"
            if data_key is None:
                taken = bool(storage.conn.eval(_ACQUIRE_LUA, 1, key, value, str(now), token))
            else:
                answer = storage.conn.eval(
                    _ACQUIRE_READING_LUA, 2, key, storage.result_key, value, str(now), token, data_key
                )
                taken = bool(answer[0])
                data = bytes(answer[1]) if taken and len(answer) > 1 else None
        else:
            with storage.db(commit=True) as cursor:
                cursor.execute("select value from kv where queue = ? and key = ?", (storage.name, self.key))
                row = cursor.fetchone()
                held = _held(row[0] if row else None)
                taken = held is None or held["expires_at"] <= now or held["token"] == token
                if taken:
                    cursor.execute(
                        "insert or replace into kv (queue, key, value) values (?, ?, ?)",
                        (storage.name, self.key, value.encode()),
                    )
                    if data_key is not None:
                        cursor.execute(
                            "select value from kv where queue = ? and key = ?", (storage.name, data_key)
                        )
                        found = cursor.fetchone()
                        data = None if found is None else bytes(found[0])
        self.token = token if taken else self.token
        return taken, data

    def renew(self, ttl: float) -> bool:
        """Extend the lock to ``ttl`` seconds from now only if this object still holds it (nobody
        took it over meanwhile); return whether it did. A lock given up or taken over stays so."""
        if self.token is None:
            return False
        value = json.dumps({"token": self.token, "expires_at": self.clock() + ttl})
        storage = self.huey.storage
        if _on_redis(storage):
            key = f"huey.{storage.name}.{self.key}"
            renewed = bool(storage.conn.eval(_RENEW_LUA, 1, key, value, self.token))
        else:
            with storage.db(commit=True) as cursor:
                cursor.execute("select value from kv where queue = ? and key = ?", (storage.name, self.key))
                row = cursor.fetchone()
                held = _held(row[0] if row else None)
                renewed = held is not None and held["token"] == self.token
                if renewed:
                    cursor.execute(
                        "update kv set value = ? where queue = ? and key = ?",
                        (value.encode(), storage.name, self.key),
                    )
        if not renewed:
            self.token = None
        return renewed

    def live(self) -> bool:
        """Return whether anyone holds the lock now (on this object's clock)."""
        held = self.holder()
        return held is not None and held["expires_at"] > self.clock()

    def release(self) -> None:
        """Give the lock up if this object still holds it."""
        if self.token is None:
            return
        storage = self.huey.storage
        if _on_redis(storage):
            storage.conn.eval(_RELEASE_LUA, 1, f"huey.{storage.name}.{self.key}", self.token)
        else:
            with storage.db(commit=True) as cursor:
                cursor.execute("select value from kv where queue = ? and key = ?", (storage.name, self.key))
                row = cursor.fetchone()
                held = _held(row[0] if row else None)
                if held is not None and held["token"] == self.token:
                    cursor.execute("delete from kv where queue = ? and key = ?", (storage.name, self.key))
        self.token = None

    def release_dropping(self, data_key: str) -> bool:
        """Delete the queue's data ``data_key`` and give the lock up if this object still holds
        it, in one atomic step, in that order; return whether the data was there."""
        storage = self.huey.storage
        token = self.token or ""
        if _on_redis(storage):
            key = f"huey.{storage.name}.{self.key}"
            dropped = bool(
                storage.conn.eval(_RELEASE_DROPPING_LUA, 2, key, storage.result_key, token, data_key)
            )
        else:
            with storage.db(commit=True) as cursor:
                cursor.execute("delete from kv where queue = ? and key = ?", (storage.name, data_key))
                dropped = cursor.rowcount > 0
                cursor.execute("select value from kv where queue = ? and key = ?", (storage.name, self.key))
                row = cursor.fetchone()
                held = _held(row[0] if row else None)
                if held is not None and held["token"] == token:
                    cursor.execute("delete from kv where queue = ? and key = ?", (storage.name, self.key))
        self.token = None
        return dropped

    def holder(self) -> dict[str, Any] | None:
        """Return the lock's ``{"token", "expires_at"}`` as stored, or ``None`` when free."""
        storage = self.huey.storage
        if _on_redis(storage):
            return _held(storage.conn.get(f"huey.{storage.name}.{self.key}"))
        rows = storage.sql(
            "select value from kv where queue = ? and key = ?", (storage.name, self.key), results=True
        )
        return _held(rows[0][0] if rows else None)


def _on_redis(storage: Any) -> bool:
    return hasattr(storage, "conn") and hasattr(storage.conn, "eval")


def _held(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        held = json.loads(bytes(raw).decode("utf-8"))
        return {"token": str(held["token"]), "expires_at": float(held["expires_at"])}
    except (ValueError, KeyError, TypeError):
        return None  # a damaged lock value is no lock
