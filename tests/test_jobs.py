"""Background work without a consumer process: the schedule on a fake clock, the site-wide locks,
scheduled retention called directly, job records and their TTL, and every refused input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from clawmem.cli.worker import retention_runner
from clawmem.clock import FakeClock
from clawmem.errors import ConfigError, JobRefused
from clawmem.jobs import JOBS_NAMESPACE, RetentionSchedule, TurnQueue, cancel_subject_turns, queue_exists
from clawmem.jobs.backend import open_huey, queue_location
from clawmem.jobs.schedule import RETENTION_LOCK_SECONDS, decide, run_retention_tick
from clawmem.jobs.worker import provider_from_settings
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0
# Tuesday 1 December 2026, 10:00:00 UTC.
START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()


def payload_of(queue: TurnQueue, job_id: str) -> dict[str, Any] | None:
    """Return what the queue holds for a job: its message and user id, or ``None``."""
    record = queue.job(job_id)
    return queue.store.turn(job_id, record.conversation_id, record.position)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.fixture
def settings(tmp_path: Path, prefix: str) -> Any:
    """Settings of a site on a fresh SQLite database, its queue in the instance folder."""
    instance = tmp_path / "instance"
    instance.mkdir()
    built = Settings(
        instance_path=str(instance),
        database_url=f"sqlite:///{tmp_path / 'claw.db'}",
        table_prefix=prefix,
        retention_days=30,
    )
    engine = engine_for(built.database_url)
    create_tables(engine, prefix)
    yield built
    drop_tables(engine, prefix)


# -- the schedule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "now", "expected"),
    [
        ("0 3 * * *", "2026-12-01 10:00:00", "2026-12-02 03:00:00"),
        ("0 3 * * *", "2026-12-01 02:59:59", "2026-12-01 03:00:00"),
        ("*/15 * * * *", "2026-12-01 10:00:00", "2026-12-01 10:15:00"),
        ("30 2 * * mon", "2026-12-01 10:00:00", "2026-12-07 02:30:00"),
        ("0 0 1 * *", "2026-12-31 23:59:00", "2027-01-01 00:00:00"),
        # Cron ORs the two day fields when both are restricted (Huey's crontab ANDs them).
        ("0 0 13 * fri", "2026-12-01 10:00:00", "2026-12-04 00:00:00"),
        ("0 0 L * *", "2027-02-01 00:00:00", "2027-02-28 00:00:00"),
    ],
)
def test_next_run_is_computed_in_utc_on_the_given_clock(expression: str, now: str, expected: str) -> None:
    schedule = RetentionSchedule.parse(expression, 90)
    assert schedule.next_run(at(now)) == datetime.fromisoformat(expected).replace(tzinfo=UTC)


def test_a_tick_is_due_once_and_not_when_it_is_long_past() -> None:
    schedule = RetentionSchedule.parse("0 3 * * *", 90)
    tick = at("2026-12-01 03:00:00")
    assert decide(schedule, at("2026-12-01 03:00:20"), None).due
    assert decide(schedule, at("2026-12-01 03:00:20"), None).tick == tick
    assert not decide(schedule, at("2026-12-01 03:01:00"), tick).due  # that tick already ran
    assert decide(schedule, at("2026-12-02 03:00:05"), tick).due  # the next day's tick
    stale = decide(schedule, at("2026-12-01 10:00:00"), None)
    assert not stale.due and "more than an hour" in stale.reason


@pytest.mark.parametrize(
    "expression",
    ["every night", "61 * * * *", "0 3 * *", "0 0 0 3 * *", "0 0 31 2 *", "@daily", "0 25 * * *"],
)
def test_a_bad_cron_expression_is_refused_in_one_line(expression: str) -> None:
    with pytest.raises(ConfigError) as raised:
        RetentionSchedule.parse(expression, 90)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("CLAW_RETENTION_SCHEDULE") and "five fields" in message


def test_a_schedule_needs_a_retention_window() -> None:
    with pytest.raises(ConfigError, match="CLAW_RETENTION_DAYS is not"):
        RetentionSchedule.parse("0 3 * * *", None)


# -- locks and scheduled retention --------------------------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def queue_settings(request: pytest.FixtureRequest, settings: Settings) -> Any:
    """The site's settings with its queue on SQLite, then on Redis (its keys deleted after)."""
    if request.param == "sqlite":
        yield settings
        return
    url = os.environ.get("CLAW_TEST_REDIS_URL")
    if not url:
        pytest.skip("CLAW_TEST_REDIS_URL is not set")
    import redis

    yield settings.replace(queue_url=url)
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"*{settings.table_prefix}*"):
        client.delete(key)


def test_the_site_lock_refuses_a_second_holder_until_it_expires(queue_settings: Settings) -> None:
    clock = FakeClock(START)
    store = TurnQueue.from_settings(queue_settings, clock=clock).store
    first, second = store.lock("retention", clock), store.lock("retention", clock)
    assert first.acquire(60)
    assert not second.acquire(60)
    assert first.acquire(60)  # its holder may extend it
    clock.advance(61)
    assert second.acquire(60)  # a holder that died does not hold it for ever
    first.release()  # no longer the holder: releases nothing
    assert not store.lock("retention", clock).acquire(60)
    second.release()
    assert store.lock("retention", clock).acquire(60)


def _old_data(site: Site, clock: FakeClock) -> None:
    """Two conversations 40 days old, one from today, and an expired and a live entry."""
    now = clock.now
    clock.now = now - 40 * DAY
    site.conversations.append("old-1", [{"role": "user", "content": "hello"}])
    site.conversations.append(
        "old-2", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    )
    site.memory.set("soon", "gone", ttl=60)
    clock.now = now
    site.conversations.append("new-1", [{"role": "user", "content": "today"}])
    site.memory.set("kept", "value")


def _audit(site: Site) -> list[dict[str, Any]]:
    return [json.loads(line) for line in site.audit_path.read_text().splitlines()]


def test_the_retention_task_prunes_sweeps_and_writes_the_commands_audit_lines(settings: Settings) -> None:
    clock = FakeClock(at("2026-12-01 03:00:10"))
    settings = settings.replace(retention_schedule="0 3 * * *")
    queue = TurnQueue.from_settings(settings, clock=clock)
    site = queue.site
    _old_data(site, clock)
    schedule = RetentionSchedule.parse(settings.retention_schedule, settings.retention_days)
    outcome = run_retention_tick(queue, schedule, retention_runner(site, schedule), clock)
    assert outcome["ran"] and outcome["outcome"] == "ok"
    assert outcome["counts"] == {"conversations": 2, "messages": 3, "expired": 1}
    assert [c.id for c in site.conversations.list().items] == ["new-1"]
    assert site.driver.entry("default", "soon") is None and site.memory.get("kept") == "value"
    lines = _audit(site)
    assert list(dict.fromkeys(line["command"] for line in lines)) == ["prune", "sweep"]
    prune = [line for line in lines if line["command"] == "prune"][-1]
    assert prune["outcome"] == "ok" and prune["time"] == "2026-12-01T03:00:10+00:00"
    assert prune["arguments"]["older_than"] == "30d" and prune["arguments"]["yes"] is True
    record = queue.book.get("retention")
    assert record is not None and record.status == "done" and record.kind == "retention"
    assert record.counts == {"conversations": 2, "messages": 3, "expired": 1}
    assert record.tick == at("2026-12-01 03:00:00")
    # Kept until an hour after the next run is due, so every host's dashboard sees it.
    row = site.driver.fetch(JOBS_NAMESPACE, ["retention"])["retention"]
    assert row.expires_at == int(at("2026-12-02 03:00:00")) + settings.job_ttl
    # The same tick runs once, whichever worker asks next.
    again = run_retention_tick(
        TurnQueue.from_settings(settings, clock=clock), schedule, retention_runner(site, schedule), clock
    )
    assert again == {"ran": False, "reason": "this tick already ran", "tick": at("2026-12-01 03:00:00")}
    assert len(_audit(site)) == len(lines)


def test_the_retention_lock_refuses_a_second_run_and_lapses(settings: Settings) -> None:
    clock = FakeClock(at("2026-12-01 03:00:10"))
    queue = TurnQueue.from_settings(settings, clock=clock)
    schedule = RetentionSchedule.parse("0 3 * * *", 30)
    held = queue.store.lock("retention", clock)
    assert held.acquire(RETENTION_LOCK_SECONDS)  # a run in progress, or one killed mid-prune
    runs: list[int] = []

    def runner() -> dict[str, Any]:
        runs.append(1)
        return {"outcome": "ok", "counts": {}}

    refused = run_retention_tick(queue, schedule, runner, clock)
    assert refused == {"ran": False, "reason": "another worker holds the retention lock"} and runs == []
    clock.advance(RETENTION_LOCK_SECONDS + 1)  # the killed run's lock lapses; the day's tick is missed
    clock.now = at("2026-12-02 03:00:01")
    assert run_retention_tick(queue, schedule, runner, clock)["ran"] and runs == [1]


# -- job records --------------------------------------------------------------------------------


def test_a_job_record_lives_for_claw_job_ttl_and_sweep_removes_it(settings: Settings) -> None:
    clock = FakeClock(START + 0.5)
    settings = settings.replace(job_ttl=900)
    queue = TurnQueue.from_settings(settings, clock=clock)
    job_id = queue.enqueue("Where is my parcel?", user_id="cust-1")
    record = queue.job(job_id)
    assert record is not None and record.status == "queued" and record.attempts == 0
    row = queue.site.driver.fetch(JOBS_NAMESPACE, [job_id])[job_id]
    assert row.expires_at == int(START) + 900
    assert "parcel" not in json.dumps(row.value) and "cust-1" not in json.dumps(row.value)
    clock.advance(899)
    assert queue.job(job_id) is not None
    assert queue.site.driver.sweep() == {}
    clock.advance(1)
    assert queue.job(job_id) is None
    assert queue.site.driver.sweep() == {JOBS_NAMESPACE: 1}
    assert queue.site.driver.entry(JOBS_NAMESPACE, job_id) is None


def test_erasure_cancels_the_subjects_queued_turns_and_says_why(settings: Settings) -> None:
    clock = FakeClock(START)
    queue = TurnQueue.from_settings(settings, clock=clock)
    theirs = [queue.enqueue("first", user_id="cust-7"), queue.enqueue("second", user_id="cust-7")]
    other = queue.enqueue("mine", user_id="cust-70")
    assert cancel_subject_turns(settings, "cust-7", dry_run=True, clock=clock) == {
        "cancelled": 2,
        "running": 0,
    }
    assert {queue.job(job_id).status for job_id in theirs} == {"queued"}
    assert cancel_subject_turns(settings, "cust-7", clock=clock) == {"cancelled": 2, "running": 0}
    for job_id in theirs:
        record = queue.job(job_id)
        assert record.status == "cancelled" and "erase --user-id" in record.reason
        assert payload_of(queue, job_id) is None
        assert queue.run(job_id, record.conversation_id, record.position) is None
    assert queue.job(other).status == "queued" and payload_of(queue, other)["message"] == "mine"


def test_a_queue_without_a_claw_factory_says_how_to_give_it_one(settings: Settings) -> None:
    queue = TurnQueue.from_settings(settings, clock=FakeClock(START))
    with pytest.raises(ConfigError, match="claw_factory="):
        queue.claw()


def test_erasure_creates_no_queue_where_there_is_none(settings: Settings) -> None:
    assert not queue_exists(settings)
    assert cancel_subject_turns(settings, "cust-7") == {"cancelled": 0, "running": 0}
    assert not Path(queue_location(settings).where).exists()


# -- refused input ------------------------------------------------------------------------------


def test_enqueueing_with_storage_off_is_refused_with_the_reason(settings: Settings) -> None:
    queue = TurnQueue.from_settings(settings.replace(store_messages=False))
    with pytest.raises(JobRefused, match="CLAW_STORE_MESSAGES is off"):
        queue.enqueue("hello")
    assert queue.huey.pending_count() == 0 and queue.book.all() == []


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (("",), "non-empty message"),
        ((b"bytes",), "non-empty message"),
        (("hi", "no spaces allowed"), "conversation id"),
        (("hi", None, 42), "user_id must be a str"),
    ],
)
def test_a_bad_turn_is_refused_and_nothing_is_queued(
    settings: Settings, arguments: tuple, reason: str
) -> None:
    queue = TurnQueue.from_settings(settings)
    with pytest.raises(JobRefused, match=reason):
        queue.enqueue(*arguments)
    assert queue.huey.pending_count() == 0 and queue.book.all() == []


@pytest.mark.parametrize("url", ["amqp://127.0.0.1/", "postgresql://x/y", "queue.db", "sqlite://"])
def test_a_queue_url_of_an_unknown_scheme_is_refused(settings: Settings, url: str) -> None:
    with pytest.raises(ConfigError, match="CLAW_QUEUE_URL") as raised:
        TurnQueue.from_settings(settings.replace(queue_url=url))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("factory", "reason"),
    [
        ("no_such_module_here:build", "cannot import 'no_such_module_here'"),
        ("clawmem.providers:NoSuchThing", "has no 'NoSuchThing'"),
        ("clawmem.providers", "must be module:callable"),
        ("clawmem.settings:ENV_PREFIX", "is not callable"),
        ("clawmem.ids:new_id", "failed: TypeError"),
        ("clawmem.jobs:queue_exists", "returned bool, not a provider"),
    ],
)
def test_an_unknown_provider_factory_is_refused(settings: Settings, factory: str, reason: str) -> None:
    with pytest.raises(ConfigError, match="CLAW_PROVIDER_FACTORY") as raised:
        provider_from_settings(settings.replace(provider_factory=factory))
    assert reason in str(raised.value)


def test_a_provider_url_needs_a_model_and_the_key_comes_from_the_environment(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="CLAW_PROVIDER_MODEL is not"):
        provider_from_settings(settings.replace(provider_url="http://127.0.0.1:9/v1"))
    provider = provider_from_settings(
        settings.replace(provider_url="http://127.0.0.1:9/v1", provider_model="m"),
        {"CLAW_PROVIDER_API_KEY": "sk-secret-123"},
    )
    assert "sk-secret-123" not in repr(provider) and provider.model == "m"
    assert not hasattr(settings, "provider_api_key")


def _worker(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": "/usr/bin:/bin",
        "CLAW_INSTANCE_PATH": str(tmp_path / "instance"),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-c", "from clawmem.cli import main; main()", "worker"],
        env={**base, **env},
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "error"),
    [
        (
            {"CLAW_RETENTION_SCHEDULE": "every night", "CLAW_RETENTION_DAYS": "30"},
            "Error: CLAW_RETENTION_SCHEDULE 'every night' is not a cron expression",
        ),
        (
            {"CLAW_RETENTION_SCHEDULE": "0 3 * * *"},
            "Error: CLAW_RETENTION_SCHEDULE is set but CLAW_RETENTION_DAYS is not",
        ),
        ({"CLAW_PROVIDER_FACTORY": "no_such_module_here:build"}, "Error: CLAW_PROVIDER_FACTORY"),
        ({"CLAW_QUEUE_URL": "amqp://127.0.0.1/"}, "Error: CLAW_QUEUE_URL must start with sqlite:///"),
        ({}, "Error: a worker needs a provider"),
    ],
)
def test_the_worker_stops_at_start_with_one_line(tmp_path: Path, env: dict[str, str], error: str) -> None:
    provider = {"CLAW_PROVIDER_FACTORY": "tests.job_providers:echo"} if env else {}
    result = _worker({**provider, **env}, tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(error) and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_erase_user_id_cancels_the_queued_turns_before_deleting(settings: Settings) -> None:
    from click.testing import CliRunner

    from clawmem.cli import ClawGroup

    clock = FakeClock(START)
    queue = TurnQueue.from_settings(settings, clock=clock)
    job_ids = [queue.enqueue("first", user_id="cust-7"), queue.enqueue("second", user_id="cust-7")]
    group = ClawGroup("clawmem", lambda: Site(settings, clock))
    preview = CliRunner().invoke(group, ["erase", "--user-id", "cust-7", "--dry-run"])
    assert preview.exit_code == 0, preview.output
    assert "would cancel 2 queued turn(s) of the subject" in preview.output
    assert {queue.job(job_id).status for job_id in job_ids} == {"queued"}
    result = CliRunner().invoke(group, ["erase", "--user-id", "cust-7", "--yes"])
    assert result.exit_code == 0, result.output
    assert "cancelled 2 queued turn(s) of the subject" in result.output and "cust-7" not in result.output
    assert {queue.job(job_id).status for job_id in job_ids} == {"cancelled"}


def test_erase_stops_when_the_queue_cannot_be_read(settings: Settings) -> None:
    from click.testing import CliRunner

    from clawmem.cli import ClawGroup

    broken = settings.replace(queue_url="redis://127.0.0.1:1/0")  # nothing listens there
    group = ClawGroup("clawmem", lambda: Site(broken))
    result = CliRunner().invoke(group, ["erase", "--user-id", "cust-7", "--yes"])
    assert result.exit_code == 1 and "cannot cancel the subject's queued turns" in result.output


def _running(queue: TurnQueue, clock: FakeClock, attempts: int) -> str:
    job_id = queue.enqueue("hello")
    record = queue.job(job_id)
    queue.book.put(record.changed(status="running", attempts=attempts, lease_until=clock() + 60))
    return job_id


def test_the_reaper_requeues_a_lapsed_lease_and_fails_a_job_out_of_attempts(settings: Settings) -> None:
    clock = FakeClock(START)
    queue = TurnQueue.from_settings(settings, clock=clock)
    lapsing, spent = _running(queue, clock, 1), _running(queue, clock, 3)
    assert queue.reap() == {"requeued": 0, "failed": 0}  # the leases are still live
    clock.advance(61)
    assert queue.reap() == {"requeued": 1, "failed": 1}
    assert queue.job(lapsing).status == "queued" and payload_of(queue, lapsing) is not None
    failed = queue.job(spent)
    assert failed.status == "failed" and failed.error_class == "WorkerLost" and "3 attempts" in failed.reason
    assert payload_of(queue, spent) is None
    assert queue.huey.pending_count() == 3  # two enqueued, one requeued


def test_the_reaper_fails_rather_than_reruns_where_no_job_id_can_be_stored(settings: Settings) -> None:
    clock = FakeClock(START)
    queue = TurnQueue.from_settings(settings, clock=clock)
    job_id = _running(queue, clock, 1)
    queue.site.conversations.shape = "phpclaw-wordpress"  # tables that keep no message metadata
    clock.advance(61)
    assert queue.reap() == {"requeued": 0, "failed": 1}
    assert "keep no job id" in queue.job(job_id).reason


def test_an_append_of_a_stored_job_writes_nothing(engine: Any, prefix: str, clock: FakeClock) -> None:
    from clawmem.turn.conversations import ConversationLog, Message

    log = ConversationLog(engine, prefix, clock)
    turn = [
        Message("user", "hi", metadata={"job_id": "01JOB", "run_id": "r1"}),
        Message("assistant", "hello"),
    ]
    first = log.append("c1", turn, job_id="01JOB", tokens=5)
    log.append("c1", [Message("user", "unrelated", metadata={"job_id": "01JOBX"})], job_id="01JOBX")
    updated = log.get("c1").updated_at
    clock.advance(60)
    again = log.append("c1", turn, job_id="01JOB", tokens=5)
    assert again == first[:1]  # the stored message that carries the job id
    assert [m.content for m in log.messages("c1").items] == ["hi", "hello", "unrelated"]
    assert log.get("c1").updated_at == updated and log.get("c1").total_tokens == 5  # rolled back
    assert [m.id for m in log.job_messages("c1", "01JOB")] == first[:1]
    assert log.job_messages("c1", "01JO") == [] and log.job_messages("c2", "01JOB") == []


def test_a_running_turn_renews_its_lease_until_it_ends(settings: Settings) -> None:
    import threading
    import time

    from clawmem.jobs.backend import open_huey
    from clawmem.providers import EchoProvider
    from clawmem.turn.pipeline import Claw

    gate = threading.Event()

    class Waiting(EchoProvider):
        def complete(self, messages: Any) -> Any:
            gate.wait(30)
            return super().complete(messages)

    queue = TurnQueue(
        Site(settings),
        open_huey(settings),
        lambda: Claw.from_settings(settings, Waiting()),
        lease_seconds=0.3,
    )
    job_id = queue.enqueue("hello")
    record = queue.job(job_id)
    runner = threading.Thread(target=queue.run, args=(job_id, record.conversation_id, record.position))
    runner.start()
    leases: list[float] = []
    deadline = time.monotonic() + 30
    while len(set(leases)) < 3 and time.monotonic() < deadline:  # taken, then renewed twice
        current = queue.job(job_id)
        if current.status == "running" and (not leases or current.lease_until != leases[-1]):
            leases.append(current.lease_until)
        time.sleep(0.01)
    gate.set()
    runner.join()
    assert len(set(leases)) == 3 and leases == sorted(leases)
    done = queue.job(job_id)
    assert done.status == "done" and done.lease_until is None and done.attempts == 1


def test_the_reaper_hands_over_again_a_queued_job_whose_task_was_lost_with_its_worker(
    queue_settings: Settings,
) -> None:
    clock = FakeClock(START)
    queue = TurnQueue.from_settings(queue_settings, clock=clock)
    lost, waiting = queue.enqueue("first"), queue.enqueue("second")
    assert queue.huey.storage.dequeue() is not None  # a worker took the first task, then was killed
    assert queue.huey.pending_count() == 1
    assert queue.reap() == {"requeued": 0, "failed": 0}  # the hand-over leases are still live
    clock.advance(61)
    assert queue.reap() == {"requeued": 1, "failed": 0}  # the second still waits in the queue
    record = queue.job(lost)
    assert record.status == "queued" and "before it ran" in record.reason and record.attempts == 0
    assert record.lease_until == clock() + 60
    assert queue.job(waiting).reason is None and queue.huey.pending_count() == 2
    assert {task.args[0] for task in queue.huey.pending()} == {lost, waiting}
    assert queue.reap() == {"requeued": 0, "failed": 0}  # handed over once, not at every reap


def test_a_second_copy_of_a_claimed_job_changes_nothing(queue_settings: Settings) -> None:
    clock = FakeClock(START)
    queue = TurnQueue.from_settings(queue_settings, clock=clock)
    job_id = queue.enqueue("hello")
    record = queue.job(job_id)
    holder = queue.store.claim(job_id, clock)
    assert holder.acquire(60)  # the worker running it
    assert queue.run(job_id, record.conversation_id, record.position) is None
    assert queue.job(job_id) == record and payload_of(queue, job_id)["message"] == "hello"
    assert holder.renew(60)
    clock.advance(61)
    assert queue.store.claim(job_id, clock).acquire(60)  # its worker died: the claim is taken over
    assert not holder.renew(60)  # and a worker that was only slow does not get it back


def test_erasure_waits_only_for_live_leases_and_cancels_a_turn_whose_worker_died(settings: Settings) -> None:
    from clawmem.errors import TurnsStillRunning
    from clawmem.jobs import settle_subject_turns
    from clawmem.jobs.recovery import CANCELLED_LOST_BY_ERASE

    clock = FakeClock(START)
    queue = TurnQueue.from_settings(settings, clock=clock)
    job_id = queue.enqueue("first", user_id="cust-7")
    record = queue.job(job_id)
    queue.book.put(record.changed(status="running", attempts=1, lease_until=clock() + 60))
    assert queue.store.claim(job_id, clock).acquire(60)  # its worker holds it
    assert settle_subject_turns(settings, "cust-7", 0, dry_run=True, clock=clock) == {
        "cancelled": 0,
        "running": 1,
    }
    with pytest.raises(TurnsStillRunning) as raised:
        settle_subject_turns(settings, "cust-7", 0, clock=clock)
    assert raised.value.jobs == [(job_id, clock() + 60)] and job_id in str(raised.value)
    assert queue.job(job_id).status == "running" and payload_of(queue, job_id) is not None
    clock.advance(61)  # the worker died: nobody renews its lease
    assert settle_subject_turns(settings, "cust-7", 0, clock=clock) == {"cancelled": 1, "waited": 0}
    cancelled = queue.job(job_id)
    assert cancelled.status == "cancelled" and cancelled.reason == CANCELLED_LOST_BY_ERASE
    assert payload_of(queue, job_id) is None
    assert queue.reap() == {"requeued": 0, "failed": 0}  # never run again after the erasure


def test_erase_dry_run_says_it_will_wait_for_the_running_turns(settings: Settings) -> None:
    from click.testing import CliRunner

    from clawmem.cli import ClawGroup

    clock = FakeClock(START)
    queue = TurnQueue.from_settings(settings, clock=clock)
    job_ids = [queue.enqueue("first", user_id="cust-7"), queue.enqueue("second", user_id="cust-7")]
    assert queue.store.claim(job_ids[0], clock).acquire(60)
    group = ClawGroup("clawmem", lambda: Site(settings, clock))
    preview = CliRunner().invoke(group, ["erase", "--user-id", "cust-7", "--dry-run", "--wait", "5"])
    assert preview.exit_code == 0, preview.output
    assert "would cancel 1 queued turn(s) of the subject" in preview.output
    assert "1 turn(s) of the subject are running now: erase waits up to 5 s" in preview.output
    assert {queue.job(job_id).status for job_id in job_ids} == {"queued"}
    refused = CliRunner().invoke(group, ["erase", "--user-id", "cust-7", "--wait", "-1", "--yes"])
    assert refused.exit_code == 2 and "--wait" in refused.output


def test_a_turn_left_by_an_enqueue_that_failed_half_way_never_holds_back_its_conversation(
    queue_settings: Settings,
) -> None:
    from clawmem.ids import new_id
    from clawmem.providers import EchoProvider
    from clawmem.turn.pipeline import Claw

    clock = FakeClock(START)
    site = Site(queue_settings, clock)
    queue = TurnQueue(
        site, open_huey(queue_settings), lambda: Claw.from_settings(queue_settings, EchoProvider(), clock)
    )
    first = queue.enqueue("first")
    conversation = queue.job(first).conversation_id
    # The queue's server went away after this enqueue stored the payload: no record, no task.
    queue.store.put_turn(new_id(), conversation, {"message": "lost", "user_id": "", "queued_at": clock()})
    second = queue.enqueue("second", conversation)
    assert isinstance(queue.run(first, conversation, 1), dict)
    record = queue.job(second)
    assert isinstance(queue.run(second, conversation, record.position), float)  # waits: it may be mid-enqueue
    clock.advance(61)  # a hand-over lease later its record would be there
    assert isinstance(queue.run(second, conversation, record.position), dict)
    assert queue.job(second).status == "done" and not queue.store.turn_waiting(conversation, 2)
