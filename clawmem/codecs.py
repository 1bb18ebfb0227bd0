"""Value codecs: how a memory value becomes the text of the ``value`` column, one per table shape.

Our shape stores compact JSON; phpClaw's WordPress shape stores PHP ``serialize()`` text,
byte-identical to what phpClaw writes (see :mod:`clawmem.php`). Either way a value is checked
against the memory contract first (finite numbers, str dict keys, no cycles) and its size
against the configured limit, and every error names the key.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from clawmem import php
from clawmem.crypto import PLAIN, Cipher, Context
from clawmem.errors import UndecodableValue, Undecryptable
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, check_size, check_value, encode_value, problem_in
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA
from clawmem.vector_data import VectorData, vector_text


def _encode_php(key: str, value: Any, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> str:
    check_value(key, value)
    try:
        text = php.serialize(value)
    except ValueError as exc:
        raise ValueError(f"value for key {key!r}: {exc}") from None
    check_size(f"value for key {key!r}", text, max_bytes)
    return text


@dataclass(frozen=True)
class ValueCodec:
    """Turns values into column text and back. ``decode`` raises ``ValueError`` for bad text."""

    name: str
    encode: Callable[[str, Any, int], str]  # (key, value, max_bytes) -> text
    decode: Callable[[str], Any]

    def read(self, namespace: str, key: str, text: str) -> Any:
        """Return the value stored as ``text``; raise :class:`UndecodableValue` naming the key."""
        try:
            return self.decode(text)
        except (ValueError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
            raise UndecodableValue(namespace, key, self.name, reason) from None

    def recallable(self, namespace: str, key: str, text: str) -> Any:
        """Return the value stored as ``text`` as :meth:`read` does, and raise
        :class:`UndecodableValue` too for one no page or prompt can hold (a lone surrogate,
        nesting past the limit: see :func:`~clawmem.rules.problem_in`)."""
        value = self.read(namespace, key, text)
        problem = problem_in(value, text)
        if problem is not None:
            raise UndecodableValue(namespace, key, self.name, f"the value {problem}")
        return value


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:20]} overflows a float")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json_value(text: str) -> Any:
    """Return the value of strict JSON ``text``: ``NaN``, ``Infinity`` and a float that overflows
    (``1e999``) raise ``ValueError``, as clawmem never writes them and a document holding them
    is not JSON. (Integers of any size are JSON, and clawmem writes them.)"""
    if isinstance(text, str) and not text.startswith("\ufeff"):  # what json.loads checks first
        return _STRICT.decode(text)
    return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)


# One decoder for every value: json.loads with these hooks would build a decoder and its
# scanner per call, and a full load of the recall index decodes every stored value.
_STRICT = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


JSON = ValueCodec("JSON", encode_value, decode_json_value)
PHP_SERIALIZE = ValueCodec("PHP serialize() text", _encode_php, php.unserialize)
CODECS = {CLAWMEM_SCHEMA: JSON, PHPCLAW_SCHEMA: PHP_SERIALIZE}


log = logging.getLogger("clawmem.recall")


def warn_unreadable(namespace: str, key: str) -> None:
    """Log that recall skips an entry whose stored value cannot be decoded: the key, never the value."""
    log.warning(
        "recall skips key %r in namespace %r: its stored value cannot be decoded (another program wrote it)",
        key,
        namespace,
    )


def readable_entries(
    codec: ValueCodec, namespace: str, rows: Iterable[tuple[str, str]]
) -> Iterator[tuple[str, Any]]:
    """Yield ``(key, value)`` of each ``(key, stored text)`` row that decodes, in order; a row
    that does not is skipped with :func:`warn_unreadable`, so one bad row never stops recall."""
    for key, text in rows:
        try:
            yield key, codec.recallable(namespace, key, text)
        except UndecodableValue:
            warn_unreadable(namespace, key)


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


def codec_for(shape: str) -> ValueCodec:
    """Return the value codec of a table shape (``clawmem`` or ``phpclaw-wordpress``)."""
    return CODECS[shape]
