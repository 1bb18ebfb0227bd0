"""Keys and seals (SPEC 13), with no SQL and no site: the sealed text envelope, the master keys,
the cipher that binds each ciphertext to its place, the key store's contract with its Redis and
file stores, stored values (codec then seal), and the private key files of the instance folder.
Needs the ``cryptography`` package (``clawmem[encrypt]``) only when keys are set.

It imports only the ground floor; :mod:`clawmem.sql` and everything above stand on it. A site's
cipher, built from its settings, is in :mod:`clawmem.encryption`.
"""

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
