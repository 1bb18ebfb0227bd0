"""KeyTable: the keys of a word index's slots, packed into a few arrays instead of Python objects.

A million keys held as ``str`` objects, a ``dict`` from key to slot and a sorted ``list`` cost
about 200 bytes an entry; packed they cost about 30: the UTF-8 bytes of every slot's key in one
``bytearray``, their end offsets, a key order (a float that sorts as the keys do, by code point),
whether each slot is alive, and the live slots sorted by key as they stood at the last rebuild.
Keys found by key are binary-searched there (UTF-8 byte order is code-point order). Keys added
since the rebuild, and keys whose slot moved, sit in a small dict and a sorted list until the
next rebuild (a compaction, a renumbering, or when they grow past a quarter of the table).

A table writes a slot's key and order once and never in place after that: a rebuild makes new
arrays, so a :class:`PackedKeys` view taken earlier still reads every slot it had.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

_MIN_ORDER_GAP = 1e-6  # closer neighbours than this and every key's order is numbered again
_RECENT_SHARE = 4  # keys outside the sorted base past a 1/4 of the table trigger a rebuild
_RECENT_FROM = 4096


def with_room(count: int) -> int:
    """Return the capacity of a per-slot array for ``count`` slots, with room for an eighth more:
    the first writes after a load (in a forked worker, say) fill untouched zero pages rather than
    copying every array."""
    return count + max(1024, count // 8)


class PackedKeys:
    """A read-only view of a table's keys by slot, as they were when the view was taken."""

    __slots__ = ("_blob", "_ends")

    def __init__(self, blob: bytearray, ends: np.ndarray) -> None:
        self._blob, self._ends = blob, ends

    def __getitem__(self, slot: int) -> str:
        return self.encoded(slot).decode("utf-8")

    def encoded(self, slot: int) -> bytes:
        """Return the UTF-8 bytes of the key of ``slot``."""
        ends = self._ends
        return bytes(self._blob[int(ends[slot]) : int(ends[slot + 1])])


class _ByKey:
    """The sorted base as a sequence of encoded keys, for :func:`bisect.bisect_left`."""

    __slots__ = ("_keys", "_sorted")

    def __init__(self, keys: PackedKeys, ordered: np.ndarray) -> None:
        self._keys, self._sorted = keys, ordered

    def __len__(self) -> int:
        return int(self._sorted.size)

    def __getitem__(self, position: int) -> bytes:
        return self._keys.encoded(int(self._sorted[position]))


class KeyTable:
    """Which key each slot holds, which slot holds each live key, and the keys' order."""

    def __init__(self) -> None:
        self.reset([])

    def reset(self, keys: Sequence[str]) -> None:
        """Hold ``keys`` (distinct) in slots ``0..len(keys)-1``, every one alive."""
        encoded = [key.encode("utf-8") for key in keys]
        count = len(encoded)
        self.count = count  # slots used, live or dead
        self.live = count
        self._blob = bytearray(b"".join(encoded))
        self._ends = np.zeros(with_room(count) + 1, dtype=np.int64)
        self._ends[1 : count + 1] = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=count))
        del encoded
        self.alive = np.zeros(self._ends.size - 1, dtype=bool)
        self.alive[:count] = True
        ordered = np.asarray(sorted(range(count), key=keys.__getitem__), dtype=np.int32)
        self.key_order = np.zeros(self.alive.size, dtype=np.float64)
        self.key_order[ordered] = np.arange(count, dtype=np.float64)
        self._base(ordered)

    def _base(self, ordered: np.ndarray) -> None:
        self._sorted = ordered  # live slots in key order, as of the rebuild
        self._moved: dict[str, int] = {}  # key -> its newest slot, when not its slot in the base
        self._recent: list[str] = []  # keys not in the base, sorted
        self._recent_order: dict[str, float] = {}

    def view(self) -> PackedKeys:
        """Return the keys by slot as they are now."""
        return PackedKeys(self._blob, self._ends)

    def __getitem__(self, slot: int) -> str:
        return self.encoded(slot).decode("utf-8")

    def encoded(self, slot: int) -> bytes:
        """Return the UTF-8 bytes of the key of ``slot``."""
        return bytes(self._blob[int(self._ends[slot]) : int(self._ends[slot + 1])])

    # -- finding --------------------------------------------------------------------------------

    def _in_base(self, encoded: bytes) -> tuple[int, bool]:
        """Return where ``encoded`` sits in the base, and whether it is there."""
        by_key = _ByKey(self.view(), self._sorted)
        position = bisect.bisect_left(by_key, encoded)
        return position, position < len(by_key) and by_key[position] == encoded

    def slot_of(self, key: str) -> int | None:
        """Return the live slot holding ``key``, or ``None``."""
        slot = self._moved.get(key)
        if slot is None:
            position, found = self._in_base(key.encode("utf-8"))
            if not found:
                return None
            slot = int(self._sorted[position])
        return slot if self.alive[slot] else None

    def _bounds(self, key: str) -> tuple[float | None, float | None, float | None]:
        """Return ``(order of key, order of the greatest key below, of the least above)`` among
        every key the table held since its rebuild, live or not (``None`` where there is none)."""
        position, found = self._in_base(key.encode("utf-8"))
        order = self.key_order
        if found:
            return float(order[self._sorted[position]]), None, None
        if key in self._recent_order:
            return self._recent_order[key], None, None
        below = float(order[self._sorted[position - 1]]) if position > 0 else None
        above = float(order[self._sorted[position]]) if position < self._sorted.size else None
        recent = bisect.bisect_left(self._recent, key)
        if recent > 0:
            candidate = self._recent_order[self._recent[recent - 1]]
            below = candidate if below is None else max(below, candidate)
        if recent < len(self._recent):
            candidate = self._recent_order[self._recent[recent]]
            above = candidate if above is None else min(above, candidate)
        return None, below, above

    def order_above(self, key: str) -> float:
        """Return a bound such that the live keys after ``key`` are exactly those whose key
        order exceeds it."""
        exact, below, _ = self._bounds(key)
        if exact is not None:
            return exact
        return -np.inf if below is None else below

    def live_slots(self) -> np.ndarray:
        """Return the live slots in key order."""
        slots = np.flatnonzero(self.alive[: self.count])
        return slots[np.argsort(self.key_order[slots], kind="stable")]

    # -- writing --------------------------------------------------------------------------------

    def add(self, key: str, replaced: int | None) -> int:
        """Give ``key`` a new slot, after its old slot ``replaced`` (which dies), if any."""
        slot = self.count
        encoded = key.encode("utf-8")
        if slot + 1 >= self._ends.size:
            self._grow(slot + 2)
        self._blob += encoded
        self._ends[slot + 1] = self._ends[slot] + len(encoded)
        self.count += 1
        self.alive[slot] = True
        self._moved[key] = slot
        if replaced is not None:
            self.alive[replaced] = False
            self.key_order[slot] = self.key_order[replaced]
            return slot
        self.live += 1
        exact, below, above = self._bounds(key)
        if exact is not None:  # held before (since removed): its place is known
            self.key_order[slot] = exact
            return slot
        low = -1.0 if below is None else below
        high = low + 2.0 if above is None else above
        bisect.insort(self._recent, key)
        if high - low > _MIN_ORDER_GAP and len(self._recent) * _RECENT_SHARE < max(self.live, _RECENT_FROM):
            self._recent_order[key] = self.key_order[slot] = (low + high) / 2
        else:  # the gap is used up, or too many keys sit outside the base: number them again
            self.key_order[slot] = low
            self.renumber(after=slot)
        return slot

    def discard(self, key: str) -> int | None:
        """Drop ``key``; return the slot it held (now dead), or ``None`` if it held none."""
        slot = self.slot_of(key)
        if slot is not None:
            self.alive[slot] = False
            self.live -= 1
        return slot

    def renumber(self, after: int | None = None) -> None:
        """Number the live keys' orders again, from 0, and make them the new base. Slot ``after``
        shares its key order with the key just before it, and sorts after it."""
        slots = np.flatnonzero(self.alive[: self.count])
        later = np.zeros(slots.size, dtype=np.int8)
        if after is not None:
            later[np.searchsorted(slots, after)] = 1
        ordered = slots[np.lexsort((later, self.key_order[slots]))].astype(np.int32)
        # Into a new array: the candidates of earlier queries still read the old one.
        key_order = self.key_order.copy()
        key_order[ordered] = np.arange(ordered.size, dtype=np.float64)
        self.key_order = key_order
        self._base(ordered)

    def compact(self) -> np.ndarray:
        """Drop the dead slots, numbering the live ones again in slot order; return the old slot
        of each new one."""
        kept = np.flatnonzero(self.alive[: self.count])
        ends = self._ends[: self.count + 1]
        lengths = np.diff(ends)
        packed = np.frombuffer(self._blob, dtype=np.uint8, count=int(ends[-1]))
        blob = bytearray(packed[np.repeat(self.alive[: self.count], lengths)].tobytes())
        del packed  # the old bytearray may not grow while a view of it is exported
        count = int(kept.size)
        self._blob = blob
        self._ends = np.zeros(with_room(count) + 1, dtype=np.int64)
        self._ends[1 : count + 1] = np.cumsum(lengths[kept])
        self.alive = np.zeros(self._ends.size - 1, dtype=bool)
        self.alive[:count] = True
        key_order = np.zeros(self.alive.size, dtype=np.float64)
        key_order[:count] = self.key_order[kept]
        self.key_order = key_order
        self.count = self.live = count
        self.renumber()
        return kept

    def _grow(self, needed: int) -> None:
        grown = max(needed, 2 * self._ends.size)
        ends = np.zeros(grown, dtype=np.int64)
        ends[: self._ends.size] = self._ends
        self._ends = ends
        alive = np.zeros(grown - 1, dtype=bool)
        alive[: self.alive.size] = self.alive
        self.alive = alive
        key_order = np.zeros(grown - 1, dtype=np.float64)
        key_order[: self.key_order.size] = self.key_order
        self.key_order = key_order

    def nbytes(self) -> int:
        """Return how many bytes the table's arrays hold."""
        return len(self._blob) + sum(
            column.nbytes for column in (self._ends, self.alive, self.key_order, self._sorted)
        )
