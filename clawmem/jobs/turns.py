"""TurnQueue: a turn handed to the queue now, run by a worker later, recorded in ``phpclaw_jobs``.

A web app calls :meth:`TurnQueue.enqueue` and returns at once with a job id; any ``clawmem
worker`` of the site runs the turn through :class:`clawmem.Claw`. What keeps it honest:

- the payload (message, conversation id, user id) waits in the queue's storage, never in the
  job record; a task returns ids, never the reply text;
- one conversation's turns run one after the other, in the order queued (each turn has a
  position in its conversation and waits until the turn before it has ended);
- a provider failure is retried with backoff, up to ``max_attempts`` runs in all;
- Huey has no acknowledgement, so a running job carries a lease that its worker renews, and
  :meth:`TurnQueue.reap` requeues (or, with the attempts spent, fails) a job whose lease ran out;
- the job id goes into the turn's one append, which refuses to store the same job twice, so a
  retry after the commit finds the turn stored and only marks the job done.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from clawmem.clock import Clock
from clawmem.conversations import validate_conversation_id, wordpress_user_id
from clawmem.errors import ConfigError, InvalidKey, JobRefused, ProviderError, StorageError
from clawmem.ids import new_id
from clawmem.jobs.backend import PayloadSeal, QueueStore, open_huey
from clawmem.jobs.records import JobBook, JobRecord, one_line
from clawmem.keystores import cipher_for
from clawmem.rules import check_size
from clawmem.settings import ENV_PREFIX, PHPCLAW_SCHEMA, Settings
from clawmem.site import Site

log = logging.getLogger("clawmem.worker")

LEASE_SECONDS = 60.0  # a running job's lease; its worker renews it every third of that
MAX_ATTEMPTS = 3
RETRY_DELAY_SECONDS = 2.0  # before the second run; doubled before each later one
WAIT_FOR_EARLIER_SECONDS = 0.5  # a turn whose predecessor runs waits this long, then is rescheduled
TURN_TASK = "clawmem_turn"
REAPER_TASK = "clawmem_reaper"
CANCELLED_BY_ERASE = "cancelled: erase --user-id removed this subject's queued turns"


def _retryable(exc: BaseException) -> bool:
    """Return whether a failed run may succeed when tried again (the provider or a store failed)."""
    import sqlalchemy as sa

    return isinstance(
        exc, (ProviderError, StorageError, ConnectionError, TimeoutError, sa.exc.OperationalError)
    )


def worker_name() -> str:
    """Return this worker thread's name in a record: host, process id and thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


class TurnQueue:
    """The background turns of one site (see the module docstring).

    ``claw_factory`` builds the :class:`clawmem.Claw` a worker runs turns with (one per worker
    thread); a process that only enqueues needs none.
    """

    def __init__(
        self,
        site: Site,
        huey: Any,
        claw_factory: Callable[[], Any] | None = None,
        *,
        lease_seconds: float = LEASE_SECONDS,
        max_attempts: int = MAX_ATTEMPTS,
        retry_delay: float = RETRY_DELAY_SECONDS,
    ) -> None:
        self.site = site
        self.settings = site.settings
        self.clock: Clock = site.clock
        self.huey = huey
        self.store = QueueStore(huey, PayloadSeal(cipher_for(site.settings), site.prefix))
        self.book = JobBook(site.driver, site.settings.job_ttl, site.clock)
        self.claw_factory = claw_factory
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self._claws = threading.local()
        self._leases: dict[str, str | None] = {}  # running job id -> the worker holding its lease
        self._leases_lock = threading.Lock()
        self._lease_keeper: threading.Thread | None = None
        self.task = huey.task(name=TURN_TASK)(self._run_task)

    @classmethod
    def from_settings(
        cls, settings: Settings, claw_factory: Callable[[], Any] | None = None, clock: Clock = time.time
    ) -> TurnQueue:
        """Return the queue of the settings' site (``CLAW_QUEUE_URL``). Raises
        :class:`clawmem.ConfigError` for a queue URL of an unknown scheme or a missing extra."""
        return cls(Site(settings, clock), open_huey(settings), claw_factory)

    # -- handing a turn over ------------------------------------------------------------------

    def enqueue(self, message: str, conversation_id: str | None = None, user_id: str = "") -> str:
        """Queue one turn and return its job id at once; the reply is stored in the conversation
        (a new one when ``conversation_id`` is ``None``: the record names it).

        Raises :class:`clawmem.errors.JobRefused` with the reason, queueing nothing, when message
        storage is off (the reply would have nowhere to go), or for a bad message or id.
        """
        if not self.settings.store_messages:
            raise JobRefused(
                f"a background turn's reply is only kept in its conversation, and {ENV_PREFIX}STORE_MESSAGES "
                "is off: run the turn in the request with Claw.send instead"
            )
        if not isinstance(message, str) or not message:
            raise JobRefused("a background turn needs a non-empty message (a str)")
        if not isinstance(user_id, str):
            raise JobRefused(f"user_id must be a str, got {type(user_id).__name__}")
        try:
            conversation_id = (
                validate_conversation_id(conversation_id) if conversation_id is not None else new_id()
            )
            check_size("a background turn's message", message, self.settings.max_value_bytes)
            if self.settings.schema == PHPCLAW_SCHEMA:
                wordpress_user_id(conversation_id, user_id)
        except (InvalidKey, ValueError) as exc:
            raise JobRefused(f"not queued: {exc}") from None
        job_id = new_id()
        now = self.clock()
        position = self.store.put_turn(job_id, conversation_id, {"message": message, "user_id": user_id})
        try:
            record = JobRecord(
                job_id,
                conversation_id=conversation_id,
                position=position,
                queued_at=now,
                max_attempts=self.max_attempts,
            )
            self.book.put(record)
            self._hand_over(record)
        except BaseException:
            self.store.drop_turn(conversation_id, position)
            raise
        return job_id

    def _hand_over(self, record: JobRecord) -> None:
        # The task carries ids only: the message waits in the queue's storage (see QueueStore).
        task = self.task.s(record.job_id, record.conversation_id, record.position)
        self.huey.enqueue(task)

    def job(self, job_id: str) -> JobRecord | None:
        """Return a job's record (with its ``status``), or ``None`` once it has aged out."""
        return self.book.get(job_id)

    def recent(self, limit: int = 50) -> list[JobRecord]:
        """Return the newest ``limit`` records of background turns."""
        return self.book.turns()[:limit]

    # -- running a turn (inside a worker) -----------------------------------------------------

    def claw(self) -> Any:
        """Return this thread's Claw, built on first use by the ``claw_factory``. Raises
        :class:`clawmem.ConfigError` when the queue has none."""
        claw = getattr(self._claws, "claw", None)
        if claw is None:
            if self.claw_factory is None:
                raise ConfigError(
                    "this TurnQueue has no claw_factory, so it cannot run turns: build it with "
                    "claw_factory=, as the clawmem worker does"
                )
            claw = self._claws.claw = self.claw_factory()
        return claw

    def _run_task(self, job_id: str, conversation_id: str, position: int) -> dict[str, str] | None:
        from huey.exceptions import RetryTask

        outcome = self.run(job_id, conversation_id, position)
        if isinstance(outcome, float):
            raise RetryTask(delay=outcome)
        return outcome

    def run(self, job_id: str, conversation_id: str, position: int) -> dict[str, str] | float | None:
        """Run the job's turn (the conversation's turn ``position``) once; return its ids
        (``job_id``, ``conversation_id``, ``run_id``), ``None`` when there is nothing to run
        (ended, cancelled, or run by another worker), or the seconds after which to run it again
        (the turn before it has not ended, or the attempt failed and may be retried)."""
        payload = self.store.turn(job_id, conversation_id, position)
        if payload is None:
            return None  # ended or cancelled: its payload went with it
        record = self.book.get(job_id)
        if record is None:  # aged out while it waited: start its record again
            record = JobRecord(
                job_id,
                conversation_id=conversation_id,
                position=position,
                queued_at=self.clock(),
                max_attempts=self.max_attempts,
                reason="its record had aged out while queued",
            )
        if record.finished:
            return None
        if record.status == "running" and (record.lease_until or 0) > self.clock():
            return None  # another worker holds it
        if self._earlier_turn_waiting(conversation_id, position):
            return WAIT_FOR_EARLIER_SECONDS
        earlier_attempts = record.attempts
        record = self.book.put(
            record.changed(
                status="running",
                attempts=record.attempts + 1,
                started_at=self.clock(),
                lease_until=self.clock() + self.lease_seconds,
                worker=worker_name(),
            )
        )
        # A first attempt cannot find itself stored; a later one may: its worker died after the
        # commit and before saying so.
        stored = self.site.conversations.job_messages(conversation_id, job_id) if earlier_attempts else []
        if stored:
            run_id = next((m.metadata.get("run_id") for m in stored if isinstance(m.metadata, dict)), None)
            return self._finish(record, "done", run_id=run_id, reason="found stored by an earlier attempt")
        self._hold_lease(job_id, record.worker)
        try:
            reply = self.claw().send(
                payload["message"], conversation_id, payload.get("user_id", ""), job_id=job_id
            )
        except Exception as exc:  # the job's boundary: any failure of the turn is its record's outcome
            self._release_lease(job_id)
            return self._failed(record, exc)
        self._release_lease(job_id)
        return self._finish(record, "done", run_id=reply.run_id)

    def _earlier_turn_waiting(self, conversation_id: str, position: int) -> bool:
        """Return whether the conversation's turn before ``position`` is still queued or running,
        after waiting up to :data:`WAIT_FOR_EARLIER_SECONDS` for it to end."""
        if position <= 1:
            return False
        deadline = time.monotonic() + WAIT_FOR_EARLIER_SECONDS
        while self.store.turn_waiting(conversation_id, position - 1):
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.02)
        return False

    def _hold_lease(self, job_id: str, worker: str | None) -> None:
        """Have this process's lease keeper renew the running job's lease until it is released."""
        with self._leases_lock:
            self._leases[job_id] = worker
            if self._lease_keeper is None or not self._lease_keeper.is_alive():
                self._lease_keeper = threading.Thread(
                    target=self._keep_leases, name="clawmem-leases", daemon=True
                )
                self._lease_keeper.start()

    def _release_lease(self, job_id: str) -> None:
        """Stop renewing the job's lease; returns once no renewal of it is under way, so the
        record written next is never overwritten by one."""
        with self._leases_lock:
            self._leases.pop(job_id, None)

    def _keep_leases(self) -> None:
        # One thread per process renews every running job's lease, a third of a lease apart.
        while True:
            time.sleep(self.lease_seconds / 3)
            with self._leases_lock:
                for job_id, worker in list(self._leases.items()):
                    try:
                        current = self.book.get(job_id)
                        if current is not None and current.status == "running" and current.worker == worker:
                            self.book.put(current.changed(lease_until=self.clock() + self.lease_seconds))
                    except Exception as exc:  # the lease thread's loop must outlive any one failure
                        # A store that failed now may answer at the next renewal; the class only,
                        # as a message may quote stored data.
                        log.warning("lease of job %s not renewed: %s", job_id, type(exc).__name__)

    def _failed(self, record: JobRecord, exc: BaseException) -> float | None:
        reason = one_line(exc) or type(exc).__name__
        if _retryable(exc) and record.attempts < record.max_attempts:
            delay = self.retry_delay * 2 ** (record.attempts - 1)
            self.book.put(
                record.changed(
                    status="queued",
                    lease_until=None,
                    error_class=type(exc).__name__,
                    reason=f"attempt {record.attempts} failed, retrying in {delay:g} s: {reason}",
                )
            )
            return float(delay)
        self._finish(record, "failed", error_class=type(exc).__name__, reason=reason)
        return None

    def _finish(self, record: JobRecord, status: str, **changes: Any) -> dict[str, str] | None:
        finished = record.changed(status=status, finished_at=self.clock(), lease_until=None, **changes)
        record = self.book.put(finished)
        if record.conversation_id and record.position:
            self.store.drop_turn(record.conversation_id, record.position)
        if status != "done":
            return None
        return {
            "job_id": record.job_id,
            "conversation_id": record.conversation_id or "",
            "run_id": record.run_id or "",
        }

    # -- the reaper and erasure -----------------------------------------------------------------

    def reap(self) -> dict[str, int]:
        """Requeue every running job whose lease ran out (its worker died), or fail it when its
        attempts are spent or the tables cannot tell whether it was stored (phpClaw's shape keeps
        no job id); return ``{"requeued": n, "failed": n}``. Runs under a site-wide lock."""
        counts = {"requeued": 0, "failed": 0}
        lock = self.store.lock("reaper", self.clock)
        if not lock.acquire(self.lease_seconds):
            return counts
        try:
            now = self.clock()
            for record in self.book.turns({"running"}):
                if (record.lease_until or 0) > now:
                    continue
                if record.attempts >= record.max_attempts:
                    self._finish(
                        record,
                        "failed",
                        error_class="WorkerLost",
                        reason=f"its worker stopped mid-turn; all {record.max_attempts} attempts spent",
                    )
                    counts["failed"] += 1
                elif not self.site.conversations.stores_metadata:
                    self._finish(
                        record,
                        "failed",
                        error_class="WorkerLost",
                        reason="its worker stopped mid-turn, and these tables keep no job id to tell "
                        "whether the turn was stored, so it is not run again",
                    )
                    counts["failed"] += 1
                else:
                    self.book.put(
                        record.changed(
                            status="queued",
                            lease_until=None,
                            reason="requeued: its worker stopped mid-turn (the lease ran out)",
                        )
                    )
                    self._hand_over(record)
                    counts["requeued"] += 1
        finally:
            lock.release()
        return counts

    def cancel_subject(self, user_id: str, dry_run: bool = False) -> dict[str, int]:
        """Cancel every queued turn of ``user_id`` (its payload deleted, its record saying why);
        return ``{"cancelled": n, "running": n}``: turns already running cannot be stopped."""
        counts = {"cancelled": 0, "running": 0}
        for payload in self.store.turns():
            if payload.get("user_id") != user_id:
                continue
            record = self.book.get(str(payload.get("job_id")))
            if record is not None and record.status == "running":
                counts["running"] += 1
                continue
            if dry_run:
                counts["cancelled"] += 1
            elif self.store.drop_turn(str(payload.get("conversation_id")), int(payload.get("position") or 0)):
                counts["cancelled"] += 1
                if record is not None:
                    cancelled = record.changed(
                        status="cancelled", finished_at=self.clock(), reason=CANCELLED_BY_ERASE
                    )
                    self.book.put(cancelled)
        return counts
