"""Keyset pagination: pages of rows and the opaque cursors that continue them."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.errors import InvalidCursor

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; ``next_cursor`` is ``None`` on the last page."""

    items: list[T]
    next_cursor: str | None


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


def decode_time_cursor(cursor: str, dialect: str = "") -> tuple[Any, str]:
    """Return the ``(created_at, id)`` in a cursor of a time-ordered listing on ``dialect``:
    a datetime, or the raw value :func:`moment_key` carried.

    Raises :class:`InvalidCursor` if it is malformed or its time is neither.
    """
    created, row_id = decode_cursor(cursor, 2)
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
        raw = json.loads(text[len(_RAW):])
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


def page_of(rows: Sequence[T], limit: int, key: Any) -> Page[T]:
    """Return the first ``limit`` of ``rows`` (fetched as ``limit + 1``) with the cursor after them.

    ``key(row)`` gives the row's sort-key values.
    """
    items = list(rows[:limit])
    more = len(rows) > limit
    return Page(items, encode_cursor(key(items[-1])) if more and items else None)


def check_limit(limit: object, maximum: int = 500) -> int:
    """Return ``limit`` if it is an int in 1..maximum, else raise ``ValueError``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValueError(f"limit must be an int from 1 to {maximum}, got {limit!r}")
    return limit


def after(columns: Sequence[Any], values: Sequence[Any], descending: bool = False) -> sa.ColumnElement[bool]:
    """Return the keyset condition "rows after ``values``" for an ORDER BY over two ``columns``."""
    (first, second), (first_value, second_value) = columns, values
    if descending:
        return sa.or_(first < first_value, sa.and_(first == first_value, second < second_value))
    return sa.or_(first > first_value, sa.and_(first == first_value, second > second_value))


def sorted_rows(
    conn: Connection,
    select: sa.Select[Any],
    columns: Sequence[Any],
    limit: int,
    start: Sequence[Any] | None = None,
    *,
    descending: bool = False,
    nullable: bool = False,
) -> list[Any]:
    """Return up to ``limit`` rows of ``select`` ordered by the two ``columns`` (a sort column
    and a unique tiebreak, both descending if asked), after the row whose values are ``start``.

    When the sort column is ``nullable`` its NULLs come last on every backend, in tiebreak
    order: a second query reads them, so that each query follows one index.
    """
    column, tiebreak = columns
    order = [column.desc(), tiebreak.desc()] if descending else [column, tiebreak]
    if not nullable:
        if start is not None:
            select = select.where(after(columns, start, descending))
        return list(conn.execute(select.order_by(*order).limit(limit)))
    rows: list[Any] = []
    if start is None or start[0] is not None:
        present = select.where(column.is_not(None))
        if start is not None:
            present = present.where(after(columns, start, descending))
        rows = list(conn.execute(present.order_by(*order).limit(limit)))
    if len(rows) < limit:
        missing = select.where(column.is_(None))
        if start is not None and start[0] is None:
            missing = missing.where(tiebreak < start[1] if descending else tiebreak > start[1])
        rows += conn.execute(missing.order_by(order[1]).limit(limit - len(rows)))
    return rows


def keyset_pages(
    engine: Engine,
    select: sa.Select[Any],
    columns: Sequence[Any],
    page_size: int,
    load: Callable[[Connection, list[Any]], Any] | None = None,
) -> Iterator[Any]:
    """Yield every row of ``select`` ordered by the two ``columns``, one page of ``page_size`` rows
    per connection: each page as a list of rows, or as ``load(conn, rows)`` run on that page's
    connection. Memory use is bounded by one page, not by the whole result."""
    last: list[Any] | None = None
    while True:
        page_select = select if last is None else select.where(after(columns, last))
        with engine.connect() as conn:
            rows = conn.execute(page_select.order_by(*columns).limit(page_size)).all()
            page = rows if load is None else load(conn, rows)
        yield page
        if len(rows) < page_size:
            return
        last = [rows[-1]._mapping[column] for column in columns]
