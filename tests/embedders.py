"""Local embedders for tests: cheap, deterministic, and counting what they embed.

``module:callable`` names here (``tests.embedders:counting``) are what ``clawmem embed --embedder``
takes, in a subprocess too.
"""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np

from clawmem.recall.words import keywords


class HashedWords:
    """A local embedder for tests: the sum of one fixed random vector per word (and per word of
    ``synonyms``' group), so texts sharing words or synonyms point alike."""

    def __init__(
        self, dimension: int = 16, synonyms: dict[str, str] | None = None, model_id: str = "hashed"
    ) -> None:
        self.dimension = dimension
        self.model_id = model_id
        self.synonyms = synonyms or {}

    def _word(self, word: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(self.synonyms.get(word, word).encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(self.dimension)

    def embed(self, texts):
        rows = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in keywords(text):
                rows[row] += self._word(word)
        return rows


class Counting:
    """Wraps an embedder and records every text it was asked to embed, in order."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        return self.inner.embed(texts)


COUNTED: list[Counting] = []  # every embedder counting() made in this process


def counting() -> Counting:
    """Return a counting HashedWords, remembered in :data:`COUNTED`."""
    made = Counting(HashedWords())
    COUNTED.append(made)
    return made


class Stalling(HashedWords):
    """HashedWords that, asked for its third batch, writes one byte to the file descriptor in
    ``CLAW_TEST_STALL_FD`` and then never returns: the two batches before are stored, and a
    test reading that byte knows the process is stuck right there, to be killed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        if self.calls == 3:
            os.write(int(os.environ["CLAW_TEST_STALL_FD"]), b"!")
            threading.Event().wait()
        return super().embed(texts)


def stalling() -> Stalling:
    """Return a :class:`Stalling` embedder."""
    return Stalling()


def wide() -> HashedWords:
    """Return HashedWords of another model: 32 dimensions, model id ``wide``."""
    return HashedWords(dimension=32, model_id="wide")


class Failing(HashedWords):
    """HashedWords whose every call fails, as a model that cannot run would."""

    def embed(self, texts):
        raise RuntimeError("the model cannot run")


def failing() -> Failing:
    """Return a :class:`Failing` embedder."""
    return Failing()
