"""The vectors held for recall at N entries, as a restarted worker loads them from the table.

It writes N random unit vectors of 512 dimensions (what the bundled encoder makes) into the
vectors table of a fresh SQLite database, the way ``clawmem embed`` does (a transaction per
batch), as int8 codes or, with ``--float32``, in the format before them, then loads them the
way a worker's first semantic turn does (:class:`PersistedVectors`), and prints the RSS growth
per entry over that load, the load time (wall and CPU), one cosine pass over every entry, and
what following the memory table's change feed and the vectors' row count costs a turn when
nothing changed.
Never part of the test suite.

    .venv/bin/python -m bench.vectors [--size 100000] [--float32]
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from bench.recall import rss_bytes
from clawmem.ids import new_id
from clawmem.memory.sql import SqlMemory
from clawmem.memory.sql_vectors import SqlVectorBacking
from clawmem.recall.embeddings import held_cosines, text_print, unit
from clawmem.recall.persisted import PersistedVectors, print_text
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, tables
from clawmem.sql.vectors import create_vector_table


class Fixed:
    """An embedder that is never asked to embed: the vectors are in the table already."""

    model_id = "bench-512"
    dimension = 512

    def embed(self, texts):
        raise AssertionError("a loaded store embeds nothing")


def float32_text(vector: np.ndarray) -> str:
    """Return a vector as stores held it before int8 codes: base64 of little-endian float32."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def memory_rows(engine: Any, size: int) -> None:
    """Write ``size`` entries ``k0000000``... into the memory table, as one transaction."""
    table = tables("").memory
    stamp = datetime(2026, 1, 1)
    with engine.begin() as conn:
        for first in range(0, size, 1000):
            rows = [
                {
                    "id": new_id(),
                    "namespace": "bench",
                    "lookup_key": f"k{n:07d}",
                    "value": json.dumps(f"text {n}"),
                    "metadata": None,
                    "expires_at": None,
                    "created_at": stamp,
                    "updated_at": stamp,
                }
                for n in range(first, min(first + 1000, size))
            ]
            conn.execute(sa.insert(table), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument(
        "--float32", action="store_true", help="write the float32 format a store held before int8 codes"
    )
    options = parser.parse_args()
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as folder:
        engine = create_engine(f"sqlite:///{Path(folder) / 'bench.db'}")
        create_tables(engine, "")
        create_vector_table(engine, "")
        memory_rows(engine, options.size)
        backing = SqlVectorBacking(engine, "")
        writer = PersistedVectors(Fixed(), backing)
        start = time.perf_counter()
        for first in range(0, options.size, 1000):
            rows = []
            for n in range(first, min(first + 1000, options.size)):
                key = f"k{n:07d}"
                vector = unit(rng.standard_normal(512).astype(np.float32))
                text = float32_text(vector) if options.float32 else writer._encode("bench", key, vector)
                rows.append((key, print_text(text_print(f"text {n}")), text))
            backing.save("bench", Fixed.model_id, Fixed.dimension, rows)
        written = time.perf_counter() - start
        del writer
        backing.count("bench")  # the connection and its caches are the database's, not the vectors'
        backing.rows_of("bench", ["k0000000"])
        backing.models()
        gc.collect()
        before = rss_bytes()
        start, start_cpu = time.perf_counter(), time.process_time()
        store = PersistedVectors(Fixed(), backing)
        held = store.count("bench")
        loaded, loaded_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        gc.collect()
        per_entry = (rss_bytes() - before) / options.size
        query = unit(rng.standard_normal(512).astype(np.float32))
        space = store._space("bench")
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(20):
            held_cosines(space.matrix[: space.size], space.scales[: space.size], query)
        cosine_pass = (time.perf_counter() - start) / 20 * 1000
        cosine_cpu = (time.process_time() - start_cpu) / 20 * 1000
        stored_as = "float32 base64 text" if options.float32 else "int8 codes"
        print(f"{held} vectors of 512 dimensions, stored as {stored_as} (the machine is shared)")
        print(f"  written in {written:.1f} s ({options.size // 1000} transactions of 1,000)")
        print(f"  loaded in {loaded:.1f} s ({loaded_cpu:.1f} s CPU) by a restarted worker")
        arrays = store.nbytes() / held
        print(f"  {per_entry / 1024:.2f} KB RSS per entry held ({arrays:.0f} B of it arrays)")
        print(f"  one cosine pass over all: {cosine_pass:.1f} ms ({cosine_cpu:.1f} ms CPU)")
        driver = SqlMemory(engine)
        store.follow(driver.changes, "bench", 0)  # the first turn's full read of the feed
        start = time.perf_counter()
        for _ in range(20):
            store.follow(driver.changes, "bench", 0)
            store.refresh("bench", held)
        following = (time.perf_counter() - start) / 20 * 1000
        print(f"  a turn's follow of the feed and the table, nothing changed: {following:.2f} ms")
        engine.dispose()


if __name__ == "__main__":
    main()
