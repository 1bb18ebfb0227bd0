"""Pages and cursors: the ground floor every listing stands on, SQL or not.

A :class:`Page` is one page of a listing and its opaque cursor. The orders a namespace's entries
can be listed in (:data:`SORTS`) are defined here, so a cursor means the same on every driver:
SQL drivers order in the database (:mod:`clawmem.sql.kv`), the others order their records with
:func:`sorted_page`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from clawmem.errors import InvalidCursor

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; ``next_cursor`` is ``None`` on the last page. ``total`` is how
    many items the whole listing holds, when the listing was asked to count them (else ``None``)."""

    items: list[T]
    next_cursor: str | None
    total: int | None = None


def encode_cursor(values: Sequence[Any]) -> str:
    """Return an opaque, URL-safe cursor for the sort-key ``values`` of the last row shown."""
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode().rstrip("=")


def _cursor_values(cursor: str, size: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, TypeError):
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}") from None
    if not isinstance(values, list) or len(values) != size:
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    return values


def decode_cursor(cursor: str, size: int) -> list[Any]:
    """Return the ``size`` sort-key values in ``cursor``; raise :class:`InvalidCursor` if malformed."""
    values = _cursor_values(cursor, size)
    if not all(_bindable(v) for v in values):
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    return values


def decode_sorted_cursor(cursor: str, sort: str) -> tuple[str | None, str]:
    """Return the ``(value, tiebreak)`` of the cursor of a listing ordered by ``sort``, which
    :func:`page_of` made from the key ``[sort, value as text or None, unique tiebreak]``.

    Raises :class:`InvalidCursor` if it is malformed or was made for another sort.
    """
    made_for, value, tiebreak = _cursor_values(cursor, 3)
    if made_for != sort or not _bindable(tiebreak) or not (value is None or _bindable(value)):
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    return value, tiebreak


def _bindable(value: object) -> bool:
    # Text every database takes as a parameter: no NUL (PostgreSQL refuses it) and no lone
    # surrogate (no driver can encode one).
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# A time column's value that is not a readable time (another program's row) is carried in a
# cursor as it was read, so that a listing continues after the row exactly.
_RAW = "raw:"
# What PostgreSQL prints for the timestamps Python cannot hold; nothing else is bound raw there.
_POSTGRES_RAW = re.compile(r"-?infinity|[0-9]{4,}-[0-9]{2}-[0-9]{2} [0-9:.]+( BC)?")


def moment_key(moment: datetime | None, raw: Any = None) -> str:
    """Return a time column's value as a cursor holds it: ISO 8601 for a readable ``moment``,
    else ``raw:`` and the JSON of the ``raw`` value as read (bytes as ``{"blob": hex}``)."""
    if moment is not None:
        return moment.isoformat()
    return _RAW + json.dumps({"blob": bytes(raw).hex()} if isinstance(raw, (bytes, bytearray)) else raw)


def is_raw_key(text: str) -> bool:
    """Return whether ``text`` is a value :func:`moment_key` carried raw (not a readable time)."""
    return text.startswith(_RAW)


# The last value of the cursor of a time-ordered listing read newest first; one read oldest
# first has none, so neither continues the other.
NEWEST_FIRST = "newest"


def time_cursor_key(moment: datetime | None, raw: Any, row_id: str, descending: bool = False) -> list[Any]:
    """Return the key of the cursor after a row of a time-ordered listing: its time as
    :func:`moment_key` writes it and its id, and :data:`NEWEST_FIRST` when read newest first."""
    return [moment_key(moment, raw), row_id, *([NEWEST_FIRST] if descending else [])]


def decode_time_cursor(cursor: str, dialect: str = "", descending: bool = False) -> tuple[Any, str]:
    """Return the ``(created_at, id)`` in a cursor of a time-ordered listing on ``dialect``,
    oldest first unless ``descending``: a datetime, or the raw value :func:`moment_key` carried.

    Raises :class:`InvalidCursor` if it is malformed, its time is neither, or it was made for
    the other direction.
    """
    values = decode_cursor(cursor, 3 if descending else 2)
    if descending and values[2] != NEWEST_FIRST:
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    created, row_id = values[:2]
    return decode_moment(created, cursor, dialect), row_id


def decode_moment(text: str, cursor: str, dialect: str = "") -> Any:
    """Return the time :func:`moment_key` wrote as ``text`` in ``cursor``: a datetime, or the raw
    value it carried. Raises :class:`InvalidCursor` if it is neither."""
    invalid = InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    if not text.startswith(_RAW):
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            raise invalid from None
    try:
        raw = json.loads(text[len(_RAW) :])
    except ValueError:
        raise invalid from None
    if isinstance(raw, dict) and set(raw) == {"blob"} and isinstance(raw["blob"], str):
        try:
            raw = bytes.fromhex(raw["blob"])
        except ValueError:
            raise invalid from None
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float, bytes)):
        raise invalid
    if isinstance(raw, str) and not _bindable(raw):
        raise invalid
    if dialect == "postgresql" and not (isinstance(raw, str) and _POSTGRES_RAW.fullmatch(raw)):
        raise invalid
    return raw


def page_of(rows: Sequence[T], limit: int, key: Any, total: int | None = None) -> Page[T]:
    """Return the first ``limit`` of ``rows`` (fetched as ``limit + 1``) with the cursor after them
    (and ``total``, the listing's count, when it was counted).

    ``key(row)`` gives the row's sort-key values.
    """
    items = list(rows[:limit])
    more = len(rows) > limit
    return Page(items, encode_cursor(key(items[-1])) if more and items else None, total)


def check_limit(limit: object, maximum: int = 500) -> int:
    """Return ``limit`` if it is an int in 1..maximum, else raise ``ValueError``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValueError(f"limit must be an int from 1 to {maximum}, got {limit!r}")
    return limit


class Listed(Protocol):
    """What a listing orders an entry by (:class:`clawmem.records.MemoryRow` has it all)."""

    @property
    def key(self) -> str: ...
    @property
    def updated_at(self) -> datetime | None: ...
    @property
    def expires_at(self) -> int | None: ...
    @property
    def raw_updated_at(self) -> Any: ...
    @property
    def raw_expires_at(self) -> Any: ...


Row = TypeVar("Row", bound=Listed)

# How a namespace's keys can be listed: by key (A to Z), by last write (newest first) or by
# expiry (soonest first, entries that never expire last), each also the other way round
# (``descending``). Ties are broken by key, in the sort's direction; a missing time sorts last
# either way. SQL serves each from an index (sql/kv.py), read forwards or backwards.
SORTS = {"key": False, "updated": True, "expires": False}  # sort -> its own direction is largest first
BIGGEST_EXPIRY = 2**63 - 1  # what a BIGINT column holds: a forged cursor beyond it is refused


def is_descending(sort: str, descending: bool | None) -> bool:
    """Return whether a listing by ``sort`` runs largest first: ``descending`` when told, else
    the sort's own direction (:data:`SORTS`)."""
    return SORTS[sort] if descending is None else descending


def directed_name(sort: str, descending: bool | None, own_descending: bool) -> str:
    """Return the name a cursor of ``sort`` in that direction is made for: ``updated``, or
    ``updated:asc`` for the other way than its own (``own_descending``), so a cursor never
    continues another order."""
    if descending is None or descending == own_descending:
        return sort
    return f"{sort}:{'desc' if descending else 'asc'}"


def cursor_name(sort: str, descending: bool | None) -> str:
    """Return the name a cursor of a key list's ``sort`` in that direction is made for."""
    return directed_name(sort, descending, SORTS[sort])


def check_sort(sort: str) -> str:
    """Return ``sort`` if a namespace's keys can be listed by it (:data:`SORTS`), else raise
    ``ValueError``."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    return sort


def sort_value(row: Listed, sort: str) -> Any:
    """Return what ``row`` is ordered by under ``sort`` (``None`` sorts last)."""
    return {"key": row.key, "updated": row.updated_at, "expires": row.expires_at}[sort]


def cursor_key(row: Listed, sort: str, descending: bool | None = None) -> list[Any]:
    """Return the key of the cursor after ``row`` in a listing by ``sort`` in that direction:
    ``[its cursor_name, its sort value as text (``None`` when missing; a time another program
    made unreadable as it was stored), key]``."""
    name = cursor_name(sort, descending)
    if sort == "updated" and (row.updated_at is not None or row.raw_updated_at is not None):
        return [name, moment_key(row.updated_at, row.raw_updated_at), row.key]
    if sort == "expires" and row.raw_expires_at is not None:
        return [name, moment_key(None, row.raw_expires_at), row.key]
    value = sort_value(row, sort)
    return [name, None if value is None else str(value), row.key]


def sort_start(
    cursor: str, sort: str, dialect: str | None = None, descending: bool | None = None
) -> tuple[Any, str]:
    """Return the ``(sort value, key)`` a listing by ``sort`` in that direction continues after.
    Only a SQL ``dialect`` takes a raw stored value back. Raises :class:`InvalidCursor` if
    ``cursor`` is malformed or was made for another sort or direction."""
    text, key = decode_sorted_cursor(cursor, cursor_name(sort, descending))
    invalid = InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    if text is None or sort == "key":
        if sort == "key" and text != key:
            raise invalid
        return text, key
    if is_raw_key(text):
        if dialect is None:
            raise invalid
        return decode_moment(text, cursor, dialect), key
    if sort == "updated":
        moment = decode_moment(text, cursor)
        if not isinstance(moment, datetime):
            raise invalid
        return moment, key
    if not re.fullmatch(r"-?[0-9]{1,19}", text) or abs(int(text)) > BIGGEST_EXPIRY:
        raise invalid
    return int(text), key


def sorted_page(
    rows: Sequence[Row], sort: str, start: tuple[Any, str] | None, limit: int, descending: bool | None = None
) -> list[Row]:
    """Return up to ``limit`` of ``rows`` in ``sort`` order (in that direction) after ``start``,
    as SQL orders them."""
    descending = is_descending(sort, descending)
    present = sorted(
        (row for row in rows if sort_value(row, sort) is not None),
        key=lambda row: (sort_value(row, sort), row.key),
        reverse=descending,
    )
    missing = sorted(
        (row for row in rows if sort_value(row, sort) is None), key=lambda row: row.key, reverse=descending
    )
    ordered = present + missing
    if start is not None:
        ordered = [row for row in ordered if _comes_after(row, sort, start, descending)]
    return ordered[:limit]


def _comes_after(row: Listed, sort: str, start: tuple[Any, str], descending: bool) -> bool:
    value, (start_value, start_key) = sort_value(row, sort), start
    if start_value is None:
        return value is None and (row.key < start_key if descending else row.key > start_key)
    if value is None:
        return True
    here, there = (value, row.key), (start_value, start_key)
    return here < there if descending else here > there
