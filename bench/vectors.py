"""The vectors held for recall at N entries, as a restarted worker loads them from the table.

It writes N random unit vectors of 512 dimensions (what the bundled encoder makes) into the
vectors table of a fresh SQLite database, the way ``clawmem embed`` does (a transaction per
batch), once as today's bytes (scale and int8 codes) and once as the float32 base64 text of
older stores (``--format`` one of them for one run), then loads each the way a worker's first
semantic turn does (:class:`PersistedVectors`), and prints, format beside format, the bytes a
row stores, the RSS growth per entry over that load, the load time (wall and CPU), a turn's
nearest vectors (:meth:`~clawmem.recall.embeddings.VectorStore.nearest`), one exact cosine pass
over every entry, and what following the memory table's change feed and the vectors' row count
costs a turn when nothing changed.
Never part of the test suite.

    .venv/bin/python -m bench.vectors [--size 100000] [--format bytes|float32]
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import statistics
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


FORMATS = {"bytes": "bytes of int8 codes", "float32": "float32 base64 text"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--format", choices=sorted(FORMATS), action="append", help="default: both")
    options = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"{options.size} vectors of 512 dimensions, load average {load:.2f} (the machine is shared)")
    results = [measure(options.size, form) for form in options.format or ["bytes", "float32"]]
    print(f"  {'stored as':<22}" + "".join(f"{FORMATS[form]:>24}" for form, _ in results))
    for name in results[0][1]:
        print(f"  {name:<22}" + "".join(f"{figures[name]:>24}" for _, figures in results))
    print(f"  load average at the end {os.getloadavg()[0]:.2f}")


def measure(size: int, form: str) -> tuple[str, dict[str, str]]:
    """Write ``size`` vectors stored as ``form``, load them as a restarted worker does, and
    return what was measured, by name."""
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as folder:
        engine = create_engine(f"sqlite:///{Path(folder) / 'bench.db'}")
        create_tables(engine, "")
        create_vector_table(engine, "")
        memory_rows(engine, size)
        backing = SqlVectorBacking(engine, "")
        writer = PersistedVectors(Fixed(), backing)
        start = time.perf_counter()
        stored = 0
        for first in range(0, size, 1000):
            rows = []
            for n in range(first, min(first + 1000, size)):
                key = f"k{n:07d}"
                vector = unit(rng.standard_normal(512).astype(np.float32))
                data = float32_text(vector) if form == "float32" else writer._encode("bench", key, vector)
                stored += len(data)
                rows.append((key, print_text(text_print(f"text {n}")), data))
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
        per_entry = (rss_bytes() - before) / size
        queries = [unit(rng.standard_normal(512).astype(np.float32)) for _ in range(20)]
        space = store._space("bench")
        nearest = []
        for query in queries:
            start_cpu = time.process_time()
            store.nearest("bench", query, 116, 5)  # what a hybrid turn's first cut asks
            nearest.append(time.process_time() - start_cpu)
        start_cpu = time.process_time()
        for query in queries[:5]:
            held_cosines(space.matrix[: space.size], space.scales[: space.size], query)
        cosine_cpu = (time.process_time() - start_cpu) / 5 * 1000
        driver = SqlMemory(engine)
        store.follow(driver.changes, "bench", 0)  # the first turn's full read of the feed
        start = time.perf_counter()
        for _ in range(20):
            store.follow(driver.changes, "bench", 0)
            store.refresh("bench", held)
        following = (time.perf_counter() - start) / 20 * 1000
        engine.dispose()
    return form, {
        "vectors held": f"{held:,}",
        "bytes stored a row": f"{stored / size:.0f}",
        "written": f"{written:.1f} s",
        "loaded (wall, CPU)": f"{loaded:.2f} s, {loaded_cpu:.2f} s",
        "RSS per entry held": f"{per_entry / 1024:.2f} KB",
        "arrays per entry": f"{store.nbytes() / held:.0f} B",
        "nearest 116, CPU": f"{statistics.median(nearest) * 1000:.1f} ms",
        "exact pass over all, CPU": f"{cosine_cpu:.1f} ms",
        "follow, nothing changed": f"{following:.2f} ms",
    }


if __name__ == "__main__":
    main()
