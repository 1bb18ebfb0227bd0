"""FrozenPostings: the postings a word index loaded, as three arrays instead of a dict of arrays.

Every key is a word of its own entry, so a namespace of a million entries has over a million
words, most held by one slot. As a ``dict`` of numpy arrays they cost about 300 bytes a word;
here they cost about 30: one array of every word's slots end to end, where each word's run
starts, the words' hashes in sorted order (a lookup is one binary search), and the words'
UTF-8 bytes, so that a hash is confirmed to be the word's and recall stays exact.

Nothing is written in place: a compaction builds new arrays, so postings handed out earlier
(views of the old ones) never change.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np


def _hashes(words: Sequence[str]) -> np.ndarray:
    return np.fromiter(map(hash, words), dtype=np.int64, count=len(words))


class FrozenPostings:
    """The slots holding each word, in ascending order, for words fixed when it was built."""

    def __init__(self) -> None:
        self._set(np.empty(0, dtype=np.int64), b"", np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int32),
                  np.empty(0, dtype=np.int64))  # fmt: skip

    @classmethod
    def grouped(cls, words: Sequence[str], word_ids: np.ndarray, slot_ids: np.ndarray) -> FrozenPostings:
        """Return the postings where word ``words[n]`` (distinct) holds the slots paired with
        ``n`` in ``word_ids``/``slot_ids`` (slots ascending within each word)."""
        hashes = _hashes(words)
        order = np.argsort(hashes, kind="stable")  # words by hash: a lookup is a binary search
        position = np.empty(len(words), dtype=np.int32)
        position[order] = np.arange(len(words), dtype=np.int32)
        of_posting = position[word_ids]
        flat = slot_ids[np.argsort(of_posting, kind="stable")].astype(np.int32)
        lengths = np.bincount(of_posting, minlength=len(words)).astype(np.int64)
        del of_posting, position
        encoded = [words[n].encode("utf-8") for n in order.tolist()]
        word_ends = np.zeros(len(encoded) + 1, dtype=np.int64)
        word_ends[1:] = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
        built = cls()
        built._set(hashes[order], b"".join(encoded), word_ends, flat, lengths)
        return built

    def _set(self, hashes: np.ndarray, blob: bytes, word_ends: np.ndarray, flat: np.ndarray,
             lengths: np.ndarray) -> None:  # fmt: skip
        self._hashes = hashes  # sorted; the n-th word's UTF-8 is blob[word_ends[n]:word_ends[n + 1]]
        self._blob = blob
        self._word_ends = word_ends
        self._flat = flat  # the n-th word's slots are flat[starts[n]:starts[n + 1]]
        self._flat.flags.writeable = False
        self._starts = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._starts[1:])

    def __len__(self) -> int:
        return int(self._hashes.size)

    def _word(self, position: int) -> str:
        return self._blob[int(self._word_ends[position]) : int(self._word_ends[position + 1])].decode("utf-8")

    def _position(self, word: str) -> int | None:
        wanted = hash(word)
        position = int(self._hashes.searchsorted(wanted))
        while position < self._hashes.size and int(self._hashes[position]) == wanted:
            if self._word(position) == word:
                return position
            position += 1
        return None

    def get(self, word: str) -> np.ndarray | None:
        """Return the slots holding ``word`` (a read-only view), or ``None``."""
        position = self._position(word)
        if position is None:
            return None
        return self._flat[int(self._starts[position]) : int(self._starts[position + 1])]

    def get_many(self, words: Collection[str]) -> dict[str, np.ndarray]:
        """Return the slots holding each of ``words`` that is held, by word: one binary search
        for them all."""
        if not words or not len(self):
            return {}
        words = list(words)
        wanted = _hashes(words)
        positions = self._hashes.searchsorted(wanted).tolist()
        found = {}
        size = int(self._hashes.size)
        for word, hashed, position in zip(words, wanted.tolist(), positions, strict=True):
            while position < size and int(self._hashes[position]) == hashed:
                if self._word(position) == word:
                    found[word] = self._flat[int(self._starts[position]) : int(self._starts[position + 1])]
                    break
                position += 1
        return found

    def words(self) -> Iterator[str]:
        """Yield every word held."""
        return (self._word(position) for position in range(len(self)))

    def compact(self, keep: np.ndarray, renumber: np.ndarray, shadowed: Collection[str]) -> FrozenPostings:
        """Return these postings without the slots ``keep`` marks dead, the others numbered by
        ``renumber``, and without the words of ``shadowed`` (held elsewhere now) or left with no
        slot."""
        lengths = np.diff(self._starts)
        owner = np.repeat(np.arange(len(self), dtype=np.int32), lengths)
        held = keep[self._flat]
        gone = [position for word in shadowed if (position := self._position(word)) is not None]
        if gone:
            dropped = np.zeros(len(self), dtype=bool)
            dropped[gone] = True
            held &= ~dropped[owner]
        flat = renumber[self._flat[held]].astype(np.int32)
        lengths = np.bincount(owner[held], minlength=len(self)).astype(np.int64)
        del owner, held
        kept_words = lengths > 0
        word_lengths = np.diff(self._word_ends)
        blob = np.frombuffer(self._blob, dtype=np.uint8)[np.repeat(kept_words, word_lengths)].tobytes()
        word_ends = np.zeros(int(np.count_nonzero(kept_words)) + 1, dtype=np.int64)
        np.cumsum(word_lengths[kept_words], out=word_ends[1:])
        compacted = FrozenPostings()
        compacted._set(self._hashes[kept_words], blob, word_ends, flat, lengths[kept_words])
        return compacted

    def nbytes(self) -> int:
        """Return how many bytes its arrays hold."""
        arrays = (self._flat, self._hashes, self._starts, self._word_ends)
        return len(self._blob) + sum(column.nbytes for column in arrays)
