"""Leases: how a job is held by exactly one worker, and found again when that worker died.

Huey hands a task out by deleting it from the queue, and has no acknowledgement, so a worker
killed at any point after that would leave its job behind. Two leases keep every job moving:

- the **claim** (an :class:`~clawmem.jobs.backend.ExpiringLock` per job in the queue's storage):
  the worker that runs a job, the reaper that requeues it and an erasure that cancels it each
  take it first, so only one of them changes the job at a time. A running job's worker renews
  it, and the job record's ``lease_until`` with it, every third of a lease; once it has run out
  anyone may take it over;
- the **hand-over lease** of a queued job (its record's ``lease_until``): by then a worker should
  have claimed it. When it has run out and the job's task is neither in the queue nor in its
  schedule, the task was lost with its worker, and the reaper hands the job over again.

:class:`LeaseKeeper` is the thread of a worker process that renews its running jobs' leases.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from clawmem.clock import Clock
from clawmem.jobs.backend import ExpiringLock
from clawmem.jobs.records import JobBook

log = logging.getLogger("clawmem.worker")

# For the tests only, and off unless set: "<point>:<file>" stops a worker thread for ever at
# that point of a turn (see pause_at), so that a test can SIGKILL the worker exactly there.
PAUSE_VARIABLE = "CLAWTEST_WORKER_PAUSE"
PAUSE_POINTS = ("taken", "running", "stored", "done")


def pause_at(point: str) -> None:
    """Do nothing, unless :data:`PAUSE_VARIABLE` names ``point`` (one of :data:`PAUSE_POINTS`):
    then create the file it names and block this thread until the process is killed."""
    wanted = os.environ.get(PAUSE_VARIABLE)
    if not wanted:
        return
    name, _, marker = wanted.partition(":")
    if name != point or not marker:
        return
    Path(marker).write_text(point)
    threading.Event().wait()


class LeaseKeeper:
    """Renews the claim and the record lease of every job this process runs, from one thread,
    a third of ``lease_seconds`` apart, until the job is released. A claim that another took
    over (the worker was too slow and its lease ran out) is not renewed again."""

    def __init__(self, book: JobBook, lease_seconds: float, clock: Clock = time.time) -> None:
        self.book = book
        self.lease_seconds = lease_seconds
        self.clock = clock
        self._held: dict[str, tuple[str | None, ExpiringLock]] = {}  # job id -> (worker, claim)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, job_id: str, worker: str | None, claim: ExpiringLock) -> None:
        """Renew the job's claim and record lease until :meth:`release`."""
        with self._lock:
            self._held[job_id] = (worker, claim)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._keep, name="clawmem-leases", daemon=True)
                self._thread.start()

    def release(self, job_id: str) -> None:
        """Stop renewing the job's leases; returns once no renewal of it is under way, so the
        record written next is never overwritten by one."""
        with self._lock:
            self._held.pop(job_id, None)

    def renew_all(self) -> None:
        """Renew every held job's claim, then its record's ``lease_until``, once."""
        with self._lock:
            for job_id, (worker, claim) in list(self._held.items()):
                try:
                    if not claim.renew(self.lease_seconds):
                        log.warning("job %s: its lease ran out and was taken over", job_id)
                        self._held.pop(job_id, None)
                        continue
                    current = self.book.get(job_id)
                    if current is not None and current.status == "running" and current.worker == worker:
                        self.book.put(current.changed(lease_until=self.clock() + self.lease_seconds))
                except Exception as exc:  # the lease thread's loop must outlive any one failure
                    # A store that failed now may answer at the next renewal; the class only,
                    # as a message may quote stored data.
                    log.warning("lease of job %s not renewed: %s", job_id, type(exc).__name__)

    def _keep(self) -> None:
        while True:
            time.sleep(self.lease_seconds / 3)
            self.renew_all()
