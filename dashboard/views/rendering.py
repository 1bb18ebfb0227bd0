"""How every view answers: the full page, or only the fragment an htmx request targets.

Also the small formatters views use to turn rows into the plain strings templates print.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from flask import abort, has_request_context, render_template, request

from clawmem.errors import InvalidCursor
from clawmem.sql.lenient import unix_to_datetime
from clawmem.sql.paging import decode_cursor, encode_cursor
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
    needs: a namespace such as ``default --yes #`` stays one argument. A ``flask claw`` command
    shown on another site than the commands' own starts with that site's ``CLAW_TABLE_PREFIX=``,
    so it acts on the site the page shows."""
    environment = state.command_environment() if words[:1] == ("flask",) and has_request_context() else ()
    return shlex.join([*environment, *(str(word) for word in words)])


def format_time(moment: Any, missing: str = "") -> str:
    """Return a naive-UTC datetime as ``2024-05-01 12:03:04 UTC`` (``missing`` for ``None``, and
    :data:`UNREADABLE_TIME` for anything else: a time another program stored that no datetime
    holds)."""
    if moment is None:
        return missing
    if not isinstance(moment, datetime):
        return UNREADABLE_TIME
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


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
