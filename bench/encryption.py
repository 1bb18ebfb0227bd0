"""What encryption at rest costs (SPEC 13), measured against the same work without it, in one run.

- A turn: ``Claw.send`` on a conversation of ``--history`` messages (default 1,000) on SQLite,
  with recall over a small namespace, the median of ``--turns`` turns; encrypted, every message
  of the history is decrypted on load and the new rows sealed. Target: at most 1.2 times plain.
- Warming the recall index: the first search of a fresh ``SqlMemory`` over ``--entries`` entries
  (default 100,000) of 12 words on SQLite, which reads and decodes (and, encrypted, decrypts)
  every value. Target: at most 1.5 times plain.

Both sides run in the same process on the same data shape, alternating, so the machine's load
weighs on both alike; the ratio is what to read. Nothing is left behind (a temporary directory).

    .venv/bin/python -m bench.encryption [--history 1000] [--turns 30] [--entries 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from clawmem.clock import FakeClock, utc_datetime
from clawmem.crypto import PLAIN, Cipher, Keyring, generate_key
from clawmem.crypto.stored import StoredValues
from clawmem.ids import new_id
from clawmem.memory.sql import SqlMemory
from clawmem.providers import EchoProvider
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, tables
from clawmem.turn.pipeline import Claw

WORDS = [f"word{index}" for index in range(50_000)]
KEYS = generate_key("k1")


def _sentence(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _settings(folder: Path, encrypted: bool) -> Settings:
    return Settings(instance_path=str(folder), encryption_keys=KEYS if encrypted else "", recall_top_k=3)


def turn_times(folder: Path, encrypted: bool, history: int, turns: int) -> tuple[list[float], list[float]]:
    """Return the wall-clock and the CPU seconds of each of ``turns`` turns on a conversation of
    ``history`` messages."""
    rng = random.Random(7)
    settings = _settings(folder, encrypted)
    create_tables(engine_for(settings.database_url))
    clock = FakeClock(1_700_000_000.0)
    claw = Claw.from_settings(settings, EchoProvider(), clock=clock)
    for index in range(50):
        claw.memory.set(f"fact{index}", _sentence(rng, 12))
    conversation_id = new_id()
    batch = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": _sentence(rng, 30)}
        for index in range(history)
    ]
    for start in range(0, history, 200):
        claw.conversations.append(conversation_id, batch[start : start + 200], user_id="bench-user")
    times, cpu = [], []
    for _ in range(turns):
        clock.advance(1)
        started, used = time.perf_counter(), time.process_time()
        claw.send(_sentence(rng, 8), conversation_id, user_id="bench-user")
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return times, cpu


def fill_memory(engine: sa.engine.Engine, prefix: str, values: StoredValues, entries: int) -> None:
    """Write ``entries`` rows of 12-word values straight into the memory table, sealed by ``values``."""
    rng = random.Random(11)
    table = tables(prefix).memory
    stamp = utc_datetime(lambda: 1_700_000_000.0)
    rows = []
    for index in range(entries):
        key = f"k{index}"
        encoded = json.dumps(_sentence(rng, 12))
        rows.append(
            {
                "id": new_id(),
                "namespace": "default",
                "lookup_key": key,
                "value": values.seal("default", key, encoded),
                "expires_at": None,
                "created_at": stamp,
                "updated_at": stamp,
            }
        )
        if len(rows) == 10_000:
            with engine.begin() as conn:
                conn.execute(sa.insert(table), rows)
            rows = []
    if rows:
        with engine.begin() as conn:
            conn.execute(sa.insert(table), rows)


def warm_time(engine: sa.engine.Engine, prefix: str, cipher: Cipher) -> tuple[float, float]:
    """Return the wall-clock and CPU seconds of the first search of a fresh driver: the index is
    built from every row."""
    memory = SqlMemory(engine, prefix=prefix, clock=lambda: 1_700_000_000.0)
    memory.use_cipher(cipher, prefix)
    started, used = time.perf_counter(), time.process_time()
    memory.search(" ".join(WORDS[:8]), limit=3)
    return time.perf_counter() - started, time.process_time() - used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3, help="index warm-ups timed per side")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    with tempfile.TemporaryDirectory() as root:
        # The machine may be shared: wall-clock time carries its load, CPU time much less of it.
        medians: dict[bool, list[tuple[float, float]]] = {}
        for encrypted in (False, True, False, True):  # alternated: both sides see the same load
            folder = Path(root) / f"turn-{encrypted}-{sum(map(len, medians.values()))}"
            folder.mkdir()
            times, cpu = turn_times(folder, encrypted, args.history, args.turns)
            medians.setdefault(encrypted, []).append((statistics.median(times), statistics.median(cpu)))
        for index, name in ((0, "wall"), (1, "CPU")):
            plain = min(run[index] for run in medians[False])
            sealed = min(run[index] for run in medians[True])
            print(
                f"turn, {args.history}-message history, SQLite, {name}: plain {plain * 1000:.1f} ms, "
                f"encrypted {sealed * 1000:.1f} ms, ratio {sealed / plain:.2f} (target <= 1.2)"
            )

        engine = engine_for(f"sqlite:///{Path(root) / 'memory.db'}")
        cipher = Cipher(Keyring.from_text(KEYS))
        for prefix in ("plain_", "sealed_"):
            create_tables(engine, prefix)
        fill_memory(engine, "plain_", StoredValues(), args.entries)
        fill_memory(engine, "sealed_", StoredValues(cipher=cipher, site="sealed_"), args.entries)
        warm: dict[str, list[tuple[float, float]]] = {"plain": [], "sealed": []}
        for _ in range(args.repeats):  # alternated too
            warm["plain"].append(warm_time(engine, "plain_", PLAIN))
            warm["sealed"].append(warm_time(engine, "sealed_", cipher))
        for index, name in ((0, "wall"), (1, "CPU")):
            plain_warm = statistics.median(run[index] for run in warm["plain"])
            sealed_warm = statistics.median(run[index] for run in warm["sealed"])
            print(
                f"recall index warm-up, {args.entries} entries, SQLite, {name}: plain {plain_warm:.2f} s, "
                f"encrypted {sealed_warm:.2f} s, ratio {sealed_warm / plain_warm:.2f} (target <= 1.5)"
            )
        engine.dispose()


if __name__ == "__main__":
    main()
