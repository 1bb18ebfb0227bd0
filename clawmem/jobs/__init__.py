"""Background work on Huey (extra ``clawmem[worker]``): queued turns and scheduled retention.

- :class:`TurnQueue` (``TurnQueue.from_settings(settings)``): ``enqueue(message,
  conversation_id=None, user_id="")`` returns a job id at once, ``job(job_id)`` its record;
- ``clawmem worker`` runs Huey's consumer: the turns, a reaper for turns whose worker died at any
  point (:mod:`clawmem.jobs.leases`, :mod:`clawmem.jobs.recovery`), and with
  ``CLAW_RETENTION_SCHEDULE`` prune and sweep on that cron schedule;
- every job's state is a memory entry in ``phpclaw_jobs`` with a TTL of ``CLAW_JOB_TTL``.

The queue stands above :mod:`clawmem.turn.pipeline` and :mod:`clawmem.sites.operations`; nothing below
imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clawmem.clock import Clock
from clawmem.jobs.backend import PayloadSeal, QueueLocation, queue_location
from clawmem.jobs.records import JOBS_NAMESPACE, JobBook, JobRecord
from clawmem.jobs.recovery import settle_subject
from clawmem.jobs.schedule import ACCEPTED_SYNTAX, RetentionSchedule, schedule_from_settings
from clawmem.jobs.turns import TurnQueue
from clawmem.settings import Settings

__all__ = [
    "ACCEPTED_SYNTAX",
    "JOBS_NAMESPACE",
    "JobBook",
    "JobRecord",
    "PayloadSeal",
    "QueueLocation",
    "RetentionSchedule",
    "TurnQueue",
    "cancel_subject_turns",
    "queue_exists",
    "queue_location",
    "schedule_from_settings",
    "settle_subject_turns",
]


def queue_exists(settings: Settings) -> bool:
    """Return whether the settings' queue may hold anything: a Redis queue always may, a SQLite
    queue only once its file exists (nothing here creates it)."""
    location = queue_location(settings)
    return location.kind != "sqlite" or Path(location.where).exists()


def cancel_subject_turns(
    settings: Settings, user_id: str, dry_run: bool = False, clock: Clock = time.time
) -> dict[str, int]:
    """Cancel the queued turns of ``user_id`` for ``erase --user-id`` (each record says why);
    return ``{"cancelled": n, "running": n}``, zeros when the site has no queue yet. Raises
    :class:`clawmem.ConfigError` for an unusable queue URL, and the queue's own errors when it
    cannot be reached, so an erasure never goes ahead believing nothing was queued."""
    if not queue_exists(settings):
        return {"cancelled": 0, "running": 0}
    return TurnQueue.from_settings(settings, clock=clock).cancel_subject(user_id, dry_run=dry_run)


def settle_subject_turns(
    settings: Settings,
    user_id: str,
    wait_seconds: float,
    dry_run: bool = False,
    clock: Clock = time.time,
    on_wait: Callable[[list[tuple[str, float | None]]], Any] | None = None,
) -> dict[str, int]:
    """Cancel the queued turns of ``user_id`` and wait up to ``wait_seconds`` for their running
    ones to end, for ``erase --user-id`` (see :func:`clawmem.jobs.recovery.settle_subject`);
    ``{"cancelled": 0, "waited": 0}`` when the site has no queue yet. Raises
    :class:`clawmem.errors.TurnsStillRunning` when some still run after the wait, and as
    :func:`cancel_subject_turns` does for a queue that cannot be used."""
    if not queue_exists(settings):
        return {"cancelled": 0, "running": 0} if dry_run else {"cancelled": 0, "waited": 0}
    queue = TurnQueue.from_settings(settings, clock=clock)
    return settle_subject(queue, user_id, wait_seconds, dry_run=dry_run, on_wait=on_wait)
