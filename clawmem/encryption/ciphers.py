"""The cipher a site's settings configure, with the key store of ``CLAW_KEYSTORE_URL`` as its
source of per-subject data keys (SPEC 13).

Every store of a process that seals or opens values for one set of settings shares one
:class:`~clawmem.crypto.Cipher` (:func:`cipher_for`), so the key of a subject erased by this
process is forgotten by every store of it at once.

With a key store, a subject's rows are sealed under the subject's own data key: their
conversations (and those conversations' messages) and every entry of their subject namespace.
The key store knows a subject by its user id (hashed with the site's prefix), the name both a
conversation's ``user_id`` and a subject namespace (:func:`clawmem.rules.subject_of_namespace`)
lead to.
"""

from __future__ import annotations

import functools
import time

from clawmem.clock import Clock
from clawmem.crypto import Cipher, Keyring
from clawmem.crypto.keystore import (
    CachedKeys,
    KeyStore,
    check_keystore_url,
    is_redis_url,
    needs_keyring,
    redis_backend,
)
from clawmem.errors import redact
from clawmem.settings import Settings
from clawmem.sql.keystore import SqlKeyBackend


def open_keystore(settings: Settings, keyring: Keyring | None, clock: Clock = time.time) -> KeyStore | None:
    """Return the key store ``settings`` configure, or ``None`` without ``CLAW_KEYSTORE_URL``.

    Nothing is created or connected to here. Raises :class:`clawmem.errors.ConfigError` for a
    URL :func:`~clawmem.crypto.keystore.check_keystore_url` refuses, or a key store without keys.
    """
    if not settings.keystore_url.strip():
        return None
    url = check_keystore_url(settings)
    keyring = needs_keyring(keyring)
    prefix = settings.table_prefix
    if is_redis_url(url):
        backend = redis_backend(url, prefix)
        return KeyStore(backend, keyring, prefix, clock)
    return KeyStore(SqlKeyBackend.from_url(url, prefix, redact(url)), keyring, prefix, clock)


@functools.cache
def cipher_for(settings: Settings) -> Cipher:
    """Return the process's one cipher for ``settings``: off without keys, with the key store
    of ``CLAW_KEYSTORE_URL`` as its key source when set. Raises :class:`ConfigError`."""
    keyring = Keyring.from_settings(settings)
    keystore = open_keystore(settings, keyring)
    return Cipher(keyring, keystore, settings.encryption_strict)


def keystore_of(cipher: Cipher) -> KeyStore | None:
    """Return the key store behind ``cipher``, or ``None`` when it has none."""
    source = cipher.key_source
    source = source.store if isinstance(source, CachedKeys) else source
    return source if isinstance(source, KeyStore) else None


def subject_of_user(user_id: str | None) -> str | None:
    """Return the subject a conversation of ``user_id`` belongs to for the key store: the user id,
    or ``None`` for an anonymous conversation (``user_id`` empty)."""
    return user_id or None
