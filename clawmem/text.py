"""Text sizes and cuts in UTF-8 bytes and characters: what budgets, logs and pages measure."""

from __future__ import annotations


def utf8_len(text: str) -> int:
    """Return the UTF-8 size of ``text`` in bytes."""
    return len(text.encode("utf-8"))


def cut_utf8(text: str, max_bytes: int) -> str:
    """Return the longest prefix of ``text`` that fits in ``max_bytes`` UTF-8 bytes."""
    if max_bytes <= 0:
        return ""
    # Decoding a byte prefix with "ignore" drops only a partial character at its end.
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def clip(text: str, max_chars: int) -> str:
    """Return ``text`` unchanged if it has at most ``max_chars`` characters, else its first
    ``max_chars - 1`` characters, trailing whitespace removed, followed by "…"."""
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"
