"""Per-turn cost of the recall scorings, and the RSS the vectors take, at N entries (ArrayMemory).

It loads N entries of 12 words (a Zipf vocabulary of 50,000 words) into one namespace, gives each
a random unit vector of 512 float32 (embedding 100,000 real entries takes hours on a small
machine; the cosine pass costs the same for any vector), then times ``MessageAugmenter.augment()``
on messages of 8 words under ``clawmem`` (word overlap, from the index), ``weighted`` and
``hybrid``. Every hybrid message is new, so its embedding by the bundled encoder is part of each
timed turn (the vectors are held for the scorer, so a hybrid turn is answered from the word index
and one float32 product over them). It prints medians, the weighted/overlap ratio, the RSS
growth per entry over filling the vector store, and the load average. Never part of the test suite.

    .venv/bin/python -m bench.scoring [--size 100000] [--turns 20]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import numpy as np

from bench.recall import rss_bytes
from clawmem.memory.array import ArrayMemory
from clawmem.recall import MessageAugmenter
from clawmem.recall.embeddings import UniversalSentenceEncoder
from clawmem.recall.fusion import SemanticScorer
from clawmem.recall.phpclaw import RANKERS


def timed(augmenter: MessageAugmenter, messages: list[str]) -> float:
    times = []
    for message in messages:
        start = time.perf_counter()
        augmenter.augment(message)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=20)
    options = parser.parse_args()
    started_load = os.getloadavg()[0]
    rng = np.random.default_rng(7)
    vocabulary = [f"w{n}x" for n in range(50_000)]
    weights = 1 / np.arange(1, len(vocabulary) + 1) ** 1.1
    weights /= weights.sum()

    def words(count: int) -> str:
        return " ".join(vocabulary[i] for i in rng.choice(len(vocabulary), count, p=weights))

    memory = ArrayMemory()
    for n in range(options.size):
        memory.set(f"k{n:07d}", words(12), namespace="bench")
    messages = [words(8) for _ in range(options.turns)]
    encoder = UniversalSentenceEncoder()
    encoder.embed(["warm up"])
    scorer = SemanticScorer(encoder, embed_on_read=False)
    gc.collect()
    before = rss_bytes()
    store = scorer.store_for(memory)
    for key, value in memory.all("bench").items():
        vector = rng.standard_normal(512).astype(np.float32)
        store.put("bench", key, value, vector, encoder.model_id)
    gc.collect()
    per_entry = (rss_bytes() - before) / options.size
    results = {}
    for name, ranker in (
        ("clawmem", RANKERS["clawmem"]),
        ("weighted", RANKERS["weighted"]),
        ("hybrid", scorer.hybrid),
    ):
        augmenter = MessageAugmenter(memory, namespace="bench", ranker=ranker, announce=False)
        augmenter.augment(messages[0])  # warm-up (builds the word index)
        results[name] = timed(augmenter, [f"{m} t{i}" for i, m in enumerate(messages)])
    start = time.perf_counter()
    for i in range(options.turns):
        encoder.embed([f"{messages[i]} q{i}"])
    query = (time.perf_counter() - start) / options.turns * 1000
    print(f"{options.size} entries, {options.turns} turns each (medians; the machine is shared)")
    print(f"  load average at the start {started_load:.2f}, at the end {os.getloadavg()[0]:.2f}")
    for name, median in results.items():
        print(f"  {name:<9} {median:9.1f} ms")
    print(f"  query embedding alone {query:.1f} ms")
    print(f"  weighted / overlap   {results['weighted'] / results['clawmem']:.1f}x")
    print(f"  vectors: {per_entry / 1024:.2f} KB RSS per entry (512 float32 = 2.0 KB)")


if __name__ == "__main__":
    main()
