"""Job records: one memory entry per job in the ``phpclaw_jobs`` namespace, as phpClaw's
Laravel ``RunAgentJob`` keeps its state, with a TTL of ``CLAW_JOB_TTL`` from its last change.

A record holds ids, states, times, counts and an error's class and one-line reason; never
message text. It is written through the storage driver itself (not the privacy switch): it is
the queue's bookkeeping, not something a customer said.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from clawmem.clock import Clock
from clawmem.errors import redact
from clawmem.memory.base import BaseMemory

JOBS_NAMESPACE = "phpclaw_jobs"
STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = frozenset({"done", "failed", "cancelled"})
REASON_CHARS = 200


def one_line(text: object, limit: int = REASON_CHARS) -> str:
    """Return the first line of ``text``, passwords masked, at most ``limit`` characters."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    line = redact(line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass(frozen=True)
class JobRecord:
    """The state of one job. ``kind`` is ``turn`` (a queued turn) or ``retention`` (a scheduled
    prune and sweep); times are Unix seconds (UTC); ``lease_until`` is when a running job's
    worker must have renewed its lease; ``position`` is the turn's place in its conversation;
    ``reason`` is one line (why it failed, was requeued or cancelled); ``counts`` what a
    retention run deleted."""

    job_id: str
    kind: str = "turn"
    status: str = "queued"
    conversation_id: str | None = None
    run_id: str | None = None
    position: int | None = None
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float | None = None
    attempts: int = 0
    max_attempts: int = 3
    lease_until: float | None = None
    worker: str | None = None
    error_class: str | None = None
    reason: str | None = None
    counts: dict[str, int] | None = None
    schedule: str | None = None
    tick: float | None = None

    @property
    def finished(self) -> bool:
        """Return whether the job has ended (done, failed or cancelled)."""
        return self.status in FINISHED

    def as_value(self) -> dict[str, Any]:
        """Return the record as the JSON object stored (``None`` fields left out)."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}

    @classmethod
    def from_value(cls, value: Any) -> JobRecord | None:
        """Return the record stored as ``value``, or ``None`` for anything that is not one."""
        if not isinstance(value, dict) or not isinstance(value.get("job_id"), str):
            return None
        known = {field.name for field in dataclasses.fields(cls)}
        try:
            return cls(**{name: item for name, item in value.items() if name in known})
        except TypeError:
            return None

    def changed(self, **changes: Any) -> JobRecord:
        """Return a copy with ``changes``."""
        return dataclasses.replace(self, **changes)


class JobBook:
    """The ``phpclaw_jobs`` namespace of a site's storage driver, with records aging out ``ttl``
    seconds after their last change."""

    def __init__(self, driver: BaseMemory, ttl: int, clock: Clock = time.time) -> None:
        self.driver = driver
        self.ttl = ttl
        self.clock = clock

    def get(self, job_id: str) -> JobRecord | None:
        """Return a job's record, or ``None`` when there is none (never made, or aged out)."""
        return JobRecord.from_value(self.driver.get(job_id, JOBS_NAMESPACE))

    def put(self, record: JobRecord, ttl: int | None = None) -> JobRecord:
        """Store ``record`` stamped ``updated_at`` now, for ``ttl`` seconds (default the book's)."""
        record = record.changed(updated_at=self.clock())
        self.driver.set(record.job_id, record.as_value(), JOBS_NAMESPACE, ttl=ttl or self.ttl)
        return record

    def update(self, job_id: str, change: Callable[[JobRecord | None], JobRecord]) -> JobRecord:
        """Read a job's record (``None`` when there is none) and store ``change(record)``,
        stamped as :meth:`put` stamps it unless it is the record read, unchanged: in one
        transaction on a SQL driver. Return the record stored."""

        def changed(value: Any) -> dict[str, Any]:
            found = JobRecord.from_value(value)
            new = change(found)
            return value if new is found else new.changed(updated_at=self.clock()).as_value()

        stored = JobRecord.from_value(self.driver.update(job_id, changed, JOBS_NAMESPACE, ttl=self.ttl))
        assert stored is not None  # a record was stored
        return stored

    def all(self) -> list[JobRecord]:
        """Return every live record, newest first (by when it was queued or ran)."""
        found = (JobRecord.from_value(value) for value in self.driver.all(JOBS_NAMESPACE).values())
        records = [record for record in found if record is not None]
        return sorted(
            records, key=lambda record: (record.queued_at or record.tick or 0, record.job_id), reverse=True
        )

    def turns(self, statuses: Iterable[str] | None = None) -> list[JobRecord]:
        """Return the live records of queued turns (with one of ``statuses``), newest first."""
        wanted = None if statuses is None else set(statuses)
        return [
            record
            for record in self.all()
            if record.kind == "turn" and (wanted is None or record.status in wanted)
        ]
