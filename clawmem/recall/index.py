"""WordIndex: an in-memory inverted index of one namespace, for exact recall at any size.

Each entry gets a *slot*. The index keeps, per slot, the key and a key order (a float that sorts
as the keys do, by code point) packed in a :class:`~clawmem.recall.keys.KeyTable`, and the
expiry, the size of the entry's injection line and a fingerprint of its value as arrays; and per
word (casefolded, at least three characters; with stemming, its stem) the slots whose key or
value holds it. A query costs the postings of the message's words: one indexed add per posting
(a vector add for a word most slots hold) gives every slot's score, and a partial sort on (score
descending, key order) gives the first candidates in the exact order a full scan gives.

An index is built under one stemming (:attr:`WordIndex.stemming`) and holds the words of that
stemming only, never a mix: another stemming is another index.

An index holds no values and does no I/O. :mod:`clawmem.recall.feeds` keeps it in step with
a driver's change feed (:meth:`put`, :meth:`remove`, :meth:`clear`, :meth:`drop_expired`);
recall verifies the few entries it injects against the backend.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clawmem.recall.injection import line_bytes
from clawmem.recall.keys import KeyTable, PackedKeys, with_room
from clawmem.recall.postings import FrozenPostings
from clawmem.recall.words import NO_STEMMING, check_stemming, entry_words, text_of

NEVER = np.iinfo(np.int64).max  # the expiry of an entry without a TTL
_GROWTH = 2
_MERGE_AT = 64  # pending postings of a word merged into its array past this many
# A word held by at least one slot in _DENSE_SHARE (in a namespace of _DENSE_FROM slots or more)
# is also kept as one byte per slot once queried: adding that array to the scores is a vector
# add, several times cheaper than an indexed add per posting (a Zipf vocabulary's common words).
_DENSE_SHARE = 8
_DENSE_FROM = 65_536
_FEW = 128  # best-scoring slots at most this many are ranked by a Python sort
_ONES = {kind: np.ones(1, dtype=kind) for kind in (np.uint8, np.uint16)}  # what a posting adds


def _fingerprint(value: Any, text: str, expires_at: int | None) -> int:
    # What tells two stored states of an entry apart: its value's type and text, and its expiry.
    return hash((type(value).__name__, text, expires_at))


class _Numbering(dict[str, int]):
    """Numbers words in the order they are first looked up."""

    def __missing__(self, word: str) -> int:
        number = self[word] = len(self)
        return number


@dataclass(frozen=True)
class Candidates:
    """The scores of one query's live entries and the count of those sharing no word with it.

    It answers from the index as it was when queried, however the index changes later: a
    report's decisions are read lazily, maybe after another turn brought the index up to date
    (new slots, replaced entries, a renumbered key order, a compaction that renumbers slots).
    """

    index: WordIndex
    counts: np.ndarray  # per slot as of the query: its score, 0 for dead and expired slots
    candidate_count: int  # slots with a score above 0
    zero_overlap: int
    # The index's per-slot data as of the query. It writes a slot's key, key order and line size
    # once, and never in place after that: it renumbers the key order or compacts into new ones.
    keys: PackedKeys
    key_order: np.ndarray
    line_size: np.ndarray
    postings: dict[str, np.ndarray]  # per query word: never changed in place, only replaced
    # Per query word common enough to be kept as one byte per slot (1 where held): the bytes of
    # the slots queried never change after the query (new slots are numbered above them).
    marks: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    _slot_of: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return self.candidate_count

    @property
    def slots(self) -> np.ndarray:
        """Return the slots with a score above 0, in slot order."""
        return np.flatnonzero(self.counts)

    def _best(self, count: int) -> np.ndarray:
        """Return the slots scoring at least the highest score that ``count`` slots reach: a count
        over the scores per score level tried, from the top, then one pass that lists the slots,
        rather than a sort of every hit."""
        if count >= self.candidate_count:
            return self.slots
        counts = self.counts
        lowest = int(counts.max())
        held = counts >= lowest  # one mask, compared again in place per level and then listed
        while lowest > 1 and np.count_nonzero(held) < count:
            lowest -= 1
            np.greater_equal(counts, lowest, out=held)
        return held.nonzero()[0]

    def first(self, count: int) -> list[tuple[str, int, int]]:
        """Return the first ``count`` candidates in rank order (score desc, key asc) as
        ``(key, score, line bytes)``."""
        if count <= 0 or not self.candidate_count:
            return []
        slots = self._best(count)
        if slots.size <= _FEW:
            # A sort of (score desc, key order) tuples: cheaper than the array steps for so few.
            scores, orders = self.counts[slots].tolist(), self.key_order[slots].tolist()
            by_rank = sorted(zip([-score for score in scores], orders, slots.tolist(), strict=True))
            return [self._found(slot, -negated) for negated, _, slot in by_rank[:count]]
        scores = self.counts[slots]
        orders = self.key_order[slots]
        orders -= orders.min()  # a copy already, taken by the indexing
        # Scores are small integers and key orders span less than ``ceiling``, and neighbouring
        # orders differ by more than a float's error at this size: one exact sort key.
        ceiling = float(orders.max()) + 1.0
        order_key = orders - scores * ceiling
        if count < slots.size:
            chosen = np.argpartition(order_key, count - 1)[:count]
        else:
            chosen = np.arange(slots.size)
        chosen = chosen[np.argsort(order_key[chosen], kind="stable")]
        slots, scores = slots[chosen], scores[chosen]
        return [self._found(slot, score) for slot, score in zip(slots.tolist(), scores.tolist(), strict=True)]

    def _found(self, slot: int, score: int) -> tuple[str, int, int]:
        key = self.keys[slot]
        self._slot_of[key] = slot
        return key, int(score), int(self.line_size[slot])

    def confirm(self, keys: Sequence[str], rows: Mapping[str, Any], now: int) -> bool:
        """Check ``keys`` (candidates of this query) against ``rows`` (see
        :meth:`WordIndex.confirm`), with the slots where the query found them."""
        return self.index.confirm(keys, rows, now, self._slot_of)

    def matched(self, keys: Sequence[str], words: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Return, for each of ``keys`` (candidates of this query), the query words it holds,
        in the order of ``words``."""
        if any(key not in self._slot_of for key in keys):
            self._slot_of.update((self.keys[slot], slot) for slot in self.slots.tolist())
        # Slots as the postings hold them (int32): searchsorted would otherwise cast every
        # posting list it searches to int64, a copy per word per call.
        slots = np.array([self._slot_of[key] for key in keys], dtype=np.int32)
        found: dict[str, list[str]] = {key: [] for key in keys}
        for word in words:
            postings = self.postings.get(word)
            if postings is None or not postings.size:
                continue
            # Postings are in ascending slot order: a binary search per key, not a pass over them.
            at = np.minimum(np.searchsorted(postings, slots), postings.size - 1)
            for key, present in zip(keys, (postings[at] == slots).tolist(), strict=True):
                if present:
                    found[key].append(word)
        return {key: tuple(matched) for key, matched in found.items()}


class WordIndex:
    """The inverted index of one namespace, its words those of :func:`~clawmem.recall.words.entry_words`
    under ``stemming``. Thread-safe: every method takes :attr:`lock`."""

    def __init__(self, namespace: str, stemming: str = NO_STEMMING) -> None:
        self.namespace = namespace
        self.stemming = check_stemming(stemming)
        self.lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        """Forget every entry."""
        with self.lock:
            self.table = KeyTable()
            self.prints = np.empty(0, dtype=np.int64)
            self.expires = np.empty(0, dtype=np.int64)
            self.line_size = np.empty(0, dtype=np.int64)
            self.frozen = FrozenPostings()  # as loaded, less what compaction dropped
            self.postings: dict[str, np.ndarray] = {}  # words written since: they shadow frozen
            self.pending: dict[str, list[int]] = {}
            self.dense: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # word -> (postings, marks)
            self._changed()

    def _changed(self) -> None:
        # Any change to which slots are alive or when they expire outdates the cached live mask.
        self.version = getattr(self, "version", 0) + 1
        self._live_cache: tuple[int, int, int, np.ndarray, int] | None = None

    def __len__(self) -> int:
        """Return how many entries (expired ones included) the index holds."""
        return self.table.live

    def __contains__(self, key: object) -> bool:
        """Return whether the index holds an entry (expired or not) of ``key``."""
        with self.lock:
            return isinstance(key, str) and self.table.slot_of(key) is not None

    def __iter__(self) -> Iterator[str]:
        """Iterate over the keys of the entries the index holds (expired ones included), as they
        are when called, in slot order."""
        with self.lock:
            keys = self.table.view()
            held = [keys[slot] for slot in np.flatnonzero(self.table.alive[: self.size]).tolist()]
        return iter(held)

    @property
    def size(self) -> int:
        """Return how many slots are used, live or dead."""
        return self.table.count

    @property
    def key_order(self) -> np.ndarray:
        """Return each slot's key order (see :class:`~clawmem.recall.keys.KeyTable`)."""
        return self.table.key_order

    # -- writing ----------------------------------------------------------------------------

    def put(self, key: str, value: Any, expires_at: int | None) -> bool:
        """Index ``key`` with ``value``; return ``False`` when it was already indexed as is."""
        with self.lock:
            return self._put(key, value, expires_at, self.table.slot_of(key))

    def _put(self, key: str, value: Any, expires_at: int | None, slot: int | None) -> bool:
        # Called with the lock held (put, confirm); the value's text is made once.
        text = text_of(value)
        print_ = _fingerprint(value, text, expires_at)
        if slot is not None and self.prints[slot] == print_:
            return False
        self._add(key, text, expires_at, print_, slot)
        return True

    def remove(self, key: str) -> None:
        """Drop ``key`` (nothing happens when it is not indexed)."""
        with self.lock:
            if self.table.discard(key) is None:
                return
            self._changed()
            self._maybe_compact()

    def drop_expired(self, now: int) -> None:
        """Drop every entry expired at ``now`` (what a sweep deleted)."""
        with self.lock:
            expired = ~self.live_mask(now) & self.table.alive[: self.size]
            for key in [self.table[slot] for slot in np.flatnonzero(expired).tolist()]:
                self.remove(key)

    def load(self, entries: Iterable[tuple[str, Any, int | None]]) -> None:
        """Replace the whole index with ``entries`` (key, value, expires_at) in one pass.

        Words are numbered as they are read and postings kept as machine integers, and keys
        packed (:class:`~clawmem.recall.keys.KeyTable`), so a load keeps a few bytes per posting
        and per key, never a Python object per entry.
        """
        with self.lock:
            self.clear()
            vocabulary = _Numbering()
            word_ids = array("i")  # the words of every entry, in slot order
            word_counts = array("i")  # per slot, how many
            expires = array("q")
            sizes = array("q")
            prints = array("q")
            keys: list[str] = []
            seen: set[str] = set()
            for key, value, expires_at in entries:
                if key in seen:
                    continue
                seen.add(key)
                text = text_of(value)
                keys.append(key)
                prints.append(_fingerprint(value, text, expires_at))
                expires.append(NEVER if expires_at is None else expires_at)
                sizes.append(line_bytes(key, text))
                words = entry_words(key, text, self.stemming)
                word_counts.append(len(words))
                word_ids.fromlist(list(map(vocabulary.__getitem__, words)))  # faster than extend(map)
            del seen
            count = len(keys)
            self.table.reset(keys)
            del keys
            self._ensure(count, with_room(count))
            self.prints[:count] = np.asarray(prints, dtype=np.int64)
            self.expires[:count] = np.asarray(expires, dtype=np.int64)
            self.line_size[:count] = np.asarray(sizes, dtype=np.int64)
            self._changed()
            if word_ids:
                slot_ids = np.repeat(np.arange(count, dtype=np.int32), np.asarray(word_counts))
                numbers = np.asarray(word_ids, dtype=np.int32)
                del word_ids
                self.frozen = FrozenPostings.grouped(list(vocabulary), numbers, slot_ids)

    def _ensure(self, needed: int, grown: int = 0) -> None:
        capacity = self.expires.size
        if needed <= capacity:
            return
        grown = max(needed, capacity * _GROWTH, 1024, grown)
        # Zeroed, then copied: the room past ``needed`` stays untouched (and not resident).
        for name in ("prints", "expires", "line_size"):
            column = getattr(self, name)
            larger = np.zeros(grown, dtype=column.dtype)
            larger[:capacity] = column
            setattr(self, name, larger)

    def _add(self, key: str, text: str, expires_at: int | None, print_: int, replaced: int | None) -> None:
        slot = self.table.add(key, replaced)
        self._ensure(self.size)
        self.prints[slot] = print_
        self.expires[slot] = NEVER if expires_at is None else expires_at
        self.line_size[slot] = line_bytes(key, text)
        self._changed()
        for word in entry_words(key, text, self.stemming):
            waiting = self.pending.setdefault(word, [])
            waiting.append(slot)
            if len(waiting) >= _MERGE_AT:
                self._merge(word)
        self._maybe_compact()

    def _merge(self, word: str) -> None:
        waiting = self.pending.pop(word, None)
        if not waiting:
            return
        added = np.asarray(waiting, dtype=np.int32)
        current = self._postings(word)
        self.postings[word] = added if current is None else np.concatenate((current, added))
        if word in self.dense:  # no query holds the marks: they follow in place
            marks = self.dense[word][1]
            if marks.size < self.size:
                marks = np.concatenate((marks, np.zeros(self.size - marks.size, dtype=np.uint8)))
            marks[added] = 1
            self.dense[word] = (self.postings[word], marks)

    def _dense_marks(self, word: str, postings: np.ndarray) -> np.ndarray | None:
        """Return one byte per slot (1 where ``word`` is held) for a word common enough to be
        scored by a vector add, else ``None``."""
        if self.size < _DENSE_FROM or postings.size * _DENSE_SHARE < self.size:
            return None
        cached = self.dense.get(word)
        # Postings only grow, by _merge (which updates the marks), or are renumbered by a
        # compaction (which drops them): the same length is the same postings.
        if cached is not None and cached[0].size == postings.size:
            return cached[1]
        marks = np.zeros(self.size, dtype=np.uint8)
        marks[postings] = 1
        self.dense[word] = (postings, marks)
        return marks

    def _maybe_compact(self) -> None:
        """Drop dead slots once they are half of all slots, renumbering the live ones."""
        dead = self.size - self.table.live
        if dead < 1024 or dead * 2 < self.size:
            return
        for word in list(self.pending):
            self._merge(word)
        keep = self.table.alive[: self.size].copy()
        renumber = np.cumsum(keep) - 1
        self.dense = {}
        self.frozen = self.frozen.compact(keep, renumber, shadowed=set(self.postings))
        for word, postings in list(self.postings.items()):
            live = postings[keep[postings]]
            if live.size:
                self.postings[word] = renumber[live].astype(np.int32)
            else:
                del self.postings[word]
        kept = self.table.compact()
        self.prints = self.prints[kept]
        self.expires = self.expires[kept]
        self.line_size = self.line_size[kept]
        self._changed()

    # -- reading ----------------------------------------------------------------------------

    def postings_of(self, word: str) -> np.ndarray | None:
        """Return the slots (live or dead) whose entry holds ``word`` in ascending order, or
        ``None``. (New slots are numbered above every other, so appending keeps the order, and
        compaction numbers the slots it keeps in the same order.)"""
        with self.lock:
            if word in self.pending:
                self._merge(word)
            return self._postings(word)

    def _postings(self, word: str) -> np.ndarray | None:
        found = self.postings.get(word)
        return self.frozen.get(word) if found is None else found

    def words(self) -> set[str]:
        """Return every word some slot (live or dead) holds."""
        with self.lock:
            return set(self.frozen.words()) | set(self.postings) | set(self.pending)

    def live_mask(self, now: int) -> np.ndarray:
        """Return, per slot, whether it holds a live entry at ``now`` (a new array)."""
        with self.lock:
            return self._live(now)[0].copy()

    def live_count(self, now: int) -> int:
        """Return how many entries the index holds that are live at ``now``."""
        with self.lock:
            return self._live(now)[1]

    def _live(self, now: int) -> tuple[np.ndarray, int]:
        """Return the live mask at ``now`` (not to be written) and how many slots are live:
        computed again only after a change, or once ``now`` reaches the next expiry."""
        cached = self._live_cache
        if cached is not None and cached[0] == self.version and cached[1] <= now < cached[2]:
            return cached[3], cached[4]
        expires = self.expires[: self.size]
        live = self.table.alive[: self.size] & (expires > now)
        later = expires[live & (expires != NEVER)]
        until = int(later.min()) if later.size else NEVER
        live.flags.writeable = False
        self._live_cache = (self.version, now, until, live, int(np.count_nonzero(live)))
        return live, self._live_cache[4]

    def answers_as_of(self, now: int) -> tuple[int, int, int]:
        """Return what every query's answer at ``now`` depends on besides its words: the index's
        version and the clock seconds ``[since, until)`` around ``now`` in which no entry
        expires. Two queries of the same words answer the same while this is the same."""
        with self.lock:
            self._live(now)
            cached = self._live_cache
            assert cached is not None  # set by _live
            return cached[0], cached[1], cached[2]

    def query(self, words: Iterable[str], now: int) -> Candidates:
        """Return the live entries sharing at least one of ``words`` with their scores, and
        how many live entries share none."""
        with self.lock:
            wanted = set(words)
            for word in wanted.intersection(self.pending):
                self._merge(word)
            found = {word: self.postings[word] for word in wanted.intersection(self.postings)}
            found.update(self.frozen.get_many(wanted.difference(found)))
            live, live_count = self._live(now)
            # A word's postings hold a slot once: one small add per posting, no sort. np.add.at
            # with a one of the scores' own type adds in place, where ``counts[postings] += 1``
            # gathers, adds and scatters, and first copies int32 postings to int64 indices.
            kind = np.uint8 if len(found) < 256 else np.uint16
            counts = np.zeros(self.size, dtype=kind)
            one = _ONES[kind]
            dense: dict[str, np.ndarray] = {}
            for word, postings in found.items():
                marks = self._dense_marks(word, postings)
                if marks is None:
                    np.add.at(counts, postings, one)
                else:
                    counts[: marks.size] += marks
                    dense[word] = marks
            if found and live_count < self.size:  # dead or expired slots: their scores go
                np.multiply(counts, live, out=counts)
            candidate_count = int(np.count_nonzero(counts))
            return Candidates(
                self,
                counts,
                candidate_count,
                live_count - candidate_count,
                self.table.view(),
                self.table.key_order,
                self.line_size,
                found,
                dense,
            )

    def _slot_of(self, key: str, hint: int | None) -> int | None:
        """Return the live slot of ``key``, checking ``hint`` (where it was) before searching."""
        table = self.table
        if hint is not None and hint < table.count and table.alive[hint] and table[hint] == key:
            return hint  # a key has one live slot
        return table.slot_of(key)

    def confirm(
        self, keys: Iterable[str], rows: Mapping[str, Any], now: int, slots: Mapping[str, int] | None = None
    ) -> bool:
        """Check indexed ``keys`` against ``rows`` just read from the backend (objects with
        ``value`` and ``expires_at``; a missing key was deleted). Return whether every one is
        live and indexed as stored; correct the index for any that is not. ``slots`` says where
        keys were when queried, which saves searching for them."""
        fresh = True
        slots = slots or {}
        with self.lock:
            for key in keys:
                row = rows.get(key)
                if row is None or getattr(row, "raw_value", False):  # gone, or no longer readable
                    self.remove(key)
                    fresh = False
                elif (
                    self._put(key, row.value, row.expires_at, self._slot_of(key, slots.get(key)))
                    or row.expires_at is not None
                    and now >= row.expires_at
                ):
                    fresh = False
        return fresh

    def state(self, key: str) -> tuple[int, int | None] | None:
        """Return ``(fingerprint, expires_at)`` of an indexed key, or ``None``."""
        with self.lock:
            slot = self.table.slot_of(key)
            if slot is None:
                return None
            expires = int(self.expires[slot])
            return int(self.prints[slot]), None if expires == NEVER else expires

    def live_sizes(self, now: int) -> dict[str, int]:
        """Return the injection-line size of every live entry, in key order."""
        with self.lock:
            slots = self.table.live_slots()
            slots = slots[self._live(now)[0][slots]]
            keys = self.table.view()
            sizes = self.line_size[slots].tolist()
            return {keys[slot]: size for slot, size in zip(slots.tolist(), sizes, strict=True)}

    def without_words(
        self, words: Iterable[str], now: int, after: str | None, limit: int
    ) -> list[tuple[str, int, int | None]]:
        """Return up to ``limit`` live entries holding none of ``words`` (the ones a query of
        them scores 0), in key order after the key ``after``, as ``(key, line bytes, expires_at)``;
        the postings of ``words`` are read, never a value."""
        with self.lock:
            unmatched = self.live_mask(now)
            for word in set(words):
                postings = self.postings_of(word)
                if postings is not None:
                    unmatched[postings] = False
            slots = np.flatnonzero(unmatched)
            if after is not None:
                # The key order follows the keys: the first key past ``after`` bounds the rest.
                slots = slots[self.key_order[slots] > self.table.order_above(after)]
            if limit < slots.size:
                slots = slots[np.argpartition(self.key_order[slots], limit - 1)[:limit]]
            slots = slots[np.argsort(self.key_order[slots], kind="stable")]
            keys = self.table.view()
            return [
                (keys[slot], int(self.line_size[slot]), None if expires == NEVER else int(expires))
                for slot, expires in zip(slots.tolist(), self.expires[slots].tolist(), strict=True)
            ]

    def nbytes(self) -> int:
        """Return roughly how many bytes of arrays the index holds (postings and per-slot data)."""
        with self.lock:
            arrays = sum(postings.nbytes for postings in self.postings.values())
            arrays += sum(marks.nbytes for _, marks in self.dense.values())
            per_slot = (self.prints, self.expires, self.line_size)
            arrays += self.frozen.nbytes() + self.table.nbytes()
            return arrays + sum(column.nbytes for column in per_slot)
