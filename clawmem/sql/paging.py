"""Keyset pagination in SQL: the conditions and queries that page rows by a cursor's values."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from clawmem.sql.engine import current


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
        with current(engine).connect() as conn:
            rows = conn.execute(page_select.order_by(*columns).limit(page_size)).all()
            page = rows if load is None else load(conn, rows)
        yield page
        if len(rows) < page_size:
            return
        last = [rows[-1]._mapping[column] for column in columns]
