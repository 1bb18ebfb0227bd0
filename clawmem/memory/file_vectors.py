"""The file driver's vectors as recall's persisted vector store reads and writes them (see
:class:`clawmem.recall.persisted.VectorBacking`): a sidecar file per namespace beside its entries.

``<stem>.vectors`` (next to the namespace's ``<stem>.json``) holds
``{"model_id": …, "dimension": …, "vectors": {key: [text print, vector text]}}``; it is written
under the namespace's lock and replaced atomically, as the entries are. With encryption at rest
on, a vector's text is sealed like the entry's value (vectors leak text), for the entry's place
and the column ``vector``; one that cannot be opened reads as empty, and is embedded again. The
driver deletes an entry's vector under the lock that forgets, flushes, sweeps or prunes it.
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

VectorRow = tuple[str, str, str]  # (key, text print, vector text)
VECTORS_SUFFIX = ".vectors"
COLUMN = "vector"  # what a sealed vector is bound to, beside the entry's place
FILE_MODE = 0o600  # every file the file driver writes
TEMP_PREFIX = ".tmp-"  # its writes go through temporary files named so; a crash can leave one

Sidecar = dict[str, Any]  # {"model_id": str, "dimension": int, "vectors": {key: [print, text]}}


def read_sidecar(path: Path) -> Sidecar:
    """Return the sidecar held at ``path`` (an empty one when there is none); raise
    :class:`CorruptStoreError` naming ``path`` for one that is not the driver's."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {"model_id": "", "dimension": 0, "vectors": {}}
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
    return data


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
    """Replace the sidecar at ``path`` atomically (remove it when it holds no vector)."""
    if not sidecar["vectors"]:
        path.unlink(missing_ok=True)
        return
    content = json.dumps(sidecar, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
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
            sidecar = read_sidecar(self._path(namespace))
            if sidecar["vectors"]:
                found.add((str(sidecar.get("model_id", "")), int(sidecar.get("dimension", -1))))
        return sorted(found)

    def count(self, namespace: str) -> int:
        """Return how many vectors ``namespace`` has."""
        return len(self._held(namespace))

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

    writes_bytes = False  # a sidecar is JSON: a vector is stored as the text of its packed bytes

    def make_binary(self) -> bool:
        """Nothing to change: a sidecar holds text."""
        return False

    def save(self, namespace: str, model_id: str, dimension: int, rows: Sequence[VectorRow]) -> None:
        """Create or replace ``rows`` (their vector text sealed when encryption is on), under
        the namespace's lock."""
        if not rows:
            return
        values = self.driver.values
        sealed = {
            key: [printed, stored_vector(values, namespace, key, data, binary=False)]
            for key, printed, data in rows
        }
        path = self._path(namespace)
        with self.driver.locked(namespace):
            sidecar = read_sidecar(path)
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
