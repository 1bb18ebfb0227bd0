"""The sealed text format: ``cm1$<key id>$<base64(nonce | ciphertext and tag), unpadded>``.

The marker and the key id stand in plain at the start, so SQL can count the rows under each key
id with ``LIKE 'cm1$<id>$%'`` (see :func:`like_pattern`) without decrypting anything, and a row
that does not start with the marker is plaintext written before encryption was on.
"""

from __future__ import annotations

import binascii
import re

# The format's version: a later format gets a new marker and this module reads both.
MARKER = "cm1"
SEPARATOR = "$"
PREFIX = MARKER + SEPARATOR
NONCE_BYTES = 12  # AES-GCM's standard nonce
TAG_BYTES = 16
# Short, plain, and free of the separator and of anything a LIKE pattern would need escaped but "_".
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


class MalformedEnvelope(ValueError):
    """Text that starts with the envelope's marker but is not a whole envelope (internal: the
    cipher reports it as :class:`clawmem.errors.Undecryptable`)."""


def is_sealed(text: object) -> bool:
    """Return whether ``text`` is a str in the envelope format (it starts with ``cm1$``)."""
    return isinstance(text, str) and text.startswith(PREFIX)


def key_id_of(text: object) -> str | None:
    """Return the key id a sealed ``text`` names, or ``None`` for plaintext or a malformed envelope."""
    if not is_sealed(text):
        return None
    assert isinstance(text, str)
    key_id, separator, _ = text[len(PREFIX) :].partition(SEPARATOR)
    return key_id if separator and KEY_ID.fullmatch(key_id) else None


def pack(key_id: str, nonce: bytes, ciphertext: bytes) -> str:
    """Return the envelope text of ``nonce`` and ``ciphertext`` (which ends with its tag)."""
    body = binascii.b2a_base64(nonce + ciphertext, newline=False).rstrip(b"=").decode("ascii")
    return f"{PREFIX}{key_id}{SEPARATOR}{body}"


def unpack(text: str) -> tuple[str, bytes, bytes]:
    """Return ``(key id, nonce, ciphertext)`` of an envelope.

    Raises :class:`MalformedEnvelope` when the text is cut short or its body is not base64.
    """
    # One split, no pattern: this runs once per row of every history a turn loads.
    marker, _, rest = text.partition(SEPARATOR)
    key_id, separator, body = rest.partition(SEPARATOR)
    if marker != MARKER or not separator or not KEY_ID.fullmatch(key_id):
        raise MalformedEnvelope("not an envelope")
    try:
        raw = binascii.a2b_base64(body + "=" * (-len(body) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        raise MalformedEnvelope("the body is not base64") from None
    if len(raw) < NONCE_BYTES + TAG_BYTES:
        raise MalformedEnvelope("the body is too short")
    return key_id, raw[:NONCE_BYTES], raw[NONCE_BYTES:]


def sealed_length(plaintext_bytes: int, key_id_length: int) -> int:
    """Return the length in characters (ASCII, so bytes too) of the envelope of a plaintext of
    ``plaintext_bytes`` UTF-8 bytes under a key id of ``key_id_length`` characters."""
    raw = NONCE_BYTES + plaintext_bytes + TAG_BYTES
    return len(PREFIX) + key_id_length + 1 + (raw * 4 + 2) // 3


def largest_plaintext(column_bytes: int, key_id_length: int) -> int:
    """Return the most UTF-8 bytes of plaintext whose envelope fits in ``column_bytes``."""
    room = column_bytes - len(PREFIX) - key_id_length - 1
    return max(0, room * 3 // 4 - NONCE_BYTES - TAG_BYTES)


def like_pattern(key_id: str | None = None) -> str:
    """Return the ``LIKE`` pattern (escape character ``\\``) matching envelopes under ``key_id``,
    or under any key id when it is ``None``."""
    if key_id is None:
        return PREFIX.replace("_", "\\_") + "%"
    return (PREFIX + key_id + SEPARATOR).replace("_", "\\_") + "%"
