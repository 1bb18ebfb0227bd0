"""Encryption at rest on one site (SPEC 13), built from its settings: the cipher
``CLAW_ENCRYPTION_KEYS`` and ``CLAW_KEYSTORE_URL`` configure (:mod:`~clawmem.encryption.ciphers`),
and the start-up check of the keys with the state pages show (:mod:`~clawmem.encryption.state`).

It stands on :mod:`clawmem.crypto` (the primitives) and :mod:`clawmem.sql` (the SQL key store,
the sealed rows' counts); memory, the turn and the operations import it, never the reverse.
"""
