"""Real ``clawmem worker`` processes: turns run and stored on SQLite, two consumers sharing a Redis
queue, and workers SIGKILLed mid-turn that leave nothing half-stored and nothing stored twice.

The test process only enqueues and reads, as a web app would; the turns run in the workers.
Waiting for another process to finish something is the one place these tests poll real time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from clawmem.clock import FakeClock
from clawmem.jobs import TurnQueue
from clawmem.jobs.turns import LEASE_SECONDS
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("CLAW_TEST_REDIS_URL")


class HeldCompletions:
    """A chat-completions server on 127.0.0.1 that holds each request until :meth:`release`
    (``hold=True``), or fails the first ``failures`` requests with HTTP 500; answers ``Noted.``."""

    def __init__(self, hold: bool = False, failures: int = 0) -> None:
        self.received = threading.Event()
        self.released = threading.Event()
        self.requests = 0
        self.failures = failures
        if not hold:
            self.released.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests += 1
                number = server.requests
                server.received.set()
                server.released.wait(timeout=120)
                if number <= server.failures:
                    body, status = b'{"error": "overloaded"}', 500
                else:
                    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Noted."}}]})
                    body, status = body.encode(), 200
                with contextlib.suppress(OSError):  # the worker it answers may have been killed
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[Callable[..., HeldCompletions]]:
    started: list[HeldCompletions] = []

    def start(**options: Any) -> HeldCompletions:
        started.append(HeldCompletions(**options))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def site(tmp_path: Path, prefix: str) -> Iterator[dict[str, Any]]:
    """A site on a SQLite file with its queue in the instance folder: its settings and the
    environment of its worker processes."""
    instance = tmp_path / "instance"
    instance.mkdir()
    url = f"sqlite:///{tmp_path / 'claw.db'}"
    engine = engine_for(url)
    create_tables(engine, prefix)
    env = {name: value for name, value in os.environ.items() if not name.startswith("CLAW")}
    env.update(
        CLAW_DATABASE_URL=url,
        CLAW_TABLE_PREFIX=prefix,
        CLAW_INSTANCE_PATH=str(instance),
        CLAW_PROVIDER_FACTORY="tests.job_providers:echo",
        PYTHONPATH=str(ROOT),
    )
    yield {
        "env": env,
        "settings": Settings(instance_path=str(instance), database_url=url, table_prefix=prefix),
        "tmp": tmp_path,
    }
    drop_tables(engine, prefix)


@contextlib.contextmanager
def worker(site: dict[str, Any], name: str, *arguments: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    """A running ``clawmem worker`` process (stopped with SIGTERM at the end, unless killed)."""
    log = (site["tmp"] / f"{name}.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", "from clawmem.cli import main; main()", "worker", *arguments],
        env={**site["env"], **env},
        cwd=site["tmp"],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def wait_for(check: Callable[[], Any], what: str, site: dict[str, Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    logs = "\n".join(path.read_text()[-3000:] for path in sorted(site["tmp"].glob("*.log")))
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def finished(queue: TurnQueue, job_ids: list[str]) -> Callable[[], bool]:
    return lambda: all((record := queue.job(job_id)) is not None and record.finished for job_id in job_ids)


def said(queue: TurnQueue, conversation_id: str) -> list[tuple[str, str | None]]:
    page = queue.site.conversations.messages(conversation_id, limit=1000)
    return [(m.role, m.content) for m in page.items if m.role in ("user", "assistant")]


def test_a_queued_turn_runs_in_a_worker_and_is_stored(site: dict[str, Any]) -> None:
    queue = TurnQueue.from_settings(site["settings"])
    job_id = queue.enqueue("Where is my parcel?", user_id="cust-1")
    conversation_id = queue.job(job_id).conversation_id
    later = [queue.enqueue(f"and turn {n}", conversation_id, user_id="cust-1") for n in range(2, 6)]
    with worker(site, "worker", "--workers", "3") as process:
        wait_for(finished(queue, [job_id, *later]), "five turns", site)
        assert process.poll() is None
    record = queue.job(job_id)
    assert record.status == "done" and record.attempts == 1 and record.run_id and record.finished_at
    # One conversation's turns ran one after another, in the order they were queued.
    assert said(queue, conversation_id) == [
        ("user", "Where is my parcel?"),
        ("assistant", "echo: Where is my parcel?"),
        *[
            pair
            for n in range(2, 6)
            for pair in (("user", f"and turn {n}"), ("assistant", f"echo: and turn {n}"))
        ],
    ]
    stored = queue.site.conversations.job_messages(conversation_id, job_id)
    assert [m.role for m in stored] == ["user"] and stored[0].metadata["run_id"] == record.run_id
    assert not queue.store.turn_waiting(conversation_id, 1)  # the message left the queue with the job
    assert process.returncode == 0


@pytest.mark.skipif(not REDIS_URL, reason="CLAW_TEST_REDIS_URL is not set")
def test_two_consumers_on_redis_share_fifty_jobs_and_run_each_once(site: dict[str, Any], prefix: str) -> None:
    import redis

    settings = site["settings"].replace(queue_url=REDIS_URL)
    queue = TurnQueue.from_settings(settings)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        job_ids = [queue.enqueue(f"question {n}") for n in range(50)]
        hosts = [worker(site, f"host-{n}", "--workers", "2", CLAW_QUEUE_URL=REDIS_URL) for n in range(2)]
        with hosts[0] as first, hosts[1] as second:
            wait_for(finished(queue, job_ids), "fifty turns", site)
            pids = {str(first.pid), str(second.pid)}
        records = [queue.job(job_id) for job_id in job_ids]
        assert {record.status for record in records} == {"done"}
        assert {record.attempts for record in records} == {1}
        ran_on = {record.worker.split(":")[1] for record in records}
        assert ran_on == pids  # both hosts took a share
        for n, record in enumerate(records):
            assert said(queue, record.conversation_id) == [
                ("user", f"question {n}"),
                ("assistant", f"echo: question {n}"),
            ]
    finally:
        for key in client.scan_iter(match=f"*{queue.huey.storage.name}*"):
            client.delete(key)


def test_a_worker_killed_while_the_provider_answers_stores_nothing_and_the_turn_runs_once(
    site: dict[str, Any], servers: Callable[..., HeldCompletions]
) -> None:
    provider = servers(hold=True)
    queue = TurnQueue.from_settings(site["settings"])
    job_id = queue.enqueue("Refund my order 1234")
    conversation_id = queue.job(job_id).conversation_id
    env = {"CLAW_PROVIDER_FACTORY": "tests.job_providers:loopback", "CLAWTEST_PROVIDER_URL": provider.url}
    with worker(site, "killed", **env) as process:
        wait_for(provider.received.is_set, "the provider call", site)
        assert queue.job(job_id).status == "running"
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert said(queue, conversation_id) == [] and queue.site.conversations.get(conversation_id) is None
    # Once the lease has run out, the reaper (any worker's, once a minute) requeues it.
    later = FakeClock(time.time() + LEASE_SECONDS + 1)
    assert TurnQueue.from_settings(site["settings"], clock=later).reap() == {"requeued": 1, "failed": 0}
    assert queue.job(job_id).status == "queued" and "requeued" in queue.job(job_id).reason
    provider.release()
    with worker(site, "next", **env):
        wait_for(finished(queue, [job_id]), "the requeued turn", site)
    record = queue.job(job_id)
    assert record.status == "done" and record.attempts == 2
    assert said(queue, conversation_id) == [("user", "Refund my order 1234"), ("assistant", "Noted.")]


def test_a_worker_killed_after_the_commit_is_recognised_and_not_stored_twice(
    site: dict[str, Any], servers: Callable[..., HeldCompletions]
) -> None:
    hold = servers(hold=True)
    queue = TurnQueue.from_settings(site["settings"])
    job_id = queue.enqueue("Change my address")
    conversation_id = queue.job(job_id).conversation_id
    env = {
        "CLAW_PROVIDER_FACTORY": "tests.job_providers:echo_then_hold_after_commit",
        "CLAWTEST_HOLD_URL": hold.url,
    }
    with worker(site, "killed", **env) as process:
        wait_for(hold.received.is_set, "the commit", site)
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert queue.job(job_id).status == "running"
    turn = [("user", "Change my address"), ("assistant", "echo: Change my address")]
    assert said(queue, conversation_id) == turn  # committed whole, in one append
    later = FakeClock(time.time() + LEASE_SECONDS + 1)
    assert TurnQueue.from_settings(site["settings"], clock=later).reap() == {"requeued": 1, "failed": 0}
    with worker(site, "next"):
        wait_for(finished(queue, [job_id]), "the requeued turn", site)
    record = queue.job(job_id)
    assert record.status == "done" and record.reason == "found stored by an earlier attempt"
    assert said(queue, conversation_id) == turn  # not stored twice


def test_a_provider_failure_is_retried_with_backoff(
    site: dict[str, Any], servers: Callable[..., HeldCompletions]
) -> None:
    provider = servers(failures=1)
    queue = TurnQueue.from_settings(site["settings"])
    job_id = queue.enqueue("Is the shop open?")
    env = {"CLAW_PROVIDER_FACTORY": "tests.job_providers:loopback", "CLAWTEST_PROVIDER_URL": provider.url}
    with worker(site, "retrying", **env):
        retry = wait_for(lambda: (r := queue.job(job_id)) and r.error_class and r, "the failed attempt", site)
        assert retry.error_class == "ProviderError" and "retrying in 2 s" in retry.reason
        assert "Is the shop open" not in json.dumps(retry.as_value())
        wait_for(finished(queue, [job_id]), "the retried turn", site)
    record = queue.job(job_id)
    assert record.status == "done" and record.attempts == 2 and provider.requests == 2
    assert said(queue, record.conversation_id)[-1] == ("assistant", "Noted.")


def test_a_turn_that_keeps_failing_ends_failed_with_its_reason(
    site: dict[str, Any], servers: Callable[..., HeldCompletions]
) -> None:
    provider = servers(failures=10)
    queue = TurnQueue.from_settings(site["settings"])
    job_id = queue.enqueue("Hello?", conversation_id=f"c{uuid.uuid4().hex[:12]}")
    env = {"CLAW_PROVIDER_FACTORY": "tests.job_providers:loopback", "CLAWTEST_PROVIDER_URL": provider.url}
    with worker(site, "failing", **env):
        wait_for(finished(queue, [job_id]), "the failed turn", site, timeout=120)
    record = queue.job(job_id)
    assert record.status == "failed" and record.attempts == 3 and provider.requests == 3
    assert record.error_class == "ProviderError" and "HTTP 500" in record.reason and "\n" not in record.reason
    assert queue.site.conversations.get(record.conversation_id) is None


# -- a worker killed at any point of a turn ------------------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def queue_site(
    request: pytest.FixtureRequest, site: dict[str, Any]
) -> Iterator[tuple[Settings, dict[str, str]]]:
    """The site's settings and its workers' extra environment, its queue on SQLite, then on
    Redis (its keys deleted after)."""
    if request.param == "sqlite":
        yield site["settings"], {}
        return
    if not REDIS_URL:
        pytest.skip("CLAW_TEST_REDIS_URL is not set")
    import redis

    settings = site["settings"].replace(queue_url=REDIS_URL)
    yield settings, {"CLAW_QUEUE_URL": REDIS_URL}
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"*{TurnQueue.from_settings(settings).huey.storage.name}*"):
        client.delete(key)


# Where the worker is killed, what the job's record says then, and how its next run goes.
KILLED_AT = {
    "taken": ("queued", 1, None),  # Huey handed the task out; nothing of the job was written
    "running": ("running", 2, None),  # marked running, before the provider was called
    "stored": ("running", 2, "found stored by an earlier attempt"),  # committed, not yet done
    "done": ("done", 1, None),  # the record ended, the payload the next turn waits on was left
}


@pytest.mark.parametrize("point", list(KILLED_AT))
def test_a_worker_killed_at_any_point_leaves_no_job_stuck_and_no_turn_twice(
    site: dict[str, Any], queue_site: tuple[Settings, dict[str, str]], point: str
) -> None:
    settings, extra = queue_site
    queue = TurnQueue.from_settings(settings)
    first = queue.enqueue("Where is my parcel?", user_id="cust-1")
    conversation_id = queue.job(first).conversation_id
    second = queue.enqueue("And my refund?", conversation_id, user_id="cust-1")
    marker = site["tmp"] / f"paused-at-{point}"
    with worker(site, "killed", **extra, CLAWTEST_WORKER_PAUSE=f"{point}:{marker}") as process:
        wait_for(marker.exists, f"the worker to reach {point!r}", site)
        process.send_signal(signal.SIGKILL)
        process.wait()
    status, attempts, reason = KILLED_AT[point]
    assert queue.job(first).status == status and queue.job(second).status == "queued"
    assert queue.reap() == {"requeued": 0, "failed": 0}  # the leases are still live
    # Once they have run out (the reaper runs once a minute on every worker), the job whose worker
    # died is handed over again; the later turn, still waiting in the queue, is left as it is.
    later = FakeClock(time.time() + LEASE_SECONDS + 1)
    requeued = 0 if point == "done" else 1
    assert TurnQueue.from_settings(settings, clock=later).reap() == {"requeued": requeued, "failed": 0}
    with worker(site, "next", **extra):
        wait_for(finished(queue, [first, second]), "both turns", site)
    record = queue.job(first)
    assert record.status == "done" and record.attempts == attempts
    if reason:
        assert record.reason == reason
    assert queue.job(second).status == "done"
    assert said(queue, conversation_id) == [  # each turn stored once, in order
        ("user", "Where is my parcel?"),
        ("assistant", "echo: Where is my parcel?"),
        ("user", "And my refund?"),
        ("assistant", "echo: And my refund?"),
    ]
    assert not queue.store.turn_waiting(conversation_id, 1) and not queue.store.turn_waiting(
        conversation_id, 2
    )


# -- erase --user-id and a running turn ----------------------------------------------------------


class Erase:
    """A ``clawmem erase`` process of the site, its stderr read line by line as it comes."""

    def __init__(self, site: dict[str, Any], *arguments: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from clawmem.cli import main; main()", "erase", *arguments],
            env=site["env"],
            cwd=site["tmp"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.errors: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.errors.append(line)

    def finish(self) -> tuple[int, str, str]:
        output = self.process.stdout.read()
        code = self.process.wait(timeout=120)
        self.reader.join(timeout=10)
        self.process.stdout.close()
        self.process.stderr.close()
        return code, output, "".join(self.errors)


def test_erase_waits_for_the_subjects_running_turn_so_nothing_is_stored_after_it(
    site: dict[str, Any], servers: Callable[..., HeldCompletions]
) -> None:
    provider = servers(hold=True)
    queue = TurnQueue.from_settings(site["settings"])
    running = queue.enqueue("My address is 1 Elm Street", user_id="cust-7")
    conversation_id = queue.job(running).conversation_id
    queued = queue.enqueue("and my phone is 555-0100", conversation_id, user_id="cust-7")
    other = queue.enqueue("keep mine", user_id="cust-8")
    env = {"CLAW_PROVIDER_FACTORY": "tests.job_providers:loopback", "CLAWTEST_PROVIDER_URL": provider.url}
    with worker(site, "worker", **env):
        wait_for(provider.received.is_set, "the provider call", site)
        erase = Erase(site, "--user-id", "cust-7", "--yes")
        wait_for(lambda: any("waiting up to 60 s" in line for line in erase.errors), "erase to wait", site)
        assert queue.job(running).status == "running"  # erase is waiting for it, deleting nothing yet
        provider.release()
        code, output, errors = erase.finish()
        assert code == 0, output + errors
        assert "cancelled 1 queued turn(s) of the subject" in output
        assert "waited for 1 running turn(s) of the subject to finish" in output
        assert "deleted 1 conversation," in output
        wait_for(finished(queue, [other]), "the other subject's turn", site)
    assert queue.job(running).status == "done" and queue.job(queued).status == "cancelled"
    # The turn that was running when erase began stored before erase deleted, so nothing is left.
    assert queue.site.conversations.get(conversation_id) is None
    assert said(queue, queue.job(other).conversation_id)[0] == ("user", "keep mine")


def test_erase_stops_in_one_line_when_a_turn_still_runs_and_deletes_nothing_more(
    site: dict[str, Any], servers: Callable[..., HeldCompletions]
) -> None:
    provider = servers(hold=True)
    queue = TurnQueue.from_settings(site["settings"])
    queue.site.conversations.append("earlier-7", [{"role": "user", "content": "hi"}], user_id="cust-7")
    running = queue.enqueue("Cancel my plan", user_id="cust-7")
    conversation_id = queue.job(running).conversation_id
    queued = queue.enqueue("and refund it", conversation_id, user_id="cust-7")
    env = {"CLAW_PROVIDER_FACTORY": "tests.job_providers:loopback", "CLAWTEST_PROVIDER_URL": provider.url}
    with worker(site, "worker", **env):
        wait_for(provider.received.is_set, "the provider call", site)
        code, output, errors = Erase(site, "--user-id", "cust-7", "--yes", "--wait", "1").finish()
        assert code == 1, errors
        waited, stopped = errors.splitlines()  # it waited, then stopped in one line
        assert waited == "waiting up to 1 s for 1 running turn(s) of the subject to finish"
        assert stopped.startswith(
            "Error: erase stopped: 1 turn(s) of the subject still running after waiting 1 s"
        )
        assert f"job {running} (lease until " in stopped and "nothing more was deleted" in stopped
        assert "cust-7" not in output + errors
        assert queue.site.conversations.get("earlier-7") is not None  # nothing deleted
        assert queue.job(queued).status == "cancelled"  # its queued turn went, as the line says
        provider.release()
        wait_for(finished(queue, [running]), "the held turn", site)
        code, output, errors = Erase(site, "--user-id", "cust-7", "--yes", "--wait", "1").finish()
        assert code == 0, output + errors
    assert queue.site.conversations.get("earlier-7") is None
    assert queue.site.conversations.get(conversation_id) is None


def test_a_queued_turn_extracts_its_facts_on_the_worker(site: dict[str, Any]) -> None:
    from clawmem.memory.registry import open_memory
    from clawmem.recall.sources import serving_driver
    from tests.loopback import LoopbackCompletions

    provider = LoopbackCompletions().start()
    try:
        answer = json.dumps({"facts": [{"key": "parcel", "value": "parcel 7 goes to the office"}]})
        provider.script("It is on its way.", answer)
        queue = TurnQueue.from_settings(site["settings"])
        job_id = queue.enqueue("Send parcel 7 to my office.", user_id="cust-1")
        env = {
            "CLAW_PROVIDER_FACTORY": "tests.job_providers:loopback",
            "CLAWTEST_PROVIDER_URL": provider.url,
            "CLAW_MEMORY_WRITES": "extract",
        }
        with worker(site, "extracting", **env):
            wait_for(finished(queue, [job_id]), "the extracting turn", site)
    finally:
        provider.stop()
    record = queue.job(job_id)
    assert record.status == "done" and len(provider.bodies) == 2  # the reply, then one extraction
    driver, _ = serving_driver(open_memory(site["settings"], FakeClock(0)), "user:cust-1")
    row = driver.entry("user:cust-1", "parcel")  # type: ignore[attr-defined]
    assert row.value == "parcel 7 goes to the office"
    assert row.metadata["origin"] == "extract" and row.metadata["conversation_id"] == record.conversation_id
    assert row.metadata["run_id"] == record.run_id
    assert queue.site.conversations.get(record.conversation_id).total_tokens == 108 + 109
