"""What one namespace's word index costs a host: RSS per entry, a turn against numpy's floor, and
how soon a second worker forked from a process holding the built index answers a fresh turn.

For each size (default 100,000 and 1,000,000 entries of 12 Zipf words, ``bench.recall``'s data):

- **RSS per entry**: the growth of VmRSS over the first turn of a fresh driver (which builds the
  index), divided by the entries, and the index's own arrays (``WordIndex.nbytes()``);
- **turn**: ``MessageAugmenter.augment()`` over ``--turns`` messages of 8 words, and the *floor*
  of the same messages: ``np.bincount`` of their words' concatenated postings into per-slot
  scores, the least any posting-list scoring does; ``x floor`` is turn over floor. Each message
  is timed ``--repeat`` times and its fastest kept (a loaded machine only ever adds time), and
  the median over the messages is shown, the same for turn and floor;
- **second worker** (``--fork``, SQLite only): another process commits a write, then this one
  forks; the child's first turn must inject the write. ``ready`` is fork to that turn's answer,
  ``private`` the child's private memory (Private_Clean + Private_Dirty of smaps_rollup) grown by
  then, per entry: what a worker adds to the one index the host shares. ``build`` is what a fresh
  process pays instead: the parent's warm-up.

    .venv/bin/python -m bench.index_memory [--sizes 100000,1000000] [--backend array|sqlite]
        [--turns 30] [--repeat 5] [--fork]

Run one size per process for clean RSS (``--sizes 1000000``); later sizes reuse freed memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import numpy as np

from bench.recall import NAMESPACE, array_memory, make_data, rss_bytes, sql_memory
from clawmem.clock import FakeClock
from clawmem.recall import MessageAugmenter
from clawmem.recall.feeds import fresh_index
from clawmem.recall.words import keywords


def private_bytes() -> int:
    """Return the process's private resident memory (smaps_rollup), 0 where it cannot be read."""
    try:
        with open("/proc/self/smaps_rollup") as rollup:
            fields = dict(line.split(":", 1) for line in rollup if ":" in line)
    except OSError:
        return 0
    return sum(int(fields.get(name, "0 kB").split()[0]) * 1024 for name in ("Private_Clean", "Private_Dirty"))


def floor_ms(memory: Any, message: str, repeat: int) -> float:
    """Time scoring ``message`` by one bincount of its words' postings (no liveness, no ranking)."""
    index = fresh_index(memory, NAMESPACE)
    postings = [found for word in set(keywords(message)) if (found := index.postings_of(word)) is not None]
    fastest = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        if postings:
            np.bincount(np.concatenate(postings), minlength=index.size)
        fastest = min(fastest, time.perf_counter() - started)
    return fastest * 1000


def timed_ms(augmenter: MessageAugmenter, message: str, repeat: int = 1) -> tuple[float, Any]:
    fastest = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = augmenter.augment(message)
        fastest = min(fastest, time.perf_counter() - started)
    return fastest * 1000, result


def second_worker(
    memory: Any, url: str, prefix: str, clock: FakeClock, entries: int
) -> tuple[float, float, bool]:
    """Commit a write from another driver, fork, and time the child's first turn; return
    (ready ms, private bytes per entry grown in the child, whether the turn injected the write)."""
    from clawmem.memory.sql import SqlMemory
    from clawmem.sql.engine import create_engine

    other_engine = create_engine(url)
    SqlMemory(other_engine, prefix=prefix, clock=clock).set("fresh-entry", "zzfreshword", NAMESPACE)
    other_engine.dispose()
    reader, writer = os.pipe()
    gc.collect()
    started = time.perf_counter()
    child = os.fork()
    if child == 0:  # the second worker
        os.close(reader)
        before = private_bytes()
        result = MessageAugmenter(memory, namespace=NAMESPACE, announce=False).augment("zzfreshword")
        ready = (time.perf_counter() - started) * 1000
        grown = (private_bytes() - before) / entries
        os.write(writer, json.dumps([ready, grown, "fresh-entry" in result.text]).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        ready, grown, fresh = json.loads(answer.read())
    os.waitpid(child, 0)
    return ready, grown, fresh


def run(size: int, backend: str, turns: int, repeat: int, fork: bool, directory: str) -> dict[str, Any]:
    clock = FakeClock(time.time())
    data = make_data("zipf", size, turns + 1)
    url = f"sqlite:///{directory}/bench-{uuid.uuid4().hex[:6]}.db"
    loaded = array_memory(data, clock, 60.0) if backend == "array" else sql_memory(url, data, clock, 60.0)
    with loaded as memory:
        augmenter = MessageAugmenter(memory, namespace=NAMESPACE, announce=False)
        gc.collect()
        before = rss_bytes()
        build_ms, _ = timed_ms(augmenter, data.messages[0])
        gc.collect()
        grown = rss_bytes() - before
        index_bytes = fresh_index(memory, NAMESPACE).nbytes()
        turn = statistics.median(timed_ms(augmenter, message, repeat)[0] for message in data.messages[1:])
        floor = statistics.median(floor_ms(memory, message, repeat) for message in data.messages[1:])
        row: dict[str, Any] = {
            "entries": size, "backend": backend, "rss_per_entry": grown / size,
            "arrays_per_entry": index_bytes / size, "build_ms": build_ms, "turn_ms": turn, "floor_ms": floor,
        }  # fmt: skip
        if fork and backend == "sqlite":
            prefix = memory.prefix
            ready, private, fresh = second_worker(memory, url, prefix, clock, size)
            row.update(ready_ms=ready, private_per_entry=private, fresh=fresh)
        del memory, augmenter
    gc.collect()
    return row


def line(row: dict[str, Any]) -> str:
    text = (
        f"{row['backend']:<7}{row['entries']:>9}{row['rss_per_entry']:>10.0f}{row['arrays_per_entry']:>10.0f}"
        f"{row['build_ms']:>10.0f}{row['turn_ms']:>9.2f}{row['floor_ms']:>9.2f}"
        f"{row['turn_ms'] / row['floor_ms']:>8.2f}"
    )
    if "ready_ms" in row:
        fresh = "yes" if row["fresh"] else "NO"
        text += f"{row['ready_ms']:>10.0f}{row['private_per_entry']:>10.0f}{fresh:>7}"
    return text


HEADER = (
    f"{'backend':<7}{'entries':>9}{'RSS B/e':>10}{'arr B/e':>10}{'build ms':>10}{'turn ms':>9}{'floor ms':>9}"
    f"{'x floor':>8}{'ready ms':>10}{'priv B/e':>10}{'fresh':>7}"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="entry counts, comma-separated")
    parser.add_argument("--backend", choices=["array", "sqlite"], default="array")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5, help="timings per message, the fastest kept")
    parser.add_argument("--fork", action="store_true", help="time a forked second worker (SQLite)")
    args = parser.parse_args(argv)
    print(HEADER)
    with tempfile.TemporaryDirectory() as directory:
        for size in (int(size) for size in args.sizes.split(",")):
            print(line(run(size, args.backend, args.turns, args.repeat, args.fork, directory)), flush=True)
    print(f"load: {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
