"""Overview: what the agent holds, how old it is, and what the privacy switch left behind."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint

from clawmem import operations
from clawmem.clock import utc_datetime
from clawmem.compaction import configured_thresholds
from clawmem.errors import redact
from clawmem.sql.schema import tables
from dashboard import state
from dashboard.views.rendering import format_bytes, format_time, render_page, shell_command

bp = Blueprint("overview", __name__)

MAX_LISTED = 10


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
    # Namespaces come from the table, so any text can be one: every word is quoted for the shell.
    namespaces = state.driver().namespaces()
    commands = [{"command": shell_command("flask", "claw", "prune", "--older-than", "1h", "--dry-run"),
                 "note": "every conversation written until an hour ago"}]
    commands += [
        {"command": shell_command("flask", "claw", "flush", "--namespace", name, "--dry-run"), "note": ""}
        for name in namespaces[:MAX_LISTED]
    ]
    return {"listed": commands, "more_namespaces": max(0, len(namespaces) - MAX_LISTED)}


@bp.get("/")
def index() -> str:
    """The three tables, the retention window, unswept keys, the privacy switch and the drivers."""
    settings = state.settings()
    conversations = state.conversations()
    driver = state.driver()
    namespaces = driver.namespace_counts()
    memory_counts = {
        "total": sum(n.total for n in namespaces),
        "live": sum(n.live for n in namespaces),
        "expired": sum(n.expired for n in namespaces),
    }
    now = utc_datetime(state.clock())
    found = operations.table_stats(state.site())
    table_rows = [
        {"name": t.name, "rows": t.rows,
         "size": format_bytes(t.bytes) if t.exists else "missing: run flask claw init-db"}
        for t in found
    ]
    schema = tables(settings.table_prefix)
    rows = {t.name: t.rows or 0 for t in found}
    counts = {"conversations": rows[schema.conversations.name], "messages": rows[schema.messages.name]}
    newest = conversations.newest(by="updated_at")
    privacy = {
        "store_messages": settings.store_messages,
        "conversations": counts["conversations"],
        "messages": counts["messages"],
        "memory_rows": memory_counts["total"],
        "newest": format_time(newest),
        "memory_newest": format_time(driver.newest_write()),
        "commands": None if settings.store_messages else _deletion_commands(),
    }
    return render_page(
        "overview/index.html",
        {},
        tables=table_rows,
        roles=operations.message_roles(state.site()),
        retention=_retention(conversations.oldest(), now, settings.retention_days),
        memory=memory_counts,
        privacy=privacy,
        drivers={
            "memory": settings.memory_driver,
            "conversations": f"sql ({state.engine().dialect.name})",
            "database": redact(settings.database_url),
            "prefix": settings.table_prefix or "(none)",
        },
        compaction=configured_thresholds(settings),
        recall={"top_k": settings.recall_top_k, "namespace": settings.recall_namespace},
    )
