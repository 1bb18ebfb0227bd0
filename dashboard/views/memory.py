"""Memory: namespaces with counts, keys with their TTL state, and one key in detail."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, request, url_for

from clawmem.clock import now_seconds
from clawmem.errors import InvalidKey, InvalidNamespace
from clawmem.memory.base import FILTERS, MemoryRow, check_filter
from clawmem.memory.rules import ttl_state, validate_namespace
from clawmem.subjects import subject_of_namespace
from clawmem.words import text_of
from dashboard import state
from dashboard.views.rendering import (
    UNREADABLE_TIME,
    format_bytes,
    format_duration,
    format_time,
    format_unix,
    pretty_json,
    preview_text,
    render_page,
    shell_command,
    text_arg,
)

bp = Blueprint("memory", __name__, url_prefix="/memory")

PAGE_SIZE = 50
STATE_LABELS = {
    "": "every state",
    "live": "live (not expired)",
    "permanent": "never expires",
    "expiring": "expiring",
    "expired": "expired",
}
assert set(STATE_LABELS) == {"", *FILTERS}


def ttl_label(expires_at: int | None, now: int) -> tuple[str, str]:
    """Return ``(state, words)`` for an entry: never expires, expires in …, expired … ago (not yet swept)."""
    status, seconds = ttl_state(expires_at, now)
    if status == "permanent":
        return status, "never expires"
    if status == "expiring":
        return status, f"expires in {format_duration(seconds or 0)}"
    return status, f"expired {format_duration(seconds or 0)} ago (not yet swept)"


@bp.get("/")
def index() -> str:
    """Every namespace with its total, live and expired-but-unswept entry counts."""
    template = state.settings().subject_namespace
    rows = []
    for n in state.driver().namespace_counts():
        row = {"namespace": n.namespace, "total": n.total, "live": n.live, "expired": n.expired,
               "subject": subject_of_namespace(n.namespace, template)}
        try:
            row["url"] = url_for("memory.namespace", namespace=validate_namespace(n.namespace))
        except InvalidNamespace:
            # Another program's rows, under a name today's rule refuses: no page reads it, and
            # the CLI deletes it as stored.
            row["url"] = None
            row["flush"] = shell_command("flask", "claw", "flush", "--namespace", n.namespace, "--dry-run")
        rows.append(row)
    return render_page("memory/index.html", {}, rows=rows, driver=state.settings().memory_driver)


def _entry_row(row: MemoryRow, now: int) -> dict[str, Any]:
    status, words = ttl_label(row.expires_at, now)
    return {
        "key": row.key,
        "url": url_for("memory.entry", namespace=row.namespace, key=row.key),
        "state": status,
        "ttl": words,
        "bytes": format_bytes(row.bytes),
        "preview": preview_text(text_of(row.value), 120),
        "updated_at": format_time(row.updated_at, UNREADABLE_TIME if row.unreadable else ""),
        "unreadable": row.unreadable,
    }


@bp.get("/<namespace>/")
def namespace(namespace: str) -> str:
    """The keys of one namespace in key order, with TTL state; filter by state and search."""
    namespace = validate_namespace(namespace)
    status = text_arg("state", 20)
    try:
        check_filter(status or None)
    except ValueError as exc:
        abort(400, description=str(exc))
    query, cursor = text_arg("q"), text_arg("cursor", 500)
    now = now_seconds(state.clock())
    page = state.driver().entries(
        namespace, state=status or None, query=query or None, limit=PAGE_SIZE, cursor=cursor or None
    )
    rows = [_entry_row(row, now) for row in page.items]
    filters = {name: value for name, value in (("q", query), ("state", status)) if value}
    more_url = url_for("memory.namespace", namespace=namespace, **filters, cursor=page.next_cursor) \
        if page.next_cursor else None
    return render_page(
        "memory/namespace.html",
        {"memory-results": "memory/_results.html", "memory-more": "memory/_rows.html"},
        namespace=namespace,
        subject=subject_of_namespace(namespace, state.settings().subject_namespace),
        filters=filters,
        state_labels=STATE_LABELS,
        rows=rows,
        more_url=more_url,
    )


def _detail(row: MemoryRow, now: int) -> dict[str, Any]:
    status, words = ttl_label(row.expires_at, now)
    return {
        "key": row.key,
        "namespace": row.namespace,
        "value": row.value if row.raw_value else pretty_json(row.value),
        "metadata": pretty_json(row.metadata) if row.metadata is not None else "",
        "state": status,
        "ttl": words,
        "expires_at": format_unix(row.expires_at) or "never",
        "created_at": format_time(row.created_at, UNREADABLE_TIME if row.unreadable else ""),
        "updated_at": format_time(row.updated_at, UNREADABLE_TIME if row.unreadable else ""),
        "bytes": format_bytes(row.bytes),
        "unreadable": row.unreadable,
    }


@bp.get("/<namespace>/entry")
def entry(namespace: str) -> str:
    """One key (``?key=``): its value as pretty JSON, metadata, and created/updated/expiry times."""
    namespace = validate_namespace(namespace)
    key = request.args.get("key", "")  # exact: "a" and "a " are different keys
    if not key:
        abort(400, description="say which entry to show with ?key=")
    try:
        row = state.driver().entry(namespace, key)
    except InvalidKey as exc:
        abort(400, description=str(exc))
    if row is None:
        abort(404, description="No entry has this key; it may have been deleted or swept.")
    return render_page("memory/entry.html", {}, entry=_detail(row, now_seconds(state.clock())),
                       back_url=url_for("memory.namespace", namespace=namespace))
