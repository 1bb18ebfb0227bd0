"""Value codecs: how a memory value becomes the text of the ``value`` column, one per table shape.

Our shape stores compact JSON; phpClaw's WordPress shape stores PHP ``serialize()`` text,
byte-identical to what phpClaw writes (see :mod:`clawmem.php`). Either way a value is checked
against the memory contract first (finite numbers, str dict keys, no cycles) and its size
against the configured limit, and every error names the key.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from clawmem import php
from clawmem.errors import UndecodableValue
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, check_size, check_value, encode_value, problem_in
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA


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


def codec_for(shape: str) -> ValueCodec:
    """Return the value codec of a table shape (``clawmem`` or ``phpclaw-wordpress``)."""
    return CODECS[shape]


# -- vectors: packed int8 codes, or their text -------------------------------------------------

VECTOR_MARK = "i8:"  # begins a vector's text (never a character of base64): its packed bytes in base64
VectorData = bytes | str  # a vector as a backing holds it: packed bytes, or a text (sealed, or older)


def vector_text(data: VectorData) -> str:
    """Return a vector as text: packed bytes as ``VECTOR_MARK`` and their base64 (what a
    backing that holds only text stores, and what is sealed), a text as it is."""
    if isinstance(data, str):
        return data
    return VECTOR_MARK + base64.b64encode(data).decode("ascii")


def read_vector(raw: bytes | memoryview | str | None) -> VectorData:
    """Return a stored vector as read from a backing that holds bytes: text where its bytes are
    ASCII (sealed, or of an older format stored as text), else packed bytes. Packed bytes are
    ASCII only when every code and scale byte is below 128, which a unit vector's never are
    together; such a row reads as an unreadable text, and is embedded again."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    data = bytes(raw)
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return data
