"""What happens to a job whose worker is gone, and to a subject's jobs when they are erased.

- :func:`reap` (any worker's reaper, once a minute, one at a time per site) finds every job
  whose lease ran out and hands it over again: a running job whose worker died mid-turn, and a
  queued job whose task was lost with the worker that had taken it from the queue. A job whose
  turn was committed before its worker died is found stored by its next attempt and only marked
  ``done`` (see :meth:`clawmem.jobs.TurnQueue.run`);
- :func:`settle_subject` (``erase --user-id``) cancels a subject's queued turns and waits for
  their running ones to end, so that an erasure that goes ahead leaves nothing of the subject
  to be stored after it.

Both take a job's claim before they change it (see :mod:`clawmem.jobs.leases`), so neither ever
races a live worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from clawmem.errors import TurnsStillRunning

# The queue these functions work on is a clawmem.jobs.TurnQueue, which calls them: it stands
# above this module, so it is not imported here.
TurnQueue = Any

CANCELLED_BY_ERASE = "cancelled: erase --user-id removed this subject's queued turns"
CANCELLED_LOST_BY_ERASE = (
    "cancelled: its worker had stopped mid-turn, and erase --user-id removed this subject's turns"
)
SETTLE_POLL_SECONDS = 0.25  # how often an erasure looks again at the subject's running turns


def reap(queue: TurnQueue) -> dict[str, int]:
    """Requeue every job whose worker died once its lease has run out, or fail it when its
    attempts are spent or the tables cannot tell whether it was stored (phpClaw's shape keeps no
    job id); return ``{"requeued": n, "failed": n}``. A queued job counts as lost only when its
    hand-over lease ran out and its task is neither in the queue nor in its schedule. Runs
    under a site-wide lock."""
    counts = {"requeued": 0, "failed": 0}
    lock = queue.store.lock("reaper", queue.clock)
    if not lock.acquire(queue.lease_seconds):
        return counts
    try:
        now = queue.clock()
        handed: set[str] | None = None  # read once, and only when a queued job's lease ran out
        for record in queue.book.turns({"queued", "running"}):
            if (record.lease_until or 0) > now:
                continue
            if record.status == "queued":
                if handed is None:
                    handed = queue.store.handed_over(queue.task.name)
                if record.job_id in handed:
                    continue  # still waiting its turn in the queue: nothing was lost
            outcome = _reap_one(queue, record.job_id)
            if outcome is not None:
                counts[outcome] += 1
    finally:
        lock.release()
    return counts


def _reap_one(queue: TurnQueue, job_id: str) -> str | None:
    """Requeue or fail one job whose lease ran out, under its claim; return which, or ``None``
    when a live worker holds it or it has moved on meanwhile."""
    claim = queue.store.claim(job_id, queue.clock)
    if not claim.acquire(queue.lease_seconds):
        return None  # a live worker holds it: its lease is renewed on the claim
    try:
        record = queue.book.get(job_id)  # read again under the claim: it may have moved on
        now = queue.clock()
        if record is None or record.finished or (record.lease_until or 0) > now:
            return None
        if not record.conversation_id or not record.position:
            return None
        if not queue.store.turn_waiting(record.conversation_id, record.position):
            queue._finish(
                record,
                "failed",
                error_class="WorkerLost",
                reason="its queued message is gone, so it cannot run",
            )
            return "failed"
        if record.status == "running" and record.attempts >= record.max_attempts:
            queue._finish(
                record,
                "failed",
                error_class="WorkerLost",
                reason=f"its worker stopped mid-turn; all {record.max_attempts} attempts spent",
            )
            return "failed"
        if record.status == "running" and not queue.site.conversations.stores_metadata:
            queue._finish(
                record,
                "failed",
                error_class="WorkerLost",
                reason="its worker stopped mid-turn, and these tables keep no job id to tell "
                "whether the turn was stored, so it is not run again",
            )
            return "failed"
        reason = (
            "requeued: its worker stopped mid-turn (the lease ran out)"
            if record.status == "running"
            else "requeued: its worker stopped after taking it from the queue, before it ran"
        )
        requeued = queue.book.put(
            record.changed(status="queued", lease_until=now + queue.lease_seconds, reason=reason)
        )
        queue._hand_over(requeued)
        return "requeued"
    finally:
        claim.release()


def _settle_pass(queue: TurnQueue, user_id: str, dry_run: bool) -> tuple[int, list[tuple[str, float | None]]]:
    """Cancel (or, on a dry run, count) every queued turn of ``user_id`` that no live worker
    holds; return how many, and the job id and lease expiry of each one a live worker holds."""
    cancelled = 0
    running: list[tuple[str, float | None]] = []
    for payload in queue.store.turns():
        if payload.get("user_id") != user_id:
            continue
        job_id = str(payload.get("job_id"))
        conversation_id, position = str(payload.get("conversation_id")), int(payload.get("position") or 0)
        claim = queue.store.claim(job_id, queue.clock)
        if dry_run:
            held = claim.holder()
            if claim.live():
                running.append((job_id, held["expires_at"] if held else None))
            elif not ((record := queue.book.get(job_id)) is not None and record.finished):
                cancelled += 1
            continue
        if not claim.acquire(queue.lease_seconds):
            held = claim.holder()
            running.append((job_id, held["expires_at"] if held else None))
            continue
        try:
            record = queue.book.get(job_id)  # under the claim: no worker changes it now
            ended = record is not None and record.finished
            if record is not None and not ended:
                reason = CANCELLED_LOST_BY_ERASE if record.status == "running" else CANCELLED_BY_ERASE
                queue.book.put(
                    record.changed(
                        status="cancelled", finished_at=queue.clock(), lease_until=None, reason=reason
                    )
                )
            # The record first, then the payload: the order a finished job keeps (see _finish).
            if queue.store.drop_turn(conversation_id, position) and not ended:
                cancelled += 1
        finally:
            claim.release()
    return cancelled, running


def cancel_subject(queue: TurnQueue, user_id: str, dry_run: bool = False) -> dict[str, int]:
    """Cancel every queued turn of ``user_id`` that no live worker holds (its record says why,
    its payload is deleted), waiting for nothing; return ``{"cancelled": n, "running": n}``."""
    cancelled, running = _settle_pass(queue, user_id, dry_run)
    return {"cancelled": cancelled, "running": len(running)}


def settle_subject(
    queue: TurnQueue,
    user_id: str,
    wait_seconds: float,
    *,
    dry_run: bool = False,
    on_wait: Callable[[list[tuple[str, float | None]]], Any] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
) -> dict[str, int]:
    """Cancel every queued turn of ``user_id`` and wait up to ``wait_seconds`` for those running
    to end (each one whose worker died, its lease run out, is cancelled too); return
    ``{"cancelled": n, "waited": n}`` once none is left, so nothing of the subject is stored
    after. ``on_wait`` is called once, with the running jobs, before the first wait. A dry run
    waits for nothing and returns ``{"cancelled": n, "running": n}``.

    Raises :class:`clawmem.errors.TurnsStillRunning` naming the jobs whose workers still renew
    their leases when the wait is over; nothing of theirs is cancelled then."""
    deadline = time.monotonic() + wait_seconds
    cancelled, waited = 0, set()
    while True:
        found, running = _settle_pass(queue, user_id, dry_run)
        cancelled += found
        if dry_run:
            return {"cancelled": cancelled, "running": len(running)}
        if not running:
            return {"cancelled": cancelled, "waited": len(waited)}
        if time.monotonic() >= deadline:
            raise TurnsStillRunning(running, wait_seconds)
        if not waited and on_wait is not None:
            on_wait(running)
        waited.update(job_id for job_id, _ in running)
        sleep(SETTLE_POLL_SECONDS)
