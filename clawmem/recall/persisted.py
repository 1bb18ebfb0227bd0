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

from clawmem.codecs import VECTOR_MARK, VectorData, vector_text
from clawmem.errors import EmbeddingMismatch
from clawmem.recall.embeddings import Embedder, Quantised, VectorStore, _Space, quantise, text_print, unit
from clawmem.recall.feeds import release_scratch
from clawmem.recall.sources import conforms

VectorRow = tuple[str, str, VectorData]  # (key, text print as 16 hex digits, vector: bytes or text)
ADOPT_CHUNK = 1024  # rows read back are held a chunk at a time
TRIM_AFTER = 10_000  # loads of this many vectors hand the heap their row texts took back


@runtime_checkable
class VectorBacking(Protocol):
    """Where a persisted store keeps its rows: one database and table prefix (the sql driver's
    table), one Redis key prefix (a hash per namespace), or one site's directory (a file per
    namespace). ``stored`` and ``replace_stored`` give and take vectors as stored (sealed),
    for a key rotation. ``writes_bytes`` says whether a vector saved is stored as packed bytes
    (else as text), and ``make_binary`` makes a store of text hold bytes (``embed --replace``)."""

    name: str  # what an error names it by
    place: tuple[str, str]  # what tells two backings of one table apart from others
    writes_bytes: bool  # whether a vector saved is stored as packed bytes (else as text)

    def make_binary(self) -> bool: ...

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


CODES_MARK = VECTOR_MARK  # begins a vector text of int8 codes: never a character of base64


def pack_vector(vector: np.ndarray) -> bytes:
    """Return a unit vector as a backing that holds bytes stores it: its scale (little-endian
    float32) and its int8 codes (:func:`quantise`), 516 bytes for 512 dimensions."""
    return packed(quantise(np.asarray(vector, dtype=np.float32).reshape(1, -1)), 0)


def packed(held: Quantised, row: int) -> bytes:
    """Return row ``row`` of ``held`` packed (see :func:`pack_vector`)."""
    return held.scales[row : row + 1].astype("<f4").tobytes() + held.codes[row].tobytes()


def encode_vector(vector: np.ndarray) -> str:
    """Return a unit vector as a backing that holds text stores it (and as it is sealed):
    ``CODES_MARK`` and the base64 of its packed bytes, 691 characters for 512 dimensions
    where float32's base64 took 2,732."""
    return vector_text(pack_vector(vector))


def held_text(held: Quantised, row: int) -> str:
    """Return row ``row`` of ``held`` as text (see :func:`encode_vector`)."""
    return vector_text(packed(held, row))


def is_float32_text(text: VectorData) -> bool:
    """Return whether a stored vector is of the format before int8 codes (base64 of float32)."""
    return isinstance(text, str) and bool(text) and not text.startswith(CODES_MARK)


Decoded = tuple[Quantised, np.ndarray, np.ndarray]  # held rows, text prints, which rows are readable
_PACKED, _CODES, _FLOAT32 = 0, 1, 2  # the three forms a stored vector comes in


def _form(data: VectorData) -> int:
    if isinstance(data, bytes):
        return _PACKED
    return _CODES if data.startswith(CODES_MARK) else _FLOAT32


def decode_chunk(texts: Sequence[VectorData], prints: Sequence[str], dimension: int) -> Decoded:
    """Return the vectors of ``texts`` as the store holds them (:class:`Quantised`), the text
    prints of ``prints`` (16 hex digits each) as int64, and which rows are readable. A stored
    vector is packed bytes (scale and codes, today's format where a backing holds bytes), a
    text of them (``CODES_MARK`` and base64, where it holds text, or sealed), or the older
    base64 of little-endian float32, read and quantised as it loads (until ``clawmem embed
    --replace`` rewrites it): a chunk may mix them. A row of the wrong length, a print that is
    not one, or a value that is not finite is unreadable (embedded again, never trusted)."""
    forms = np.fromiter(map(_form, texts), dtype=np.int8, count=len(texts))
    present = np.unique(forms).tolist()
    if len(present) == 1:
        return _DECODERS[present[0]](texts, prints, dimension)
    held = Quantised(np.zeros((len(texts), dimension), dtype=np.int8), np.zeros(len(texts), dtype=np.float32))
    printed = np.zeros(len(texts), dtype=np.int64)
    ok = np.zeros(len(texts), dtype=bool)
    for form in present:
        chosen = np.flatnonzero(forms == form)
        part, part_prints, part_ok = _DECODERS[form](
            [texts[at] for at in chosen.tolist()], [prints[at] for at in chosen.tolist()], dimension
        )
        held.codes[chosen], held.scales[chosen] = part.codes, part.scales
        printed[chosen], ok[chosen] = part_prints, part_ok
    return held, printed, ok


def _decode_packed(datas: Sequence[Any], prints: Sequence[str], dimension: int) -> Decoded:
    size = 4 + dimension
    count = len(datas)
    ok = np.fromiter((len(data) == size for data in datas), dtype=bool, count=count)
    ok &= np.fromiter((len(printed) == 16 for printed in prints), dtype=bool, count=count)
    filler = bytes(size)
    joined = b"".join(data if fits else filler for data, fits in zip(datas, ok.tolist(), strict=True))
    raw = np.frombuffer(joined, dtype=np.uint8).reshape(count, size)
    try:
        hexes = "".join(text if fits else "0" * 16 for text, fits in zip(prints, ok.tolist(), strict=True))
        printed = np.frombuffer(bytes.fromhex(hexes), dtype="<i8").astype(np.int64)
    except ValueError:  # a print that is not hex: each row alone
        printed = np.zeros(count, dtype=np.int64)
        for row, text in enumerate(prints):
            found = print_of(text) if ok[row] else None
            ok[row] = found is not None
            printed[row] = found or 0
    return _held_of(raw, printed, ok)


def _decode_codes(texts: Sequence[Any], prints: Sequence[str], dimension: int) -> Decoded:
    raw, printed, ok = decode_raw([text[len(CODES_MARK) :] for text in texts], prints, 4 + dimension)
    return _held_of(raw, printed, ok)


def _held_of(raw: np.ndarray, printed: np.ndarray, ok: np.ndarray) -> Decoded:
    """Return rows of packed bytes (scale, then codes) as held, refusing the unreadable ones."""
    scales = np.ascontiguousarray(raw[:, :4]).view("<f4").reshape(-1).astype(np.float32)
    ok &= np.isfinite(scales) & (scales >= 0)
    codes = np.array(raw[:, 4:]).view(np.int8)
    ok &= (codes != -128).all(axis=1)  # never written: a row holding it is not of clawmem
    scales[~ok] = 0
    return Quantised(codes, scales), printed, ok


def _decode_float32(texts: Sequence[Any], prints: Sequence[str], dimension: int) -> Decoded:
    vectors, printed, ok = decode_raw(texts, prints, 4 * dimension)
    rows = vectors.view("<f4").astype(np.float32, copy=False)
    ok &= np.isfinite(rows).all(axis=1)
    rows[~ok] = 0
    return quantise(_normalised(rows)), printed, ok


_DECODERS = {_PACKED: _decode_packed, _CODES: _decode_codes, _FLOAT32: _decode_float32}

Raw = tuple[np.ndarray, np.ndarray, np.ndarray]  # bytes a row (uint8), text prints, readable rows


def decode_raw(texts: Sequence[str], prints: Sequence[str], size: int) -> Raw:
    """Return the bytes of ``texts`` (base64 of ``size`` bytes each) as one uint8 matrix, the
    text prints of ``prints`` (16 hex digits each) as int64, and which rows are readable:
    decoded by one call for the whole chunk, not one a row, so a worker's first turn loads
    100,000 vectors fast. A row of the wrong length or a print that is not one is unreadable;
    a chunk holding a row that is not strict base64 is read a row at a time."""
    count = len(texts)
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
        return _decode_rows(texts, prints, size)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(count, -1)[:, :size]
    return np.array(rows), printed.astype(np.int64), ok  # a copy of its own: written to


def _decode_rows(texts: Sequence[str], prints: Sequence[str], size: int) -> Raw:
    """:func:`decode_raw`, a row at a time (for a chunk holding a row no batch can read)."""
    rows = np.zeros((len(texts), size), dtype=np.uint8)
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
        if len(raw) != size:
            continue
        rows[row] = np.frombuffer(raw, dtype=np.uint8)
        printed[row] = found
        ok[row] = True
    return rows, printed, ok


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

    def _encode(self, namespace: str, key: str, vector: np.ndarray) -> VectorData:
        """Return a vector packed (:func:`pack_vector`; the backing seals it, or stores it as
        text where it holds no bytes)."""
        return pack_vector(vector)

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
        held, printed, ok = decode_chunk(texts, prints, self.dimension)
        if ok.all():
            put(list(keys), printed, held)
        elif ok.any():
            chosen = np.flatnonzero(ok)
            put(
                [keys[at] for at in chosen.tolist()],
                printed[chosen],
                Quantised(*(part[chosen] for part in held)),
            )

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

    def convert(self, namespace: str) -> int:
        """Rewrite the vectors of ``namespace`` stored in an older format in today's, as they
        load (their entries are not embedded again); return how many were rewritten: float32
        texts everywhere, and texts of int8 codes where the backing now stores bytes
        (``writes_bytes``, after its ``make_binary``). A row that cannot be read stays, to be
        embedded again when it is found missing."""
        bytes_now = self.backing.writes_bytes
        old = [
            row
            for row in self.backing.rows(namespace)
            if is_float32_text(row[2]) or (bytes_now and isinstance(row[2], str) and row[2])
        ]
        converted = 0
        for start in range(0, len(old), ADOPT_CHUNK):
            chunk = old[start : start + ADOPT_CHUNK]
            held, _, ok = decode_chunk(
                [text for _, _, text in chunk], [p for _, p, _ in chunk], self.dimension
            )
            rows: list[VectorRow] = [
                (key, printed, packed(held, at)) for at, (key, printed, _) in enumerate(chunk) if ok[at]
            ]
            self.backing.save(namespace, self.model_id, self.dimension, rows)
            converted += len(rows)
        return converted

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
