"""Jobs: scheduled retention (its schedule, last and next run) and recent background turns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, url_for

from clawmem.errors import redact
from clawmem.jobs.records import JobRecord
from clawmem.jobs.schedule import ACCEPTED_SYNTAX
from clawmem.jobs.status import RetentionStatus, recent_turns, retention_status
from dashboard import state
from dashboard.views.rendering import format_duration, render_page, shell_command

bp = Blueprint("jobs", __name__)

RECENT_TURNS = 50


def moment(seconds: float | None) -> datetime | None:
    """Return Unix seconds as the naive UTC time the templates' ``when`` filter takes."""
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def audit_moment(text: Any) -> datetime | None:
    """Return an audit line's ``time`` as a naive UTC time, or ``None`` when unreadable."""
    try:
        return datetime.fromisoformat(str(text)).astimezone(UTC).replace(tzinfo=None)
    except ValueError:
        return None


def counts_text(counts: Any) -> str:
    """Return deletion counts as ``3 conversations, 12 messages, 0 expired``."""
    if not isinstance(counts, dict) or not counts:
        return "nothing"
    return ", ".join(f"{amount} {name}" for name, amount in counts.items())


def retention_view(status: RetentionStatus) -> dict[str, Any]:
    """Return what the page and the Overview's retention card show of scheduled retention."""
    last = status.last_run
    audited = [
        {
            "command": command,
            "when": audit_moment(line.get("time")),
            "outcome": line.get("outcome"),
            "deleted": counts_text(line.get("counts")),
            "dry_run": bool(line.get("dry_run")),
        }
        for command, line in sorted(status.audited.items())
    ]
    return {
        "scheduled": status.scheduled,
        "expression": status.expression,
        "explained": status.schedule.explain() if status.schedule else None,
        "days": status.schedule.retention_days if status.schedule else None,
        "problem": redact(status.problem) if status.problem else None,
        "next_run": status.next_run,
        "last": None
        if last is None
        else {
            "when": moment(last.finished_at),
            "outcome": last.status,
            "deleted": counts_text(last.counts),
            "reason": last.reason,
            "tick": moment(last.tick),
        },
        "audited": audited,
    }


def turn_row(record: JobRecord) -> dict[str, Any]:
    """Return one background turn as the page lists it."""
    return {
        "job_id": record.job_id,
        "status": record.status,
        "attempts": record.attempts,
        "max_attempts": record.max_attempts,
        "queued": moment(record.queued_at),
        "finished": moment(record.finished_at),
        "conversation_id": record.conversation_id,
        "conversation_url": url_for("conversations.detail", conversation_id=record.conversation_id)
        if record.conversation_id
        else None,
        "error_class": record.error_class,
        "reason": record.reason,
    }


@bp.get("/jobs")
def index() -> str:
    """Scheduled tasks with their schedule, last run (what it deleted) and next run, and the
    recent background turns with their status, attempts and conversation."""
    site = state.site()
    settings = site.settings
    return render_page(
        "jobs/index.html",
        {},
        retention=retention_view(retention_status(site)),
        turns=[turn_row(record) for record in recent_turns(site, RECENT_TURNS)],
        syntax=ACCEPTED_SYNTAX,
        job_ttl=format_duration(settings.job_ttl),
        worker_command=shell_command("flask", "claw", "worker", "--workers", "2"),
    )
