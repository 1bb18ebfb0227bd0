"""Memory: namespaces with counts, keys with their TTL state, and one key in detail."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, request, url_for

from clawmem.clock import now_seconds
from clawmem.errors import InvalidNamespace
from clawmem.memory.rules import ttl_state, validate_namespace
from clawmem.sql.kv import STATES, MemoryRow
from clawmem.words import text_of
from dashboard import state
from dashboard.views.rendering import (
    format_bytes,
    format_duration,
    format_time,
    format_unix,
    offset_cursor,
    offset_from_cursor,
    pretty_json,
    preview_text,
    render_page,
    text_arg,
)
from dashboard.views.stores import memory_store

bp = Blueprint("memory", __name__, url_prefix="/memory")

PAGE_SIZE = 50
STATE_LABELS = {"": "every state", "live": "live (not expired)", "expiring": "expiring", "expired": "expired"}


def ttl_label(expires_at: int | None, now: int) -> tuple[str, str]:
    """Return ``(state, words)`` for an entry: live, expires in …, expired … ago (not yet swept)."""
    status, seconds = ttl_state(expires_at, now)
    if status == "live":
        return status, "live"
    if status == "expiring":
        return status, f"expires in {format_duration(seconds or 0)}"
    return status, f"expired {format_duration(seconds or 0)} ago (not yet swept)"


def _namespace(raw: str) -> str:
    try:
        return validate_namespace(raw)
    except InvalidNamespace as exc:
        abort(404, description=str(exc))


@bp.get("/")
def index() -> str:
    """Every namespace with its total, live and expired-but-unswept entry counts."""
    store = memory_store()
    if store is not None:
        rows = [
            {"namespace": n.namespace, "total": n.total, "live": n.live, "expired": n.expired,
             "url": url_for("memory.namespace", namespace=n.namespace)}
            for n in store.namespaces()
        ]
    else:
        memory = state.memory()
        rows = [
            {"namespace": name, "total": None, "live": len(memory.all(name)), "expired": None,
             "url": url_for("memory.namespace", namespace=name)}
            for name in state.kv_namespaces()
        ]
    return render_page("memory/index.html", {}, rows=rows, sql=store is not None,
                       driver=state.settings().memory_driver)


def _entry_row(namespace: str, key: str, value: Any, expires_at: int | None, size: int, now: int,
               updated: str) -> dict[str, Any]:
    status, words = ttl_label(expires_at, now)
    return {
        "key": key,
        "url": url_for("memory.entry", namespace=namespace, key=key),
        "state": status,
        "ttl": words,
        "bytes": format_bytes(size),
        "preview": preview_text(text_of(value), 120),
        "updated_at": updated,
    }


def _contract_page(namespace: str, query: str, cursor: str) -> tuple[list[dict[str, Any]], str | None]:
    # Drivers other than sql are read through the contract: live entries only, no timestamps.
    entries = state.memory().all(namespace)
    needle = query.casefold()
    matching = [
        (key, value) for key, value in entries.items()
        if not needle or needle in key.casefold() or needle in text_of(value).casefold()
    ]
    offset = offset_from_cursor(cursor)
    shown = matching[offset:offset + PAGE_SIZE]
    now = now_seconds(state.clock())
    rows = [
        _entry_row(namespace, key, value, None, state.value_bytes(key, value), now, "")
        for key, value in shown
    ]
    more = offset + PAGE_SIZE < len(matching)
    return rows, offset_cursor(offset + PAGE_SIZE) if more else None


@bp.get("/<namespace>/")
def namespace(namespace: str) -> str:
    """The keys of one namespace in key order, with TTL state; filter by state and search."""
    namespace = _namespace(namespace)
    status = text_arg("state", 20)
    if status and status not in STATES:
        abort(400, description=f"state must be one of {', '.join(STATES)}, got {status!r}")
    query, cursor = text_arg("q"), text_arg("cursor", 500)
    store = memory_store()
    if store is not None:
        now = now_seconds(state.clock())
        page = store.entries(namespace, state=status or None, query=query or None,
                             limit=PAGE_SIZE, cursor=cursor or None)
        rows = [_entry_row(namespace, row.key, row.value, row.expires_at, row.bytes, now,
                           format_time(row.updated_at)) for row in page.items]
        next_cursor = page.next_cursor
    else:
        rows, next_cursor = _contract_page(namespace, query, cursor)
    filters = {name: value for name, value in (("q", query), ("state", status)) if value}
    more_url = url_for("memory.namespace", namespace=namespace, **filters, cursor=next_cursor) \
        if next_cursor else None
    return render_page(
        "memory/namespace.html",
        {"memory-results": "memory/_results.html", "memory-more": "memory/_rows.html"},
        namespace=namespace,
        filters=filters,
        state_labels=STATE_LABELS,
        rows=rows,
        more_url=more_url,
        sql=store is not None,
    )


def _detail(row: MemoryRow, now: int) -> dict[str, Any]:
    status, words = ttl_label(row.expires_at, now)
    return {
        "key": row.key,
        "namespace": row.namespace,
        "value": pretty_json(row.value),
        "metadata": pretty_json(row.metadata) if row.metadata is not None else "",
        "state": status,
        "ttl": words,
        "expires_at": format_unix(row.expires_at) or "never",
        "created_at": format_time(row.created_at),
        "updated_at": format_time(row.updated_at),
        "bytes": format_bytes(row.bytes),
    }


@bp.get("/<namespace>/entry")
def entry(namespace: str) -> str:
    """One key (``?key=``): its value as pretty JSON, metadata, and created/updated/expiry times."""
    namespace = _namespace(namespace)
    key = request.args.get("key", "")  # exact: "a" and "a " are different keys
    if not key:
        abort(400, description="say which entry to show with ?key=")
    store, now = memory_store(), now_seconds(state.clock())
    if store is not None:
        row = store.entry(namespace, key)
        if row is None:
            abort(404, description="No entry has this key; it may have been deleted or swept.")
        detail = _detail(row, now)
    else:
        memory = state.memory()
        if not memory.has(key, namespace):
            abort(404, description="No live entry has this key; it may have expired or been deleted.")
        value = memory.get(key, namespace)
        size = state.value_bytes(key, value)
        detail = {"key": key, "namespace": namespace, "value": pretty_json(value), "metadata": "",
                  "state": "live", "ttl": "live (this driver does not report expiry)", "expires_at": "",
                  "created_at": "", "updated_at": "", "bytes": format_bytes(size)}
    return render_page("memory/entry.html", {}, entry=detail, sql=store is not None,
                       back_url=url_for("memory.namespace", namespace=namespace))
