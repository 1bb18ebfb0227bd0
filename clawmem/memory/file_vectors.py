"""The file driver's vectors as recall's persisted vector store reads and writes them (see
:class:`clawmem.recall.persisted.VectorBacking`): a sidecar file per namespace beside its entries.

``<stem>.vectors`` (next to the namespace's ``<stem>.json``) is binary: the line
:data:`BINARY_MARK`, a line of JSON ``{"model_id": …, "dimension": …, "count": …}`` (what a
worker checks and sizes its matrix by, read without the rest), a line of JSON ``[[key, text print,
form, length], …]``, then each row's bytes in that order: a vector's packed bytes (form ``b``:
its scale and int8 codes, 516 bytes for 512 dimensions) or the ASCII of its text (form ``t``:
sealed, or written as text before). A file written before is JSON,
``{"model_id": …, "dimension": …, "vectors": {key: [text print, vector text]}}``: it is read, and
written as JSON, never refused, until ``clawmem embed --replace`` (:meth:`FileVectorBacking.make_binary`)
rewrites it binary, keeping every row as it was (the command then rewrites the rows of text).
A file is written under the namespace's lock and replaced atomically, as the entries are. With
encryption at rest on, a vector's text is sealed like the entry's value (vectors leak text), for
the entry's place and the column ``vector``; one that cannot be opened reads as empty, and is
embedded again. The driver deletes an entry's vector under the lock that forgets, flushes,
sweeps or prunes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from clawmem.crypto.stored import StoredValues, opened_vectors, stored_vector
from clawmem.errors import CorruptStoreError

VectorRow = tuple[str, str, str | bytes]  # (key, text print, vector as stored: packed bytes or text)
VECTORS_SUFFIX = ".vectors"
COLUMN = "vector"  # what a sealed vector is bound to, beside the entry's place
FILE_MODE = 0o600  # every file the file driver writes
TEMP_PREFIX = ".tmp-"  # its writes go through temporary files named so; a crash can leave one

BINARY_MARK = b"clawmem vectors 1\n"  # the first line of a binary vectors file
_FORMS = {"b": bytes, "t": str}  # a row's form in a binary file: packed bytes, or text as ASCII

# {"model_id": str, "dimension": int, "vectors": {key: [print, bytes or text]}, "binary": bool}
Sidecar = dict[str, Any]


def read_sidecar(path: Path) -> Sidecar:
    """Return the sidecar held at ``path`` (an empty binary one when there is none); raise
    :class:`CorruptStoreError` naming ``path`` for one that is not the driver's."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {"model_id": "", "dimension": 0, "vectors": {}, "binary": True}
    if raw.startswith(BINARY_MARK):
        return _read_binary(path, raw)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptStoreError(
            f"{path} is not valid UTF-8 JSON ({exc}); move it away to embed again"
        ) from None
    vectors = data.get("vectors") if isinstance(data, dict) else None
    if not isinstance(vectors, dict) or not all(
        isinstance(row, list) and len(row) == 2 and all(isinstance(part, str) for part in row)
        for row in vectors.values()
    ):
        raise CorruptStoreError(f"{path} is not a vectors file of clawmem; move it away to embed again")
    data["binary"] = False
    return data


def _meta(line: bytes) -> dict[str, Any]:
    """Return a binary file's second line read: its model, dimension and count of rows."""
    meta = json.loads(line.decode("utf-8"))
    if not isinstance(meta, dict) or not isinstance(meta.get("count"), int):
        raise ValueError("no count of rows")
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """Return ``{"model_id", "dimension", "count"}`` of the vectors file at ``path`` (zeros
    when there is none), reading only its first lines when it is binary; raise
    :class:`CorruptStoreError` naming ``path`` for one that is not the driver's."""
    try:
        with path.open("rb") as opened:
            head = opened.read(len(BINARY_MARK) + 4096)
    except FileNotFoundError:
        return {"model_id": "", "dimension": 0, "count": 0}
    end = head.find(b"\n", len(BINARY_MARK))
    if head.startswith(BINARY_MARK) and end >= 0:
        try:
            return _meta(head[len(BINARY_MARK) : end])
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CorruptStoreError(
                f"{path} is not a vectors file of clawmem ({exc}); move it away to embed again"
            ) from None
    sidecar = read_sidecar(path)  # JSON, or a model's name past 4 KB
    return {
        "model_id": sidecar["model_id"],
        "dimension": sidecar["dimension"],
        "count": len(sidecar["vectors"]),
    }


def _read_binary(path: Path, raw: bytes) -> Sidecar:
    """Return the sidecar of a binary vectors file's bytes ``raw`` (module docstring)."""
    start = len(BINARY_MARK)
    middle = raw.find(b"\n", start)
    end = raw.find(b"\n", middle + 1) if middle >= 0 else -1
    try:
        if end < 0:
            raise ValueError("no rows")
        header = _meta(raw[start:middle])
        rows = json.loads(raw[middle + 1 : end].decode("utf-8"))
        if not isinstance(rows, list) or len(rows) != header["count"]:
            raise ValueError("not the rows its count says")
        vectors: dict[str, list[Any]] = {}
        at = end + 1
        for key, printed, form, length in rows:
            if not (isinstance(key, str) and isinstance(printed, str) and form in _FORMS):
                raise ValueError("a row that is not one")
            if not isinstance(length, int) or length < 0 or at + length > len(raw):
                raise ValueError("a row past the end")
            data = raw[at : at + length]
            vectors[key] = [printed, data if form == "b" else data.decode("ascii")]
            at += length
        if at != len(raw):
            raise ValueError("bytes past the last row")
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CorruptStoreError(
            f"{path} is not a vectors file of clawmem ({exc}); move it away to embed again"
        ) from None
    return {
        "model_id": header.get("model_id", ""),
        "dimension": header.get("dimension", 0),
        "vectors": vectors,
        "binary": True,
    }


def replace_file(path: Path, content: bytes, suffix: str) -> None:
    """Replace the file at ``path`` with ``content`` atomically: a temporary file beside it
    (``TEMP_PREFIX`` + ``suffix``, readable by its owner only), synced, then renamed over it.
    Without the sync a crash could leave an empty file behind the rename."""
    descriptor, temp_name = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX, suffix=suffix)
    try:
        with os.fdopen(descriptor, "wb") as temp_file:
            temp_file.write(content)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.chmod(temp_name, FILE_MODE)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise


def write_sidecar(path: Path, sidecar: Sidecar) -> None:
    """Replace the sidecar at ``path`` atomically, in its format (binary unless it was read as
    JSON); remove it when it holds no vector."""
    if not sidecar["vectors"]:
        path.unlink(missing_ok=True)
        return
    if sidecar.get("binary", True):
        rows, parts = [], []
        for key, (printed, data) in sidecar["vectors"].items():
            part = data if isinstance(data, bytes) else data.encode("ascii")
            rows.append([key, printed, "b" if isinstance(data, bytes) else "t", len(part)])
            parts.append(part)
        meta = {"model_id": sidecar["model_id"], "dimension": sidecar["dimension"], "count": len(rows)}
        lines = [
            json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            for part in (meta, rows)
        ]
        content = b"".join([BINARY_MARK, lines[0], b"\n", lines[1], b"\n", *parts])
    else:
        old = {key: sidecar[key] for key in ("model_id", "dimension", "vectors")}
        content = json.dumps(old, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    replace_file(path, content, VECTORS_SUFFIX)


def drop_vectors(path: Path, keys: Iterable[str] | None) -> None:
    """Delete the vectors of ``keys`` (every one with ``None``) from the sidecar ``path``; the
    caller holds the namespace's lock."""
    if not path.exists():
        return
    if keys is None:
        path.unlink(missing_ok=True)
        return
    keys = list(keys)
    if not keys:
        return
    sidecar = read_sidecar(path)
    held = sidecar["vectors"]
    if any(key in held for key in keys):
        for key in keys:
            held.pop(key, None)
        write_sidecar(path, sidecar)


class VectorFiles(Protocol):
    """What the backing uses of :class:`~clawmem.memory.file.FileMemory`."""

    values: StoredValues
    directory: Path

    def vectors_path(self, namespace: str) -> Path: ...

    def vector_namespaces(self) -> list[str]: ...

    def locked(self, namespace: str) -> contextlib.AbstractContextManager[None]: ...


class FileVectorBacking:
    """The vectors sidecars of one :class:`~clawmem.memory.file.FileMemory` (its site's directory)."""

    def __init__(self, driver: VectorFiles) -> None:
        self.driver = driver
        self.name = f"the vectors files ({VECTORS_SUFFIX}) in {driver.directory}"
        self.place = ("file", os.fspath(driver.directory.resolve()))

    def _path(self, namespace: str) -> Path:
        return self.driver.vectors_path(namespace)

    def _opened(self, namespace: str, rows: Iterable[VectorRow]) -> Iterator[VectorRow]:
        return opened_vectors(self.driver.values, namespace, rows, COLUMN)

    def _held(self, namespace: str) -> dict[str, list[str]]:
        return read_sidecar(self._path(namespace))["vectors"]

    def namespaces(self) -> list[str]:
        """Return the namespaces that have vectors."""
        return self.driver.vector_namespaces()

    def models(self) -> list[tuple[str, int]]:
        """Return every ``(model id, dimension)`` the sidecars hold vectors of."""
        found = set()
        for namespace in self.namespaces():
            meta = read_meta(self._path(namespace))
            if meta["count"]:
                found.add((str(meta.get("model_id", "")), int(meta.get("dimension", -1))))
        return sorted(found)

    def count(self, namespace: str) -> int:
        """Return how many vectors ``namespace`` has."""
        return int(read_meta(self._path(namespace))["count"])

    def stored(self, namespace: str) -> list[VectorRow]:
        """Return every ``(key, text print, vector text as stored)`` of ``namespace``."""
        return [(key, printed, text) for key, (printed, text) in self._held(namespace).items()]

    def rows(self, namespace: str) -> Iterator[VectorRow]:
        """Yield every row of ``namespace`` (its vector text opened)."""
        yield from self._opened(namespace, self.stored(namespace))

    def rows_of(self, namespace: str, keys: Sequence[str]) -> list[VectorRow]:
        """Return the rows of ``keys`` that exist (their vector text opened)."""
        held = self._held(namespace)
        found = [(key, *held[key]) for key in keys if key in held]
        return list(self._opened(namespace, found))  # type: ignore[arg-type]

    def prints(self, namespace: str) -> dict[str, str]:
        """Return the text print of every vector of ``namespace``, by key."""
        return {key: printed for key, (printed, _) in self._held(namespace).items()}

    @property
    def writes_bytes(self) -> bool:
        """Return whether a vector saved is stored as its packed bytes: unless it is sealed (a
        file still JSON stores text until :meth:`make_binary`)."""
        return not self.driver.values.cipher.enabled

    def make_binary(self) -> bool:
        """Rewrite every vectors file still JSON as binary, each row kept as it was
        (``clawmem embed --replace``); return whether one changed."""
        changed = False
        for namespace in self.namespaces():
            path = self._path(namespace)
            with self.driver.locked(namespace):
                sidecar = read_sidecar(path)
                if not sidecar["binary"]:
                    sidecar["binary"] = changed = True
                    write_sidecar(path, sidecar)
        return changed

    def save(self, namespace: str, model_id: str, dimension: int, rows: Sequence[VectorRow]) -> None:
        """Create or replace ``rows`` (their vector text sealed when encryption is on), under
        the namespace's lock."""
        if not rows:
            return
        values = self.driver.values
        path = self._path(namespace)
        with self.driver.locked(namespace):
            sidecar = read_sidecar(path)
            binary = sidecar["binary"]
            sealed = {
                key: [printed, stored_vector(values, namespace, key, data, binary=binary)]
                for key, printed, data in rows
            }
            sidecar["model_id"], sidecar["dimension"] = model_id, dimension
            sidecar["vectors"].update(sealed)
            write_sidecar(path, sidecar)

    def replace_stored(self, namespace: str, changes: Sequence[tuple[str, str, str, str]]) -> int:
        """Store each ``(key, text print, vector text read, new vector text)`` where the sidecar
        still holds what was read; return how many changed."""
        path = self._path(namespace)
        changed = 0
        with self.driver.locked(namespace):
            sidecar = read_sidecar(path)
            held = sidecar["vectors"]
            for key, printed, old, new in changes:
                if held.get(key) == [printed, old]:
                    held[key] = [printed, new]
                    changed += 1
            if changed:
                write_sidecar(path, sidecar)
        return changed

    def delete(self, namespace: str, gone: Sequence[str], stale: Sequence[tuple[str, str]]) -> None:
        """Delete the vectors of ``gone``, and each ``(key, print)`` of ``stale`` still of that print."""
        path = self._path(namespace)
        if not path.exists():
            return
        with self.driver.locked(namespace):
            sidecar = read_sidecar(path)
            held = sidecar["vectors"]
            before = len(held)
            for key in gone:
                held.pop(key, None)
            for key, printed in stale:
                if key in held and held[key][0] == printed:
                    del held[key]
            if len(held) != before:
                write_sidecar(path, sidecar)

    def delete_other_models(self, model_id: str, dimension: int) -> int:
        """Delete every sidecar of a model other than ``model_id`` at ``dimension``; return how
        many vectors went."""
        deleted = 0
        for namespace in self.namespaces():
            path = self._path(namespace)
            with self.driver.locked(namespace):
                sidecar = read_sidecar(path)
                if (sidecar.get("model_id"), sidecar.get("dimension")) != (model_id, dimension):
                    deleted += len(sidecar["vectors"])
                    path.unlink(missing_ok=True)
        return deleted
