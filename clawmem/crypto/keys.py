"""Master keys: ``CLAW_ENCRYPTION_KEYS`` or ``CLAW_ENCRYPTION_KEY_FILE``, parsed into a :class:`Keyring`.

A key lives in the process only: it is never written to the database, and nothing here prints
it (the keyring's ``repr`` names the key ids alone).
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
from pathlib import Path

from clawmem.crypto.envelope import KEY_ID
from clawmem.errors import ConfigError

KEY_BYTES = 32  # AES-256
KEYS_VARIABLE = "CLAW_ENCRYPTION_KEYS"
KEY_FILE_VARIABLE = "CLAW_ENCRYPTION_KEY_FILE"


def generate_key(key_id: str) -> str:
    """Return a new ``id:base64key`` item for ``CLAW_ENCRYPTION_KEYS`` with 32 random bytes.

    Raises :class:`ConfigError` when ``key_id`` is not 1-32 of ``A-Z a-z 0-9 _ -``.
    """
    _check_key_id(key_id, "the key id")
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode('ascii')}"


def _check_key_id(key_id: str, where: str) -> None:
    if not KEY_ID.fullmatch(key_id):
        raise ConfigError(f"{where}: a key id is 1-32 of A-Z a-z 0-9 _ -, got {key_id!r}")


def parse_keys(text: str, source: str = KEYS_VARIABLE) -> tuple[tuple[str, bytes], ...]:
    """Return the ``(key id, key)`` pairs of a comma- or newline-separated ``id:base64key`` list,
    in order (blank items and ``#`` comment lines skipped).

    Raises :class:`ConfigError` naming ``source`` and the item's position, never the key: an item
    without ``:``, a bad key id, a key id named twice, a key that is not base64 of 32 bytes.
    """
    lines = (line for line in text.splitlines() if not line.lstrip().startswith("#"))
    items = [item.strip() for line in lines for item in line.split(",")]
    pairs: list[tuple[str, bytes]] = []
    for position, item in enumerate((item for item in items if item), start=1):
        key_id, colon, encoded = (part.strip() for part in item.partition(":"))
        where = f"{source} item {position}"
        if not colon:
            raise ConfigError(f"{where} must be id:base64key, such as k1:<44 base64 characters>")
        _check_key_id(key_id, where)
        if any(key_id == seen for seen, _ in pairs):
            raise ConfigError(f"{where} names the key id {key_id!r} twice")
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where} ({key_id!r}): the key is not base64") from None
        if len(key) != KEY_BYTES:
            raise ConfigError(
                f"{where} ({key_id!r}): the key must be {KEY_BYTES} bytes (AES-256), got {len(key)}; "
                "make one with `clawmem keys generate`"
            )
        pairs.append((key_id, key))
    return tuple(pairs)


def read_key_file(path: str | os.PathLike[str]) -> str:
    """Return the text of a key file, refusing one that its group or others may read or write.

    Raises :class:`ConfigError` naming ``CLAW_ENCRYPTION_KEY_FILE`` and the path (missing, not a
    file, or a mode other than owner-only such as 0600 or 0400).
    """
    file = Path(path)
    try:
        info = file.stat()
    except OSError as exc:
        raise ConfigError(f"{KEY_FILE_VARIABLE}: cannot read {file}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{KEY_FILE_VARIABLE}: {file} is not a regular file")
    if info.st_mode & 0o077:
        raise ConfigError(
            f"{KEY_FILE_VARIABLE}: {file} has mode {stat.S_IMODE(info.st_mode):04o}, readable beyond its "
            f"owner; make it 0600 (chmod 600 {file})"
        )
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{KEY_FILE_VARIABLE}: cannot read {file}: {exc}") from None


class Keyring:
    """The master keys in order: the first (``primary``) encrypts, every one decrypts.

    Build it with :meth:`from_text`, :meth:`from_file` or :meth:`from_settings`.
    """

    __slots__ = ("_keys",)

    def __init__(self, pairs: tuple[tuple[str, bytes], ...] | list[tuple[str, bytes]]) -> None:
        keys = dict(pairs)
        if not keys:
            raise ConfigError(f"{KEYS_VARIABLE} names no key")
        if len(keys) != len(pairs):
            raise ConfigError(f"{KEYS_VARIABLE} names a key id twice")
        for key_id, key in keys.items():
            _check_key_id(key_id, KEYS_VARIABLE)
            if len(key) != KEY_BYTES:
                raise ConfigError(f"{KEYS_VARIABLE} ({key_id!r}): the key must be {KEY_BYTES} bytes")
        self._keys = keys

    @classmethod
    def from_text(cls, text: str, source: str = KEYS_VARIABLE) -> Keyring:
        """Return the keyring of an ``id:base64key,…`` list; raises :class:`ConfigError`."""
        return cls(parse_keys(text, source))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """Return the keyring of a 0600 key file; raises :class:`ConfigError` (see :func:`read_key_file`)."""
        return cls(parse_keys(read_key_file(path), f"{KEY_FILE_VARIABLE} {path}"))

    @classmethod
    def from_settings(cls, settings: object) -> Keyring | None:
        """Return the keyring ``settings`` (a :class:`clawmem.settings.Settings`) configure, or
        ``None`` when encryption is off. Raises :class:`ConfigError` when both or a bad one is set."""
        text = getattr(settings, "encryption_keys", "")
        path = getattr(settings, "encryption_key_file", "")
        if text and path:
            raise ConfigError(f"set {KEYS_VARIABLE} or {KEY_FILE_VARIABLE}, not both")
        if path:
            return cls.from_file(path)
        return cls.from_text(text) if text else None

    @property
    def primary_id(self) -> str:
        """Return the id of the key that encrypts: the first listed."""
        return next(iter(self._keys))

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Return every key id, the primary first."""
        return tuple(self._keys)

    def key(self, key_id: str) -> bytes | None:
        """Return the key of ``key_id``, or ``None`` when the keyring does not hold it."""
        return self._keys.get(key_id)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __repr__(self) -> str:
        return f"Keyring(key_ids={list(self._keys)!r})"
