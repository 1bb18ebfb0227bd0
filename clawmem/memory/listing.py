"""The orders a namespace's entries can be listed in, and the keyset cursors that page them.

SQL drivers order in the database (:mod:`clawmem.sql.kv`); the others order their records here,
the same way, so a cursor means the same on every driver.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from clawmem.errors import InvalidCursor
from clawmem.sql.paging import decode_moment, decode_sorted_cursor, is_raw_key, moment_key


class Listed(Protocol):
    """What a listing orders an entry by (:class:`clawmem.memory.base.MemoryRow` has it all)."""

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
# expiry (soonest first, entries that never expire last). Ties are broken by key, in the
# sort's direction; a missing time sorts last. SQL serves each from an index (sql/kv.py).
SORTS = {"key": False, "updated": True, "expires": False}  # sort -> newest (largest) first
BIGGEST_EXPIRY = 2**63 - 1  # what a BIGINT column holds: a forged cursor beyond it is refused


def check_sort(sort: str) -> str:
    """Return ``sort`` if a namespace's keys can be listed by it (:data:`SORTS`), else raise
    ``ValueError``."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    return sort


def sort_value(row: Listed, sort: str) -> Any:
    """Return what ``row`` is ordered by under ``sort`` (``None`` sorts last)."""
    return {"key": row.key, "updated": row.updated_at, "expires": row.expires_at}[sort]


def cursor_key(row: Listed, sort: str) -> list[Any]:
    """Return the key of the cursor after ``row`` in a listing by ``sort``: ``[sort, its sort
    value as text (``None`` when missing; a time another program made unreadable as it was
    stored), key]``."""
    if sort == "updated" and (row.updated_at is not None or row.raw_updated_at is not None):
        return [sort, moment_key(row.updated_at, row.raw_updated_at), row.key]
    if sort == "expires" and row.raw_expires_at is not None:
        return [sort, moment_key(None, row.raw_expires_at), row.key]
    value = sort_value(row, sort)
    return [sort, None if value is None else str(value), row.key]


def sort_start(cursor: str, sort: str, dialect: str | None = None) -> tuple[Any, str]:
    """Return the ``(sort value, key)`` a listing by ``sort`` continues after. Only a SQL
    ``dialect`` takes a raw stored value back. Raises :class:`InvalidCursor` if ``cursor`` is
    malformed or was made for another sort."""
    text, key = decode_sorted_cursor(cursor, sort)
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


def sorted_page(rows: Sequence[Row], sort: str, start: tuple[Any, str] | None, limit: int) -> list[Row]:
    """Return up to ``limit`` of ``rows`` in ``sort`` order after ``start``, as SQL orders them."""
    descending = SORTS[sort]
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
