"""Value codecs: how a memory value becomes the text of the ``value`` column, one per table shape.

Our shape stores compact JSON; phpClaw's WordPress shape stores PHP ``serialize()`` text,
byte-identical to what phpClaw writes (see :mod:`clawmem.php`). Either way a value is checked
against the memory contract first (finite numbers, str dict keys, no cycles) and its size
against the configured limit, and every error names the key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawmem import php
from clawmem.rules import DEFAULT_MAX_VALUE_BYTES, check_size, check_value, encode_value
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA


class UndecodableValue(ValueError):
    """A stored value is not text its shape's codec reads. Drivers raise it internally; callers
    see a :class:`clawmem.StorageError` that names the key (never the value)."""

    def __init__(self, namespace: str, key: str, codec: str, reason: str) -> None:
        self.namespace = namespace
        self.key = key
        super().__init__(f"the value of key {key!r} in namespace {namespace!r} is not {codec}: {reason}")


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


JSON = ValueCodec("JSON", encode_value, json.loads)
PHP_SERIALIZE = ValueCodec("PHP serialize() text", _encode_php, php.unserialize)
CODECS = {CLAWMEM_SCHEMA: JSON, PHPCLAW_SCHEMA: PHP_SERIALIZE}


def codec_for(shape: str) -> ValueCodec:
    """Return the value codec of a table shape (``clawmem`` or ``phpclaw-wordpress``)."""
    return CODECS[shape]
