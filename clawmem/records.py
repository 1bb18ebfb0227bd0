"""Row records: what a stored entry, a namespace's counts, a search hit and a change feed's batch
look like. The ground floor: memory/, sql/ and recall/ all stand on it, and it imports nothing of
theirs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class MemoryRow:
    """One stored entry as an operator sees it, expired or not.

    ``created_at``, ``updated_at`` and ``metadata`` are ``None`` on drivers that keep none.
    ``unreadable`` says which columns could not be read (a row another program wrote): then
    ``metadata`` holds the column's raw text, or a time is ``None``, and when the value could
    not be decoded ``raw_value`` is true and ``value`` is the column's raw text (never recalled).
    """

    namespace: str
    key: str
    value: Any
    expires_at: int | None
    bytes: int
    metadata: Any = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    unreadable: str | None = None
    raw_value: bool = False
    # An unreadable time as it was stored, so that a listing sorted by it continues after the row.
    raw_updated_at: Any = field(default=None, repr=False, compare=False)
    raw_expires_at: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class NamespaceCount:
    """Entries of one namespace: all of them, the live ones, the expired-but-unswept ones, and
    ``expiring``: the live ones that carry an expiry (``live - expiring`` never expire).
    ``unreadable`` says why a namespace could not be read at all (a namespace file that is no
    JSON object), and then every count is 0."""

    namespace: str
    total: int
    live: int
    expired: int
    expiring: int
    unreadable: str | None = None


@dataclass(frozen=True)
class MemoryHit:
    """One search result: the entry and its overlap score."""

    key: str
    value: Any
    namespace: str
    score: int


# One entry as a change feed carries it: (key, value, expires_at).
FedEntry = tuple[str, Any, "int | None"]


@dataclass(frozen=True)
class Changes:
    """One batch of a namespace's change feed (a driver's ``changes(namespace, cursor)``).

    Applied in this order to a copy of the namespace, it makes the copy equal a full read of
    the recallable entries (expired-but-unswept ones included, rows whose value cannot be
    decoded left out): with ``reset`` empty the copy first; with ``swept_at`` drop every entry
    that expires at or before it (a sweep); then store ``entries`` and remove ``gone``. Pass
    ``cursor`` to the next call, with the keys the copy then holds as ``held`` if the copy can
    say (with every call, or with none).
    """

    cursor: Any
    entries: list[FedEntry] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    reset: bool = False
    swept_at: int | None = None

    @property
    def empty(self) -> bool:
        """Return whether the batch changes nothing."""
        return not (self.entries or self.gone or self.reset or self.swept_at is not None)
