"""The sql driver's vectors table as recall's persisted vector store reads and writes it (see
:class:`clawmem.recall.persisted.VectorBacking`): each call one connection, each write one
transaction.

With encryption at rest on, a vector's text is sealed like the entry's value (vectors leak
text), for the entry's place and the column ``vector``, under the subject's key in a subject
namespace; a row that cannot be opened reads as empty, and is embedded again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy.engine import Engine

from clawmem.codecs import VectorData
from clawmem.crypto.stored import StoredValues, opened_vectors, stored_vector
from clawmem.sql import vectors
from clawmem.sql.engine import current, write_transaction
from clawmem.sql.vectors import VectorRow

COLUMN = "vector"  # what a sealed vector is bound to, beside the entry's place


class SqlVectorBacking:
    """``{prefix}clawmem_vectors`` in the database of ``engine``."""

    def __init__(self, engine: Engine, prefix: str, values: StoredValues | None = None) -> None:
        self.engine = engine
        self.prefix = prefix
        self.values = values or StoredValues()
        self.name = vectors.vector_table(prefix).name
        # Where the vectors are: stores of one place are shared by every driver on it.
        self.place = (engine.url.render_as_string(hide_password=False), prefix)
        self._binary: bool | None = None  # whether the column is binary, looked up once

    @property
    def binary(self) -> bool:
        """Return whether the table's column is binary (one made before holds text)."""
        if self._binary is None:
            self._binary = vectors.is_binary(self.engine, self.prefix)
        return self._binary

    @property
    def writes_bytes(self) -> bool:
        """Return whether a vector saved is stored as its packed bytes (not sealed, binary column)."""
        return self.binary and not self.values.cipher.enabled

    def make_binary(self) -> bool:
        """Make a column that holds text binary (``clawmem embed --replace``); return whether it changed."""
        changed = vectors.make_binary(self.engine, self.prefix)
        self._binary = True
        return changed

    def models(self) -> list[tuple[str, int]]:
        """Return every ``(model id, dimension)`` the table holds vectors of."""
        with current(self.engine).connect() as conn:
            return vectors.models(conn, self.prefix)

    def count(self, namespace: str) -> int:
        """Return how many vectors ``namespace`` has."""
        with current(self.engine).connect() as conn:
            return vectors.count(conn, self.prefix, namespace)

    def _opened(self, namespace: str, rows: Iterable[VectorRow]) -> Iterator[VectorRow]:
        return opened_vectors(self.values, namespace, rows, COLUMN)

    def namespaces(self) -> list[str]:
        """Return the namespaces that have vectors."""
        with current(self.engine).connect() as conn:
            return vectors.namespaces(conn, self.prefix)

    def stored(self, namespace: str) -> list[VectorRow]:
        """Return every ``(key, text print, vector text as stored)`` of ``namespace``."""
        with current(self.engine).connect() as conn:
            return list(vectors.namespace_rows(conn, self.prefix, namespace))

    def replace_stored(
        self, namespace: str, changes: Sequence[tuple[str, str, VectorData, VectorData]]
    ) -> int:
        """Store each ``(key, text print, vector read, new vector)`` where the row still holds
        what was read, in one transaction; return how many changed."""
        binary = self.binary
        with write_transaction(self.engine) as conn:
            return sum(
                vectors.replace_vector(conn, self.prefix, namespace, key, old, new, binary)
                for key, _, old, new in changes
            )

    def rows(self, namespace: str) -> Iterator[VectorRow]:
        """Yield every row of ``namespace`` (its vector text opened), read as consumed."""
        with current(self.engine).connect() as conn:
            yield from self._opened(namespace, vectors.namespace_rows(conn, self.prefix, namespace))

    def rows_of(self, namespace: str, keys: Sequence[str]) -> list[VectorRow]:
        """Return the rows of ``keys`` that exist (their vector text opened)."""
        with current(self.engine).connect() as conn:
            return list(self._opened(namespace, vectors.rows_of_keys(conn, self.prefix, namespace, keys)))

    def prints(self, namespace: str) -> dict[str, str]:
        """Return the text print of every vector of ``namespace``, by key."""
        with current(self.engine).connect() as conn:
            return vectors.prints_of(conn, self.prefix, namespace)

    def save(self, namespace: str, model_id: str, dimension: int, rows: Sequence[VectorRow]) -> None:
        """Create or replace ``rows`` (sealed when encryption is on, as text where the column is)."""
        binary = self.binary
        stored = [
            (key, printed, stored_vector(self.values, namespace, key, data, binary))
            for key, printed, data in rows
        ]
        with write_transaction(self.engine) as conn:
            vectors.upsert_vectors(conn, self.prefix, namespace, model_id, dimension, stored, binary)

    def delete(self, namespace: str, gone: Sequence[str], stale: Sequence[tuple[str, str]]) -> None:
        """Delete the rows of ``gone``, and each ``(key, print)`` of ``stale`` still of that print."""
        with write_transaction(self.engine) as conn:
            if gone:
                vectors.delete_keys(conn, self.prefix, namespace, gone)
            for key, printed in stale:
                vectors.delete_stale(conn, self.prefix, namespace, key, printed)

    def delete_other_models(self, model_id: str, dimension: int) -> int:
        """Delete every vector not of ``model_id`` at ``dimension``; return how many went."""
        with write_transaction(self.engine) as conn:
            return vectors.delete_other_models(conn, self.prefix, model_id, dimension)
