"""Reading rows that another program wrote: a column our code cannot read becomes a reason, never
an error.

The three tables are shared with phpClaw and with operators' own SQL, so any column may hold
anything its type allows: text that is not JSON, JSON nested deeper than any page can walk, a
zero or out-of-range ``DATETIME``, an ``expires_at`` of ``'soon'`` (SQLite keeps what it is
given) or far past the calendar. The row mappers read every column through these functions:
what is readable is returned as usual, and what is not comes back as its raw text (or ``None``
for a time) with a short reason, so each page, export and command can show the row marked
unreadable instead of failing on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect

from clawmem.crypto.envelope import is_sealed
from clawmem.errors import Undecryptable
from clawmem.rules import problem_in

# Unix seconds that datetime can show: 0001-01-01 to 9999-12-31 23:59:59 UTC.
FIRST_SECOND = -62_135_596_800
LAST_SECOND = 253_402_300_799


class LenientDateTime(sa.types.TypeDecorator[datetime]):
    """``DATETIME`` (microseconds on MariaDB/MySQL) that reads a value the dialect cannot parse
    (SQLite text such as ``'soon'``, a number, bytes) as that raw value instead of failing the
    whole query; :func:`read_moment` then marks it. A raw value given back (a cursor that
    continues after such a row) is bound as it is."""

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(sa.DateTime())

    def bind_processor(self, dialect: Dialect) -> Any:
        inner = super().bind_processor(dialect)
        if inner is None:
            return None

        def process(value: Any) -> Any:
            return inner(value) if value is None or isinstance(value, date) else value

        return process

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        inner = super().result_processor(dialect, coltype)
        if inner is None:
            return None

        def process(value: Any) -> Any:
            try:
                return inner(value)
            except (ValueError, TypeError, OverflowError):
                return value

        return process


def as_text(value: Any) -> str | None:
    """Return a text column's value as ``str`` (``None`` stays): bytes SQLite kept as a BLOB are
    decoded with U+FFFD for bad bytes, and a number is written out."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


class Sealed(str):
    """A column's text in the envelope format (:mod:`clawmem.crypto`), read as it is stored: the
    log that owns the row opens it with the site's cipher. Being its own type, it is never
    mistaken for a JSON string value that happens to look like an envelope."""

    __slots__ = ()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"JSON text holds {name}, which JSON does not allow")


# Made once: json.loads with an option builds a decoder on every call, and a page reads
# every row's JSON columns.
_JSON = json.JSONDecoder(parse_constant=_refuse_constant)


def read_json(text: Any, column: str) -> tuple[Any, str | None]:
    """Return ``(value, None)`` for a readable JSON column (``None`` for NULL or empty), else
    ``(raw text, reason)``; sealed text comes back as :class:`Sealed`, for its owner to open."""
    raw = as_text(text)
    if not raw:
        return None, None
    if is_sealed(raw):
        return Sealed(raw), None
    try:
        value = _JSON.decode(raw)
    except (ValueError, RecursionError):
        return raw, f"{column} is not JSON"
    problem = problem_in(value, raw)
    return (raw, f"{column} {problem}") if problem else (value, None)


def read_value(decode: Callable[[str], Any], text: Any, column: str = "value") -> tuple[Any, str | None]:
    """Return ``(decode(text), None)`` for a readable value column, else ``(raw text, reason)``:
    ``decode`` raised ``ValueError`` (or ran out of stack), or what it gave cannot be shown
    safely (see :func:`problem_in`). A value that cannot be decrypted is ``(None, reason)``."""
    raw = as_text(text) or ""
    try:
        value = decode(raw)
    except Undecryptable as exc:  # a missing or wrong key, or altered text: said, never guessed at
        return None, f"{column} cannot be decrypted ({exc.reason})"  # never the ciphertext as a value
    except (ValueError, RecursionError):
        return raw, f"{column} cannot be decoded"
    problem = problem_in(value, raw)
    return (raw, f"{column} {problem}") if problem else (value, None)


def read_moment(value: Any, column: str) -> tuple[datetime | None, str | None]:
    """Return ``(naive UTC datetime, None)`` for a readable time column, ``(None, None)`` for
    NULL, else ``(None, reason)`` (a zero date, text such as ``'soon'``, a time past 9999)."""
    if value is None:
        return None, None
    if isinstance(value, datetime):
        return (value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)), None
    return None, f"{column} is not a readable time"


def raw_moment(value: Any) -> Any:
    """Return a time column's value as read when it is not a readable time (what a cursor must
    carry to continue after the row), else ``None``."""
    return None if value is None or isinstance(value, datetime) else value


def read_expiry(value: Any) -> tuple[int | None, str | None]:
    """Return ``(Unix seconds, None)`` for a readable ``expires_at`` (``None`` never expires),
    else ``(None, reason)``: a value that is not a whole number, or one past the calendar."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            return None, "expires_at is not a whole number of seconds"
    if not FIRST_SECOND <= value <= LAST_SECOND:
        return value, "expires_at is beyond the calendar"
    return value, None


def unix_to_datetime(seconds: int | None) -> datetime | None:
    """Return Unix ``seconds`` as a naive UTC datetime, or ``None`` (none given, or past the
    calendar)."""
    if seconds is None or not FIRST_SECOND <= seconds <= LAST_SECOND:
        return None
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def reasons(*found: str | None) -> str | None:
    """Return the reasons a row is unreadable joined with ``"; "``, or ``None`` when it has none."""
    if not any(found):  # the usual row: every column readable, said without building a string
        return None
    return "; ".join(reason for reason in found if reason)
