"""Overview: what the agent holds, how old it is, and what the privacy switch left behind."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint, url_for

from clawmem.clock import utc_datetime
from clawmem.errors import CorruptStoreError, StorageError, redact
from clawmem.jobs.status import retention_status
from clawmem.records import NamespaceCount
from clawmem.rules import subject_namespace, subject_of_namespace
from clawmem.sites import operations
from clawmem.sql.activity import Activity, day_edges
from clawmem.sql.schema import tables
from clawmem.sql.sizes import TableStats
from clawmem.turn.compaction import configured_thresholds
from dashboard import charts, state
from dashboard.views.jobs import retention_view
from dashboard.views.recall import COLD_MESSAGES, injection_survey
from dashboard.views.rendering import format_bytes, format_duration, format_time, render_page, shell_command

bp = Blueprint("overview", __name__)

MAX_LISTED = 10
CHART_DAYS = 30
CHART_NAMESPACES = 12  # namespaces drawn in the TTL chart, the largest first
CHART_KEYS = 10  # keys in each of the most and least injected bars
TTL_STATES = (("permanent", "never expire"), ("expiring", "expiring"), ("expired", "expired, not yet swept"))


def _daily(added: list[int], days: list[str], total: int | None = None) -> dict[str, Any]:
    values = added if total is None else charts.totals_over_time(total, added)
    return {
        "bars": charts.columns(days, values),
        "points": charts.line_points(values),
        "rows": list(zip(days, values, strict=True)),
        "top": max(values, default=0),
    }


def _encryption_line() -> dict[str, Any]:
    # No query: the key ids come from the settings and the check from start-up; the rows per
    # key id are counted on the Settings page.
    cipher = state.site().cipher
    return {
        "on": cipher.enabled,
        "primary": cipher.primary_id,
        "problem": state.key_problem(),
        "keys": len(cipher.keyring.key_ids) if cipher.keyring else 0,
        "strict": cipher.strict,
    }


NOT_REPORTED = "not reported"


def _tokens_daily(tokens: list[int | None] | None, days: list[str]) -> dict[str, Any] | None:
    # A day no provider reported tokens for draws no bar and reads "not reported", never 0;
    # with no reported day at all there is no chart to draw (None).
    if tokens is None or all(value is None for value in tokens):
        return None
    heights = [value or 0 for value in tokens]
    return {
        "bars": charts.columns(days, heights),
        "top": max(heights),
        "rows": [
            (day, NOT_REPORTED if value is None else value) for day, value in zip(days, tokens, strict=True)
        ],
        "reported_days": sum(1 for value in tokens if value is not None),
        "sum": sum(heights),
    }


def _growth(activity: Activity, memory_added: list[int] | None, memory_total: int) -> dict[str, Any]:
    days = [charts.day_label(day) for day in activity.days]
    return {
        "first": days[0],
        "last": days[-1],
        "days": CHART_DAYS,
        "messages": _daily(activity.messages, days),
        "conversations": _daily(activity.conversations, days, activity.conversations_now),
        "memory": None if memory_added is None else _daily(memory_added, days, memory_total),
        "tokens": _tokens_daily(activity.tokens, days),
        "total_tokens": activity.total_tokens,  # None: not reported
        "tokens_stored": activity.tokens is not None,  # False: phpClaw's tables keep no usage
        "writing_tokens": activity.writing_tokens,  # None: no extraction call reported tokens
        "by_tokens": url_for("conversations.index", sort="-tokens"),
    }


def _ttl_chart(namespaces: list[NamespaceCount]) -> dict[str, Any]:
    largest = sorted(namespaces, key=lambda n: (-n.total, n.namespace))[:CHART_NAMESPACES]
    widest = max((n.total for n in largest), default=0)
    rows = []
    for found in largest:
        counts = {
            "permanent": found.live - found.expiring,
            "expiring": found.expiring,
            "expired": found.expired,
        }
        parts = [(name, words, counts[name]) for name, words in TTL_STATES]
        rows.append(
            {
                "namespace": found.namespace,
                "total": found.total,
                "counts": counts,
                "shares": charts.shares(parts, widest),
                "url": url_for("memory.namespace", namespace=found.namespace),
            }
        )
    return {"rows": rows, "states": TTL_STATES, "more": max(0, len(namespaces) - len(largest))}


def _injected_chart(namespace: str) -> dict[str, Any]:
    try:
        found = injection_survey(COLD_MESSAGES, namespace)
    except StorageError as exc:
        if not isinstance(exc.__cause__, CorruptStoreError):
            raise
        # The recall namespace's file is no store: said here, and the rest of the page answers.
        return {"namespace": namespace, "unreadable": str(exc.__cause__)}
    read, injections, sizes = found.messages, found.injections, found.sizes
    times = {key: injections.get(key, 0) for key in sizes}
    # Ten of thousands of keys: pick them without sorting the rest.
    most = [
        item
        for item in heapq.nsmallest(CHART_KEYS, times.items(), key=lambda item: (-item[1], item[0]))
        if item[1] > 0
    ]
    shown = {key for key, _ in most}
    rest = ((key, count) for key, count in times.items() if key not in shown)
    least = heapq.nsmallest(CHART_KEYS, rest, key=lambda item: (item[1], item[0]))
    widest = max(times.values(), default=0)

    def bars(items: list[tuple[str, int]]) -> list[dict[str, Any]]:
        return [
            {
                "key": key,
                "times": count,
                "shares": charts.shares([("injected", "", count)], widest),
                "url": url_for("memory.entry", namespace=namespace, key=key),
            }
            for key, count in items
        ]

    return {
        "namespace": namespace,
        "messages": read,
        "entries": len(sizes),
        "cold": sum(1 for count in times.values() if count == 0),
        "most": bars(most),
        "least": bars(least),
        "url": url_for("recall.cold", namespace=namespace, n=COLD_MESSAGES),
    }


def _retention(oldest: datetime | None, now: datetime, days: int | None) -> dict[str, Any]:
    report: dict[str, Any] = {"days": days, "oldest": format_time(oldest), "age_days": None, "beyond": False}
    if oldest is not None:
        report["age_days"] = (now - oldest).days
        if days is not None:
            report["beyond"] = oldest < now - timedelta(days=days)
            report["command"] = shell_command(
                "flask", "claw", "prune", "--older-than", f"{days}d", "--dry-run"
            )
    return report


def _deletion_commands() -> dict[str, Any]:
    """Return what the storage-off notice offers to delete, previewed first: the conversations
    by age, each subject (their conversations and their own namespace, by ``erase``), and the
    other namespaces; ``default`` is said apart, as the operator's own content."""
    settings = state.settings()
    # Namespaces come from the table, so any text can be one: every word is quoted for the shell.
    namespaces = state.driver().namespaces()
    subject_of = {name: subject_of_namespace(name, settings.subject_namespace) for name in namespaces}
    subjects = sorted(
        set(state.conversations().subjects(limit=MAX_LISTED + 1))
        | {subject for subject in subject_of.values() if subject}
    )
    listed_subjects = [
        {
            "user_id": subject,
            "url": url_for("subjects.detail", user_id=subject),
            "namespace": subject_namespace(subject, settings.subject_namespace),
            "command": shell_command("flask", "claw", "erase", "--user-id", subject, "--dry-run"),
        }
        for subject in subjects[:MAX_LISTED]
    ]
    others = [name for name in namespaces if not subject_of[name] and name != settings.recall_namespace]
    return {
        "prune": shell_command("flask", "claw", "prune", "--older-than", "1h", "--dry-run"),
        "subjects": listed_subjects,
        "more_subjects": max(0, len(subjects) - MAX_LISTED),
        "namespaces": [
            {
                "namespace": name,
                "command": shell_command("flask", "claw", "flush", "--namespace", name, "--dry-run"),
            }
            for name in others[:MAX_LISTED]
        ],
        "more_namespaces": max(0, len(others) - MAX_LISTED),
        "operator_namespace": settings.recall_namespace if settings.recall_namespace in namespaces else None,
    }


@dataclass(frozen=True)
class Totals:
    """Exact row counts and sizes of the three tables and messages per role."""

    tables: list[TableStats]
    roles: dict[str, int]


def _totals() -> tuple[Totals, float]:
    # Exact counts and sizes cost a pass over every row (a third of a second at a million
    # messages): taken at most once a minute, never kept while a table is missing (init-db).
    site = state.site()

    def take() -> Totals:
        stats = operations.table_stats(site)
        return Totals(stats, operations.message_roles(site, stats))

    return state.recent("overview_totals", take, keep=lambda totals: all(t.exists for t in totals.tables))


@bp.get("/")
def index() -> str:
    """The three tables, the retention window, unswept keys, the privacy switch and the drivers."""
    settings = state.settings()
    driver = state.driver()
    now = utc_datetime(state.clock())
    namespaces, memory_added = driver.counts_and_rows_per_day(day_edges(now, CHART_DAYS))
    memory_counts = {
        "total": sum(n.total for n in namespaces),
        "live": sum(n.live for n in namespaces),
        "expired": sum(n.expired for n in namespaces),
    }
    totals, counted_at = _totals()
    found = totals.tables
    init_db = shell_command("flask", "claw", "init-db")
    # A missing table has neither rows nor a size: it says so in its own cell, not as a "Size".
    table_rows = [
        {
            "name": t.name,
            "rows": t.rows,
            "missing": not t.exists,
            "size": format_bytes(t.bytes) if t.exists and t.bytes is not None else None,
        }
        for t in found
    ]
    schema = tables(settings.table_prefix)
    rows = {t.name: t.rows or 0 for t in found}
    counts = {"conversations": rows[schema.conversations.name], "messages": rows[schema.messages.name]}
    # The charts' counts and the conversations' first and last times, in one statement.
    activity = operations.activity(state.site(), CHART_DAYS)
    newest = activity.newest
    privacy = {
        "store_messages": settings.store_messages,
        "conversations": counts["conversations"],
        "messages": counts["messages"],
        "memory_rows": memory_counts["total"],
        "newest": format_time(newest),
        # Only the notice shown while storage is off says these.
        "memory_newest": None if settings.store_messages else format_time(driver.newest_write()),
        "commands": None if settings.store_messages else _deletion_commands(),
    }
    return render_page(
        "overview/index.html",
        {},
        tables=table_rows,
        init_db=init_db,
        roles=totals.roles,
        counted={
            "at": format_time(utc_datetime(lambda: counted_at)),
            "max_age": format_duration(state.COUNTS_MAX_AGE),
        },
        retention=_retention(activity.oldest, now, settings.retention_days),
        scheduled_retention=retention_view(retention_status(state.site())),
        memory=memory_counts,
        memory_commands={"sweep": shell_command("flask", "claw", "sweep", "--dry-run")},
        privacy=privacy,
        drivers={
            "memory": settings.memory_driver,
            "conversations": f"sql ({state.engine().dialect.name})",
            "database": redact(settings.database_url),
            "prefix": settings.table_prefix or "(none)",
        },
        compaction=configured_thresholds(settings),
        recall={"top_k": settings.recall_top_k, "namespace": settings.recall_namespace},
        growth=_growth(activity, memory_added, memory_counts["total"]),
        ttl_chart=_ttl_chart(namespaces),
        injected=_injected_chart(settings.recall_namespace),
        encryption=_encryption_line(),
    )
