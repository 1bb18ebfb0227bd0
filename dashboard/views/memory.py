"""Memory: namespaces with counts, keys with their TTL state, and one key in detail."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, abort, request, url_for

from clawmem.clock import now_seconds
from clawmem.errors import InvalidKey, InvalidNamespace
from clawmem.memory.base import FILTERS, BaseMemory, check_filter
from clawmem.memory.sql import SCAN_LIMIT as SQL_SCAN_LIMIT
from clawmem.memory.sql import SqlMemory
from clawmem.paging import SORTS
from clawmem.recall.words import text_of
from clawmem.records import MemoryRow
from clawmem.rules import subject_of_namespace, ttl_state, validate_namespace
from clawmem.turn.writes import ORIGINS
from dashboard import state
from dashboard.views.downloads import DOWNLOAD_FORMATS, DOWNLOAD_LIMIT, moment_text
from dashboard.views.downloads import download as download_response
from dashboard.views.rendering import (
    UNREADABLE_TIME,
    format_bytes,
    format_duration,
    pretty_json,
    render_page,
    shell_command,
    sort_arg,
    sort_links,
    sort_word,
    text_arg,
    wants_fragment,
)

bp = Blueprint("memory", __name__, url_prefix="/memory")

PAGE_SIZE = 50
SEARCH_LIMIT = 200  # entries a search across namespaces lists
DOWNLOAD_PAGE = 500  # entries read per page while a download streams
MORE_TARGET = "memory-more"
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
    counts = state.driver().namespace_counts()
    for n in counts:
        subject = subject_of_namespace(n.namespace, template)
        row = {
            "namespace": n.namespace,
            "total": n.total,
            "live": n.live,
            "expired": n.expired,
            "unreadable": n.unreadable,
            "subject": subject,
            "subject_url": _subject_url(subject),
        }
        try:
            row["url"] = url_for("memory.namespace", namespace=validate_namespace(n.namespace))
        except InvalidNamespace:
            # Another program's rows, under a name today's rule refuses: shown read-only under
            # an encoded name (a '/', '..' or '%2e' cannot travel in a path), and the CLI
            # deletes it as stored.
            row["url"] = url_for("memory.stored_namespace", token=stored_token(n.namespace))
            row["breaks_rule"] = True
            row["flush"] = shell_command("flask", "claw", "flush", "--namespace", n.namespace, "--dry-run")
        rows.append(row)
    totals = {name: sum(getattr(n, name) for n in counts) for name in ("total", "live", "expired")}
    return render_page(
        "memory/index.html",
        {},
        rows=rows,
        totals=totals,
        driver=state.settings().memory_driver,
        search=_search(text_arg("q")),
    )


def _search(query: str) -> dict[str, Any]:
    """Return the entries of every namespace whose key or value holds ``query`` exactly (the
    match export and erase use), at most ``SEARCH_LIMIT`` of them, by namespace then key."""
    if not query:
        return {"q": "", "rows": [], "more": False, "limit": SEARCH_LIMIT}
    now = now_seconds(state.clock())
    found = list(itertools.islice(state.driver().find(query), SEARCH_LIMIT + 1))
    rows = []
    for row in found[:SEARCH_LIMIT]:
        listed = entry_row(row, now)
        try:
            validate_namespace(row.namespace)
        except InvalidNamespace:
            # Another program's row under a name today's rule refuses: its list is read-only.
            listed["url"] = url_for("memory.stored_namespace", token=stored_token(row.namespace))
        rows.append(listed)
    return {"q": query, "rows": rows, "more": len(found) > SEARCH_LIMIT, "limit": SEARCH_LIMIT}


def _subject_url(subject: str | None) -> str | None:
    """Return the page of ``subject`` (``None`` for no subject)."""
    return url_for("subjects.detail", user_id=subject) if subject else None


def origin_of(metadata: Any) -> tuple[str | None, int]:
    """Return who wrote an entry, from its metadata's attribution (one of
    :data:`clawmem.turn.writes.ORIGINS`; ``None`` when it names none: the operator's code), and how
    many earlier values it keeps (an extraction keeps the last few it replaced)."""
    described = metadata if isinstance(metadata, dict) else {}
    origin = described.get("origin")
    history = described.get("history")
    return (origin if origin in ORIGINS else None), (len(history) if isinstance(history, list) else 0)


def entry_row(row: MemoryRow, now: int) -> dict[str, Any]:
    """Return one entry as a list row shows it: key, link, TTL state, size, text, times, and
    who wrote it (:func:`origin_of`)."""
    status, words = ttl_label(row.expires_at, now)
    origin, replaced = origin_of(row.metadata)
    return {
        "namespace": row.namespace,
        "key": row.key,
        "url": url_for("memory.entry", namespace=row.namespace, key=row.key),
        "state": status,
        "ttl": words,
        "bytes": format_bytes(row.bytes),
        "text": text_of(row.value),
        "updated_at": row.updated_at or (UNREADABLE_TIME if row.raw_updated_at is not None else None),
        "expires_at": row.expires_at,
        "unreadable": row.unreadable,
        "origin": origin,
        "replaced": replaced,
    }


def _list_arguments(namespace: str) -> tuple[str, str, str, bool, str]:
    # A key list and its download read the same filters (400 for a bad one) and order.
    namespace = validate_namespace(namespace)
    status = text_arg("state", 20)
    try:
        check_filter(status or None)
    except ValueError as exc:
        abort(400, description=str(exc))
    sort, descending = sort_arg(SORTS, "key")
    return namespace, status, sort, descending, text_arg("q")


@bp.get("/<namespace>/")
def namespace(namespace: str) -> str:
    """The keys of one namespace by key, last write or expiry (``sort``, either way round), with
    TTL state and how many there are; filter by state and search."""
    namespace, status, sort, descending, query = _list_arguments(namespace)
    cursor = text_arg("cursor", 500)
    now = now_seconds(state.clock())
    driver = state.driver()
    listed = {"state": status or None, "query": query or None}
    page = driver.entries(
        namespace, **listed, limit=PAGE_SIZE, cursor=cursor or None, sort=sort, descending=descending
    )
    filters = {name: value for name, value in (("q", query), ("state", status)) if value}
    order = sort_word(sort, descending)
    downloads = {
        format: url_for("memory.download", namespace=namespace, format=format, **filters, sort=order)
        for format in DOWNLOAD_FORMATS
    }
    more_url = (
        url_for("memory.namespace", namespace=namespace, **filters, sort=order, cursor=page.next_cursor)
        if page.next_cursor
        else None
    )
    subject = subject_of_namespace(namespace, state.settings().subject_namespace)
    return render_page(
        "memory/namespace.html",
        {"memory-results": "memory/_results.html", MORE_TARGET: "memory/_rows.html"},
        namespace=namespace,
        subject=subject,
        subject_url=_subject_url(subject),
        filters=filters,
        state_labels=STATE_LABELS,
        sort=order,
        sorts=sort_links(SORTS, sort, descending, "memory.namespace", namespace=namespace, **filters),
        rows=[entry_row(row, now) for row in page.items],
        total=None if wants_fragment(MORE_TARGET) else _totals(driver, namespace, listed),
        more_url=more_url,
        scanned=_scanned(driver, namespace, status or None, query),
        downloads=downloads,
        download_limit=DOWNLOAD_LIMIT,
    )


def _scanned(driver: BaseMemory, namespace: str, status: str | None, query: str) -> dict[str, Any] | None:
    # Sealed values cannot be matched in SQL: the search read the newest rows decrypted, and
    # the page says how many (the same scan the list made, kept for the page).
    if not query or not driver.encrypted or not isinstance(driver, SqlMemory):
        return None
    _, read, complete = driver.scanned(namespace, status, query)
    return {"read": read, "complete": complete, "limit": SQL_SCAN_LIMIT}


KEY_COLUMNS = ("namespace", "key", "state", "expires_at", "value", "bytes", "created_at", "updated_at")


@bp.get("/<namespace>/export.<any(csv, json):format>")
def download(namespace: str, format: str) -> Response:
    """The namespace's keys under the list's filters and order as CSV or JSON, streamed, at
    most ``DOWNLOAD_LIMIT`` rows: the value as its JSON text, expiry as Unix seconds (UTC)."""
    namespace, status, sort, descending, query = _list_arguments(namespace)
    driver, now = state.driver(), now_seconds(state.clock())
    listed = {"state": status or None, "query": query or None}

    def rows() -> Iterator[dict[str, Any]]:
        def fetch(cursor: str | None) -> Any:
            return driver.entries(
                namespace, **listed, limit=DOWNLOAD_PAGE, cursor=cursor, sort=sort, descending=descending
            )

        for row in state.every_item(fetch):
            yield {
                "namespace": row.namespace,
                "key": row.key,
                "state": ttl_state(row.expires_at, now)[0],
                "expires_at": row.expires_at,
                "value": row.value if row.raw_value else json.dumps(row.value, ensure_ascii=False),
                "bytes": row.bytes,
                "created_at": moment_text(row.created_at),
                "updated_at": moment_text(row.updated_at),
            }

    filters = {name: value for name, value in (("q", query), ("state", status)) if value}
    about = {"namespace": namespace, "filters": filters, "sort": sort_word(sort, descending), "times": "UTC"}
    return download_response(format, f"memory-{namespace}", KEY_COLUMNS, rows, about)


def _totals(driver: BaseMemory, namespace: str, listed: dict[str, str | None]) -> dict[str, int]:
    """Return how many entries match the filters, and how many the namespace holds in all."""
    everything = driver.count(namespace)
    matching = driver.count_entries(namespace, **listed) if any(listed.values()) else everything
    return {"matching": matching, "all": everything}


def _detail(row: MemoryRow, now: int) -> dict[str, Any]:
    status, words = ttl_label(row.expires_at, now)
    return {
        "key": row.key,
        "namespace": row.namespace,
        "value": row.value if row.raw_value else pretty_json(row.value),
        "metadata": pretty_json(row.metadata) if row.metadata is not None else "",
        "state": status,
        "ttl": words,
        "expires_at": "never" if row.expires_at is None else row.expires_at,
        "created_at": row.created_at or (UNREADABLE_TIME if row.unreadable else None),
        "updated_at": row.updated_at or (UNREADABLE_TIME if row.unreadable else None),
        "bytes": format_bytes(row.bytes),
        "unreadable": row.unreadable,
        "forget_preview": _forget_command(row.namespace, row.key, "--dry-run"),
        "forget": _forget_command(row.namespace, row.key, "--yes"),
    }


def _forget_command(namespace: str, key: str, mode: str) -> str:
    """Return the shell command that previews (``--dry-run``) or deletes (``--yes``) this one key
    (``--`` keeps a key such as ``-x`` from being read as an option)."""
    words = ["--", key] if key.startswith("-") else [key]
    return shell_command("flask", "claw", "forget", "--namespace", namespace, mode, *words)


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
    subject = subject_of_namespace(namespace, state.settings().subject_namespace)
    return render_page(
        "memory/entry.html",
        {},
        entry=_detail(row, now_seconds(state.clock())),
        back_url=url_for("memory.namespace", namespace=namespace),
        subject=subject,
        subject_url=_subject_url(subject),
    )


def stored_token(namespace: str) -> str:
    """Return a namespace name as one URL path segment: base64url of its UTF-8, unpadded."""
    return base64.urlsafe_b64encode(namespace.encode("utf-8", "surrogatepass")).decode("ascii").rstrip("=")


def _stored_name(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8")
    except ValueError:
        abort(404, description="No namespace has this name.")


@bp.get("/~/<token>/")
def stored_namespace(token: str) -> str:
    """The entries of a namespace another program wrote under a name today's rule refuses
    (``..``, ``a/b``), named by :func:`stored_token`: read-only, every entry as stored."""
    namespace = _stored_name(token)
    try:
        rows = state.driver().stored_records(namespace)
    except ValueError:
        rows = []
    if not rows:
        abort(404, description="No entries are stored under this namespace.")
    now = now_seconds(state.clock())
    shown = []
    for row in rows:
        status, words = ttl_label(row.expires_at, now)
        value = row.value if row.raw_value else pretty_json(row.value)
        shown.append(
            {
                "key": row.key,
                "state": status,
                "ttl": words,
                "bytes": format_bytes(row.bytes),
                "value": value,
                "updated_at": row.updated_at,
                "unreadable": row.unreadable,
            }
        )
    return render_page(
        "memory/stored.html",
        {},
        namespace=namespace,
        rows=shown,
        flush=shell_command("flask", "claw", "flush", "--namespace", namespace, "--dry-run"),
    )
