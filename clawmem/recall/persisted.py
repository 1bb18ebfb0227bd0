"""Vectors kept in the database: what lets neither a restart nor a second worker embed again.

:class:`PersistedVectors` is a :class:`~clawmem.recall.embeddings.VectorStore` whose vectors
are also rows of a :class:`VectorBacking` (the sql driver's ``{prefix}clawmem_vectors`` table,
:mod:`clawmem.memory.sql_vectors`). A namespace's rows are loaded on first use; after that each
turn follows the memory table's change feed, deleting the vector of every entry gone, expired
or changed (however it went: clawmem, another worker, plain SQL), and reads the vectors other
processes wrote since (a ``clawmem embed``, another worker's turn). The sql driver itself
deletes the vectors of what it forgets, flushes and sweeps, in the same transaction.

With encryption at rest on, the backing seals a vector like a value (vectors leak text).
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from clawmem.errors import EmbeddingMismatch
from clawmem.recall.embeddings import Embedder, VectorStore, _Space, text_print, unit
from clawmem.recall.feeds import release_scratch
from clawmem.recall.sources import conforms

VectorRow = tuple[str, str, str]  # (key, text print as 16 hex digits, vector text)
ADOPT_CHUNK = 1024  # rows read back are held a chunk at a time
TRIM_AFTER = 10_000  # loads of this many vectors hand the heap their row texts took back


@runtime_checkable
class VectorBacking(Protocol):
    """Where a persisted store keeps its rows: one database and table prefix (the sql driver's
    table), one Redis key prefix (a hash per namespace), or one site's directory (a file per
    namespace). ``stored`` and ``replace_stored`` give and take vector texts as stored (sealed),
    for a key rotation."""

    name: str  # what an error names it by
    place: tuple[str, str]  # what tells two backings of one table apart from others

    def models(self) -> list[tuple[str, int]]: ...

    def count(self, namespace: str) -> int: ...

    def rows(self, namespace: str) -> Iterator[VectorRow]: ...

    def rows_of(self, namespace: str, keys: Sequence[str]) -> list[VectorRow]: ...

    def prints(self, namespace: str) -> dict[str, str]: ...

    def save(self, namespace: str, model_id: str, dimension: int, rows: Sequence[VectorRow]) -> None: ...

    def delete(self, namespace: str, gone: Sequence[str], stale: Sequence[tuple[str, str]]) -> None: ...

    def delete_other_models(self, model_id: str, dimension: int) -> int: ...

    def namespaces(self) -> list[str]: ...

    def stored(self, namespace: str) -> Iterable[VectorRow]: ...

    def replace_stored(self, namespace: str, changes: Sequence[tuple[str, str, str, str]]) -> int: ...


@runtime_checkable
class VectorKeeping(Protocol):
    """A driver that keeps its entries' vectors beside them (the sql, redis and file drivers)."""

    def vector_backing(self) -> VectorBacking | None:
        """Return where the vectors are kept, or ``None`` when there is nowhere (no table)."""


def print_text(printed: int) -> str:
    """Return a text print as a backing stores it (16 hex digits)."""
    return printed.to_bytes(8, "little", signed=True).hex()


def print_of(stored: str) -> int | None:
    """Return the text print a row holds, or ``None`` for one that is not a print."""
    try:
        raw = bytes.fromhex(stored)
    except ValueError:
        return None
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 8 else None


Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # vectors, text prints, which rows are readable


def decode_chunk(texts: Sequence[str], prints: Sequence[str], dimension: int) -> Decoded:
    """Return the vectors of ``texts`` (base64 of little-endian float32) as one float32 matrix,
    the text prints of ``prints`` (16 hex digits each) as int64, and which rows are readable:
    decoded by one call for the whole chunk, not one a row, so a worker's first turn loads
    100,000 vectors fast. A row of the wrong length, a print that is not one, or a value that is
    not finite is unreadable (embedded again, never trusted); a chunk holding a row that is not
    strict base64 is read a row at a time."""
    count = len(texts)
    size = 4 * dimension
    width = 4 * -(-size // 3)  # characters of one vector's base64
    padding = width // 4 * 3 - size
    ok = np.fromiter((len(text) == width for text in texts), dtype=bool, count=count)
    ok &= np.fromiter((len(printed) == 16 for printed in prints), dtype=bool, count=count)
    filler = "A" * (width - padding) + "=" * padding
    joined = "".join(text if fits else filler for text, fits in zip(texts, ok.tolist(), strict=True))
    try:
        encoded = joined.encode("ascii")
        # Padding belongs at the end of each row only: every row ends so, and there is no other.
        ends = np.frombuffer(encoded, dtype=np.uint8).reshape(count, width)[:, width - padding :]
        if encoded.count(b"=") != count * padding or not (ends == ord("=")).all():
            raise ValueError("padding inside a row")
        # "=" read as "A" decodes each row to a whole number of bytes: one call for the chunk.
        raw = binascii.a2b_base64(encoded.replace(b"=", b"A"), strict_mode=True)
        hexes = "".join(text if fits else "0" * 16 for text, fits in zip(prints, ok.tolist(), strict=True))
        printed = np.frombuffer(bytes.fromhex(hexes), dtype="<i8")
    except (UnicodeEncodeError, ValueError):  # binascii.Error is a ValueError
        return _decode_rows(texts, prints, dimension)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(count, -1)[:, :size]
    vectors = np.array(rows).view("<f4").astype(np.float32, copy=False)  # a copy of its own: written to
    ok &= np.isfinite(vectors).all(axis=1)
    return vectors, printed.astype(np.int64), ok


def _decode_rows(texts: Sequence[str], prints: Sequence[str], dimension: int) -> Decoded:
    """:func:`decode_chunk`, a row at a time (for a chunk holding a row no batch can read)."""
    vectors = np.zeros((len(texts), dimension), dtype=np.float32)
    printed = np.zeros(len(texts), dtype=np.int64)
    ok = np.zeros(len(texts), dtype=bool)
    for row, (text, stored_print) in enumerate(zip(texts, prints, strict=True)):
        found = print_of(stored_print)
        if found is None:
            continue
        try:
            raw = base64.b64decode(text, validate=True)
        except ValueError:  # not base64 (binascii.Error is one)
            continue
        if len(raw) != 4 * dimension:
            continue
        vectors[row] = np.frombuffer(raw, dtype="<f4")
        printed[row] = found
        ok[row] = bool(np.isfinite(vectors[row]).all())
    return vectors, printed, ok


def _normalised(rows: np.ndarray) -> np.ndarray:
    """Scale ``rows`` to length 1 in place (stored vectors are unit already, bar rounding)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    np.divide(rows, norms, out=rows, where=norms > 0)
    return rows


class PersistedVectors(VectorStore):
    """The vectors of one database and table prefix, held in process and kept in the table."""

    def __init__(self, embedder: Embedder, backing: VectorBacking) -> None:
        super().__init__(embedder)
        self.backing = backing
        self.table = backing.name
        self._checked = False

    # -- the text of a vector ----------------------------------------------------------------

    def _encode(self, namespace: str, key: str, vector: np.ndarray) -> str:
        """Return a vector as a row holds it: base64 of little-endian float32 (the backing seals it)."""
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")

    # -- loading and reading back ------------------------------------------------------------

    def check_models(self) -> None:
        """Refuse a table holding vectors of another model (:class:`EmbeddingMismatch`)."""
        found = self.backing.models()
        others = [model for model in found if model != (self.model_id, self.dimension)]
        if others:
            model, dimension = others[0]
            raise EmbeddingMismatch(
                f"the table {self.table} holds vectors of {model} ({dimension} dimensions), not of "
                f"{self.model_id} ({self.dimension} dimensions): run `clawmem embed --replace` to "
                "embed every entry again with this model"
            )

    def _adopt(self, space: _Space, namespace: str, rows: Iterable[VectorRow], fresh: bool = False) -> None:
        """Hold the readable vectors of ``rows`` (one that cannot be read, written by another
        program or sealed with a key no longer held, which the backing gives as empty, is
        embedded again, never trusted), decoded a chunk at a time (:func:`decode_chunk`) into
        the space's one matrix. ``fresh``: ``space`` is new and ``rows`` are all of a
        namespace, one per key."""
        put = space.append_many if fresh else space.put_many
        chunk: list[VectorRow] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == ADOPT_CHUNK:
                self._put_chunk(put, chunk)
                chunk = []
        if chunk:
            self._put_chunk(put, chunk)

    def _put_chunk(self, put: Any, chunk: Sequence[VectorRow]) -> None:
        keys, prints, texts = zip(*chunk, strict=True)
        vectors, printed, ok = decode_chunk(texts, prints, self.dimension)
        if ok.all():
            put(list(keys), printed, _normalised(vectors))
        elif ok.any():
            chosen = np.flatnonzero(ok)
            put([keys[at] for at in chosen.tolist()], printed[chosen], _normalised(vectors[chosen]))

    def _space(self, namespace: str) -> _Space:
        space = self._spaces.get(namespace)
        if space is None:
            if not self._checked:
                self.check_models()
                self._checked = True
            space = _Space(self.dimension, capacity=self.backing.count(namespace))
            self._adopt(space, namespace, self.backing.rows(namespace), fresh=True)
            if space.size >= TRIM_AFTER:
                release_scratch()  # glibc would keep some 60 bytes an entry of the load
            self._spaces[namespace] = space
        return space

    def refresh(self, namespace: str, entries: int) -> None:
        """Read the vectors other processes wrote (or deleted) since this one last looked, when
        fewer are held than the namespace has ``entries`` (else there is nothing to read: a
        changed entry's new vector is read back when it is found missing). A row count that
        differs from the vectors held makes it compare every key's print."""
        with self._lock:
            space = self._space(namespace)
            if space.size >= entries or self.backing.count(namespace) == space.size:
                return
            self._read_back(space, namespace)

    def _read_back(self, space: _Space, namespace: str) -> None:
        prints = self.backing.prints(namespace)
        space.remove_many([key for key in space.keys if key not in prints])
        keys = list(prints)
        rows = space.rows_of(keys)
        wanted = [
            key
            for key, row in zip(keys, rows.tolist(), strict=True)
            if row < 0 or print_of(prints[key]) != int(space.prints[row])
        ]
        self._adopt(space, namespace, self.backing.rows_of(namespace, wanted))

    def missing(self, namespace: str, entries: Any) -> list[tuple[str, str]]:
        """Return the entries without a vector of their text, after reading back any another
        process wrote for them."""
        with self._lock:
            missing = super().missing(namespace, entries)
            if missing:
                rows = self.backing.rows_of(namespace, [key for key, _ in missing])
                self._adopt(self._space(namespace), namespace, rows)
                missing = super().missing(namespace, missing)
            return missing

    # -- writing -----------------------------------------------------------------------------

    def _embedded(self, namespace: str, chunk: Sequence[tuple[str, str]], vectors: np.ndarray) -> None:
        rows = [
            (key, print_text(text_print(text)), self._encode(namespace, key, unit(vector)))
            for (key, text), vector in zip(chunk, vectors, strict=True)
        ]
        self.backing.save(namespace, self.model_id, self.dimension, rows)
        super()._embedded(namespace, chunk, vectors)

    def _written(self, namespace: str, entries: Sequence[tuple[str, str]], vectors: np.ndarray) -> None:
        with self._lock:
            if not self._checked:
                self.check_models()
                self._checked = True
            rows = [
                (key, print_text(text_print(text)), self._encode(namespace, key, unit(vector)))
                for (key, text), vector in zip(entries, vectors, strict=True)
            ]
            self.backing.save(namespace, self.model_id, self.dimension, rows)
            if namespace in self._spaces:
                VectorStore._embedded(self, namespace, entries, vectors)

    def _dropped(self, namespace: str, gone: Sequence[str], stale: Sequence[tuple[str, int]]) -> None:
        self.backing.delete(namespace, gone, [(key, print_text(printed)) for key, printed in stale])


class Stores:
    """A scorer's persisted stores, one per place of the drivers it reads; a driver that keeps
    no vectors, or a prefix without a vectors table (``init-db`` not run since it was added),
    gets none, and its vectors stay in process."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str], PersistedVectors] = {}
        self._lock = threading.Lock()

    def of(self, driver: object, embedder: Embedder) -> PersistedVectors | None:
        """Return the persisted store of ``driver``'s vectors, or ``None``."""
        if not conforms(driver, VectorKeeping):
            return None
        backing = driver.vector_backing()
        if backing is None:
            return None
        with self._lock:
            store = self._found.get(backing.place)
            if store is None:
                store = self._found[backing.place] = PersistedVectors(embedder, backing)
            return store
