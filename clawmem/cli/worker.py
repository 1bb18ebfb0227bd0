"""``worker``: the background consumer of one site (queued turns, the reaper, scheduled retention).

Scheduled retention runs this group's own ``prune`` and ``sweep`` commands, so each run writes
exactly the audit lines an operator's run writes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from clawmem.cli import ClawGroup, current_site
from clawmem.errors import ConfigError, StorageError, TurnsStillRunning
from clawmem.jobs.backend import open_huey, queue_errors, queue_location
from clawmem.jobs.schedule import ACCEPTED_SYNTAX, RetentionSchedule, schedule_from_settings
from clawmem.jobs.turns import LEASE_SECONDS, TurnQueue
from clawmem.jobs.worker import add_periodic_tasks, claw_factory, provider_from_settings, run_consumer
from clawmem.sites.site import Site

RETENTION_STEPS = ("prune", "sweep")
# How long erase --user-id waits for the subject's running turns: a live worker renews its lease
# at least twice in that time, so a lease still live then is a worker still at work.
ERASE_WAIT_SECONDS = int(LEASE_SECONDS)


def audit_lines_since(path: Path, offset: int) -> list[dict[str, Any]]:
    """Return the audit log's lines written after byte ``offset``, parsed (unreadable ones skipped)."""
    if not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(offset)
        raw = handle.read().decode("utf-8", errors="replace")
    lines = []
    for text in raw.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


def retention_runner(site: Site, schedule: RetentionSchedule) -> Callable[[], dict[str, Any]]:
    """Return the function a scheduled retention run calls: ``prune --older-than <days>d --yes``
    and then ``sweep --yes`` of this command group on ``site``, each audited as when an operator
    runs it. It returns ``{"outcome": "ok" | "error", "counts": {...}, "reason": ...}``, the
    counts and outcomes read back from the audit lines the two commands wrote."""

    def run() -> dict[str, Any]:
        counts: dict[str, int] = {}
        failures: list[str] = []
        for step in RETENTION_STEPS:
            arguments = [step, "--yes"]
            if step == "prune":
                arguments[1:1] = ["--older-than", f"{schedule.retention_days}d"]
            path = site.audit_path
            offset = path.stat().st_size if path.exists() else 0
            group = ClawGroup("clawmem", lambda: site)
            try:
                group.main(arguments, prog_name="clawmem", standalone_mode=False)
            except (click.ClickException, click.Abort) as exc:
                failures.append(f"{step}: {exc}" if str(exc) else f"{step} failed")
            except (StorageError, ConfigError, OSError, RuntimeError, ValueError) as exc:
                failures.append(f"{step}: {type(exc).__name__}: {exc}")
            written = [line for line in audit_lines_since(path, offset) if line.get("command") == step]
            if written:
                last = written[-1]
                for name, amount in (last.get("counts") or {}).items():
                    if isinstance(amount, int):
                        counts[name] = counts.get(name, 0) + amount
                if last.get("outcome") not in (None, "ok") and not any(f.startswith(step) for f in failures):
                    failures.append(f"{step}: {last.get('outcome')}")
        return {
            "outcome": "error" if failures else "ok",
            "counts": counts,
            "reason": "; ".join(failures)[:200] if failures else None,
        }

    return run


@click.command("worker", epilog=f"Accepted cron syntax: {ACCEPTED_SYNTAX}.")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker threads: turns run at once on this host.",
)
def worker(workers: int) -> None:
    """Run the background worker: queued turns, and prune and sweep on CLAW_RETENTION_SCHEDULE.

    The queue is CLAW_QUEUE_URL: queue.db in the instance folder (one machine), or redis://...
    for workers on many hosts. The provider is CLAW_PROVIDER_FACTORY=module:callable, or
    CLAW_PROVIDER_URL and CLAW_PROVIDER_MODEL with CLAW_PROVIDER_API_KEY in the environment.
    A bad cron expression, or a schedule without CLAW_RETENTION_DAYS, stops it at start.
    SIGTERM stops it once running turns have finished (a minute at most); Ctrl-C stops it at
    once, and the reaper requeues what was running.
    """
    site = current_site()
    settings = site.settings
    try:
        location = queue_location(settings)
        schedule = schedule_from_settings(settings)
        huey = open_huey(settings)
        provider_from_settings(settings)  # a provider that cannot be built stops the worker now
        queue = TurnQueue(site, huey, claw_factory(settings, site.clock))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    runner = retention_runner(site, schedule) if schedule else None
    add_periodic_tasks(queue, schedule, runner)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plan = (
        f"retention {schedule.expression!r} ({schedule.explain()})" if schedule else "retention not scheduled"
    )
    click.echo(
        f"worker: {location.kind} queue {location.name!r} at {location.where}, {workers} thread(s), {plan}",
        err=True,
    )
    run_consumer(queue, workers)


COMMANDS = [worker]


def settle_queued_turns(site: Site, user_id: str, dry_run: bool, wait_seconds: float) -> None:
    """``erase --user-id``'s hook: cancel the subject's queued turns and wait up to
    ``wait_seconds`` for their running ones to end (on a dry run, only count them), saying so in
    one line each. A queue that cannot be reached, or a turn still running after the wait,
    stops the erasure before it deletes anything more, in one line."""
    from clawmem.jobs import settle_subject_turns

    def waiting(running: list[tuple[str, float | None]]) -> None:
        click.echo(
            f"waiting up to {wait_seconds:g} s for {len(running)} running turn(s) of the subject to finish",
            err=True,
        )

    try:
        counts = settle_subject_turns(
            site.settings, user_id, wait_seconds, dry_run=dry_run, clock=site.clock, on_wait=waiting
        )
    except TurnsStillRunning as exc:
        jobs = ", ".join(f"{job_id} (lease until {_utc(lease)})" for job_id, lease in exc.jobs)
        raise click.ClickException(
            f"erase stopped: {len(exc.jobs)} turn(s) of the subject still running after waiting "
            f"{exc.waited:g} s, job {jobs}; nothing more was deleted (its queued turns were cancelled): "
            "run erase again once they have finished, or with a longer --wait"
        ) from None
    except ConfigError as exc:
        raise click.ClickException(f"cannot cancel the subject's queued turns: {exc}") from None
    except queue_errors() as exc:
        raise click.ClickException(
            f"cannot cancel the subject's queued turns: {type(exc).__name__}: {exc}"
        ) from None
    verb = "would cancel" if dry_run else "cancelled"
    if counts["cancelled"]:
        click.echo(f"{verb} {counts['cancelled']} queued turn(s) of the subject")
    if dry_run and counts["running"]:
        click.echo(
            f"{counts['running']} turn(s) of the subject are running now: erase waits up to "
            f"{wait_seconds:g} s for them to finish before it deletes anything"
        )
    if counts.get("waited"):
        click.echo(f"waited for {counts['waited']} running turn(s) of the subject to finish")


def _utc(moment: float | None) -> str:
    if moment is None:
        return "unknown"
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
