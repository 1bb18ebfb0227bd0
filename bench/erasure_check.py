"""What the key store's erasure check costs a turn (SPEC 13): every process reads the store's
generation once per read or turn, so that a subject erased anywhere is not read here again.

A turn is ``Claw.send`` on SQLite for one subject whose conversation holds ``--history`` messages
and whose subject namespace a few facts, all sealed under the subject's data key. For each key
store given (a SQLite file by default; also any ``--keystore`` URL, such as a PostgreSQL, MariaDB
or Redis one), ``--turns`` turns are timed, every other one as shipped and the others with the
check skipped (the keys kept without asking, as the cache of keys did before it), so both see
the same data and the same load of a shared machine. It prints:

- the check itself, timed inside the checked turns: generation reads a turn, and the median of
  a turn's total time in ``KeyStore.check`` (every call, the ones a block answers at once too);
  this is the number to read, as it carries little of the rest of the turn's noise;
- the two turn medians and their difference, which on a loaded machine is mostly noise;
- one generation read timed alone, in a loop.

Nothing is left behind (a temporary directory, a table prefix or Redis keys of its own).

    .venv/bin/python -m bench.erasure_check [--history 200] [--turns 200] [--keystore URL ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clawmem.clock import FakeClock
from clawmem.crypto import generate_key
from clawmem.crypto.keystore import KeyStore
from clawmem.encryption.ciphers import cipher_for, keystore_of
from clawmem.ids import new_id
from clawmem.providers import EchoProvider
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.keystore import generation_table, key_table
from clawmem.sql.schema import create_tables
from clawmem.turn.pipeline import Claw

KEYS = generate_key("k1")
WORDS = [f"word{index}" for index in range(5_000)]
USER = "bench-user"


def _sentence(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@contextlib.contextmanager
def _patched_check(skip: bool, spent: list[float]) -> Iterator[None]:
    """With ``skip``, make every key store trust the keys it kept without reading the generation;
    else add the seconds each check takes to ``spent[0]``."""
    check = KeyStore.check

    def timed(self: KeyStore) -> None:
        started = time.perf_counter()
        try:
            check(self)
        finally:
            spent[0] += time.perf_counter() - started

    KeyStore.check = (lambda self: None) if skip else timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        KeyStore.check = check  # type: ignore[method-assign]


def _forget(store: KeyStore, prefix: str) -> None:
    backend: Any = store.backend
    if hasattr(backend, "keys_hash"):
        backend.client.delete(backend.keys_hash, backend.subjects_hash, backend.generation_key)
    elif backend.url and not backend.url.startswith("sqlite"):
        for table in (key_table(prefix), generation_table(prefix)):
            table.drop(backend.engine, checkfirst=True)


def turn_times(
    folder: Path, keystore: str, history: int, turns: int
) -> tuple[list[float], list[float], list[float], float]:
    """Return the seconds of each checked and each unchecked turn (``turns`` in all, alternated),
    the seconds each checked turn spent checking, and how many generation reads it made."""
    rng = random.Random(7)
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    settings = Settings(
        instance_path=str(folder),
        table_prefix=prefix,
        encryption_keys=KEYS,
        keystore_url=keystore,
        recall_top_k=3,
    )
    create_tables(engine_for(settings.database_url), prefix)
    clock = FakeClock(1_700_000_000.0)
    claw = Claw.from_settings(settings, EchoProvider(), clock=clock)
    store = keystore_of(cipher_for(settings))
    assert store is not None
    reads = [0]
    generation = store.backend.generation

    def counted() -> int:
        reads[0] += 1
        return generation()

    store.backend.generation = counted  # type: ignore[method-assign]
    try:
        for index in range(5):
            claw.memory.set(f"fact{index}", _sentence(rng, 12), f"user:{USER}")
        conversation_id = new_id()
        batch = [
            {"role": "user" if index % 2 == 0 else "assistant", "content": _sentence(rng, 30)}
            for index in range(history)
        ]
        claw.conversations.append(conversation_id, batch, user_id=USER)
        claw.send(_sentence(rng, 8), conversation_id, user_id=USER)  # warm: keys read, index built
        times: dict[bool, list[float]] = {False: [], True: []}
        checking: list[float] = []
        reads[0] = 0
        for turn in range(turns):
            skip = turn % 2 == 1
            spent = [0.0]
            with _patched_check(skip, spent):
                clock.advance(1)
                started = time.perf_counter()
                claw.send(_sentence(rng, 8), conversation_id, user_id=USER)
                times[skip].append(time.perf_counter() - started)
            if not skip:
                checking.append(spent[0])
        return times[False], times[True], checking, reads[0] / len(times[False])
    finally:
        _forget(store, prefix)


def read_cost(folder: Path, keystore: str, reads: int = 2000) -> float:
    """Return the median seconds of one read of the generation of a store that had an erasure."""
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    settings = Settings(
        instance_path=str(folder), table_prefix=prefix, encryption_keys=KEYS, keystore_url=keystore
    )
    store = keystore_of(cipher_for(settings))
    assert store is not None
    try:
        store.subject_key("someone")
        store.erase("someone")
        times = []
        for _ in range(reads):
            started = time.perf_counter()
            store.backend.generation()
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        _forget(store, prefix)


def _shown(url: str) -> str:
    return url.split("://")[0]  # the kind, never a password


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=200)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--keystore", action="append", default=[], help="a key store URL (repeatable)")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "keys").mkdir()
        stores = [f"sqlite:///{Path(root) / 'keys' / 'keys.db'}", *args.keystore]
        for number, keystore in enumerate(stores):
            folder = Path(root) / f"site-{number}"
            folder.mkdir()
            checked, unchecked, checking, per_turn = turn_times(folder, keystore, args.history, args.turns)
            one = read_cost(Path(root) / f"site-{number}-read", keystore)
            checked_ms, unchecked_ms = statistics.median(checked) * 1000, statistics.median(unchecked) * 1000
            print(
                f"key store {_shown(keystore)}, {args.history}-message history: the check "
                f"{statistics.median(checking) * 1000:.2f} ms a turn ({per_turn:.1f} generation reads); "
                f"turn checked {checked_ms:.2f} ms, unchecked {unchecked_ms:.2f} ms "
                f"({checked_ms - unchecked_ms:+.2f}); one read alone {one * 1_000_000:.0f} us"
            )


if __name__ == "__main__":
    main()
