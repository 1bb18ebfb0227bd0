"""Time in recall: an entry's time, whether a message asks when, and the times it names.

An entry's time is the one its writer gave in metadata (``{"at": ISO-8601}``: when what it says
happened), else its ``updated_at``. A time given that does not parse is ignored for that entry,
with a warning naming the entry's key (never the value).

A message *names* a time when it writes a day ("8 May 2023", "May 8, 2023"), a month of a year
("July 2023"), a year ("in 2022"), a month alone ("in June": that month of any year), or one
relative to now ("yesterday", "last week", "this month"...): :func:`named_periods`. ``hybrid``
lifts the candidates whose time falls in one of them (:mod:`clawmem.recall.fusion`). A question
that asks when without naming a time ("When did Ann move?") weighs no time: on LoCoMo's dev
split its answer is the date of the entry that says what happened, so finding that entry is
what counts, and nothing about its time tells it from the others.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

log = logging.getLogger(__name__)

TIME_FIELD = "at"  # the metadata field a writer gives an entry's time in

# What a message asking when looks like: "when", "what year", "how long ago", "last week", ...
_ASKS_WHEN = re.compile(
    r"\b(?:when|what\s+(?:year|month|day|date|time)|which\s+(?:year|month|day|date)|how\s+long\s+ago"
    r"|(?:last|next|this)\s+(?:week|month|year|weekend|summer|winter|spring|fall|autumn)"
    r"|(?:a|one|two|few)\s+(?:days?|weeks?|months?|years?)\s+ago|yesterday|since\s+when)\b",
    re.IGNORECASE,
)


def asks_when(message: str) -> bool:
    """Return whether ``message`` asks when something happened."""
    return _ASKS_WHEN.search(message) is not None


def _seconds(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def entry_time(key: str, updated_at: datetime | None, metadata: Any) -> float | None:
    """Return the entry's time in seconds since the epoch (a time without an offset is UTC):
    ``metadata["at"]`` when it is an ISO-8601 time, else ``updated_at``, else ``None``. A
    ``metadata["at"]`` that does not parse is ignored, with a warning naming ``key``."""
    given = metadata.get(TIME_FIELD) if isinstance(metadata, Mapping) else None
    if given is not None:
        try:
            if not isinstance(given, str):
                raise ValueError
            return _seconds(datetime.fromisoformat(given))
        except ValueError:
            log.warning("entry %r: metadata %r is not an ISO-8601 time, ignored", key, TIME_FIELD)
    return _seconds(updated_at) if updated_at is not None else None


DAY = 86_400
_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_MONTH = "|".join(_MONTHS)
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH}),?\s+(\d{{4}})\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b({_MONTH})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.IGNORECASE)
_MONTH_YEAR = re.compile(rf"\b({_MONTH}),?\s+(?:of\s+)?(\d{{4}})\b", re.IGNORECASE)
_YEAR = re.compile(r"\b((?:19|20)\d\d)\b")
_MONTH_ALONE = re.compile(rf"\b(?:in|during|since|by|of|early|late|mid)\s+({_MONTH})\b", re.IGNORECASE)
_RELATIVE = re.compile(r"\b(yesterday|today|(?:last|this)\s+(?:week|month|year))\b", re.IGNORECASE)


@dataclass(frozen=True)
class Period:
    """A time a message names: from ``start`` (included) to ``end`` (excluded), in seconds, or
    with ``month`` alone (1-12), that month of any year; ``text`` is how the message wrote it."""

    text: str
    start: float = 0.0
    end: float = 0.0
    month: int = 0

    def holds(self, moment: float) -> bool:
        """Return whether ``moment`` (seconds since the epoch) falls in the period."""
        if self.month:
            return datetime.fromtimestamp(moment, UTC).month == self.month
        return self.start <= moment < self.end


def _utc(year: int, month: int, day: int = 1) -> float:
    return datetime(year, month, day, tzinfo=UTC).timestamp()


def _month_period(text: str, year: int, month: int) -> Period:
    return Period(text, _utc(year, month), _utc(year + month // 12, month % 12 + 1))


def _relative(text: str, now: float) -> Period:
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    words = text.casefold().split()
    if words == ["today"] or words == ["yesterday"]:
        start = today - timedelta(days=words == ["yesterday"])
        return Period(text, start.timestamp(), start.timestamp() + DAY)
    if words[1] == "week":
        monday = today - timedelta(days=today.weekday()) - timedelta(weeks=words[0] == "last")
        return Period(text, monday.timestamp(), monday.timestamp() + 7 * DAY)
    if words[1] == "month":
        month = today.month - (words[0] == "last")
        year, month = (today.year, month) if month else (today.year - 1, 12)
        return _month_period(text, year, month)
    year = today.year - (words[0] == "last")
    return Period(text, _utc(year, 1), _utc(year + 1, 1))


def named_periods(message: str, now: float) -> list[Period]:
    """Return the times ``message`` names (module docstring), the most precise first: a day,
    then a month of a year, a year, a month alone; relative ones are taken from ``now``."""
    found: list[Period] = []
    rest = message

    def take(pattern: re.Pattern[str], make: Any) -> None:
        nonlocal rest
        for match in pattern.finditer(rest):
            try:
                found.append(make(match))
            except ValueError:  # "31 February 2023": no such day, no period
                continue
        rest = pattern.sub(" ", rest)

    def day(text: str, year: str, month: str, number: str) -> Period:
        start = _utc(int(year), _MONTHS.index(month.casefold()) + 1, int(number))
        return Period(text, start, start + DAY)

    take(_DAY_MONTH_YEAR, lambda m: day(m[0], m[3], m[2], m[1]))
    take(_MONTH_DAY_YEAR, lambda m: day(m[0], m[3], m[1], m[2]))
    take(_MONTH_YEAR, lambda m: _month_period(m[0], int(m[2]), _MONTHS.index(m[1].casefold()) + 1))
    take(_YEAR, lambda m: Period(m[0], _utc(int(m[1]), 1), _utc(int(m[1]) + 1, 1)))
    take(_MONTH_ALONE, lambda m: Period(m[1], month=_MONTHS.index(m[1].casefold()) + 1))
    take(_RELATIVE, lambda m: _relative(m[0], now))
    return found
