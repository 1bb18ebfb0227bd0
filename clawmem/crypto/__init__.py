"""Encryption at rest (SPEC 13): the sealed text envelope, the master keys, and the cipher that
binds each ciphertext to its place. Needs the ``cryptography`` package (``clawmem[encrypt]``)
only when keys are set."""

from __future__ import annotations

from clawmem.crypto.cipher import ENTRY, PLAIN, ROW, Cipher, Context, DataKey, KeySource
from clawmem.crypto.envelope import (
    MARKER,
    PREFIX,
    is_sealed,
    key_id_of,
    largest_plaintext,
    like_pattern,
    sealed_length,
)
from clawmem.crypto.keys import KEY_BYTES, Keyring, generate_key, parse_keys, read_key_file

__all__ = [
    "ENTRY",
    "KEY_BYTES",
    "MARKER",
    "PLAIN",
    "PREFIX",
    "ROW",
    "Cipher",
    "Context",
    "DataKey",
    "KeySource",
    "Keyring",
    "generate_key",
    "is_sealed",
    "key_id_of",
    "largest_plaintext",
    "like_pattern",
    "parse_keys",
    "read_key_file",
    "sealed_length",
]
