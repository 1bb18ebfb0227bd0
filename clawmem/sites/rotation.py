"""Key rotation (SPEC 13): every encrypted value of a site brought under the key that encrypts
(the first of ``CLAW_ENCRYPTION_KEYS``), plaintext left from before encryption was on sealed, and
every subject's data key re-wrapped under the new master key, in batches that each commit on
their own, so a killed run loses nothing and the next one carries on where it stopped.

Persisted vectors (the sql driver's vectors table, Redis hashes, vectors files) are sealed like
the values and rotated with them; they are derived, so one that cannot be decrypted is deleted
and embedded again, never reported as a value left behind.

A value that cannot be decrypted (its key missing, wrong or altered) is never rewritten and never
deleted: it is counted, named by table and row id, and left for the operator. After a run with
nothing left behind, ``keys status`` shows no row under the old key, which can then be dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from clawmem.codecs import vector_text
from clawmem.crypto import Cipher, Context, key_id_of
from clawmem.crypto.keystore import CachedKeys
from clawmem.encryption.ciphers import cipher_for, keystore_of
from clawmem.errors import ConfigError, Undecryptable
from clawmem.rules import subject_of_namespace
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql import rotation as sql
from clawmem.sql.sizes import present_tables

TABLES = tuple(sql.ROTATED)
SUBJECT_KEYS = "subject_keys"
VECTORS = "vectors"
VECTOR_COLUMN = "vector"  # what a sealed vector is bound to (clawmem.memory.sql_vectors.COLUMN)


@dataclass(frozen=True)
class RotationBatch:
    """One committed batch: ``rows`` of ``table`` re-encrypted (or ``subject_keys`` re-wrapped)."""

    table: str
    rows: int
    skipped: int = 0  # rows written by the agent between the read and the write: left as they are


@dataclass
class Rotated:
    """What a rotation did, or with ``dry_run`` would do: rows per table and subject keys."""

    dry_run: bool
    primary: str
    counts: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    undecryptable: list[str] = field(default_factory=list)  # "table row id: reason", never a value
    vectors_dropped: int = 0  # vectors that could not be decrypted: deleted, embedded again

    @property
    def total(self) -> int:
        """Return every row and key the rotation moved (or would move)."""
        return sum(self.counts.values())


OnRotated = Callable[[RotationBatch], None]


def rotation_cipher(settings: Settings) -> Cipher:
    """Return the cipher a rotation re-encrypts with: the site's keys and key store, never strict
    (a rotation must read the plaintext it is there to seal). Raises :class:`ConfigError` when
    encryption is off: there is no key to rotate to."""
    site_cipher = cipher_for(settings)
    if not site_cipher.enabled:
        raise ConfigError(
            "encryption is off: set CLAW_ENCRYPTION_KEYS (or CLAW_ENCRYPTION_KEY_FILE), the new key first, "
            "then run keys rotate"
        )
    keystore = keystore_of(site_cipher)
    return Cipher(site_cipher.keyring, None if keystore is None else CachedKeys(keystore), strict=False)


def _behind(text: str, primary: str) -> bool:
    # Plaintext, or sealed under a master key other than the first; a subject's data key is
    # re-wrapped instead, and its rows never move.
    key_id = key_id_of(text)
    return key_id != primary and not (key_id or "").startswith("s-")


def _subjects(site: Site, cipher: Cipher) -> str | None:
    # With a key store, subjects' rows belong under their data keys: the template that names them.
    return site.settings.subject_namespace if keystore_of(cipher) is not None else None


def _entry_behind(site: Site, cipher: Cipher, namespace: str, text: str) -> bool:
    if _behind(text, cipher.primary_id or ""):
        return True
    keyed = keystore_of(cipher) is not None
    subject = subject_of_namespace(namespace, site.settings.subject_namespace) if keyed else None
    return subject is not None and not (key_id_of(text) or "").startswith("s-")


def _stored_driver(site: Site) -> Any:
    """Return the site's memory driver when it keeps entries outside the SQL tables and can list
    them as stored (Redis, files); ``None`` for the sql driver and for drivers that keep nothing."""
    if site.settings.memory_driver == "sql":
        return None
    driver = site.driver
    return driver if hasattr(driver, "stored_texts") and getattr(driver, "at_rest", False) else None


def vector_backing(site: Site) -> Any:
    """Return where the site's memory driver keeps its vectors, or ``None`` (the array driver, a
    prefix whose vectors table ``init-db`` has not created)."""
    try:
        driver = site.driver
    except ConfigError:
        return None
    keeping = getattr(driver, "vector_backing", None)
    return keeping() if callable(keeping) else None


def vector_key_counts(site: Site) -> tuple[str, dict[str, int], int] | None:
    """Return where the persisted vectors are, their count per key id and the plaintext ones;
    ``None`` without a store of vectors."""
    backing = vector_backing(site)
    if backing is None:
        return None
    texts = (
        vector_text(text) for namespace in backing.namespaces() for _, _, text in backing.stored(namespace)
    )
    return (backing.name, *_by_key_id(texts))


def memory_key_counts(site: Site) -> tuple[dict[str, int], int] | None:
    """Return the entries of a Redis or file memory per key id and the plaintext ones, by a scan
    of every namespace (expired entries included); ``None`` for the sql driver (counted by SQL)."""
    driver = _stored_driver(site)
    if driver is None:
        return None
    texts = (text for namespace in driver.namespaces() for _, text, _ in driver.stored_texts(namespace))
    return _by_key_id(texts)


def _by_key_id(texts: Iterable[str]) -> tuple[dict[str, int], int]:
    """Return how many of ``texts`` are sealed under each key id, and how many are plaintext."""
    per_key: dict[str, int] = {}
    plaintext = 0
    for text in texts:
        key_id = key_id_of(text)
        if key_id is None:
            plaintext += 1
        else:
            per_key[key_id] = per_key.get(key_id, 0) + 1
    return per_key, plaintext


def rotation_plan(site: Site, cipher: Cipher) -> dict[str, int]:
    """Return what a rotation would do now: rows per table not under the first key (plaintext
    included), and subject keys wrapped by another master key."""
    primary = cipher.primary_id or ""
    subjects = _subjects(site, cipher)
    plan = dict.fromkeys(TABLES, 0)
    if present_tables(site.engine, site.prefix):
        with site.engine.connect() as conn:
            for name in TABLES:
                if name == "memory" and site.settings.memory_driver != "sql":
                    continue
                plan[name] = sql.count_behind(conn, site.prefix, name, primary, subjects)
    driver = _stored_driver(site)
    if driver is not None:
        plan["memory"] = sum(
            _entry_behind(site, cipher, namespace, text)
            for namespace in driver.namespaces()
            for _, text, _ in driver.stored_texts(namespace)
        )
    backing = vector_backing(site)
    if backing is not None:
        behind = sum(
            _entry_behind(site, cipher, namespace, vector_text(text))
            for namespace in backing.namespaces()
            for _, _, text in backing.stored(namespace)
        )
        if behind:
            plan[VECTORS] = behind
    keystore = keystore_of(cipher)
    if keystore is not None:
        plan[SUBJECT_KEYS] = sum(count for master, count in keystore.counts().items() if master != primary)
    return plan


def _context(prefix: str, row: sql.StoredRow, column: str) -> Context:
    if row.table == "memory":
        return Context.entry(prefix, row.namespace or "", row.key or "", column)
    return Context.row(prefix, row.table, row.row_id, column)


def _subject(settings: Settings, row: sql.StoredRow) -> str | None:
    if row.table == "memory":
        return subject_of_namespace(row.namespace or "", settings.subject_namespace)
    return row.user_id


def _resealed(
    site: Site, cipher: Cipher, row: sql.StoredRow, columns: tuple[str, ...]
) -> tuple[str | None, ...]:
    subject = _subject(site.settings, row)
    new = []
    for column, text in zip(columns, row.texts, strict=True):
        if text is None:
            new.append(None)
            continue
        context = _context(site.prefix, row, column)
        new.append(cipher.seal(cipher.open(text, context), context, subject))
    return tuple(new)


def _table_batches(
    site: Site, cipher: Cipher, name: str, batch_size: int, rotated: Rotated
) -> Iterator[RotationBatch]:
    primary = cipher.primary_id or ""
    subjects = _subjects(site, cipher)
    columns = sql.ROTATED[name]
    after = ""
    while True:
        with site.engine.connect() as conn:
            rows = sql.rows_behind(conn, site.prefix, name, primary, after, batch_size, subjects)
        if not rows:
            return
        after = rows[-1].row_id
        changes = []
        for row in rows:
            try:
                changes.append((row, _resealed(site, cipher, row, columns)))
            except Undecryptable as exc:
                rotated.undecryptable.append(f"{name} row {row.row_id}: {exc}")
        written = sql.write_rotated(site.engine, site.prefix, name, changes)
        if changes:
            yield RotationBatch(name, written, len(changes) - written)


def _driver_batches(site: Site, cipher: Cipher, batch_size: int, rotated: Rotated) -> Iterator[RotationBatch]:
    # Redis and files: each namespace's entries as stored, written back where unchanged.
    driver = _stored_driver(site)
    if driver is None:
        return
    for namespace in driver.namespaces():
        subject = subject_of_namespace(namespace, site.settings.subject_namespace)
        behind = [
            entry
            for entry in driver.stored_texts(namespace)
            if _entry_behind(site, cipher, namespace, entry[1])
        ]
        for start in range(0, len(behind), batch_size):
            changes = []
            for key, text, raw in behind[start : start + batch_size]:
                context = Context.entry(site.prefix, namespace, key, "value")
                try:
                    changes.append((key, raw, cipher.seal(cipher.open(text, context), context, subject)))
                except Undecryptable as exc:
                    rotated.undecryptable.append(str(exc))
            written = driver.replace_texts(namespace, changes)
            if changes:
                yield RotationBatch("memory", written, len(changes) - written)


def _vector_batches(site: Site, cipher: Cipher, batch_size: int, rotated: Rotated) -> Iterator[RotationBatch]:
    # Each namespace's vectors as stored, written back where unchanged; one that cannot be
    # opened is deleted, so the next turn or `clawmem embed` embeds it again.
    backing = vector_backing(site)
    if backing is None:
        return
    for namespace in backing.namespaces():
        subject = subject_of_namespace(namespace, site.settings.subject_namespace)
        behind = [
            row
            for row in backing.stored(namespace)
            if _entry_behind(site, cipher, namespace, vector_text(row[2]))
        ]
        for start in range(0, len(behind), batch_size):
            changes = []
            unreadable = []
            for key, printed, text in behind[start : start + batch_size]:
                context = Context.entry(site.prefix, namespace, key, VECTOR_COLUMN)
                try:
                    # packed bytes (plaintext) are sealed as their text
                    sealed = cipher.seal(cipher.open(vector_text(text), context), context, subject)
                    changes.append((key, printed, text, sealed))
                except Undecryptable:
                    unreadable.append(key)
            if unreadable:
                backing.delete(namespace, unreadable, [])
                rotated.vectors_dropped += len(unreadable)
            written = backing.replace_stored(namespace, changes)
            if changes:
                yield RotationBatch(VECTORS, written, len(changes) - written)


def rotate(
    site: Site,
    batch_size: int = 1000,
    dry_run: bool = False,
    on_batch: OnRotated | None = None,
    cipher: Cipher | None = None,
) -> Rotated:
    """Re-encrypt every value of the site's tables that is not under the first key (plaintext
    included), ``batch_size`` rows per committed batch, then re-wrap every subject key under it;
    tell ``on_batch`` of each committed batch. With ``dry_run`` only count.

    Raises :class:`ConfigError` when encryption is off or ``batch_size`` is below 1, and
    :class:`clawmem.errors.KeyStoreError` for a subject key whose master key is not listed.
    """
    if batch_size < 1:
        raise ConfigError(f"the batch size must be at least 1, got {batch_size}")
    cipher = cipher if cipher is not None else rotation_cipher(site.settings)
    rotated = Rotated(dry_run, cipher.primary_id or "")
    if dry_run:
        rotated.counts = rotation_plan(site, cipher)
        return rotated

    def committed(batch: RotationBatch) -> None:
        rotated.counts[batch.table] = rotated.counts.get(batch.table, 0) + batch.rows
        rotated.batches += 1
        if on_batch is not None:
            on_batch(batch)

    if present_tables(site.engine, site.prefix):
        for name in TABLES:
            if name == "memory" and site.settings.memory_driver != "sql":
                continue
            for batch in _table_batches(site, cipher, name, batch_size, rotated):
                committed(batch)
    for batch in _driver_batches(site, cipher, batch_size, rotated):
        committed(batch)
    for batch in _vector_batches(site, cipher, batch_size, rotated):
        committed(batch)
    keystore = keystore_of(cipher)
    if keystore is not None:
        for rewrapped in keystore.rewrap(batch_size):
            committed(RotationBatch(SUBJECT_KEYS, rewrapped.keys))
    return rotated
