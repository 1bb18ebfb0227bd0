"""Scheduled retention: CLAW_RETENTION_SCHEDULE read as cron, and one run per tick per site.

Huey's own ``crontab`` is not cron (a subset of the syntax, the two day fields ANDed, no
next-run time), so the expression is read by cronsim, the cron evaluator Healthchecks uses,
in UTC on the injected clock. Huey only wakes the retention task every minute, on every
worker; the task asks the schedule whether a tick has come that has not run yet, and an
expiring site-wide lock makes exactly one worker run it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from clawmem.clock import Clock
from clawmem.errors import ConfigError
from clawmem.jobs.records import JobRecord
from clawmem.settings import ENV_PREFIX, Settings

ACCEPTED_SYNTAX = (
    "five fields in UTC: minute hour day-of-month month day-of-week, each *, a number, a range a-b, "
    "a list a,b, a step */n or a-b/n; month and day names (jan, mon); L (last day), W (nearest "
    "weekday) and # (nth weekday) as in cron; when both day fields are restricted, either may match"
)
# How long a run may hold the site's retention lock before another worker may take it over: a
# killed prune must not hold it for ever. A live run renews it between its two steps.
RETENTION_LOCK_SECONDS = 3600
# A tick counts as due for this long after its time: a worker that was down for longer skips it.
DUE_WINDOW_SECONDS = 3600
RETENTION_JOB_ID = "retention"


@dataclass(frozen=True)
class RetentionSchedule:
    """A parsed ``CLAW_RETENTION_SCHEDULE`` and the window prune keeps."""

    expression: str
    retention_days: int

    @classmethod
    def parse(cls, expression: str, retention_days: int | None) -> RetentionSchedule:
        """Return the schedule of ``expression``; raises :class:`ConfigError` in one line for an
        expression cron would not take (see :data:`ACCEPTED_SYNTAX`) or when no retention window
        (``CLAW_RETENTION_DAYS``) says what prune keeps."""
        from cronsim import CronSim, CronSimError

        text = " ".join(str(expression).split())
        if len(text.split()) != 5:
            raise ConfigError(
                f"{ENV_PREFIX}RETENTION_SCHEDULE {expression!r} is not a cron expression: expected "
                f"{ACCEPTED_SYNTAX}"
            )
        try:
            next(CronSim(text, datetime(2000, 1, 1, tzinfo=UTC)))
        except (CronSimError, StopIteration, ValueError) as exc:
            raise ConfigError(
                f"{ENV_PREFIX}RETENTION_SCHEDULE {expression!r} is not a cron expression ({exc}): expected "
                f"{ACCEPTED_SYNTAX}"
            ) from None
        if retention_days is None:
            raise ConfigError(
                f"{ENV_PREFIX}RETENTION_SCHEDULE is set but {ENV_PREFIX}RETENTION_DAYS is not: set the "
                "window prune keeps (for example CLAW_RETENTION_DAYS=90)"
            )
        return cls(text, retention_days)

    def next_run(self, now: float) -> datetime:
        """Return the first tick strictly after ``now`` (Unix seconds), as an aware UTC time."""
        from cronsim import CronSim

        return next(CronSim(self.expression, datetime.fromtimestamp(now, UTC)))

    def latest_tick(self, now: float) -> datetime:
        """Return the latest tick at or before ``now`` (Unix seconds), as an aware UTC time."""
        from cronsim import CronSim

        minute = datetime.fromtimestamp(now, UTC).replace(second=0, microsecond=0)
        return next(CronSim(self.expression, minute + timedelta(minutes=1), reverse=True))

    def explain(self) -> str:
        """Return the schedule in words ("At 03:00 every day")."""
        from cronsim import CronSim

        return CronSim(self.expression, datetime(2000, 1, 1, tzinfo=UTC)).explain()


def schedule_from_settings(settings: Settings) -> RetentionSchedule | None:
    """Return the settings' retention schedule, or ``None`` when none is set; raises
    :class:`ConfigError` as :meth:`RetentionSchedule.parse` does."""
    if not settings.retention_schedule.strip():
        return None
    return RetentionSchedule.parse(settings.retention_schedule, settings.retention_days)


@dataclass(frozen=True)
class TickDecision:
    """Whether a retention tick is to run now: ``tick`` (Unix seconds) and, when not, why."""

    tick: float
    due: bool
    reason: str = ""


def decide(schedule: RetentionSchedule, now: float, last_tick: float | None) -> TickDecision:
    """Return whether the latest tick at or before ``now`` is due: it has not run yet
    (``last_tick`` is the tick of the last run) and came less than an hour ago."""
    tick = schedule.latest_tick(now).timestamp()
    if last_tick is not None and tick <= last_tick:
        return TickDecision(tick, False, "this tick already ran")
    if now - tick >= DUE_WINDOW_SECONDS:
        return TickDecision(tick, False, "the latest tick is more than an hour old")
    return TickDecision(tick, True)


def record_retention(
    queue: Any, schedule: RetentionSchedule, tick: float, started: float, result: Mapping[str, Any]
) -> JobRecord:
    """Record a scheduled retention run in ``phpclaw_jobs`` under ``retention``, kept until an
    hour (``CLAW_JOB_TTL``) after the next run is due, so every host's dashboard sees it."""
    now = queue.clock()
    keep = int(schedule.next_run(now).timestamp() - now) + queue.settings.job_ttl
    record = JobRecord(
        RETENTION_JOB_ID,
        kind="retention",
        status="done" if result.get("outcome") == "ok" else "failed",
        started_at=started,
        finished_at=now,
        attempts=1,
        max_attempts=1,
        worker=None,
        reason=result.get("reason"),
        counts=dict(result.get("counts") or {}),
        schedule=schedule.expression,
        tick=tick,
    )
    return queue.book.put(record, ttl=max(keep, 1))


RetentionRunner = Callable[[], dict[str, Any]]


def run_retention_tick(
    queue: Any,
    schedule: RetentionSchedule,
    runner: RetentionRunner,
    clock: Clock = time.time,
    force: bool = False,
) -> dict[str, Any]:
    """Run ``runner`` (prune then sweep, audited as the CLI's commands) for the due tick, once
    across the site: under the site's retention lock, and only when the tick has not run yet
    (``force`` runs the latest tick even so). Return what happened:
    ``{"ran": bool, "reason": ..., "tick": ..., "outcome": ..., "counts": ...}``; the outcome is
    also recorded in ``phpclaw_jobs`` under ``retention``."""
    now = clock()
    lock = queue.store.lock("retention", clock)
    if not lock.acquire(RETENTION_LOCK_SECONDS):
        return {"ran": False, "reason": "another worker holds the retention lock"}
    try:
        last = queue.store.last_retention_tick()
        decision = decide(schedule, now, last)
        if not decision.due and not force:
            return {"ran": False, "reason": decision.reason, "tick": decision.tick}
        queue.store.set_last_retention_tick(decision.tick)
        started = clock()
        result = runner()
        record_retention(queue, schedule, decision.tick, started, result)
        return {"ran": True, "tick": decision.tick, **result}
    finally:
        lock.release()
