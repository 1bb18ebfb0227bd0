"""The key store: one random data key per subject, wrapped by the master key, kept apart from the
database of the three tables (``CLAW_KEYSTORE_URL``), so that erasing a subject's key makes every
copy of their rows unreadable, older backups of the database included (SPEC 13).

A data key is 32 random bytes. It is stored only wrapped: AES-256-GCM under the first key of the
keyring, with associated data that binds the wrapping to the site, the subject's hash, the data
key's id and the master key's id, so a wrapped key copied to another subject does not unwrap. Any
key of the keyring unwraps what it wrapped, so a rotation can re-wrap under the new master key.

The key store holds a subject as a hash of the site and the user id, never as the user id. It
lives in a SQL database (tables ``{prefix}clawmem_subject_keys`` and
``{prefix}clawmem_key_generation``, see :mod:`clawmem.sql.keystore`) or a Redis (two hashes and a
counter under ``clawmem:keystore:{prefix}``), and never in the database that holds the three
tables: a backup of that would hold the keys too.

Beside the keys the store keeps a generation, a number that every deletion of a key raises in the
same transaction. A process keeps the keys it has read, and before it uses them again it reads
the generation once per read or turn (:meth:`KeyStore.checked`): when it moved, every key it kept
is forgotten, and every plaintext its cipher kept. So once an erasure has returned, no process of
the site opens the subject's rows, in this database or in any restored copy of it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from clawmem.clock import Clock, utc_datetime
from clawmem.crypto.cipher import DataKey
from clawmem.crypto.keys import KEY_BYTES, Keyring
from clawmem.errors import ConfigError, KeyStoreError, redact
from clawmem.ids import new_id
from clawmem.settings import CONNECT_TIMEOUT_SECONDS, REDIS_READ_TIMEOUT_SECONDS

KEYSTORE_VARIABLE = "CLAW_KEYSTORE_URL"
# A data key's id as envelopes name it: "s-" and a ULID. A master key id of that form is refused,
# so an envelope's key id always says which of the two it is.
DATA_KEY_ID = re.compile(r"s-[0-9A-HJKMNP-TV-Z]{26}")
_WRAP_FORMAT = "clawmem-subject-key/1"
# How many data keys a process keeps at most (about 100 bytes each), then it starts again.
KEYS_KEPT = 100_000
_NONCE_BYTES = 12
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", ""}
_DEFAULT_PORTS = {"mysql": 3306, "mariadb": 3306, "postgresql": 5432, "redis": 6379, "rediss": 6379}
# Within a KeyStore.checked block: the key stores whose generation the block read already.
_CHECKED: ContextVar[set[Any] | None] = ContextVar("clawmem_keystores_checked", default=None)


@dataclass(frozen=True)
class WrappedKey:
    """One subject's data key as the key store holds it: wrapped by the master key ``master_id``."""

    key_id: str
    subject: str  # the subject's hash, never the user id
    master_id: str
    wrapped: str
    created_at: datetime | None = None


def subject_hash(site: str, subject: str) -> str:
    """Return how the key store names ``subject`` (a user id) of the site with table prefix
    ``site``: 64 hex digits of SHA-256, the same in every process."""
    text = json.dumps([site, subject], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def _associated_data(site: str, key: WrappedKey) -> bytes:
    parts = [_WRAP_FORMAT, site, key.subject, key.key_id, key.master_id]
    return json.dumps(parts, separators=(",", ":")).encode("utf-8")


def _aead(key: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def wrap(site: str, key: WrappedKey, master: bytes, secret: bytes) -> WrappedKey:
    """Return ``key`` with ``secret`` wrapped under ``master`` (the key of ``key.master_id``)."""
    nonce = os.urandom(_NONCE_BYTES)
    sealed = _aead(master).encrypt(nonce, secret, _associated_data(site, key))
    text = base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")
    return WrappedKey(key.key_id, key.subject, key.master_id, text, key.created_at)


def unwrap(site: str, key: WrappedKey, keyring: Keyring) -> bytes:
    """Return the data key that ``key`` wraps. Raises :class:`KeyStoreError` naming the data key
    and master key ids when the keyring lacks the master key, or the wrapping does not open."""
    master = keyring.key(key.master_id)
    if master is None:
        raise KeyStoreError(
            "unwrap",
            f"the data key {key.key_id} is wrapped by the master key {key.master_id!r}, which the keyring "
            "does not list: add it back to CLAW_ENCRYPTION_KEYS (a rotation re-wraps it under the first key)",
        )
    try:
        raw = base64.urlsafe_b64decode(key.wrapped + "=" * (-len(key.wrapped) % 4))
        secret = _aead(master).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _associated_data(site, key))
    except (binascii.Error, ValueError, Exception):  # InvalidTag: a wrong key, or an altered row
        raise KeyStoreError(
            "unwrap",
            f"the data key {key.key_id} does not unwrap under the master key {key.master_id!r}: a wrong "
            "key of that id, or the key store row was altered or copied from another subject",
        ) from None
    if len(secret) != KEY_BYTES:
        raise KeyStoreError("unwrap", f"the data key {key.key_id} is not {KEY_BYTES} bytes")
    return secret


# -- where wrapped keys are kept ----------------------------------------------------------------


class KeyBackend(Protocol):
    """Where wrapped keys live: a SQL table or a Redis. Reads never create anything."""

    where: str

    def by_subject(self, subject: str) -> WrappedKey | None: ...

    def by_id(self, key_id: str) -> WrappedKey | None: ...

    def add(self, key: WrappedKey) -> WrappedKey: ...

    def delete_subject(self, subject: str) -> list[str]: ...

    def generation(self) -> int: ...

    def count_by_master(self) -> dict[str, int]: ...

    def not_under(self, master_id: str, limit: int) -> list[WrappedKey]: ...

    def rewrap(self, pairs: list[tuple[WrappedKey, WrappedKey]]) -> int: ...


_ADD_LUA = """
local existing = redis.call('HGET', KEYS[2], ARGV[1])
if existing then return existing end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return ARGV[2]
"""
_DELETE_LUA = """
local id = redis.call('HGET', KEYS[2], ARGV[1])
if not id then return false end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], id)
if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('SET', KEYS[3], ARGV[2]) end
redis.call('INCR', KEYS[3])
return id
"""
_REWRAP_LUA = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
local ok, current = pcall(cjson.decode, held)
if ok and type(current) == 'table' and current['wrapped'] == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0
"""


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


class RedisKeyBackend:
    """Wrapped keys in a Redis: the hash ``clawmem:keystore:{prefix}:keys`` (data key id to the
    wrapped key as JSON) and ``clawmem:keystore:{prefix}:subjects`` (subject hash to key id),
    changed together by scripts, so a reader never sees one without the other; the counter
    ``clawmem:keystore:{prefix}:generation`` rises in the script that deletes a key."""

    def __init__(self, client: Any, prefix: str, where: str) -> None:
        self.client = client
        self.where = where
        self.keys_hash = f"clawmem:keystore:{prefix}:keys"
        self.subjects_hash = f"clawmem:keystore:{prefix}:subjects"
        self.generation_key = f"clawmem:keystore:{prefix}:generation"

    @staticmethod
    def _encode(key: WrappedKey) -> str:
        created = None if key.created_at is None else key.created_at.isoformat()
        document = {
            "subject": key.subject,
            "master_id": key.master_id,
            "wrapped": key.wrapped,
            "created_at": created,
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":"))

    def _decode(self, key_id: str, raw: bytes | str) -> WrappedKey:
        try:
            document = json.loads(_text(raw))
            created = document.get("created_at")
            return WrappedKey(
                key_id,
                str(document["subject"]),
                str(document["master_id"]),
                str(document["wrapped"]),
                None if created is None else datetime.fromisoformat(created),
            )
        except (ValueError, KeyError, TypeError):
            raise KeyStoreError(
                "read", f"the key store entry of {key_id} in {self.keys_hash} is damaged"
            ) from None

    def by_subject(self, subject: str) -> WrappedKey | None:
        """Return the subject hash's wrapped key, or ``None``."""
        key_id = self.client.hget(self.subjects_hash, subject)
        return None if key_id is None else self.by_id(_text(key_id))

    def by_id(self, key_id: str) -> WrappedKey | None:
        """Return the wrapped key of ``key_id``, or ``None``."""
        raw = self.client.hget(self.keys_hash, key_id)
        return None if raw is None else self._decode(key_id, raw)

    def add(self, key: WrappedKey) -> WrappedKey:
        """Store ``key`` unless its subject has one; return the subject's key."""
        keys = [self.keys_hash, self.subjects_hash]
        winner = _text(self.client.eval(_ADD_LUA, 2, *keys, key.subject, key.key_id, self._encode(key)))
        found = self.by_id(winner)
        if found is None:  # pragma: no cover - only an erasure racing the first write gets here
            raise KeyStoreError("store", "the subject's data key vanished while it was being stored")
        return found

    def delete_subject(self, subject: str) -> list[str]:
        """Delete the subject hash's key and raise the generation; return the ids deleted."""
        keys = [self.keys_hash, self.subjects_hash, self.generation_key]
        # A counter that went missing (deleted, evicted) starts again at a number no process can
        # hold already, so every one of them sees this erasure.
        restart = secrets.randbelow(2**62)
        deleted = self.client.eval(_DELETE_LUA, 3, *keys, subject, restart)
        return [] if deleted is None else [_text(deleted)]

    def generation(self) -> int:
        """Return how many keys were ever deleted from this store (0 before the first)."""
        raw = self.client.get(self.generation_key)
        try:
            return 0 if raw is None else int(_text(raw))
        except ValueError:
            raise KeyStoreError("read", f"{self.generation_key} in {self.where} is not a number") from None

    def _all(self) -> Iterator[WrappedKey]:
        for key_id, raw in self.client.hscan_iter(self.keys_hash, count=1000):
            yield self._decode(_text(key_id), raw)

    def count_by_master(self) -> dict[str, int]:
        """Return how many data keys each master key id wraps (a scan of the hash)."""
        counts: dict[str, int] = {}
        for key in self._all():
            counts[key.master_id] = counts.get(key.master_id, 0) + 1
        return counts

    def not_under(self, master_id: str, limit: int) -> list[WrappedKey]:
        """Return up to ``limit`` keys wrapped by a master key other than ``master_id``."""
        found = []
        for key in self._all():
            if key.master_id != master_id:
                found.append(key)
                if len(found) >= limit:
                    break
        return found

    def rewrap(self, pairs: list[tuple[WrappedKey, WrappedKey]]) -> int:
        """Replace each ``(old, new)`` wrapping where the store still holds ``old``'s."""
        pipe = self.client.pipeline(transaction=True)
        for old, new in pairs:
            pipe.eval(_REWRAP_LUA, 1, self.keys_hash, old.key_id, old.wrapped, self._encode(new))
        return sum(int(done) for done in pipe.execute())


# -- the key store ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rewrapped:
    """One committed batch of a re-wrap: how many keys moved to the first master key."""

    keys: int


class KeyStore:
    """Per-subject data keys of one site, wrapped by the keyring's master keys: the key source of
    :class:`clawmem.crypto.Cipher` (``subject_key`` / ``key_by_id``).

    A subject is a user id, as a conversation's ``user_id`` and a subject namespace name it.
    A key read is kept, and used again only after :meth:`check` found the store's generation
    where it was when the key was read: once per :meth:`checked` block (a read or a turn), else
    at every use of a kept key. :meth:`erase` forgets the subject's key here at once. Every
    failure of the store itself raises :class:`KeyStoreError`, never a key.
    """

    def __init__(
        self, backend: KeyBackend, keyring: Keyring, site: str = "", clock: Clock = time.time
    ) -> None:
        for key_id in keyring.key_ids:
            if DATA_KEY_ID.fullmatch(key_id):
                raise ConfigError(
                    f"the master key id {key_id!r} has the form of a subject's data key id (s- and 26 "
                    "characters); give the master key another id"
                )
        self.backend = backend
        self.keyring = keyring
        self.site = site
        self.clock = clock
        # The store's generation as this process last read it (None: not read yet). Each key kept
        # carries the generation read before it was fetched, and serves only while that holds.
        self._generation: int | None = None
        self._by_subject: dict[str, tuple[int | None, DataKey]] = {}
        self._by_id: dict[str, tuple[int | None, bytes]] = {}
        self._on_forget: list[Callable[[], None]] = []

    def _remember(self, generation: int | None, subject: str | None, key: DataKey) -> DataKey:
        if len(self._by_id) >= KEYS_KEPT:
            self._by_subject.clear()
            self._by_id.clear()
        if subject is not None:
            self._by_subject[subject] = (generation, key)
        self._by_id[key.key_id] = (generation, key.secret)
        return key

    @property
    def where(self) -> str:
        """Return where the keys are kept, password hidden (for messages and the status)."""
        return self.backend.where

    def _guarded(self, operation: str, action: Any) -> Any:
        # The backends raise KeyStoreError for their own failures; the redis client's errors
        # are named here by module, so that this module needs no redis import.
        try:
            return action()
        except KeyStoreError:
            raise
        except Exception as exc:
            if type(exc).__module__.split(".")[0] != "redis":
                raise
            raise KeyStoreError(
                operation, f"{self.where}: {type(exc).__name__}: {redact(str(exc))}"
            ) from None

    def on_forget(self, forget: Callable[[], None]) -> None:
        """Call ``forget`` whenever this store drops the keys it kept because a key was erased
        (by any process): a cipher drops the plaintexts it kept with them."""
        self._on_forget.append(forget)

    def check(self) -> None:
        """Read the store's generation (one round trip) unless it was read already within the
        :meth:`checked` block around this call; when it moved since the last read, forget every
        key kept. Raises :class:`KeyStoreError`."""
        scope = _CHECKED.get()
        if scope is not None and self in scope:
            return
        generation = self._guarded("read", self.backend.generation)
        if scope is not None:
            scope.add(self)
        if generation == self._generation:
            return
        self._generation = generation
        self._by_subject.clear()
        self._by_id.clear()
        for forget in self._on_forget:
            forget()

    @contextlib.contextmanager
    def checked(self) -> Iterator[None]:
        """Within this block (one read, or one turn), :meth:`check` reads the generation once, when
        a kept key is first used, and after that the keys kept serve without another round trip.
        Blocks nest (the outermost counts); keep them short, since an erasure that ends inside
        one after that read is seen only by the next."""
        if _CHECKED.get() is not None:
            yield
            return
        token = _CHECKED.set(set())
        try:
            yield
        finally:
            _CHECKED.reset(token)

    def _kept(self, kept: dict[str, Any], name: str) -> Any:
        # A key kept serves only if the generation it was read under is still the store's. A
        # turn opens its whole history through here: the checked block's test is inlined.
        held = kept.get(name)
        if held is None:
            return None
        scope = _CHECKED.get()
        if scope is None or self not in scope:
            self.check()
            held = kept.get(name)
            if held is None:
                return None
        return held[1] if held[0] == self._generation else None

    def subject_key(self, subject: str) -> DataKey:
        """Return the data key of ``subject``, making, wrapping and storing one on first use.

        Two processes making a subject's first key at once agree on one (the store keeps the
        first). Raises :class:`KeyStoreError`.
        """
        held = self._kept(self._by_subject, subject)
        if held is not None:
            return held
        generation = self._generation
        hashed = subject_hash(self.site, subject)
        found = self._guarded("read", lambda: self.backend.by_subject(hashed))
        if found is None:
            secret = secrets.token_bytes(KEY_BYTES)
            master_id = self.keyring.primary_id
            draft = WrappedKey("s-" + new_id(), hashed, master_id, "", utc_datetime(self.clock))
            master = self.keyring.key(master_id)
            assert master is not None
            found = self._guarded("store", lambda: self.backend.add(wrap(self.site, draft, master, secret)))
            if found.key_id == draft.key_id:
                return self._remember(generation, subject, DataKey(found.key_id, secret))
        key = DataKey(found.key_id, unwrap(self.site, found, self.keyring))
        return self._remember(generation, subject, key)

    def key_by_id(self, key_id: str) -> bytes | None:
        """Return the data key of ``key_id``, or ``None`` when the store does not hold it (it was
        erased with its subject, or is not a data key id). Raises :class:`KeyStoreError` when it
        is held but cannot be unwrapped."""
        if not DATA_KEY_ID.fullmatch(key_id):
            return None
        held = self._kept(self._by_id, key_id)
        if held is not None:
            return held
        generation = self._generation
        found = self._guarded("read", lambda: self.backend.by_id(key_id))
        if found is None:
            return None
        return self._remember(
            generation, None, DataKey(key_id, unwrap(self.site, found, self.keyring))
        ).secret

    def has_key(self, subject: str) -> bool:
        """Return whether ``subject`` has a data key in the store (reads only)."""
        hashed = subject_hash(self.site, subject)
        return self._guarded("read", lambda: self.backend.by_subject(hashed)) is not None

    def erase(self, subject: str) -> list[str]:
        """Delete ``subject``'s data key, raising the store's generation with it; return the ids
        deleted (none when it had none). Every row sealed under it, in this database and in every
        copy of it, is unreadable from now on, in every process at its next read."""
        hashed = subject_hash(self.site, subject)
        erased = self._guarded("erase", lambda: self.backend.delete_subject(hashed))
        self._by_subject.pop(subject, None)
        for key_id in erased:
            self._by_id.pop(key_id, None)
        return erased

    def counts(self) -> dict[str, int]:
        """Return how many data keys each master key id wraps."""
        return self._guarded("read", self.backend.count_by_master)

    def rewrap(self, batch_size: int = 1000) -> Iterator[Rewrapped]:
        """Re-wrap every data key not under the keyring's first key with it, ``batch_size`` per
        committed batch, yielding each batch. Raises :class:`KeyStoreError` for a key whose master
        key is not in the keyring (nothing of that batch changes)."""
        primary = self.keyring.primary_id
        master = self.keyring.key(primary)
        assert master is not None
        skipped: set[str] = set()
        while True:
            found = self._guarded("read", lambda: self.backend.not_under(primary, batch_size + len(skipped)))
            batch = [key for key in found if key.key_id not in skipped][:batch_size]
            if not batch:
                return
            pairs = []
            for old in batch:
                secret = unwrap(self.site, old, self.keyring)
                draft = WrappedKey(old.key_id, old.subject, primary, "", old.created_at)
                pairs.append((old, wrap(self.site, draft, master, secret)))
            changed = self._guarded("rewrap", lambda pairs=pairs: self.backend.rewrap(pairs))
            # A key erased or re-wrapped by another run meanwhile is not this run's to count.
            skipped.update(old.key_id for old, _ in pairs)
            yield Rewrapped(changed)


class CachedKeys:
    """A key store's keys remembered for one run, such as a rotation that seals thousands of a
    few subjects' rows: each subject's key is looked up once. Never kept beyond the run, so an
    erasure elsewhere is not outlived for long."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self._subjects: dict[str, DataKey] = {}
        self._ids: dict[str, bytes | None] = {}

    def subject_key(self, subject: str) -> DataKey:
        """Return :meth:`KeyStore.subject_key`, looked up once per subject."""
        found = self._subjects.get(subject)
        if found is None:
            found = self._subjects[subject] = self.store.subject_key(subject)
            self._ids[found.key_id] = found.secret
        return found

    def key_by_id(self, key_id: str) -> bytes | None:
        """Return :meth:`KeyStore.key_by_id`, looked up once per key id."""
        if key_id not in self._ids:
            self._ids[key_id] = self.store.key_by_id(key_id)
        return self._ids[key_id]


# -- opening the key store of the settings ------------------------------------------------------


def _same_host(one: str | None, other: str | None) -> bool:
    first, second = (one or "").lower(), (other or "").lower()
    return first == second or (first in _LOCAL_HOSTS and second in _LOCAL_HOSTS)


def _same_sql_database(keystore_url: str, database_url: str) -> bool:
    mine, theirs = make_url(keystore_url), make_url(database_url)
    if mine.get_backend_name() != theirs.get_backend_name():
        return False
    if mine.get_backend_name() == "sqlite":
        if not mine.database or not theirs.database:
            return False
        return Path(mine.database).resolve() == Path(theirs.database).resolve()
    default = _DEFAULT_PORTS.get(mine.get_backend_name())
    return (
        _same_host(mine.host, theirs.host)
        and (mine.port or default) == (theirs.port or default)
        and (mine.database or "") == (theirs.database or "")
    )


def _same_redis_server(keystore_url: str, redis_url: str) -> bool:
    mine, theirs = urlsplit(keystore_url), urlsplit(redis_url)
    if mine.scheme == "unix" or theirs.scheme == "unix":
        return mine.scheme == theirs.scheme and mine.path == theirs.path
    default = _DEFAULT_PORTS["redis"]
    return _same_host(mine.hostname, theirs.hostname) and (mine.port or default) == (theirs.port or default)


def check_keystore_url(settings: Any) -> str:
    """Return the settings' ``CLAW_KEYSTORE_URL`` unless it would keep the keys beside the data
    they protect: the database of the three tables, a SQLite database in memory, or (with the
    redis memory driver) the Redis server that holds the memory entries. Raises
    :class:`ConfigError` in one line naming the settings, without a password."""
    url = settings.keystore_url.strip()
    shown = redact(url)
    scheme = urlsplit(url).scheme.lower()
    if not scheme:
        raise ConfigError(f"{KEYSTORE_VARIABLE} must be a database URL or a redis:// URL, got {shown!r}")
    if scheme in _REDIS_SCHEMES:
        if settings.memory_driver == "redis" and _same_redis_server(url, settings.redis_url):
            raise ConfigError(
                f"{KEYSTORE_VARIABLE} names the Redis server of CLAW_REDIS_URL, which holds the memory "
                "entries: a snapshot of that server would hold the subjects' keys too, so erasure would not "
                "reach its backups; keep the key store on another server or a SQL database"
            )
        return url
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise ConfigError(
            f"{KEYSTORE_VARIABLE} must be a database URL or a redis:// URL, got {shown!r}"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ConfigError(
            f"{KEYSTORE_VARIABLE} names a SQLite database in memory, which loses every subject's key at "
            "exit: give a file, such as sqlite:////var/lib/clawmem/keys.db"
        )
    if _same_sql_database(url, settings.database_url):
        raise ConfigError(
            f"{KEYSTORE_VARIABLE} names the database of CLAW_DATABASE_URL, which holds the three tables: a "
            "backup of it would hold the subjects' keys too, so erasure would not reach it; keep the key "
            "store in another database or a Redis"
        )
    return url


def redis_backend(url: str, prefix: str) -> RedisKeyBackend:
    """Return the Redis backend of a ``redis://`` key store URL for the site of ``prefix``
    (nothing is connected to yet). Raises :class:`ConfigError` without the redis module or for a
    malformed URL."""
    try:
        import redis
    except ImportError:
        raise ConfigError(
            "a redis:// key store needs the redis module: pip install 'clawmem[redis]'"
        ) from None
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, socket_timeout=REDIS_READ_TIMEOUT_SECONDS
        )
    except ValueError as exc:
        raise ConfigError(f"invalid {KEYSTORE_VARIABLE} {redact(url)!r}: {exc}") from None
    return RedisKeyBackend(client, prefix, redact(url))


def is_redis_url(url: str) -> bool:
    """Return whether a key store URL names a Redis rather than a SQL database."""
    return urlsplit(url).scheme.lower() in _REDIS_SCHEMES


def needs_keyring(keyring: Keyring | None) -> Keyring:
    """Return ``keyring``; raise :class:`ConfigError` when a key store is set without one."""
    if keyring is None:
        raise ConfigError(
            f"{KEYSTORE_VARIABLE} is set but encryption is off: the data keys it keeps are wrapped by the "
            "master key, so set CLAW_ENCRYPTION_KEYS (or CLAW_ENCRYPTION_KEY_FILE) too"
        )
    return keyring
