"""TurnQueue: a turn handed to the queue now, run by a worker later, recorded in ``phpclaw_jobs``.

A web app calls :meth:`TurnQueue.enqueue` and returns at once with a job id; any ``clawmem
worker`` of the site runs the turn through :class:`clawmem.Claw`. What keeps it honest:

- the payload (message, conversation id, user id) waits in the queue's storage, never in the
  job record; a task returns ids, never the reply text;
- one conversation's turns run one after the other, in the order queued (each turn has a
  position in its conversation and waits until the turn before it has ended);
- a provider failure is retried with backoff, up to ``max_attempts`` runs in all;
- Huey has no acknowledgement, so a job is claimed by the one worker that runs it, a running job
  carries a lease that its worker renews and a queued one a hand-over lease, and
  :meth:`TurnQueue.reap` requeues (or, with the attempts spent, fails) a job whose worker died at
  any point once its lease ran out (see :mod:`clawmem.jobs.leases`);
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
from clawmem.encryption.ciphers import cipher_for
from clawmem.errors import ConfigError, InvalidKey, JobRefused, ProviderError, StorageError, Undecryptable
from clawmem.ids import new_id
from clawmem.jobs.backend import ExpiringLock, PayloadSeal, QueueStore, open_huey
from clawmem.jobs.leases import LeaseKeeper, pause_at
from clawmem.jobs.records import JobBook, JobRecord, one_line
from clawmem.jobs.recovery import cancel_subject, reap
from clawmem.rules import check_size
from clawmem.settings import ENV_PREFIX, PHPCLAW_SCHEMA, Settings
from clawmem.sites.site import Site
from clawmem.turn.messages import validate_conversation_id, wordpress_user_id

log = logging.getLogger("clawmem.worker")

LEASE_SECONDS = 60.0  # a running job's lease; its worker renews it every third of that
MAX_ATTEMPTS = 3
RETRY_DELAY_SECONDS = 2.0  # before the second run; doubled before each later one
WAIT_FOR_EARLIER_SECONDS = 0.5  # a turn whose predecessor runs waits this long, then is rescheduled
TURN_TASK = "clawmem_turn"
REAPER_TASK = "clawmem_reaper"


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
        self.leases = LeaseKeeper(self.book, lease_seconds, site.clock)
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
        payload = {"message": message, "user_id": user_id, "queued_at": now}
        position = self.store.put_turn(job_id, conversation_id, payload)
        try:
            record = JobRecord(
                job_id,
                conversation_id=conversation_id,
                position=position,
                queued_at=now,
                max_attempts=self.max_attempts,
                lease_until=now + self.lease_seconds,  # the hand-over lease (see clawmem.jobs.leases)
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

        pause_at("taken")  # Huey has handed the task out; nothing of the job is written yet
        outcome = self.run(job_id, conversation_id, position)
        if isinstance(outcome, float):
            raise RetryTask(delay=outcome)
        return outcome

    def run(self, job_id: str, conversation_id: str, position: int) -> dict[str, str] | float | None:
        """Run the job's turn (the conversation's turn ``position``) once; return its ids
        (``job_id``, ``conversation_id``, ``run_id``), ``None`` when there is nothing to run
        (ended, cancelled, or held by another worker), or the seconds after which to run it
        again (the turn before it has not ended, or the attempt failed and may be retried)."""
        # The claim and the payload in one step: one round trip to the queue's storage.
        claim, payload = self.store.claim_turn(
            job_id, conversation_id, position, self.lease_seconds, self.clock
        )
        if claim is None:
            return None  # another worker runs it (this task was a second copy), or an erasure holds it
        try:
            return self._run_claimed(job_id, conversation_id, position, claim, payload)
        finally:
            claim.release()  # nothing left to do when the job's end gave it up already

    def _run_claimed(
        self,
        job_id: str,
        conversation_id: str,
        position: int,
        claim: ExpiringLock,
        payload: dict[str, Any] | None,
    ) -> dict[str, str] | float | None:
        if payload is None:
            return None  # ended or cancelled: its payload went with it
        if self._earlier_turn_waiting(conversation_id, position):
            waiting = self._as_found(self.book.get(job_id), job_id, conversation_id, position)
            if waiting.finished:
                self.store.drop_turn(conversation_id, position)  # its worker stopped, as below
                return None
            self._renew_hand_over(waiting, WAIT_FOR_EARLIER_SECONDS)
            return WAIT_FOR_EARLIER_SECONDS
        # The record is read and marked running in one transaction on a SQL driver.
        record = self.book.update(
            job_id, lambda found: self._started(found, job_id, conversation_id, position)
        )
        if record.finished:
            # Its worker stopped between ending the record and deleting the payload.
            self.store.drop_turn(conversation_id, position)
            return None
        earlier_attempts = record.attempts - 1
        self.leases.hold(job_id, record.worker, claim)
        try:
            pause_at("running")
            # A first attempt cannot find itself stored; a later one may: its worker died after
            # the commit and before saying so.
            stored = self.site.conversations.job_messages(conversation_id, job_id) if earlier_attempts else []
            if not stored:
                reply = self.claw().send(
                    payload["message"], conversation_id, payload.get("user_id", ""), job_id=job_id
                )
                pause_at("stored")  # the turn is committed; its record still says running
        except Exception as exc:  # the job's boundary: any failure of the turn is its record's outcome
            self.leases.release(job_id)
            return self._failed(record, exc, claim)
        finally:
            self.leases.release(job_id)
        if stored:
            run_id = next((m.metadata.get("run_id") for m in stored if isinstance(m.metadata, dict)), None)
            return self._finish(
                record, "done", claim, run_id=run_id, reason="found stored by an earlier attempt"
            )
        return self._finish(record, "done", claim, run_id=reply.run_id)

    def _as_found(
        self, record: JobRecord | None, job_id: str, conversation_id: str, position: int
    ) -> JobRecord:
        """Return the job's record as read, or one started again when it aged out while queued."""
        if record is not None:
            return record
        return JobRecord(
            job_id,
            conversation_id=conversation_id,
            position=position,
            queued_at=self.clock(),
            max_attempts=self.max_attempts,
            reason="its record had aged out while queued",
        )

    def _started(
        self, found: JobRecord | None, job_id: str, conversation_id: str, position: int
    ) -> JobRecord:
        """Return the job's record marked running by this worker, or as ``found`` once it has
        ended (then stored unchanged)."""
        record = self._as_found(found, job_id, conversation_id, position)
        if record.finished:
            return record
        now = self.clock()
        return record.changed(
            status="running",
            attempts=record.attempts + 1,
            started_at=now,
            lease_until=now + self.lease_seconds,
            worker=worker_name(),
        )

    def _renew_hand_over(self, record: JobRecord, delay: float) -> None:
        """Keep a queued job's hand-over lease ahead of the reaper while it waits (written only
        when less than half of it is left, so a waiting turn rarely writes)."""
        now = self.clock()
        if record.status == "queued" and (record.lease_until or 0) - now >= self.lease_seconds / 2:
            return
        self.book.put(record.changed(status="queued", lease_until=now + delay + self.lease_seconds))

    def _earlier_turn_waiting(self, conversation_id: str, position: int) -> bool:
        """Return whether the conversation's turn before ``position`` is still queued or running,
        after waiting up to :data:`WAIT_FOR_EARLIER_SECONDS` for it to end. An earlier turn whose
        record has ended but whose payload is left (its worker stopped in between) does not
        count, and its payload is deleted."""
        if position <= 1:
            return False
        deadline = time.monotonic() + WAIT_FOR_EARLIER_SECONDS
        while self.store.turn_waiting(conversation_id, position - 1):
            if time.monotonic() >= deadline:
                return not self._drop_if_ended(conversation_id, position - 1)
            time.sleep(0.02)
        return False

    def _drop_if_ended(self, conversation_id: str, position: int) -> bool:
        """Delete the payload of the conversation's turn ``position`` if its record has ended;
        return whether it did."""
        try:
            earlier = self.store.turn_at(conversation_id, position)
        except (ValueError, Undecryptable):
            return False  # a payload this site cannot read is never taken for an ended one
        if earlier is None:
            return False
        record = self.book.get(str(earlier.get("job_id")))
        if record is None and self._left_by_a_failed_enqueue(earlier):
            log.warning(
                "dropped the queued turn %s of conversation %s: its job record was never written "
                "(the enqueue failed half-way), so it would have held back every later turn",
                position,
                conversation_id,
            )
        elif record is None or not record.finished:
            return False
        self.store.drop_turn(conversation_id, position)
        return True

    def _left_by_a_failed_enqueue(self, payload: dict[str, Any]) -> bool:
        """Return whether a turn's payload without a job record was left by an enqueue that
        failed after storing it (its server went away before the record was written, and before
        the payload could be taken back): the record is written a moment after the payload, so
        one still missing a hand-over lease later never comes. A payload older than the records'
        lifetime may have outlived a record that aged out, and is never taken for one."""
        queued_at = payload.get("queued_at")
        if not isinstance(queued_at, (int, float)) or isinstance(queued_at, bool):
            return False  # from before payloads said when they were queued
        age = self.clock() - queued_at
        return self.lease_seconds <= age < self.settings.job_ttl

    def _failed(
        self, record: JobRecord, exc: BaseException, claim: ExpiringLock | None = None
    ) -> float | None:
        reason = one_line(exc) or type(exc).__name__
        if _retryable(exc) and record.attempts < record.max_attempts:
            delay = self.retry_delay * 2 ** (record.attempts - 1)
            self.book.put(
                record.changed(
                    status="queued",
                    lease_until=self.clock() + delay + self.lease_seconds,  # the hand-over lease
                    error_class=type(exc).__name__,
                    reason=f"attempt {record.attempts} failed, retrying in {delay:g} s: {reason}",
                )
            )
            return float(delay)
        self._finish(record, "failed", claim, error_class=type(exc).__name__, reason=reason)
        return None

    def _finish(
        self, record: JobRecord, status: str, claim: ExpiringLock | None = None, **changes: Any
    ) -> dict[str, str] | None:
        """End the job's record, then delete its payload (and give up its ``claim`` in the same
        step, when the caller holds one and is done with it)."""
        finished = record.changed(status=status, finished_at=self.clock(), lease_until=None, **changes)
        record = self.book.put(finished)
        pause_at("done")  # the record has ended; the payload, which the next turn waits on, is left
        if record.conversation_id and record.position:
            if claim is not None:
                self.store.end_turn(claim, record.conversation_id, record.position)
            else:
                self.store.drop_turn(record.conversation_id, record.position)
        if status != "done":
            return None
        return {
            "job_id": record.job_id,
            "conversation_id": record.conversation_id or "",
            "run_id": record.run_id or "",
        }

    # -- the reaper and erasure (see clawmem.jobs.recovery) -------------------------------------

    def reap(self) -> dict[str, int]:
        """Requeue every job whose worker died, at any point, once its lease has run out; return
        ``{"requeued": n, "failed": n}`` (see :func:`clawmem.jobs.recovery.reap`)."""
        return reap(self)

    def cancel_subject(self, user_id: str, dry_run: bool = False) -> dict[str, int]:
        """Cancel every queued turn of ``user_id`` that no worker holds; return ``{"cancelled":
        n, "running": n}`` (see :func:`clawmem.jobs.recovery.settle_subject`, which also waits)."""
        return cancel_subject(self, user_id, dry_run=dry_run)
