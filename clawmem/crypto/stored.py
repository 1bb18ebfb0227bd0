"""Stored values: how one driver's memory values become stored text and back, the shape's
codec (:mod:`clawmem.codecs`) and then the site's cipher, and the warnings of what a list or
recall skips."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from clawmem.codecs import JSON, ValueCodec, VectorData, vector_text, warn_unreadable
from clawmem.crypto.cipher import PLAIN, Cipher, Context
from clawmem.errors import UndecodableValue, Undecryptable

log = logging.getLogger("clawmem.recall")


def warn_undecryptable(exc: Undecryptable) -> None:
    """Log that a list or recall skips a value it cannot decrypt: where it lives and the key id."""
    log.warning("skipping an entry that cannot be decrypted: %s", exc)


SubjectOf = Callable[[str], "str | None"]


def _no_subject(namespace: str) -> str | None:
    return None


@dataclass(frozen=True)
class StoredValues:
    """How one driver's memory values become stored text and back: the shape's codec, then the
    site's cipher (SPEC 13), each value sealed for its site, namespace, key and column.

    ``subject_of`` names the subject a namespace belongs to (a subject namespace), whose data
    key seals its values when a key store is configured.
    """

    codec: ValueCodec = JSON
    cipher: Cipher = PLAIN
    site: str = ""
    subject_of: SubjectOf = _no_subject

    def context(self, namespace: str, key: str, column: str = "value") -> Context:
        """Return the place a value (or ``metadata``) of ``namespace``/``key`` is sealed for."""
        return Context.entry(self.site, namespace, key, column)

    def seal(self, namespace: str, key: str, encoded: str, column: str = "value") -> str:
        """Return the stored text of an encoded value: sealed when encryption is on."""
        if not self.cipher.enabled:
            return encoded
        return self.cipher.seal(encoded, self.context(namespace, key, column), self.subject_of(namespace))

    def open(self, namespace: str, key: str, text: str, column: str = "value") -> str:
        """Return the encoded text of a stored value. Raises :class:`Undecryptable` (or its
        :class:`~clawmem.errors.PlaintextRefused` in strict mode), naming the entry."""
        return self.cipher.open(text, self.context(namespace, key, column))

    def read(self, namespace: str, key: str, text: str) -> Any:
        """Return the value stored as ``text``. Raises :class:`Undecryptable` or
        :class:`UndecodableValue`, each naming the key, never the value."""
        return self.codec.read(namespace, key, self.open(namespace, key, text))

    def readable(self, namespace: str, rows: Iterable[tuple[str, str]]) -> Iterator[tuple[str, Any]]:
        """Yield ``(key, value)`` of each ``(key, stored text)`` that opens and decodes; the
        others are skipped with a warning naming the key (see :func:`readable_entries`)."""
        for key, text in rows:
            try:
                yield key, self.codec.recallable(namespace, key, self.open(namespace, key, text))
            except UndecodableValue:
                warn_unreadable(namespace, key)
            except Undecryptable as exc:
                warn_undecryptable(exc)


def stored_vector(
    values: StoredValues, namespace: str, key: str, data: VectorData, binary: bool
) -> VectorData:
    """Return what a backing stores of a vector: sealed text when encryption is on, else its
    packed bytes where the backing holds bytes (``binary``) and its text where it does not."""
    if values.cipher.enabled:
        return values.seal(namespace, key, vector_text(data), "vector")
    return data if binary else vector_text(data)


def opened_vectors(
    values: StoredValues, namespace: str, rows: Iterable[tuple[str, str, VectorData]], column: str = "vector"
) -> Iterator[tuple[str, str, VectorData]]:
    """Yield each ``(key, text print, stored vector)`` of ``namespace`` with its vector text
    opened by ``values``' cipher; one that cannot be opened (a key no longer held, or
    altered) as empty, so that it is embedded again. Without encryption the rows pass as they
    are, with no per-row work (a worker's first turn loads every vector of a namespace).
    Packed bytes are plaintext: passed as they are, or refused (as empty) in strict mode."""
    if not values.cipher.enabled and not values.cipher.strict:
        yield from rows
        return
    for key, printed, stored in rows:
        if isinstance(stored, bytes):
            yield key, printed, b"" if values.cipher.strict else stored
            continue
        try:
            yield key, printed, values.open(namespace, key, stored, column)
        except Undecryptable:
            yield key, printed, ""
