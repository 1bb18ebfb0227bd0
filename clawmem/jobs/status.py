"""What the dashboard shows of background work: read from ``phpclaw_jobs`` and the audit log only.

Nothing here opens the queue (or needs Huey): the job records and the audit log say everything
an operator needs to see, and a page must not create a queue file by looking.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from clawmem.errors import ConfigError
from clawmem.jobs.records import JobBook, JobRecord
from clawmem.jobs.schedule import RETENTION_JOB_ID, RetentionSchedule, schedule_from_settings
from clawmem.sites.site import Site

AUDIT_TAIL_BYTES = 1 << 20  # the last run of a command is near the end of the log
RETENTION_COMMANDS = ("prune", "sweep")


@dataclass(frozen=True)
class RetentionStatus:
    """Scheduled retention of a site: the schedule (or why it is unusable), the next run, the
    last scheduled run's record (from any host) and the last audit line of prune and of sweep
    in this host's audit log."""

    expression: str | None
    schedule: RetentionSchedule | None
    problem: str | None
    next_run: datetime | None
    last_run: JobRecord | None
    audited: dict[str, dict[str, Any]]

    @property
    def scheduled(self) -> bool:
        """Return whether retention runs on a schedule that a worker accepts."""
        return self.schedule is not None


def last_audit_lines(path: Path, commands: tuple[str, ...] = RETENTION_COMMANDS) -> dict[str, dict[str, Any]]:
    """Return the last audit line of each of ``commands`` in the log at ``path`` (read from its
    last megabyte), by command; a command with no line there is left out."""
    if not path.is_file():
        return {}
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - AUDIT_TAIL_BYTES))
        raw = handle.read().decode("utf-8", errors="replace")
    found: dict[str, dict[str, Any]] = {}
    for text in raw.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and line.get("command") in commands:
            found[line["command"]] = line
    return found


def retention_status(site: Site) -> RetentionStatus:
    """Return the site's :class:`RetentionStatus` on the site's clock."""
    settings = site.settings
    expression = settings.retention_schedule.strip() or None
    schedule, problem, next_run = None, None, None
    try:
        schedule = schedule_from_settings(settings)
    except ConfigError as exc:
        problem = str(exc)
    if schedule is not None:
        next_run = schedule.next_run(site.clock()).replace(tzinfo=None)
    book = JobBook(site.driver, settings.job_ttl, site.clock)
    last = book.get(RETENTION_JOB_ID)
    return RetentionStatus(expression, schedule, problem, next_run, last, last_audit_lines(site.audit_path))


def recent_turns(site: Site, limit: int = 50) -> list[JobRecord]:
    """Return the newest ``limit`` background turns' records of the site, newest first."""
    return JobBook(site.driver, site.settings.job_ttl, site.clock).turns()[:limit]
