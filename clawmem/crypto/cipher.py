"""AES-256-GCM over the envelope of :mod:`clawmem.crypto.envelope`, each ciphertext bound by its
associated data to the place it belongs, so a ciphertext copied to another row, column, key or
site fails to open instead of reading as that place's value.
"""

from __future__ import annotations

import binascii
import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawmem.crypto.envelope import (
    NONCE_BYTES,
    SEPARATOR,
    MalformedEnvelope,
    is_sealed,
    key_id_of,
    pack,
    unpack,
)
from clawmem.crypto.keys import Keyring
from clawmem.errors import EncryptionUnavailable, PlaintextRefused, Undecryptable

# How many opened history rows a cipher keeps (about their text's size each), then starts again.
OPENED_KEPT = 20_000

# Which kind of place a Context names: a row of a table, or a memory entry (which Redis and the
# file driver store without a row id, and whose row id an upsert does not know).
ROW = "row"
ENTRY = "entry"


@dataclass(frozen=True)
class Context:
    """Where a sealed value lives; it becomes the ciphertext's associated data.

    Build one with :meth:`row` (conversations, messages, and any other table with row ids) or
    :meth:`entry` (memory entries, on every driver).
    """

    kind: str
    site: str
    table: str
    column: str
    row_id: str = ""
    namespace: str = ""
    key: str = ""

    @classmethod
    def row(cls, site: str, table: str, row_id: str, column: str) -> Context:
        """Return the context of ``column`` of row ``row_id`` in ``table`` (logical name, such as
        ``messages``) of the site whose table prefix is ``site``."""
        return cls(ROW, site, table, column, row_id=row_id)

    @classmethod
    def entry(cls, site: str, namespace: str, key: str, column: str) -> Context:
        """Return the context of ``column`` (``value`` or ``metadata``) of the memory entry
        ``namespace``/``key`` of the site whose table prefix is ``site``."""
        return cls(ENTRY, site, "memory", column, namespace=namespace, key=key)

    def associated_data(self) -> bytes:
        """Return the bytes bound to the ciphertext (see :func:`row_data` and :func:`entry_data`)."""
        if self.kind == ROW:
            return row_data(self.site, self.table, self.row_id, self.column)
        return entry_data(self.site, self.namespace, self.key, self.column)

    def describe(self) -> str:
        """Return where the value lives in words, for an error message (never the value)."""
        site = f" (prefix {self.site!r})" if self.site else ""
        if self.kind == ROW:
            return f"{self.table} row {self.row_id!r} column {self.column}{site}"
        return f"memory namespace {self.namespace!r} key {self.key!r} column {self.column}{site}"


# Each part is prefixed by its length, so no two places give the same bytes, whatever characters
# an id, namespace or key holds.


def row_data(site: str, table: str, row_id: str, column: str) -> bytes:
    """Return the associated data of ``column`` of row ``row_id`` of ``table`` on ``site``."""
    return (
        f"row|{len(site)}:{site}|{len(table)}:{table}|{len(row_id)}:{row_id}|{len(column)}:{column}"
    ).encode("utf-8", "surrogatepass")


def entry_data(site: str, namespace: str, key: str, column: str) -> bytes:
    """Return the associated data of ``column`` of the memory entry ``namespace``/``key`` on ``site``."""
    return (
        f"entry|{len(site)}:{site}|{len(namespace)}:{namespace}|{len(key)}:{key}|{len(column)}:{column}"
    ).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class DataKey:
    """A data key a :class:`KeySource` hands out: its id (as the envelope names it) and its bytes,
    which ``repr`` never shows."""

    key_id: str
    secret: bytes = field(repr=False)


class KeySource(Protocol):
    """Keys beyond the keyring's, such as one data key per subject kept in a key store.

    ``subject_key`` returns the data key that seals ``subject``'s values (creating it if needed),
    or ``None`` to seal under the keyring's primary key. ``key_by_id`` returns the key an
    envelope names, or ``None`` when it is not held (for example erased with its subject).

    A source that keeps keys may also have ``check()`` (forget them if one was erased anywhere),
    ``checked()`` (a block within which that is asked once) and ``on_forget(callback)``; see
    :class:`clawmem.crypto.keystore.KeyStore`.
    """

    def subject_key(self, subject: str) -> DataKey | None: ...

    def key_by_id(self, key_id: str) -> bytes | None: ...


def _aead(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:  # pragma: no cover - the extra is installed wherever tests run
        raise EncryptionUnavailable(
            "CLAW_ENCRYPTION_KEYS is set but the cryptography package is missing: "
            "pip install 'clawmem[encrypt]'"
        ) from None
    return AESGCM(key)


class Cipher:
    """Seals and opens values. With no keyring it is off: :meth:`seal` returns the plaintext, and
    :meth:`open` passes plaintext through but refuses sealed text, which it has no key for.

    ``strict`` (``CLAW_ENCRYPTION_STRICT``) makes :meth:`open` refuse plaintext.
    """

    def __init__(
        self, keyring: Keyring | None = None, key_source: KeySource | None = None, strict: bool = False
    ) -> None:
        self.keyring = keyring
        self.key_source = key_source
        self.strict = strict and keyring is not None
        self._aeads: dict[str, Any] = {}
        # Histories a turn reloads, opened once: the plaintext of an envelope at its place (the
        # same envelope elsewhere is another place and is opened, and fails, on its own).
        self._opened: dict[tuple[bytes, str], str] = {}
        # How many times what was kept was dropped: a reader's own cache of opened text (a
        # search's matches) serves only while this has not moved.
        self.forgotten = 0
        on_forget = getattr(key_source, "on_forget", None)
        if on_forget is not None:
            on_forget(self.forget_opened)  # a key erased by any process drops the plaintexts kept
        if keyring is not None:
            self._aead_for(keyring.primary_id)  # fail now, not at the first write, without the extra

    @classmethod
    def from_settings(cls, settings: Any, key_source: KeySource | None = None) -> Cipher:
        """Return the cipher ``settings`` configure (off when no key is set).

        Raises :class:`clawmem.errors.ConfigError` for a malformed key list or key file.
        """
        keyring = Keyring.from_settings(settings)
        return cls(keyring, key_source, bool(getattr(settings, "encryption_strict", False)))

    @property
    def enabled(self) -> bool:
        """Return whether values are sealed on write."""
        return self.keyring is not None

    @property
    def primary_id(self) -> str | None:
        """Return the key id new values are sealed under (without a subject), or ``None`` when off."""
        return None if self.keyring is None else self.keyring.primary_id

    def reading(self) -> contextlib.AbstractContextManager[None]:
        """Return a block for one read or one turn: the key source checks once, when a key it
        kept is first used (or :meth:`fast_opener` asks), that none was erased since in any
        process, and within the block they serve without asking again. Nothing to check without
        a key source that keeps keys."""
        checked = getattr(self.key_source, "checked", None)
        return checked() if checked is not None else contextlib.nullcontext()

    def check_erasures(self) -> None:
        """Ask the key source (once within a :meth:`reading` block) whether a key it kept was
        erased by any process; if so it forgets its keys, and this cipher every plaintext kept
        (``forgotten`` moves). Raises :class:`~clawmem.errors.KeyStoreError`."""
        check = getattr(self.key_source, "check", None)
        if check is not None:
            check()

    def _aead_for(self, key_id: str) -> Any:
        aead = self._aeads.get(key_id)
        if aead is None:
            key = self.keyring.key(key_id) if self.keyring is not None else None
            if key is None and self.key_source is not None:
                # Not kept here: the key source decides how long a data key outlives its erasure
                # by another process (see clawmem.crypto.keystore).
                key = self.key_source.key_by_id(key_id)
                return None if key is None else _aead(key)
            if key is None:
                return None
            aead = self._aeads[key_id] = _aead(key)
        return aead

    def seal(self, plaintext: str, context: Context, subject: str | None = None) -> str:
        """Return ``plaintext`` sealed for ``context`` under the primary key, or under ``subject``'s
        data key when a key source gives one; the plaintext itself when encryption is off."""
        if self.keyring is None:
            return plaintext
        key_id = self.keyring.primary_id
        aead = None
        if subject and self.key_source is not None:
            data_key = self.key_source.subject_key(subject)
            if data_key is not None:
                key_id = data_key.key_id
                aead = _aead(data_key.secret)
        if aead is None:
            aead = self._aead_for(key_id)
        nonce = os.urandom(NONCE_BYTES)
        return pack(key_id, nonce, aead.encrypt(nonce, plaintext.encode("utf-8"), context.associated_data()))

    def open(self, text: str, context: Context) -> str:
        """Return the plaintext of ``text`` stored at ``context``; plaintext passes through unless strict.

        Raises :class:`clawmem.errors.Undecryptable` (missing key, wrong key, altered or moved
        text) or :class:`clawmem.errors.PlaintextRefused` (strict mode), naming the place and key id.
        """
        if not is_sealed(text):
            if self.strict:
                raise PlaintextRefused(
                    context.describe(), None, "stored as plaintext and CLAW_ENCRYPTION_STRICT is on"
                )
            return text
        return self.open_sealed(text, context.associated_data(), context.describe)

    def open_sealed(self, text: str, associated_data: bytes, where: Any) -> str:
        """Return the plaintext of the envelope ``text`` bound to ``associated_data`` (see
        :func:`row_data`), for callers opening many rows; ``where()`` describes the place, asked
        only for an error. Raises :class:`clawmem.errors.Undecryptable` as :meth:`open` does."""
        try:
            key_id, nonce, ciphertext = unpack(text)
        except MalformedEnvelope as exc:
            raise Undecryptable(where(), key_id_of(text), f"the envelope is damaged ({exc})") from None
        aead = self._aead_for(key_id)
        if aead is None:
            reason = (
                "encryption is off (no CLAW_ENCRYPTION_KEYS)"
                if self.keyring is None
                else "no configured key has this id"
            )
            raise Undecryptable(where(), key_id, reason)
        try:
            plain = aead.decrypt(nonce, ciphertext, associated_data)
        except _open_failures():
            raise Undecryptable(
                where(), key_id, "wrong key, or the text was altered or moved from another place"
            ) from None
        try:
            return plain.decode("utf-8")
        except UnicodeDecodeError:  # pragma: no cover - only a sealed non-UTF-8 value could do this
            raise Undecryptable(where(), key_id, "the plaintext is not UTF-8") from None

    def fast_opener(self) -> Any:
        """Return ``open(text, associated_data) -> str | None`` for opening many rows in a loop:
        the plaintext, or ``None`` whenever anything is amiss (a key not yet loaded, a damaged
        envelope, a failed tag), for the caller to open that row with :meth:`open_sealed`, which
        says why. Never a value that did not authenticate. Raises
        :class:`~clawmem.errors.KeyStoreError` when the key source cannot say whether a key was
        erased (the plaintexts kept are dropped when one was)."""
        self.check_erasures()
        aeads = self._aeads
        if self.keyring is not None:
            for key_id in self.keyring.key_ids:
                self._aead_for(key_id)
        a2b = binascii.a2b_base64
        opened = self._opened
        failures = _open_failures()

        def open_fast(text: str, associated_data: bytes) -> str | None:
            place = (associated_data, text)
            found = opened.get(place)
            if found is not None:
                return found
            _, _, rest = text.partition(SEPARATOR)
            key_id, separator, body = rest.partition(SEPARATOR)
            aead = aeads.get(key_id)
            if aead is None or not separator:
                return None
            try:
                raw = a2b(body + "=" * (-len(body) % 4))
                plain = aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], associated_data).decode("utf-8")
            except failures:  # the careful path opens it again and says why
                return None
            if len(opened) >= OPENED_KEPT:
                opened.clear()
            opened[place] = plain
            return plain

        return open_fast

    def forget_opened(self) -> None:
        """Drop the plaintexts :meth:`fast_opener` keeps (after an erasure, or a key removed)."""
        self._opened.clear()
        self.forgotten += 1

    def forget_key(self, key_id: str) -> None:
        """Drop the cached key of ``key_id`` and every plaintext kept, so the next open asks the
        key source again (after a subject's data key is erased)."""
        self._aeads.pop(key_id, None)
        self.forget_opened()

    def __repr__(self) -> str:
        ids = None if self.keyring is None else list(self.keyring.key_ids)
        return f"Cipher(key_ids={ids!r}, strict={self.strict}, key_source={self.key_source is not None})"


# The cipher that seals nothing: what every store uses until keys are set.
PLAIN = Cipher()


def _open_failures() -> tuple[type[Exception], ...]:
    # What a failed open raises: a tag that does not authenticate (cryptography's InvalidTag),
    # and ValueError for bad base64, a nonce of the wrong size or a plaintext that is not UTF-8.
    try:
        from cryptography.exceptions import InvalidTag
    except ImportError:  # without it no key loads, so nothing is ever decrypted
        return (ValueError,)
    return (InvalidTag, ValueError)
