"""FileMemory: one JSON file per namespace in a private directory per site, safe across processes.

Layout of ``directory`` (``CLAW_FILE_DIR``): one subdirectory per site, named by
:func:`site_directory_name` (``default-site`` for the table prefix ``""``, ``site-wp_2_`` for
``wp_2_``). In a site's directory, ``<stem>.json`` holds a namespace's entries as
``{key: {"value": <JSON>, "expires_at": <int | null>}}`` and ``<stem>.lock`` is the lock file that
serialises writers. The stem encodes the namespace injectively (see :func:`namespace_file_stem`).
``<stem>.vectors`` holds the entries' vectors, derived (see :mod:`clawmem.memory.file_vectors`).
With encryption on (SPEC 13) an entry is ``{"value": null, "sealed": <envelope>, "expires_at": …}``,
the envelope holding the value's JSON.

Another program may edit a file. An entry it left that cannot be read (not of that shape, an
expiry that is not a whole number, a value holding NaN, infinity or a lone surrogate, or nested
too deep) is skipped by recall with a warning naming the key, shown marked unreadable, and kept
as it is when the file is written again. A file that is not a JSON object at all makes its
namespace unreadable: every operation on it raises ``StorageError`` naming the file, and the
file is never written over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawmem.clock import Clock
from clawmem.codecs import warn_unreadable
from clawmem.crypto.stored import warn_undecryptable
from clawmem.errors import CorruptStoreError, InvalidNamespace, StorageError, Undecryptable
from clawmem.memory.base import DEFAULT_NAMESPACE, FeedingMemory, emit_write
from clawmem.memory.file_vectors import (
    FILE_MODE,
    TEMP_PREFIX,
    VECTORS_SUFFIX,
    FileVectorBacking,
    drop_vectors,
    replace_file,
)
from clawmem.records import Changes, MemoryRow, NamespaceCount
from clawmem.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    Ttl,
    decode_value,
    is_expired,
    problem_in,
    validate_namespace,
    validate_prefix,
)

log = logging.getLogger(__name__)

STORE_SUFFIX = ".json"
LOCK_SUFFIX = ".lock"
DIRECTORY_MODE = 0o700
DEFAULT_SITE_DIRECTORY = "default-site"
SITE_DIRECTORY_PREFIX = "site-"

# Every namespace character outside [a-z0-9] becomes "_" plus one character: an upper-case
# letter its lower-case form, the four punctuation marks a digit. Stems are then lower-case
# ASCII (distinct on case-insensitive file systems too) and at most twice the namespace length.
_ESCAPES = {"_": "0", ".": "1", ":": "2", "-": "3"}
_UNESCAPES = {code: char for char, code in _ESCAPES.items()}
_STEM = re.compile(r"(?:[a-z0-9]|_[a-z0-3])+")

# key -> {"value": ..., "expires_at": int | None}
Store = dict[str, dict[str, Any]]


def namespace_file_stem(namespace: str) -> str:
    """Return the file name stem (no suffix) that stores ``namespace``; injective and case-safe."""
    validate_namespace(namespace)
    parts = []
    for char in namespace:
        if char in _ESCAPES:
            parts.append("_" + _ESCAPES[char])
        elif "A" <= char <= "Z":
            parts.append("_" + char.lower())
        else:
            parts.append(char)
    return "".join(parts)


def namespace_of_stem(stem: str) -> str | None:
    """Return the namespace a file stem encodes, or ``None`` if the stem is not one of ours."""
    if not _STEM.fullmatch(stem):
        return None
    namespace = re.sub(r"_(.)", lambda match: _UNESCAPES.get(match[1]) or match[1].upper(), stem)
    try:
        return validate_namespace(namespace)
    except InvalidNamespace:
        return None


def site_directory_name(site: str) -> str:
    """Return the name of the subdirectory that holds site ``site`` (a table prefix).

    ``""`` gives ``default-site``; any other prefix gives ``site-`` plus the prefix with each
    upper-case letter written as ``-`` and its lower-case form (``wp_2_`` -> ``site-wp_2_``,
    ``WP_`` -> ``site--w-p_``). Raises ``ConfigError`` if ``site`` is not a valid table prefix.
    """
    validate_prefix(site)
    if not site:
        return DEFAULT_SITE_DIRECTORY
    # "-" never occurs in a prefix, so this is injective, and the name is lower-case, so two
    # sites stay apart on a case-insensitive file system too. No name has a dot: no namespace
    # file or temporary file can take a site's name.
    return SITE_DIRECTORY_PREFIX + "".join("-" + char.lower() if char.isupper() else char for char in site)


def site_directory(file_dir: str | os.PathLike[str], site: str) -> Path:
    """Return the directory under ``file_dir`` (``CLAW_FILE_DIR``) that holds site ``site``."""
    return Path(file_dir) / site_directory_name(site)


def _stored_bytes(value: Any) -> int:
    """Return the size of ``value`` as compact JSON, the form every driver reports."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


ADVICE = "repair the file or move it away; nothing was changed"


def parse_store(raw: bytes, path: Path) -> Store:
    """Return the store held in ``raw``, entries another program left unreadable included (see
    :func:`entry_problem`); raise :class:`CorruptStoreError` naming ``path`` when it is not UTF-8
    JSON holding an object."""
    try:
        # NaN and Infinity as another program may write them: the entries holding them are
        # unreadable, not the whole file.
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise CorruptStoreError(f"{path} is not valid UTF-8 JSON ({reason}); {ADVICE}") from None
    if not isinstance(data, dict):
        raise CorruptStoreError(
            f"{path} holds a JSON {type(data).__name__}, not an object of entries; {ADVICE}"
        )
    return data


def entry_problem(entry: Any) -> str | None:
    """Return why a stored entry cannot be read (one another program wrote), in the words the
    operator's pages use, or ``None`` for an entry of the shape ``{"value": …, "expires_at": …}``
    whose value can be recalled and shown."""
    if not isinstance(entry, dict) or "value" not in entry or not isinstance(entry.get("sealed", ""), str):
        return "value cannot be decoded"
    expires_at = entry.get("expires_at", False)
    if not (expires_at is None or type(expires_at) is int):
        return "expires_at is not a whole number of seconds"
    value = entry["value"]
    if value is None or type(value) in (bool, int) or (type(value) is str and _is_text(value)):
        return None  # most entries: nothing in them can be a problem, so nothing to walk
    problem = problem_in(value)
    return None if problem is None else f"value {problem}"


def _expiry(entry: Any) -> int | None:
    """Return an entry's ``expires_at``, or ``None`` when it holds none that is readable."""
    expires_at = entry.get("expires_at") if isinstance(entry, dict) else None
    return expires_at if type(expires_at) is int else None


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \u escapes can write
        return False
    return True


def entry_text(entry: Any) -> str:
    """Return an unreadable entry as JSON text a page can show (ASCII, NaN as written)."""
    try:
        return json.dumps(entry, separators=(",", ":"))
    except (ValueError, RecursionError):
        return "(nested too deeply to show)"


def dump_store(store: Store) -> bytes:
    """Return the file content for ``store``: one entry per line, sorted by key. An entry (or key)
    another program left unreadable is written as it was read, with ``\\u`` escapes and NaN."""
    lines = []
    for key in sorted(store):
        entry = store[key]
        if entry_problem(entry) is None and _is_text(key):
            name = json.dumps(key, ensure_ascii=False)
            lines.append(
                name + ":" + json.dumps(entry, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            )
        else:
            lines.append(json.dumps(key) + ":" + json.dumps(entry, separators=(",", ":")))
    return ("{\n" + ",\n".join(lines) + "\n}\n").encode("utf-8")


def _signature(path: Path) -> tuple[int, int, int] | None:
    """Return what changes whenever a namespace file is replaced: inode, size and mtime."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _warn_about_files_of_an_earlier_layout(root: Path) -> None:
    # Before sites had directories of their own, namespace files lay in CLAW_FILE_DIR itself.
    try:
        stray = [path.name for path in root.glob(f"*{STORE_SUFFIX}") if namespace_of_stem(path.stem)]
    except OSError:
        return
    if stray:
        log.warning(
            "%d namespace files lie directly in %s, where an earlier version kept every site's files; "
            "they are not read. Move each site's files into its directory (for the table prefix '': %s)",
            len(stray),
            root,
            DEFAULT_SITE_DIRECTORY,
        )


@dataclass(frozen=True)
class _FileCursor:
    """A namespace's file as a change feed last read it: its signature and its store."""

    signature: tuple[int, int, int] | None
    store: Store = field(default_factory=dict)


class FileMemory(FeedingMemory):
    """Keeps each namespace of site ``site`` (a table prefix) in its own JSON file under
    ``directory/<site directory>`` (both created 0700 on first write).

    Writers hold an exclusive ``flock`` on the namespace's lock file for the whole
    read-modify-write cycle and replace the data file atomically, so concurrent processes lose
    no update and readers never see a half-written file. A corrupt file raises ``StorageError``.

    Its change feed compares the file's signature (inode, size, mtime) with the cursor's, and
    when the file was replaced, the entries of the new store with the cursor's.
    """

    name = "file"
    backend_errors = (OSError, CorruptStoreError)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        clock: Clock = time.time,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        site: str = "",
    ) -> None:
        super().__init__(clock, max_value_bytes)
        self.root = Path(directory)
        self.site = site
        # Every file of this store lives here; another site's directory is never opened.
        self.directory = site_directory(self.root, site)
        # The last store read of each namespace's file, by the file's signature: a turn that
        # finds the file unchanged reads its candidates from here, not from the disk.
        self._read_cache: dict[str, tuple[tuple[int, int, int] | None, Store]] = {}
        self._cache_lock = threading.Lock()
        _warn_about_files_of_an_earlier_layout(self.root)

    def path_for(self, namespace: str) -> Path:
        """Return the JSON file that holds ``namespace`` (it may not exist yet)."""
        return self.directory / (namespace_file_stem(namespace) + STORE_SUFFIX)

    def vectors_path(self, namespace: str) -> Path:
        """Return the file that holds ``namespace``'s vectors (it may not exist yet)."""
        return self.directory / (namespace_file_stem(namespace) + VECTORS_SUFFIX)

    def vector_backing(self) -> FileVectorBacking:
        """Return the vectors files as recall's persisted vectors keep them."""
        return FileVectorBacking(self)

    def vector_namespaces(self) -> list[str]:
        """Return the namespaces that have a vectors file."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            stem, suffix = os.path.splitext(entry.name)
            namespace = namespace_of_stem(stem) if suffix == VECTORS_SUFFIX else None
            if namespace is not None and entry.is_file():
                found.append(namespace)
        return sorted(found)

    def locked(self, namespace: str) -> contextlib.AbstractContextManager[None]:
        """Return the context holding the exclusive lock of ``namespace``'s files."""
        return self._locked(self.path_for(namespace))

    # -- file I/O --------------------------------------------------------------------------

    def _read(self, path: Path) -> Store:
        # No lock needed: writers replace the file atomically, so a reader sees old or new.
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        return parse_store(raw, path)

    def _ensure_directory(self) -> None:
        for directory, parents in ((self.root, True), (self.directory, False)):
            try:
                directory.mkdir(parents=parents, mode=DIRECTORY_MODE)
            except FileExistsError:
                continue
            os.chmod(directory, DIRECTORY_MODE)  # mkdir's mode is filtered by the umask

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        """Hold the exclusive lock of the data file ``path`` (its ``.lock`` sibling)."""
        self._ensure_directory()
        # The lock file is never replaced or deleted: a new inode would let two writers in.
        lock_path = path.with_suffix(LOCK_SUFFIX)
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # closing the descriptor releases the lock

    def _write(self, path: Path, store: Store) -> None:
        if not store:
            path.unlink(missing_ok=True)
            return
        replace_file(path, dump_store(store), STORE_SUFFIX)

    def _rewrite(self, namespace: str, now: int, edit: Callable[[Store], bool]) -> int:
        """Apply ``edit`` (returns whether it changed the store) and prune expired entries, all
        under the lock; return how many were pruned."""
        path = self.path_for(namespace)
        with self._locked(path):
            store = self._read(path)
            before = list(store)
            changed = edit(store)
            expired = [key for key, entry in store.items() if is_expired(_expiry(entry), now)]
            for key in expired:
                del store[key]
            if changed or expired:
                self._write(path, store)
                # A vector goes with its entry: it would tell what the entry said.
                drop_vectors(self.vectors_path(namespace), [key for key in before if key not in store])
        return len(expired)

    # -- primitives ------------------------------------------------------------------------

    def _stored_entry(self, key: str, namespace: str, encoded: str, expires_at: int | None) -> dict[str, Any]:
        """Return the entry a write stores: the value itself, or sealed when encryption is on."""
        if self.encrypted:
            sealed = self.values.seal(namespace, key, encoded)
            return {"value": None, "sealed": sealed, "expires_at": expires_at}
        return {"value": decode_value(encoded), "expires_at": expires_at}

    def _opened(self, key: str, namespace: str, entry: dict[str, Any], raising: bool = False) -> Any:
        """Return an entry's value, opening a sealed one. One that cannot be opened (or plaintext
        in strict mode) raises with ``raising``, else reads as :data:`UNREADABLE`, skipped by
        every list with a warning; :meth:`_opened_rows` marks it for the operator's pages."""
        if "sealed" not in entry and not self.values.cipher.strict:
            return entry["value"]
        try:
            return json.loads(self.values.open(namespace, key, entry.get("sealed", "")))
        except Undecryptable as exc:
            if raising:
                raise
            warn_undecryptable(exc)
            return _Unreadable(f"value cannot be decrypted ({exc.reason})")

    def _opened_rows(
        self, namespace: str, store: Store, keys: Any = None, recalling: bool = False
    ) -> list[MemoryRow]:
        """Return the rows of ``keys`` (every key by default) of ``store``; an entry another
        program left unreadable is marked, its text as read for its value (with ``recalling``,
        logged as skipped by recall). A key that is no text (a lone surrogate) is left out."""
        rows = []
        for key in store if keys is None else keys:
            if key not in store:
                continue
            if not _is_text(key):
                log.warning(
                    "a key in %s is not text (a lone surrogate); it is left out", self.path_for(namespace)
                )
                continue
            entry = store[key]
            problem = entry_problem(entry)
            if problem is not None:
                if recalling:
                    warn_unreadable(namespace, key)
                shown = entry_text(entry)
                size = len(shown.encode("utf-8"))
                rows.append(
                    MemoryRow(namespace, key, shown, _expiry(entry), size, unreadable=problem, raw_value=True)
                )
                continue
            value = self._opened(key, namespace, entry)
            if isinstance(value, _Unreadable):
                size = len(entry.get("sealed") or "")
                expires_at = entry["expires_at"]
                rows.append(
                    MemoryRow(namespace, key, None, expires_at, size, unreadable=value.reason, raw_value=True)
                )
            else:
                rows.append(MemoryRow(namespace, key, value, entry["expires_at"], _stored_bytes(value)))
        return rows

    def _fed(self, namespace: str, store: Store) -> list[tuple[str, Any, int | None]]:
        rows = self._opened_rows(namespace, store, recalling=True)
        return [(row.key, row.value, row.expires_at) for row in rows if not row.unreadable]

    def _get(self, key: str, namespace: str, now: int) -> tuple[bool, Any]:
        path = self.path_for(namespace)
        entry = self._read(path).get(key)
        if entry is None or is_expired(_expiry(entry), now):
            return False, None
        return True, self._readable(path, key, namespace, entry)

    def _readable(self, path: Path, key: str, namespace: str, entry: Any) -> Any:
        """Return the value of an entry, or raise :class:`CorruptStoreError` naming the file and
        the key (never the value) when another program left it unreadable."""
        problem = entry_problem(entry)
        if problem is not None:
            raise CorruptStoreError(f"{path}: the entry of key {key!r} is unreadable ({problem}); {ADVICE}")
        return self._opened(key, namespace, entry, raising=True)

    def _set(self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int) -> None:
        entry = self._stored_entry(key, namespace, encoded, expires_at)

        def put(store: Store) -> bool:
            store[key] = entry
            return True

        self._rewrite(namespace, now, put)

    def _forget(self, key: str, namespace: str, now: int) -> None:
        if not self.path_for(namespace).exists():
            return  # nothing to delete or prune; leave no lock file behind for it
        self._rewrite(namespace, now, lambda store: store.pop(key, None) is not None)

    def _flush(self, namespace: str) -> int:
        path = self.path_for(namespace)
        if not path.exists() and not self.vectors_path(namespace).exists():
            return 0
        with self._locked(path):
            count = len(self._read(path))
            path.unlink(missing_ok=True)
            drop_vectors(self.vectors_path(namespace), None)
        return count

    def _all(self, namespace: str, now: int) -> dict[str, Any]:
        store = self._read(self.path_for(namespace))
        live = {key: entry for key, entry in store.items() if not is_expired(_expiry(entry), now)}
        rows = self._opened_rows(namespace, live, recalling=True)
        return {row.key: row.value for row in rows if not row.unreadable}

    def _records(self, namespace: str) -> list[MemoryRow]:
        return self._opened_rows(namespace, self._read(self.path_for(namespace)))

    def _current(self, namespace: str) -> tuple[tuple[int, int, int] | None, Store]:
        """Return the signature of the namespace's file and its store, read again only when the
        file was replaced (the signature is taken before reading: a later replace shows next time)."""
        path = self.path_for(namespace)
        signature = _signature(path)
        with self._cache_lock:
            cached = self._read_cache.get(namespace)
        if cached is not None and cached[0] == signature:
            return cached
        current = (signature, self._read(path) if signature is not None else {})
        with self._cache_lock:
            self._read_cache[namespace] = current
        return current

    def _changes(self, namespace: str, cursor: Any, held: Collection[str] | None = None) -> Changes:
        signature, store = self._current(namespace)
        if isinstance(cursor, _FileCursor) and cursor.signature == signature:
            return Changes(cursor)
        fed = _FileCursor(signature, store)
        if not isinstance(cursor, _FileCursor):
            return Changes(fed, self._fed(namespace, store), reset=True)
        # Every entry of the new store, however few changed: reading the file cost as much, and
        # an index stores again only those whose text, type or expiry differ.
        entries = self._fed(namespace, store)
        return Changes(fed, entries, [key for key in cursor.store if key not in store])

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return self._opened_rows(namespace, self._current(namespace)[1], keys)

    def _namespaces(self) -> list[str]:
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        namespaces = []
        for entry in entries:
            stem, suffix = os.path.splitext(entry.name)
            namespace = namespace_of_stem(stem) if suffix == STORE_SUFFIX else None
            if namespace is not None and entry.is_file():
                namespaces.append(namespace)
        return namespaces

    def _namespace_count(self, namespace: str, now: int) -> NamespaceCount:
        # A file that is no store leaves its namespace listed, saying why, and never the list
        # of the others blank; every read of the namespace itself still raises naming the file.
        try:
            return super()._namespace_count(namespace, now)
        except StorageError as exc:
            if not isinstance(exc.__cause__, CorruptStoreError):
                raise
            log.warning("namespace %r cannot be read: %s", namespace, exc.__cause__)
            return NamespaceCount(namespace, 0, 0, 0, 0, unreadable=str(exc.__cause__))

    def _sweep(self, now: int, dry_run: bool) -> dict[str, int]:
        counts: dict[str, int] = {}
        for namespace in sorted(self._namespaces()):
            if dry_run:
                store = self._read(self.path_for(namespace))
                expired = sum(1 for entry in store.values() if is_expired(_expiry(entry), now))
            else:
                expired = self._rewrite(namespace, now, lambda store: False)
            if expired:
                counts[namespace] = expired
        return counts

    # -- beyond the contract ---------------------------------------------------------------

    def update(
        self,
        key: str,
        function: Callable[[Any], Any],
        namespace: str = DEFAULT_NAMESPACE,
        ttl: Ttl = None,
    ) -> Any:
        """Store ``function(current)`` under one exclusive lock and return it, so no update is lost.

        ``current`` is ``None`` when the key is missing or expired; ``ttl`` works as in ``set``.
        Raises what ``set`` raises; an exception from ``function`` propagates and writes nothing.
        """
        now, expires_at = self._prepare_write(key, namespace, ttl)
        written: list[tuple[str, Any]] = []

        def apply(store: Store) -> bool:
            entry = store.get(key)
            current = (
                self._readable(self.path_for(namespace), key, namespace, entry)
                if entry is not None and not is_expired(_expiry(entry), now)
                else None
            )
            encoded = self._encode(key, function(current))
            value = decode_value(encoded)
            store[key] = self._stored_entry(key, namespace, encoded, expires_at)
            written.append((encoded, value))
            return True

        self._call("update", self._rewrite, namespace, now, apply)
        encoded, value = written[0]
        emit_write(self.name, namespace, key, encoded, ttl)
        self._written(namespace, key, value)
        return value

    # -- stored text, for a key rotation (SPEC 13) --------------------------------------------

    def stored_texts(self, namespace: str) -> list[tuple[str, str, str]]:
        """Return ``(key, text, text)`` of every entry of ``namespace``, expired ones included:
        ``text`` is a sealed entry's envelope, or a plain entry's value as JSON. Opens nothing.
        An entry another program left unreadable is left out: no key of the site sealed it."""
        store = self._read(self.path_for(namespace))
        readable = ((key, entry) for key, entry in store.items() if entry_problem(entry) is None)
        return [(key, _stored_text(entry), _stored_text(entry)) for key, entry in readable]

    def replace_texts(self, namespace: str, changes: list[tuple[str, str, str]]) -> int:
        """Store each ``(key, text read, new envelope)`` as the entry's sealed value, keeping its
        expiry, only where the entry still holds that text; one write of the file under its
        lock. Return how many changed."""
        path = self.path_for(namespace)
        changed = 0
        with self._locked(path):
            store = self._read(path)
            for key, text, sealed in changes:
                entry = store.get(key)
                if entry is not None and entry_problem(entry) is None and _stored_text(entry) == text:
                    store[key] = {"value": None, "sealed": sealed, "expires_at": entry["expires_at"]}
                    changed += 1
            if changed:
                self._write(path, store)
        return changed


def _stored_text(entry: dict[str, Any]) -> str:
    sealed = entry.get("sealed")
    return sealed if isinstance(sealed, str) else json.dumps(entry["value"], ensure_ascii=False)


# -- one site's directory as a whole (uninstall --files) -------------------------------------


@dataclass(frozen=True)
class _Unreadable:
    """What an entry that cannot be decrypted reads as inside the driver: never a value."""

    reason: str


def _is_store_file(name: str) -> bool:
    stem, suffix = os.path.splitext(name)
    if suffix in (STORE_SUFFIX, VECTORS_SUFFIX) and stem.startswith(TEMP_PREFIX):
        return True
    return suffix in (STORE_SUFFIX, LOCK_SUFFIX, VECTORS_SUFFIX) and namespace_of_stem(stem) is not None


def store_files(file_dir: str | os.PathLike[str], site: str) -> list[Path]:
    """Return the file driver's files of site ``site`` (a table prefix) under ``file_dir``
    (``CLAW_FILE_DIR``), sorted; none if the site has no directory there.

    Only the site's own directory is looked at, never another site's. Raises ``ValueError``
    naming the first entry in it that the file driver did not write, so that a mistyped
    ``CLAW_FILE_DIR`` (``/``, a home directory) is never emptied.
    """
    root = Path(file_dir)
    if root.exists() and not root.is_dir():
        raise ValueError(f"CLAW_FILE_DIR {root} is not a directory; refusing to remove it")
    directory = site_directory(root, site)
    if not directory.exists():
        return []
    if not directory.is_dir() or directory.is_symlink():
        raise ValueError(f"{directory} is not a directory the file driver made; refusing to remove it")
    found = []
    for item in sorted(directory.iterdir()):
        if not item.is_file() or item.is_symlink() or not _is_store_file(item.name):
            raise ValueError(
                f"{directory} holds {item.name!r}, which the file driver did not write; "
                "nothing was removed (move it away, or remove the directory yourself)"
            )
        found.append(item)
    return found


def remove_store_files(file_dir: str | os.PathLike[str], site: str) -> int:
    """Remove site ``site``'s files and directory under ``file_dir``; return how many files went.

    ``file_dir`` itself goes too once no other site's directory (or anything else) is left in
    it. Raises ``ValueError`` (before removing anything) if the site's directory holds
    anything the file driver did not write.
    """
    found = store_files(file_dir, site)
    for path in found:
        path.unlink(missing_ok=True)
    directory = site_directory(file_dir, site)
    if directory.exists():
        directory.rmdir()
    try:
        Path(file_dir).rmdir()
    except OSError as exc:
        # rmdir removes only an empty directory: another site's files keep CLAW_FILE_DIR.
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise
    return len(found)
