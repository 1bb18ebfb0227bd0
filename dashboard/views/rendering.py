"""How every view answers: the full page, or only the fragment an htmx request targets.

Also the small formatters views use to turn rows into the plain strings templates print.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import quote

from flask import abort, g, has_request_context, render_template, request, url_for
from markupsafe import Markup, escape

from clawmem.errors import InvalidCursor
from clawmem.paging import decode_cursor, encode_cursor
from clawmem.sql.lenient import unix_to_datetime
from dashboard import state

UNREADABLE_TIME = "unreadable time"


def wants_fragment(target_id: str) -> bool:
    """Return whether this is an htmx request aimed at element ``target_id`` (not boosted, not a
    history restore, which both need the whole page)."""
    htmx = request.htmx
    return bool(htmx) and htmx.target == target_id and not htmx.boosted and not htmx.history_restore_request


def render_page(
    template: str,
    fragments: Mapping[str, str],
    page_context: Callable[[], dict[str, Any]] | None = None,
    **context: Any,
) -> str:
    """Render ``template``, or the partial of ``fragments`` (target id -> partial) the request targets.

    ``page_context()`` adds what only the full page shows; fragment requests never call it.
    """
    for target_id, partial in fragments.items():
        if wants_fragment(target_id):
            return render_template(partial, **context)
    if page_context is not None:
        context.update(page_context())
    return render_template(template, **context)


def text_arg(name: str, max_chars: int = 200) -> str:
    """Return the stripped query parameter ``name`` ('' when absent), cut to ``max_chars``."""
    return request.args.get(name, "").strip()[:max_chars]


def sort_arg(sorts: Mapping[str, bool], default: str) -> tuple[str, bool]:
    """Return the ``sort`` query parameter as ``(column, descending)``: ``sort=key`` lists by
    ``key`` smallest first, ``sort=-key`` largest first (``default``, in the same words, when
    absent). Abort with a 400 naming the choices for anything else."""
    if "order" in request.args:
        # The parameter of earlier versions: its link would now list in an order it did not ask for.
        abort(400, description="order is not read: sort says the direction, e.g. sort=tokens or sort=-tokens")
    sort = text_arg("sort", 40) or default
    name = sort.removeprefix("-")
    if name not in sorts:
        choices = ", ".join(f"{name}, -{name}" for name in sorts)
        abort(400, description=f"sort must be one of {choices}, got {sort!r}")
    return name, sort.startswith("-")


def sort_word(name: str, descending: bool) -> str:
    """Return the ``sort`` parameter of the order by ``name`` in that direction (``-name``: largest first)."""
    return f"-{name}" if descending else name


def sort_links(
    sorts: Mapping[str, bool], current: str, descending: bool, endpoint: str, **params: Any
) -> dict[str, dict[str, Any]]:
    """Return, for each of ``sorts`` (name -> its first click lists largest first), the URL of page
    one of the list in that order with the same ``params``, and the ``aria-sort`` of its column
    header (only the ``current`` sort has one, in its direction ``descending``, whose link turns
    it around)."""
    links = {}
    for name, own in sorts.items():
        if name != current:
            links[name] = {"url": url_for(endpoint, **params, sort=sort_word(name, own)), "aria_sort": None}
            continue
        links[name] = {
            "url": url_for(endpoint, **params, sort=sort_word(name, not descending)),
            "aria_sort": "descending" if descending else "ascending",
        }
    return links


def int_arg(name: str, default: int, minimum: int, maximum: int) -> int:
    """Return query parameter ``name`` as an int clamped to ``minimum..maximum`` (``default`` if absent)."""
    raw = request.args.get(name, "").strip()
    if not raw:
        return default
    try:
        number = int(raw)
    except ValueError:
        abort(400, description=f"{name} must be a whole number, got {raw[:40]!r}")
    return max(minimum, min(maximum, number))


def offset_cursor(offset: int) -> str:
    """Return the opaque cursor of a list computed in memory, continuing at ``offset``."""
    return encode_cursor([str(offset)])


def offset_from_cursor(cursor: str) -> int:
    """Return the offset in a cursor made by :func:`offset_cursor` (0 for none).

    Raises :class:`InvalidCursor` (answered as a 400) for a malformed or negative one.
    """
    if not cursor:
        return 0
    (raw,) = decode_cursor(cursor, 1)
    try:
        offset = int(raw)
    except ValueError:
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}") from None
    if offset < 0:
        raise InvalidCursor(f"invalid cursor {cursor[:40]!r}")
    return offset


def shell_command(*words: object) -> str:
    """Return a command for an operator to copy into a shell, every word quoted as the shell
    needs: a namespace such as ``default --yes #`` stays one argument. A claw command (written
    ``"flask", "claw", ...`` by the views) is given as this installation runs it from a plain
    shell (see :func:`dashboard.state.command_program`), after the ``CLAW_*`` variables the
    page's site needs, so it acts on the site the page shows."""
    text = [str(word) for word in words]
    if text[:2] == ["flask", "claw"] and has_request_context():
        program = state.command_program()
        text = [*state.command_environment(program), *program, *text[2:]]
    return shlex.join(text)


def display_zone() -> Any:
    """Return the zone absolute times are printed in: ``CLAW_DISPLAY_TZ`` of the app (UTC outside
    a request)."""
    if not has_request_context():
        return UTC
    # Asked for every time a page prints (hundreds on a list): looked up once per request.
    zone = g.get("clawmem_display_zone")
    if zone is None:
        zone = g.clawmem_display_zone = state.settings().display_zone
    return zone


def zone_name(zone: Any = None) -> str:
    """Return the name of the display zone as the pages say it (``UTC``, ``Europe/Berlin``)."""
    zone = zone if zone is not None else display_zone()
    return "UTC" if zone is UTC else str(zone)


def format_time(moment: Any, missing: str = "", zone: Any = None) -> str:
    """Return a naive-UTC datetime as ``2024-05-01 12:03:04 UTC`` in ``zone`` (by default the
    display zone, ``CLAW_DISPLAY_TZ``; its abbreviation, such as ``CEST``, ends it), ``missing``
    for ``None``, and :data:`UNREADABLE_TIME` for anything else: a time another program stored
    that no datetime holds."""
    if moment is None:
        return missing
    if not isinstance(moment, datetime):
        return UNREADABLE_TIME
    zone = zone if zone is not None else display_zone()
    try:
        local = moment.replace(tzinfo=UTC).astimezone(zone)
    except (OverflowError, ValueError):  # the first or last day of the calendar, moved off it
        return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or zone_name(zone)}"


TIME_UNITS = (("h", 3600), ("min", 60), ("s", 1))


def relative_words(seconds_ahead: float, days_ahead: int | None = None) -> str:
    """Return how far a moment ``seconds_ahead`` of now is: ``now``, ``in 10 min``, ``3 h ago``
    within a day; past that, in calendar days (``days_ahead``, counted between the dates in the
    display zone; else whole days): ``yesterday``, ``tomorrow``, ``12 days ago``, ``in 3 days``."""
    size = abs(seconds_ahead)
    if size < 1:
        return "now"
    if size < 86400:
        unit, length = next((unit, length) for unit, length in TIME_UNITS if size >= length)
        amount = f"{int(size / length + 0.5)} {unit}"
        return f"in {amount}" if seconds_ahead > 0 else f"{amount} ago"
    days = days_ahead if days_ahead is not None else int(seconds_ahead / 86400)
    if days == 0:  # under a day apart on the clock, yet another date: say which
        days = 1 if seconds_ahead > 0 else -1
    if days == 1:
        return "tomorrow"
    if days == -1:
        return "yesterday"
    return f"in {days} days" if days > 0 else f"{-days} days ago"


def _clock_text(moment: datetime) -> str:
    """Return ``moment`` as ``2024-05-01 12:03:04``, as ``%Y-%m-%d %H:%M:%S`` writes it (which
    costs three times as much; before the year 1000 it writes the year unpadded)."""
    if moment.year < 1000:
        return f"{moment:%Y-%m-%d %H:%M:%S}"
    return moment.isoformat(" ", "seconds")[:19]


TimeFrame = tuple[float, Any, date]  # the app's clock, the display zone and today's date there


def time_frame() -> TimeFrame:
    """Return the app's clock, the display zone and today's date there, read once per request:
    a list page prints a hundred times, and each would otherwise look all three up. A zone that
    is UTC by another name (``ZoneInfo("UTC")``) is given as :data:`~datetime.UTC`, whose times
    need no conversion."""
    frame = g.get("clawmem_time_frame") if has_request_context() else None
    if frame is None:
        now, zone = state.clock()(), display_zone()
        if getattr(zone, "key", None) == "UTC":
            zone = UTC
        frame = (now, zone, datetime.fromtimestamp(now, zone).date())
        if has_request_context():
            g.clawmem_time_frame = frame
    return frame


def when(moment: Any, frame: TimeFrame | None = None) -> Markup | str:
    """Return a time as a ``<time>`` element saying how long ago (or ahead of the app's clock)
    it is, followed by the absolute time in the display zone, visible on every screen (a phone
    has no hover). Takes a naive-UTC datetime or Unix seconds; ``None`` is '', words (``never``,
    :data:`UNREADABLE_TIME`) stay as they are, anything else is unreadable."""
    if moment is None or isinstance(moment, str):
        return moment or ""
    if isinstance(moment, int) and not isinstance(moment, bool):
        readable = unix_to_datetime(moment)
        if readable is None:
            return format_unix(moment)
        moment = readable
    if not isinstance(moment, datetime):
        return UNREADABLE_TIME
    now, zone, today = frame or time_frame()
    aware = moment.replace(tzinfo=UTC)
    ahead = aware.timestamp() - now
    stamp = moment.isoformat(timespec="seconds")
    try:
        if zone is UTC:
            local = aware
            # The stamp's own digits: isoformat pads a year before 1000, which _clock_text does not.
            clock = stamp.replace("T", " ") if moment.year >= 1000 else _clock_text(moment)
        else:
            local = aware.astimezone(zone)
            clock = _clock_text(local)
        days_ahead: int | None = (local.date() - today).days
        absolute = f"{clock} {_escaped_zone(local.tzname() or zone_name(zone))}"
    except (OverflowError, ValueError, OSError):
        days_ahead, absolute = None, escape(format_time(moment, zone=zone))
    # Joined from parts: Markup.format costs more than the rest of this on a list page. Only the
    # zone's name is escaped: the time stamps hold digits, dashes and colons, the words are ours.
    return Markup(
        f'<time datetime="{stamp}Z">{relative_words(ahead, days_ahead)}</time> '
        f'<span class="absolute">({absolute})</span>'
    )


@functools.cache
def _escaped_zone(name: str) -> str:
    # A zone's name as HTML: a page prints it a hundred times, and a site has one or two.
    return str(escape(name))


# What werkzeug's converters leave unquoted in a path value (BaseConverter.to_url).
_PATH_SAFE = "!$&'()*+,/:;=@"
_URL_VALUE = "clawmem-url-value"
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]+")  # what quote leaves as it is, whatever it is told


def url_maker(endpoint: str, name: str, **values: Any) -> Callable[[str], str]:
    """Return what gives ``url_for(endpoint, **{name: value}, **values)`` for any ``value`` of
    a path part, from one URL built here: a list builds one link per row, and url_for costs
    more than the rest of the row."""
    head, _, tail = url_for(endpoint, **{name: _URL_VALUE}, **values).partition(_URL_VALUE)

    def url(value: str) -> str:
        # An id of what quote never changes (every id this package makes, a user id such as
        # cust-1001) needs no quoting.
        text = str(value)
        return f"{head}{text if _UNQUOTED.fullmatch(text) else quote(text, safe=_PATH_SAFE)}{tail}"

    return url


def marked(text: str | None, query: str | None) -> Markup:
    """Return ``text`` escaped, with every case-insensitive occurrence of ``query`` in
    ``<mark>``: built from escaped pieces, so neither can add markup."""
    text = text or ""
    needle = " ".join((query or "").split())
    if not needle:
        return escape(text)
    pieces, done = [], 0
    for found in re.finditer(re.escape(needle), text, re.IGNORECASE):
        pieces += [escape(text[done : found.start()]), Markup("<mark>{}</mark>").format(found.group())]
        done = found.end()
    return Markup("").join([*pieces, escape(text[done:])])


def snippet(text: str | None, query: str | None, max_chars: int = 160) -> Markup:
    """Return about ``max_chars`` characters of ``text`` on one line around the first match of
    ``query``, marked as :func:`marked` does (the start of ``text`` when nothing matches)."""
    flat = " ".join((text or "").split())
    needle = " ".join((query or "").split())
    found = re.search(re.escape(needle), flat, re.IGNORECASE) if needle else None
    if found is None:
        return escape(preview_text(flat, max_chars))
    start = max(0, min(found.start() - max_chars // 3, len(flat) - max_chars))
    end = max(start + max_chars, found.end())
    window = marked(flat[start:end], needle)
    return Markup("").join(["…" if start else "", window, "…" if end < len(flat) else ""])


# The filters templates use, registered on the app by dashboard.views.
TEMPLATE_FILTERS = {"when": when, "marked": marked, "snippet": snippet}


def format_unix(seconds: Any) -> str:
    """Return Unix seconds as ``2024-05-01 12:03:04 UTC`` ('' for ``None``; seconds past the
    calendar or not a number are said to be so)."""
    if seconds is None:
        return ""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        return UNREADABLE_TIME
    moment = unix_to_datetime(seconds)
    return format_time(moment) if moment is not None else f"{seconds} (beyond the calendar)"


def format_duration(seconds: float) -> str:
    """Return a rough human duration: ``45 s``, ``12 min``, ``3 h 5 min``, ``4 d 2 h``."""
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours == 0:
        return f"{minutes} min"
    if days == 0:
        rest = minutes % 60
        return f"{hours} h" + (f" {rest} min" if rest else "")
    rest = hours % 24
    return f"{days} d" + (f" {rest} h" if rest else "")


def format_bytes(size: int | None) -> str:
    """Return a byte count as ``512 B``, ``4.0 KiB``, ``3.2 MiB`` ('' for ``None``)."""
    if size is None:
        return ""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def pretty_json(value: Any) -> str:
    """Return ``value`` as indented JSON text with non-ASCII characters kept readable (or, for a
    value no JSON can show, its ``repr``: the row mappers mark such rows unreadable first)."""
    try:
        return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def preview_text(text: str | None, max_chars: int = 160) -> str:
    """Return the first ``max_chars`` characters of ``text`` on one line, with an ellipsis if cut."""
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"
