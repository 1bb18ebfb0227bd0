"""The redis driver's vectors as recall's persisted vector store reads and writes them (see
:class:`clawmem.recall.persisted.VectorBacking`): one hash per namespace beside its entries.

Layout under the driver's prefix ``P`` for namespace ``N``::

    P{N}:v      hash: an entry's key -> its text print (16 hex digits), ":", its vector text;
                the field MODEL_FIELD -> the model id and dimension, tab-separated
    Pvectors    set of the namespaces that have had a vectors hash (a flush leaves the name,
                so that it costs one command no more; an empty hash reads as no vectors)

A key never holds a control character, so MODEL_FIELD is never an entry's key. With encryption
at rest on, a vector's text is sealed like the entry's value (vectors leak text), for the
entry's place and the column ``vector``; a field that cannot be opened reads as empty, and is
embedded again. The driver deletes an entry's vector in the transaction that forgets, flushes or
sweeps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from clawmem.codecs import VectorData, read_vector
from clawmem.crypto.stored import StoredValues, opened_vectors, stored_vector

VectorRow = tuple[str, str, VectorData]  # (key, text print, vector: packed bytes, or text)
COLUMN = "vector"  # what a sealed vector is bound to, beside the entry's place
MODEL_FIELD = "\x00model"
_BATCH = 1000  # fields per HMGET/HDEL, so no single command grows with the namespace
_SCAN = 1000  # fields per HSCAN step while a namespace loads

# Delete a field only while it still holds the vector of the text print given: a vector of the
# entry's newer text, written meanwhile by another worker, stays.
_DELETE_STALE_LUA = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and string.sub(held, 1, 17) == ARGV[2] .. ':' then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


def _row(key: str, raw: bytes | str) -> tuple[str, str, VectorData]:
    if isinstance(raw, str):
        printed, _, text = raw.partition(":")
        return key, printed, text
    printed_bytes, _, stored = raw.partition(b":")
    return key, printed_bytes.decode("ascii", "replace"), read_vector(stored)


def _field(printed: str, data: VectorData) -> bytes:
    """Return a hash field's value: the text print, ":", and the vector (bytes or text)."""
    return printed.encode("ascii") + b":" + (data if isinstance(data, bytes) else data.encode("utf-8"))


class VectorHashes(Protocol):
    """What the backing uses of :class:`~clawmem.memory.redis.RedisMemory`."""

    values: StoredValues
    client: Any
    prefix: str
    vectors_key: str

    def vector_key(self, namespace: str) -> str: ...


class RedisVectorBacking:
    """The vectors hashes of one :class:`~clawmem.memory.redis.RedisMemory` (its client and prefix)."""

    def __init__(self, driver: VectorHashes) -> None:
        self.driver = driver
        self.name = f"Redis vectors hashes {driver.prefix}{{namespace}}:v"
        pool = getattr(driver.client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", {})
        where = "|".join(str(kwargs.get(name, "")) for name in ("host", "port", "path", "db"))
        self.place = (f"redis:{where}", driver.prefix)

    @property
    def client(self) -> Any:
        """The driver's client (on the async path, its twin on the loop)."""
        return self.driver.client

    @property
    def writes_bytes(self) -> bool:
        """Return whether a vector saved is stored as its packed bytes (when not sealed)."""
        return not self.driver.values.cipher.enabled

    def make_binary(self) -> bool:
        """Nothing to change: a hash holds bytes."""
        return False

    def _key(self, namespace: str) -> str:
        return self.driver.vector_key(namespace)

    def _opened(self, namespace: str, rows: Iterable[VectorRow]) -> Iterator[VectorRow]:
        return opened_vectors(self.driver.values, namespace, rows, COLUMN)

    def namespaces(self) -> list[str]:
        """Return the namespaces that have vectors."""
        return sorted(_text(name) for name in self.client.smembers(self.driver.vectors_key))

    def models(self) -> list[tuple[str, int]]:
        """Return every ``(model id, dimension)`` the hashes hold vectors of."""
        names = self.namespaces()
        pipe = self.client.pipeline(transaction=False)
        for namespace in names:
            pipe.hget(self._key(namespace), MODEL_FIELD)
        found = set()
        for raw in pipe.execute():
            if raw is not None:
                model, _, dimension = _text(raw).partition("\t")
                found.add((model, int(dimension) if dimension.isdigit() else -1))
        return sorted(found)

    def count(self, namespace: str) -> int:
        """Return how many vectors ``namespace`` has."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen(self._key(namespace))
        pipe.hexists(self._key(namespace), MODEL_FIELD)
        fields, has_model = pipe.execute()
        return int(fields) - int(bool(has_model))

    def stored(self, namespace: str) -> Iterator[VectorRow]:
        """Yield every ``(key, text print, vector text as stored)`` of ``namespace`` (sealed
        ones not opened), read a step at a time."""
        for field, raw in self.client.hscan_iter(self._key(namespace), count=_SCAN):
            key = _text(field)
            if key != MODEL_FIELD:
                yield _row(key, raw)

    def rows(self, namespace: str) -> Iterator[VectorRow]:
        """Yield every row of ``namespace`` (its vector text opened), read as consumed."""
        yield from self._opened(namespace, self.stored(namespace))

    def rows_of(self, namespace: str, keys: Sequence[str]) -> list[VectorRow]:
        """Return the rows of ``keys`` that exist (their vector text opened)."""
        found: list[VectorRow] = []
        for start in range(0, len(keys), _BATCH):
            batch = list(keys[start : start + _BATCH])
            raws = self.client.hmget(self._key(namespace), batch)
            found.extend(_row(key, raw) for key, raw in zip(batch, raws, strict=True) if raw is not None)
        return list(self._opened(namespace, found))

    def prints(self, namespace: str) -> dict[str, str]:
        """Return the text print of every vector of ``namespace``, by key."""
        return {key: printed for key, printed, _ in self.stored(namespace)}

    def save(self, namespace: str, model_id: str, dimension: int, rows: Sequence[VectorRow]) -> None:
        """Create or replace ``rows`` (their vector text sealed when encryption is on)."""
        if not rows:
            return
        values = self.driver.values
        mapping: dict[str, str | bytes] = {MODEL_FIELD: f"{model_id}\t{dimension}"}
        for key, printed, data in rows:
            mapping[key] = _field(printed, stored_vector(values, namespace, key, data, binary=True))
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self._key(namespace), mapping=mapping)
        pipe.sadd(self.driver.vectors_key, namespace)
        pipe.execute()

    def replace_stored(self, namespace: str, changes: Sequence[tuple[str, str, str, str]]) -> int:
        """Store each ``(key, text print, vector text read, new vector text)`` where the field
        still holds what was read; return how many changed."""
        pipe = self.client.pipeline(transaction=False)
        for key, printed, old, new in changes:
            pipe.eval(_REPLACE_LUA, 1, self._key(namespace), key, _field(printed, old), _field(printed, new))
        return sum(int(done) for done in pipe.execute())

    def delete(self, namespace: str, gone: Sequence[str], stale: Sequence[tuple[str, str]]) -> None:
        """Delete the fields of ``gone``, and each ``(key, print)`` of ``stale`` still of that print."""
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(gone), _BATCH):
            pipe.hdel(self._key(namespace), *gone[start : start + _BATCH])
        for key, printed in stale:
            pipe.eval(_DELETE_STALE_LUA, 1, self._key(namespace), key, printed)
        pipe.execute()

    def delete_other_models(self, model_id: str, dimension: int) -> int:
        """Delete every namespace's vectors not of ``model_id`` at ``dimension``; return how many went."""
        deleted = 0
        for namespace in self.namespaces():
            raw = self.client.hget(self._key(namespace), MODEL_FIELD)
            if raw is None or _text(raw) == f"{model_id}\t{dimension}":
                continue
            deleted += self.count(namespace)
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(self._key(namespace))
            pipe.srem(self.driver.vectors_key, namespace)
            pipe.execute()
        return deleted


_REPLACE_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0
"""


def drop_vector_fields(pipe: Any, vector_key: str, keys: Sequence[str]) -> None:
    """Queue the deletion of ``keys``' vectors on ``pipe`` (in the driver's own transaction)."""
    for start in range(0, len(keys), _BATCH):
        pipe.hdel(vector_key, *keys[start : start + _BATCH])
