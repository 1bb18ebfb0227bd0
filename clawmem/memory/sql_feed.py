"""The change feed of the key/value table: what changed in a namespace since a cursor, whoever
wrote it (another worker, the CLI, another program with plain SQL).

On PostgreSQL each row's ``xmin`` names the transaction that wrote it, so one pass over the
namespace counts its rows and names those written since the cursor's snapshot
(:func:`clawmem.sql.kv.versions_since`): only those are read, whatever their ``updated_at``.

Elsewhere a call reads the key, stamp and version (see :func:`clawmem.sql.kv.row_version`) of
the rows stamped since the newest ``updated_at`` the cursor saw (less :data:`REINDEX_OVERLAP`),
reads the values of only those that changed, and compares the namespace's row count with the
keys the copy holds, reading every key again only when rows went missing. The copy says which
keys it holds (``held``, the recall index); a caller whose copy cannot say has the cursor keep a
set of them.

Where the table's change log is in place (:mod:`clawmem.sql.changes`, kept by triggers), a call
instead reads the log's rows since the cursor and then only the keys they name: no count, no
window, whoever wrote (a whole namespace stamped by one ``UPDATE`` is read once, then each row
another program changes costs one key). The log's numbers are not commit order, so the cursor
also keeps the numbers below the newest it read that it has not seen (:class:`LogCursor`), and
reads them again until each has come or is known never to come. Triggers dropped by hand are
noticed at the next call, which reads the namespace again and counts from then on.

Deletions this process made are told to the cursor directly (:class:`LocalDeletions`), so they
never look missing.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from clawmem.codecs import UndecodableValue, warn_unreadable
from clawmem.crypto.stored import StoredValues
from clawmem.records import Changes, FedEntry
from clawmem.sql import changes, kv
from clawmem.sql.lenient import as_text, read_expiry, read_value

# Rows whose updated_at is this much older than the newest one the cursor has seen are still
# read again on each call: a writer's clock may lag, and a long transaction may commit a stamp
# from before others that committed first. A change stamped further back than this is only
# found when the namespace's row count says something is missing.
REINDEX_OVERLAP = timedelta(minutes=5)
_LOCAL_LOG_LENGTH = 4096  # deletions kept per namespace before the log starts again
# MariaDB: a number of the change log that is no row, not even a locked one, is taken for one
# that will never come (a rolled-back write) only once it has been missing this long: a writer
# takes its number a moment before its row exists, in the same statement.
GAP_GRACE = 1.0  # seconds
# Keys read in one statement: PostgreSQL takes at most 65,535 parameters, SQLite 32,766.
KEYS_PER_READ = 1000
# While recall counts, how often a feed looks whether the change log has been added since.
LOG_LOOK_AGAIN = 60.0  # seconds


@dataclass(eq=False)
class LogCursor:
    """How far a feed has read the change log: every number up to ``seen`` has been read but
    those of ``pending`` (number -> when first missed: PostgreSQL's next transaction id then,
    elsewhere a monotonic time), which may still come; ``floor``, until settled, says the same
    of every number below it (those the log no longer held when the feed began)."""

    seen: int = 0
    pending: dict[int, Any] = field(default_factory=dict)
    floor: tuple[int, Any] | None = None


@dataclass(eq=False)
class SqlCursor:
    """What a feed had seen of a namespace's rows when it last answered."""

    newest: datetime | None = None
    # The readable keys the copy holds, or None when the copy says (``held``, see SqlFeed): a
    # set of every key costs about 300 bytes an entry, twice what the copy's index costs.
    known: set[str] | None = field(default_factory=set)
    unreadable: set[str] = field(default_factory=set)  # keys stored but not decodable
    # SQLite's data_version or PostgreSQL's snapshot: while it is the same, nothing has been
    # committed since, and nothing needs reading.
    marker: Any = None
    # What was seen of each row stamped within REINDEX_OVERLAP of the newest: a changed row
    # there shows a different mark, and only those are read again.
    window: dict[str, int] = field(default_factory=dict)
    # MariaDB: the window's bounds and digest (see clawmem.sql.kv.window_digest) when last probed.
    digest: tuple[Any, Any] = (None, None)
    local: tuple[int, int] = (0, 0)  # (generation, position) in this process's deletion log
    written: tuple[int, int] = (0, 0)  # SQLite: the same in the reading line's log of writes
    broken: bool = False  # a call failed half-way: the next one starts again from a full read
    # SQLite: the whole table's rows when last counted (see _count), None before.
    table_rows: int | None = None
    log: LogCursor | None = None  # while the change log is followed
    log_checked: float = float("-inf")  # when the log's triggers were last looked for (monotonic)


class LocalDeletions:
    """The keys this process deleted, per namespace (``None`` for a flush), in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, tuple[int, list[str | None]]] = {}
        self._generation = 0

    def add(self, namespace: str, key: str | None) -> None:
        with self._lock:
            log = self._logs.get(namespace)
            if log is None or len(log[1]) >= _LOCAL_LOG_LENGTH:
                self._generation += 1
                log = self._logs[namespace] = (self._generation, [])
            log[1].append(key)

    def restart(self, namespace: str) -> None:
        """Start the namespace's log again: a change it cannot list happened (a sweep)."""
        with self._lock:
            self._generation += 1
            self._logs[namespace] = (self._generation, [])

    def position(self, namespace: str) -> tuple[int, int]:
        with self._lock:
            generation, keys = self._logs.get(namespace, (0, []))
            return generation, len(keys)

    def since(self, namespace: str, position: tuple[int, int]) -> list[str | None] | None:
        """Return the deletions after ``position``, or ``None`` when the log started again since."""
        with self._lock:
            generation, keys = self._logs.get(namespace, (0, []))
            if generation != position[0]:
                return None
            return list(keys[position[1] :])


# SQLite: per reading line, the keys this process wrote or deleted through it (None: the whole
# namespace), which PRAGMA data_version does not count (see clawmem.sql.engine.ReadingLine).
_WRITTEN: weakref.WeakKeyDictionary[Any, LocalDeletions] = weakref.WeakKeyDictionary()
_WRITTEN_LOCK = threading.Lock()


def written_log(line: Any) -> LocalDeletions:
    """Return the log of the writes made through the SQLite reading line ``line``."""
    with _WRITTEN_LOCK:
        log = _WRITTEN.get(line)
        if log is None:
            log = _WRITTEN[line] = LocalDeletions()
        return log


def _marks(probe: list[tuple[Any, Any, Any, Any]]) -> dict[str, int]:
    """Return, per key of :func:`clawmem.sql.kv.index_probe`'s rows, what tells two states of
    the row apart: a hash of its stamp, expiry and version as stored."""
    return {as_text(key): hash((stamp, expires, version)) for key, stamp, expires, version in probe}


class _Copy(Collection[str]):
    """The readable keys a copy holds as of this call: ``held`` (the copy as of the last batch)
    with the changes this call found so far."""

    def __init__(self, held: Collection[str], changed: dict[str, FedEntry | None]) -> None:
        self._held, self._changed = held, changed

    def __contains__(self, key: object) -> bool:
        if key in self._changed:
            return self._changed[key] is not None  # type: ignore[index]
        return key in self._held

    def __len__(self) -> int:
        count = len(self._held)
        for key, entry in self._changed.items():
            if entry is None and key in self._held:
                count -= 1
            elif entry is not None and key not in self._held:
                count += 1
        return count

    def __iter__(self) -> Iterator[str]:
        changed = self._changed
        yield from (key for key in self._held if key not in changed)
        yield from (key for key, entry in list(changed.items()) if entry is not None)


class SqlFeed:
    """One call of the feed of ``namespace`` on ``conn``: :meth:`load` or :meth:`catch_up`
    fill :attr:`changed` (key -> entry, or ``None`` for a key no longer recallable)."""

    def __init__(
        self,
        conn: Any,
        prefix: str,
        shape: str,
        namespace: str,
        values: StoredValues,
        held: Collection[str] | None = None,
    ) -> None:
        self.conn, self.prefix, self.shape = conn, prefix, shape
        # How the driver's values are stored: every row this feed reads is opened with it.
        self.namespace, self.values = namespace, values
        self.held = held  # the keys of the copy the batch goes to, for a cursor without its own
        self.changed: dict[str, FedEntry | None] = {}

    def _known(self, cursor: SqlCursor) -> Collection[str]:
        """Return the readable keys the copy holds, with what this call found so far."""
        if cursor.known is not None:
            return cursor.known
        return _Copy(self.held or (), self.changed)

    def _hold(self, cursor: SqlCursor, key: str) -> None:
        cursor.unreadable.discard(key)
        if cursor.known is not None:
            cursor.known.add(key)

    def _drop(self, cursor: SqlCursor, key: str) -> None:
        cursor.unreadable.discard(key)
        if cursor.known is not None:
            cursor.known.discard(key)

    def _decoded(self, cursor: SqlCursor, rows: Iterable[Any]) -> list[FedEntry]:
        entries = []
        for key, text, expires_at, updated_at in rows:
            if isinstance(updated_at, datetime) and (cursor.newest is None or updated_at > cursor.newest):
                cursor.newest = updated_at  # an unreadable stamp (another program's row) says nothing
            key = as_text(key)
            value, problem = read_value(lambda raw, key=key: self.values.read(self.namespace, key, raw), text)
            if problem is not None:
                if key not in cursor.unreadable:
                    warn_unreadable(self.namespace, key)
                cursor.unreadable.add(key)  # another program's row; recall cannot use it
                continue
            self._hold(cursor, key)
            # An expiry that is not a number (SQLite keeps 'soon') never compares as expired in SQL.
            entries.append((key, value, read_expiry(expires_at)[0]))
        return entries

    def load(self, cursor: SqlCursor) -> list[FedEntry]:
        """Return every recallable entry, and fill ``cursor`` as of this read."""
        if self._armed(cursor):
            cursor.log = self._start_log()  # before the rows: a change after it is in the log
        elif not self._by_version():
            # The window's marks are read before the values: a row changed in between shows a
            # different mark on the next call and is read again, never the other way round.
            newest = kv.newest_stamp(self.conn, self.prefix, self.namespace, self.shape)
            since = newest - REINDEX_OVERLAP if isinstance(newest, datetime) else None
            probe = kv.index_probe(self.conn, self.prefix, self.namespace, since, self.shape)
            cursor.window = _marks(probe)
        return self._decoded(cursor, kv.index_rows(self.conn, self.prefix, self.namespace, None, self.shape))

    def _by_version(self) -> bool:
        # PostgreSQL: rows are found by the transaction that wrote them, not by their stamp.
        return self.conn.dialect.name == "postgresql"

    def batch(self, cursor: SqlCursor) -> Changes:
        """Return what this call found as one batch of the feed."""
        entries = [entry for entry in self.changed.values() if entry is not None]
        gone = [key for key, entry in self.changed.items() if entry is None]
        return Changes(cursor, entries, gone)

    def apply_own(self, cursor: SqlCursor, logged: list[str | None]) -> None:
        """Read again the keys this process wrote (``None``: it flushed the namespace) when no
        other connection committed since ``cursor``: nothing else can have changed."""
        if None in logged:
            self.forget_local(cursor, [None])
        self._read_keys(cursor, sorted({key for key in logged if key is not None}))

    def forget_local(self, cursor: SqlCursor, deletions: list[str | None]) -> None:
        """Tell the cursor of the deletions this process made since it last answered."""
        for key in deletions:
            keys = [*self._known(cursor), *cursor.unreadable] if key is None else [key]
            for gone in keys:
                self._drop(cursor, gone)
                self.changed[gone] = None

    def catch_up(self, cursor: SqlCursor, marker: Any = None) -> None:
        """Bring ``cursor`` from its marker to ``marker`` (read before this call): read the rows
        written since, and compare the row count to find rows deleted elsewhere.

        With the change log, the keys it names since the cursor. Without: on PostgreSQL the rows
        written since are those of transactions that committed between the two snapshots;
        elsewhere, the rows stamped within the overlap of the newest seen whose marks differ
        (and, through the row count, rows stamped far back)."""
        # Followed, the log's triggers are checked with each read of it; counted, a log added
        # since is looked for once in a while.
        if cursor.log is not None:
            if self._follow_log(cursor, marker):
                return
            cursor.log = None  # the triggers went: what changed since cannot be told
            self._read_all(cursor)
            return
        if time.monotonic() - cursor.log_checked >= LOG_LOOK_AGAIN and self._armed(cursor):
            # the log is new: follow it from now, after catching up by counting
            cursor.log = self._start_log()
        if self._by_version() and isinstance(cursor.marker, str) and isinstance(marker, str):
            count, written = kv.versions_since(
                self.conn, self.prefix, self.namespace, kv.written_after(cursor.marker, marker), self.shape
            )
            if written:
                self._read_keys(cursor, sorted(written))
            self._reconcile(cursor, count)
            return
        since = None if cursor.newest is None else cursor.newest - REINDEX_OVERLAP
        # Read before the marks: a row changed after it makes the next digest differ.
        found = kv.window_digest(self.conn, self.prefix, self.namespace, since, self.shape)
        digest = (since, None if found is None else found[0])
        if digest[1] is None or digest != cursor.digest:
            self._probe_window(cursor, since)
            cursor.digest = digest
        if found is None:
            self._reconcile(cursor, self._count(cursor))
        else:  # MariaDB counted the namespace with the digest, in the same statement
            self._reconcile(cursor, found[1])

    # -- the change log ------------------------------------------------------------------------

    def _armed(self, cursor: SqlCursor) -> bool:
        cursor.log_checked = time.monotonic()
        return changes.armed(self.conn, self.prefix)

    def _note(self) -> Any:
        """Return what a number missed now is noted with (see :class:`LogCursor`)."""
        if self.conn.dialect.name == "postgresql":
            return kv.parse_snapshot(kv.commit_marker(self.conn) or "0:0:")[1]
        return time.monotonic()

    def _start_log(self) -> LogCursor:
        """Return a log cursor as of now: the numbers the log holds are taken as read (the
        caller reads the namespace after this), the missing ones between them as pending."""
        low, high, rows = changes.bounds(self.conn, self.prefix)
        if self.conn.dialect.name == "sqlite":  # one writer at a time: numbers in commit order
            return LogCursor(seen=high)
        note = self._note()  # after the bounds: a writer that took a missing number had begun
        missing = {}
        if rows and high - low + 1 != rows:
            held = changes.seqs_between(self.conn, self.prefix, low, high)
            missing = {seq: note for seq in range(low, high + 1) if seq not in held}
        return LogCursor(seen=high, pending=missing, floor=(low if rows else high + 1, note))

    def _follow_log(self, cursor: SqlCursor, marker: Any) -> bool:
        """Read the log since ``cursor`` and the keys it names; return ``False``, reading
        nothing more, when its triggers are no longer all in place."""
        log = cursor.log
        assert log is not None
        floor = log.floor[0] if log.floor else None
        armed, found = changes.read(self.conn, self.prefix, log.seen, sorted(log.pending), floor)
        if not armed:
            return False
        keys: set[str] = set()
        came: set[int] = set()
        trimmed = False
        lowest_open = min([*log.pending, log.seen + 1, *([floor] if floor is not None else [])])
        top = log.seen
        for change in found:
            if (
                change.seq <= log.seen
                and change.seq not in log.pending
                and (floor is None or change.seq >= floor)
            ):
                continue  # read before (a range read of many pending numbers brings these too)
            came.add(change.seq)
            top = max(top, change.seq)
            if change.through is not None:
                trimmed = trimmed or change.through >= lowest_open
            elif change.namespace == self.namespace and change.key is not None:
                keys.add(as_text(change.key))
        if trimmed:  # rows this cursor had not read were trimmed: read the namespace again
            cursor.log = self._start_log()
            self._read_all(cursor)
            return True
        for seq in came:
            log.pending.pop(seq, None)
        missed = [seq for seq in range(log.seen + 1, top) if seq not in came]
        log.seen = top
        if missed and self.conn.dialect.name != "sqlite":
            note = self._note()
            log.pending.update(dict.fromkeys(missed, note))
        self._settle(log, marker, came)
        if keys:
            self._read_keys(cursor, sorted(keys))
        return True

    def _settle(self, log: LogCursor, marker: Any, came: set[int]) -> None:
        """Forget the pending numbers that can no longer come, given what this call read
        (``came``) after ``marker``."""
        if not log.pending and log.floor is None:
            return
        dialect = self.conn.dialect.name
        if dialect == "sqlite":
            log.pending.clear()
            log.floor = None
        elif dialect == "postgresql":
            # Every transaction below the xmin of the snapshot taken before this call read has
            # ended; a number missed at next id X was taken by a transaction below X, so once
            # that xmin reaches X its row was read now or never will be.
            oldest = kv.parse_snapshot(marker)[0] if isinstance(marker, str) else 0
            log.pending = {seq: note for seq, note in log.pending.items() if note > oldest}
            if log.floor is not None and log.floor[1] <= oldest:
                log.floor = None
        else:
            now = time.monotonic()
            old = [seq for seq, note in log.pending.items() if now - note >= GAP_GRACE]
            floor = log.floor[0] if log.floor is not None and now - log.floor[1] >= GAP_GRACE else None
            if not old and floor is None:
                return
            rows = changes.in_flight(self.conn, self.prefix, old, floor)
            if rows is None:  # one is still being written: all wait for the next call
                return
            for seq in old:
                if seq not in rows:  # no row at all: rolled back
                    del log.pending[seq]
            # Rows below the floor that committed after this call read come at the next one.
            if floor is not None and {seq for seq in rows if seq < floor} <= came:
                log.floor = None

    def _read_all(self, cursor: SqlCursor) -> None:
        """Read every key of the namespace again, and the window's marks for counting after."""
        present = kv.namespace_keys(self.conn, self.prefix, self.namespace, self.shape)
        for key in (set(self._known(cursor)) | cursor.unreadable) - present:
            self._drop(cursor, key)
            self.changed[key] = None
        self._read_keys(cursor, sorted(present))
        if not self._by_version():
            newest = kv.newest_stamp(self.conn, self.prefix, self.namespace, self.shape)
            since = newest - REINDEX_OVERLAP if isinstance(newest, datetime) else None
            cursor.window = _marks(kv.index_probe(self.conn, self.prefix, self.namespace, since, self.shape))
            cursor.newest = newest if isinstance(newest, datetime) else cursor.newest
            cursor.digest = (None, None)

    def _count(self, cursor: SqlCursor) -> int:
        """Return how many rows the namespace holds. On SQLite, while the namespace held at
        least half the table when last counted (or before the first count), as the table's count
        less the other namespaces' rows, which costs less there (see
        :func:`clawmem.sql.kv.count_by_the_rest`)."""
        conn, prefix, namespace, shape = self.conn, self.prefix, self.namespace, self.shape
        held = len(self._known(cursor)) + len(cursor.unreadable)
        if conn.dialect.name == "sqlite" and (cursor.table_rows is None or held * 2 >= cursor.table_rows):
            count, cursor.table_rows = kv.count_by_the_rest(conn, prefix, namespace, shape)
            return count
        return kv.count_namespace(conn, prefix, namespace, shape)

    def _reconcile(self, cursor: SqlCursor, count: int) -> None:
        """Compare the namespace's row ``count`` with the keys ``cursor`` knows, and read every
        key only when they differ."""
        if count == len(self._known(cursor)) + len(cursor.unreadable):
            return
        # Rows went missing (deleted elsewhere) or came with an old stamp: compare every key.
        present = kv.namespace_keys(self.conn, self.prefix, self.namespace, self.shape)
        known = set(self._known(cursor))  # for this comparison only
        for key in (known | cursor.unreadable) - present:
            self._drop(cursor, key)
            self.changed[key] = None
        self._read_keys(cursor, sorted(present - known - cursor.unreadable))

    def _probe_window(self, cursor: SqlCursor, since: datetime | None) -> None:
        probe = kv.index_probe(self.conn, self.prefix, self.namespace, since, self.shape)
        window = _marks(probe)
        changed = [key for key, mark in window.items() if cursor.window.get(key) != mark]
        if changed:
            self._read_keys(cursor, changed)
        # Only once read: marks of rows that fell out of the window go with it.
        cursor.window = window
        # A row whose mark is the same had its stamp seen when it was first read.
        moved = set(changed)
        stamps = [kv.read_stamp(self.conn, stamp) for key, stamp, _, _ in probe if as_text(key) in moved]
        stamps = [stamp for stamp in stamps if isinstance(stamp, datetime)]
        if stamps and (cursor.newest is None or max(stamps) > cursor.newest):
            cursor.newest = max(stamps)

    def _read_keys(self, cursor: SqlCursor, keys: list[str]) -> None:
        """Read the stored rows of ``keys`` as they are now; those no longer stored are gone."""
        ordered = sorted(keys)
        for start in range(0, len(ordered), KEYS_PER_READ):
            self._read_some(cursor, ordered[start : start + KEYS_PER_READ])

    def _read_some(self, cursor: SqlCursor, keys: list[str]) -> None:
        unknown, prefix, namespace, shape = list(keys), self.prefix, self.namespace, self.shape
        while unknown:
            try:
                rows = kv.rows_of_keys(self.conn, prefix, namespace, unknown, shape, self.values)
            except UndecodableValue as exc:  # another program's row; recall cannot use it
                self._unreadable(cursor, exc.key)
                unknown.remove(exc.key)
                continue
            found = {row.key for row in rows}
            for row in rows:
                if row.raw_value:  # another program's row; recall cannot use it
                    self._unreadable(cursor, row.key)
                else:
                    self._hold(cursor, row.key)
                    self.changed[row.key] = (row.key, row.value, row.expires_at)
            for key in set(unknown) - found:
                self._drop(cursor, key)
                self.changed[key] = None
            break

    def _unreadable(self, cursor: SqlCursor, key: str) -> None:
        if key not in cursor.unreadable:
            warn_unreadable(self.namespace, key)
        self._drop(cursor, key)
        cursor.unreadable.add(key)
        self.changed[key] = None
