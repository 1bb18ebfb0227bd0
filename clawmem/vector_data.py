"""A stored vector's two forms: packed bytes (its scale and int8 codes) where a backing holds
bytes, and text (a mark and their base64, or an older format) where it holds text or seals."""

from __future__ import annotations

import base64

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
