"""CSV and JSON downloads of a filtered list, streamed a page at a time and capped.

A download holds the rows the list shows under the same filters and order, at most
:data:`DOWNLOAD_LIMIT` of them (the page beside the links says so, and the JSON says whether
rows were left out). CSV cells are made safe to open in a spreadsheet: a text cell that starts
with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'``, so customer
text is never run as a formula.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from flask import Response, stream_with_context

DOWNLOAD_LIMIT = 10_000
DOWNLOAD_FORMATS = ("csv", "json")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def moment_text(value: Any) -> str | None:
    """Return a stored time as ``YYYY-MM-DD HH:MM:SS`` text, ``None`` for none (or no time)."""
    return value.isoformat(sep=" ", timespec="seconds") if hasattr(value, "isoformat") else None


def spreadsheet_safe(cell: Any) -> Any:
    """Return ``cell`` as a spreadsheet should read it: text that a spreadsheet would take for a
    formula gets a leading ``'``; numbers and empty cells are left as they are."""
    if isinstance(cell, str) and cell.startswith(FORMULA_STARTS):
        return "'" + cell
    return cell


def capped(
    rows: Iterable[dict[str, Any]], limit: int = DOWNLOAD_LIMIT
) -> Iterator[tuple[dict[str, Any], bool]]:
    """Yield each of the first ``limit`` rows with whether more rows followed it (true only on
    the last one yielded when the cap cut the list)."""
    iterator = iter(rows)
    for count, row in enumerate(iterator, start=1):
        if count == limit:
            yield row, next(iterator, None) is not None
            return
        yield row, False


def _csv_lines(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(cells: Sequence[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(cells)
        return buffer.getvalue()

    yield line(columns)
    for row, _ in capped(rows):
        yield line([spreadsheet_safe("" if row[name] is None else row[name]) for name in columns])


def _json_chunks(
    columns: Sequence[str], rows: Iterable[dict[str, Any]], about: dict[str, Any]
) -> Iterator[str]:
    yield json.dumps({**about, "limit": DOWNLOAD_LIMIT})[:-1] + ', "rows": ['
    truncated = False
    for number, (row, more) in enumerate(capped(rows)):
        yield ("," if number else "") + json.dumps({name: row[name] for name in columns}, ensure_ascii=False)
        truncated = more
    yield f'], "truncated": {json.dumps(truncated)}}}'


def download(
    format: str,
    filename: str,
    columns: Sequence[str],
    rows: Callable[[], Iterable[dict[str, Any]]],
    about: dict[str, Any],
) -> Response:
    """Return a streamed attachment ``filename.csv`` or ``filename.json`` of ``rows()``, at most
    :data:`DOWNLOAD_LIMIT` of them, with the ``columns`` named (JSON: an object with ``about``,
    the limit, the rows and whether the cap left rows out)."""
    if format == "csv":
        body = _csv_lines(columns, rows())
        mimetype = "text/csv"
    else:
        body = _json_chunks(columns, rows(), about)
        mimetype = "application/json"
    response = Response(stream_with_context(body), mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}.{format}"'
    return response
