"""Per-turn cost of the recall scorings, and the RSS the vectors take, at N entries (ArrayMemory).

It loads N entries of 12 words into one namespace, the words drawn from a Zipf vocabulary
(50,000 words, frequency of the r-th word proportional to r^-1.1), and gives each a random unit
vector of 512 float32 (embedding 100,000 real entries takes hours on a small machine; the cosine
pass costs the same for any vector). It then times ``MessageAugmenter.augment()`` on messages of
8 words from the same vocabulary under ``clawmem`` (word overlap, from the index), ``weighted``
and ``hybrid`` (or the scorings ``--scoring`` names, ``semantic`` among them), taking turns so
that a change of load hits each alike. Every semantic and hybrid message is new, so its
embedding by the bundled encoder is part of each timed turn (the vectors are held for the
scorer, ``SemanticScorer(embed_on_read=False)``, so such a turn is answered from the word index
and one float32 product over the vectors). ``--embedder minilm`` times all-MiniLM-L6-v2 (384
dimensions) in place of the default encoder.

It prints, per scoring, the median wall-clock and CPU time of a turn; the weighted/overlap
ratios of both; the RSS growth per entry over filling the vector store; and the load average.
On a shared machine the CPU medians are the ones to compare with a target: a turn of some 20 ms
waits for the CPU several times when the load is above the core count, which a wall-clock
median counts. Never part of the test suite.

    .venv/bin/python -m bench.scoring [--size 100000] [--turns 20] [--scoring semantic] [--embedder minilm]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np

from bench.recall import rss_bytes
from clawmem.memory.array import ArrayMemory
from clawmem.recall import MessageAugmenter
from clawmem.recall.embeddings import Embedder, VectorStore, held_rows, load_embedder, one_blas_thread, unit
from clawmem.recall.fusion import COSINE_DIGITS, DEPTH, SemanticScorer
from clawmem.recall.phpclaw import RANKERS
from clawmem.recall.semantic_index import MARGIN

VOCABULARY = 50_000
ZIPF = 1.1
# Questions as people ask them, for the query embedding alone: a message of 8 of the bench's
# words ("w123x") is some 30 word pieces to a WordPiece encoder, where these are 8 to 14.
QUESTIONS = [
    "When did Anna move to Lisbon?",
    "What does Tom do for a living?",
    "Which books has Maria read this year?",
    "How long ago did Sam adopt his dog?",
    "What did Priya paint last summer?",
    "Where does Omar go hiking with his kids?",
    "Who gave Lena the guitar?",
    "What instrument is Jon learning?",
    "When is the charity race?",
    "Why did Kim change jobs?",
]


class RandomForEntries:
    """The encoder for messages, and random vectors while the store is filled."""

    def __init__(self, encoder: Embedder, rng: np.random.Generator) -> None:
        self.encoder = encoder
        self.model_id = encoder.model_id
        self.dimension = encoder.dimension
        self.filling = True
        self._rng = rng

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.filling:
            return self._rng.standard_normal((len(texts), self.dimension)).astype(np.float32)
        return self.encoder.embed(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument(
        "--scoring",
        action="append",
        choices=["clawmem", "weighted", "semantic", "hybrid"],
        help="a scoring to time (repeatable; default clawmem, weighted and hybrid)",
    )
    parser.add_argument("--embedder", default="", help="as CLAW_RECALL_EMBEDDER: '' (the default) or minilm")
    options = parser.parse_args()
    started_load = os.getloadavg()[0]
    rng = np.random.default_rng(7)
    vocabulary = [f"w{n}x" for n in range(VOCABULARY)]
    weights = 1 / np.arange(1, VOCABULARY + 1) ** ZIPF
    weights /= weights.sum()
    drawn = iter(rng.choice(VOCABULARY, 12 * options.size + 8 * options.turns, p=weights).tolist())

    def words(count: int) -> str:
        return " ".join(vocabulary[next(drawn)] for _ in range(count))

    memory = ArrayMemory()
    for n in range(options.size):
        memory.set(f"k{n:07d}", words(12), namespace="bench")
    messages = [words(8) for _ in range(options.turns)]
    encoder = load_embedder(options.embedder)
    encoder.embed(["warm up"])
    embedder = RandomForEntries(encoder, rng)
    scorer = SemanticScorer(embedder, embed_on_read=False)
    stored = list(memory.all("bench").items())
    gc.collect()
    before = rss_bytes()
    store = scorer.store_for(memory)
    for start in range(0, len(stored), 256):  # small batches: the allocator keeps what a batch frees
        store.embed_missing("bench", stored[start : start + 256])
    embedder.filling = False
    gc.collect()
    per_entry = (rss_bytes() - before) / options.size
    del stored
    rankers = {
        "clawmem": RANKERS["clawmem"],
        "weighted": RANKERS["weighted"],
        "semantic": scorer.semantic,
        "hybrid": scorer.hybrid,
    }
    timed = options.scoring or ["clawmem", "weighted", "hybrid"]
    augmenters = {
        name: MessageAugmenter(memory, namespace="bench", ranker=rankers[name], announce=False)
        for name in dict.fromkeys(timed)
    }
    for augmenter in augmenters.values():
        augmenter.augment(messages[0])  # warm-up (builds the word index)
    wall: dict[str, list[float]] = {name: [] for name in augmenters}
    cpu: dict[str, list[float]] = {name: [] for name in augmenters}
    for turn, message in enumerate(messages):
        for name, augmenter in augmenters.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            augmenter.augment(f"{message} t{turn}")
            cpu[name].append(time.process_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    query_cpu = []
    for turn, message in enumerate(messages):
        start_cpu = time.process_time()
        encoder.embed([f"{message} q{turn}"])
        query_cpu.append(time.process_time() - start_cpu)
    asked_cpu = []
    for turn in range(3):
        for question in QUESTIONS:
            start_cpu = time.process_time()
            encoder.embed([f"{question} {turn}"])
            asked_cpu.append(time.process_time() - start_cpu)
    median = {name: statistics.median(times) * 1000 for name, times in wall.items()}
    median_cpu = {name: statistics.median(times) * 1000 for name, times in cpu.items()}
    print(
        f"{options.size} entries of 12 words, Zipf vocabulary ({VOCABULARY} words, s = {ZIPF}), "
        f"{options.turns} turns each, taken in turn (medians; the machine may be shared)"
    )
    print(f"  load average at the start {started_load:.2f}, at the end {os.getloadavg()[0]:.2f}")
    print(f"  {'turn':<9} {'wall ms':>9} {'CPU ms':>9}")
    for name in augmenters:
        print(f"  {name:<9} {median[name]:9.2f} {median_cpu[name]:9.2f}")
    for name in ("semantic", "hybrid"):
        if name in median:
            print(
                f"  {name}, query embedding included: {median[name]:.1f} ms wall, "
                f"{median_cpu[name]:.1f} ms CPU"
            )
    print(
        f"  query embedding alone {statistics.median(query_cpu) * 1000:.1f} ms CPU; of a question "
        f"such as {QUESTIONS[0]!r} {statistics.median(asked_cpu) * 1000:.1f} ms CPU"
    )
    if "weighted" in median and "clawmem" in median:
        print(
            f"  weighted / overlap   {median['weighted'] / median['clawmem']:.2f}x wall, "
            f"{median_cpu['weighted'] / median_cpu['clawmem']:.2f}x CPU"
        )
    print(
        f"  vectors of {encoder.model_id}: {per_entry / 1024:.2f} KB RSS per entry (held as "
        f"{encoder.dimension} int8 codes and a scale, {(encoder.dimension + 4) / 1024:.2f} KB)"
    )
    if "hybrid" in median_cpu:
        beside_float32(store, encoder, messages, median_cpu["hybrid"], options.size)


def beside_float32(
    store: VectorStore, encoder: Embedder, messages: list[str], turn: float, size: int
) -> None:
    """Print the same vectors held as float32 beside the int8 codes: their RSS, and a hybrid
    turn whose nearest vectors were one exact float32 product and a partial selection (the
    turn measured, less its nearest pass, plus that product)."""
    space = store._space("bench")
    queries = [unit(encoder.embed([f"{message} f"])[0]) for message in messages]
    gc.collect()
    before = rss_bytes()
    rows = held_rows(space.held(np.arange(space.size)))  # float32, 2 KB a row
    float32_entry = (rss_bytes() - before) / size
    wanted = DEPTH + MARGIN
    held_ms, float32_ms = [], []
    for query in queries:
        start = time.process_time()
        store.nearest("bench", query, wanted, COSINE_DIGITS)
        held_ms.append((time.process_time() - start) * 1000)
        start = time.process_time()
        with one_blas_thread():
            cosines = rows @ query
        best = np.argpartition(cosines, cosines.size - wanted)[cosines.size - wanted :]
        sorted(best.tolist(), key=lambda row: -cosines[row])
        float32_ms.append((time.process_time() - start) * 1000)
    held, exact = statistics.median(held_ms), statistics.median(float32_ms)
    print(f"  beside float32 (the same vectors; CPU medians of {len(queries)} queries):")
    arrays = store.nbytes() / size / 1024
    print(
        f"    RSS per entry      int8 codes {arrays:.2f} KB of arrays, float32 {float32_entry / 1024:.2f} KB"
    )
    print(f"    nearest {wanted} pass  int8 codes {held:.1f} ms, float32 product {exact:.1f} ms")
    swapped = turn - held + exact
    print(f"    hybrid turn        int8 codes {turn:.1f} ms, float32 (its nearest swapped) {swapped:.1f} ms")
    del rows


if __name__ == "__main__":
    main()
