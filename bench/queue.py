"""Background turns: the queue's overhead per turn over a direct ``Claw.send``, and turns per second.

Every turn uses the echo provider, so what is measured is clawmem and Huey, not a model:

1. direct: ``Claw.send`` in this process, one new conversation per turn (the baseline);
2. on SQLite (``queue.db``) and on Redis (``CLAW_BENCH_REDIS_URL``, default
   ``redis://127.0.0.1:6379/15``), against ``clawmem worker`` processes:
   - one turn at a time: ``enqueue``, then wait until the job record says ``done``; the record's
     times split it into waiting for the worker (its polling) and the worker's run.
     Overhead = median end to end - direct median;
   - ``--burst`` turns queued at once to one worker thread: time per turn until the last is
     done. Overhead = that - the direct mean: the queue's own work per turn, without idle polling;
3. turns per second on Redis, ``--burst`` queued at once, with one and with two worker processes.

The turns' conversations live in a SQLite file (``--database-url`` for another database). Each
run uses its own table prefix and queue name, and deletes its Redis keys afterwards. Never part
of the test suite.

    .venv/bin/python -m bench.queue [--turns 200] [--burst 300] [--no-redis]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from clawmem.jobs import TurnQueue
from clawmem.providers import EchoProvider
from clawmem.settings import Settings
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.turn.pipeline import Claw

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = "Where is my parcel? It was due on Monday and the tracking page has not changed since."


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@contextlib.contextmanager
def workers(settings: Settings, count: int, threads: int, log_dir: Path) -> Iterator[None]:
    """``count`` ``clawmem worker`` processes of ``threads`` threads each, stopped at the end."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    env.update(
        CLAW_DATABASE_URL=settings.database_url,
        CLAW_TABLE_PREFIX=settings.table_prefix,
        CLAW_INSTANCE_PATH=settings.instance_path,
        CLAW_QUEUE_URL=settings.queue_url,
        CLAW_PROVIDER_FACTORY="tests.job_providers:echo",
        CLAW_RECORD_RECALL="false",
        PYTHONPATH=str(ROOT),
    )
    processes = []
    for number in range(count):
        log = (log_dir / f"worker-{number}.log").open("w")
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from clawmem.cli import main; main()",
                    "worker",
                    "--workers",
                    str(threads),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        yield
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def wait_done(queue: TurnQueue, job_id: str, timeout: float = 60) -> None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        record = queue.job(job_id)
        if record is not None and record.finished:
            if record.status != "done":
                raise SystemExit(f"job {job_id} ended {record.status}: {record.reason}")
            return
        time.sleep(0.001)
    raise SystemExit(f"job {job_id} did not finish within {timeout} s")


def direct(settings: Settings, turns: int) -> list[float]:
    claw = Claw.from_settings(settings, EchoProvider())
    claw.send(MESSAGE)  # warm the engine and the indexes
    times = []
    for _ in range(turns):
        start = time.perf_counter()
        claw.send(MESSAGE)
        times.append(time.perf_counter() - start)
    return times


def queued(settings: Settings, turns: int, log_dir: Path) -> tuple[list[float], list[float], list[float]]:
    """Return each turn's end-to-end time, and from its record the wait until a worker took it
    and the time the worker ran it."""
    queue = TurnQueue.from_settings(settings)
    with workers(settings, 1, 1, log_dir):
        wait_done(queue, queue.enqueue(MESSAGE), timeout=120)  # the worker is up
        times, waits, runs = [], [], []
        for _ in range(turns):
            start = time.perf_counter()
            job_id = queue.enqueue(MESSAGE)
            wait_done(queue, job_id)
            times.append(time.perf_counter() - start)
            record = queue.job(job_id)
            waits.append(record.started_at - record.queued_at)
            runs.append(record.finished_at - record.started_at)
    return times, waits, runs


def throughput(settings: Settings, burst: int, processes: int, threads: int, log_dir: Path) -> float:
    """Return turns per second: ``burst`` turns queued at once, until the last is done."""
    queue = TurnQueue.from_settings(settings)
    with workers(settings, processes, threads, log_dir):
        wait_done(queue, queue.enqueue(MESSAGE), timeout=120)
        if processes > 1:  # every process is up: each takes one of a small first burst
            for job_id in [queue.enqueue(MESSAGE) for _ in range(4 * processes)]:
                wait_done(queue, job_id)
        start = time.perf_counter()
        job_ids = [queue.enqueue(MESSAGE) for _ in range(burst)]
        for job_id in job_ids:
            wait_done(queue, job_id, timeout=600)
        return burst / (time.perf_counter() - start)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200, help="turns timed one at a time (default 200)")
    parser.add_argument(
        "--burst", type=int, default=300, help="turns queued at once for turns/s (default 300)"
    )
    parser.add_argument("--database-url", default=None, help="where the conversations live (default SQLite)")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis runs")
    options = parser.parse_args()
    redis_url = os.environ.get("CLAW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
    with tempfile.TemporaryDirectory(prefix="clawmem-bench-queue-") as folder:
        base = Path(folder)
        prefix = f"bq{uuid.uuid4().hex[:6]}_"
        url = options.database_url or f"sqlite:///{base / 'claw.db'}"
        settings = Settings(
            instance_path=str(base / "instance"), database_url=url, table_prefix=prefix, record_recall=False
        )
        Path(settings.instance_path).mkdir()
        engine = engine_for(url)
        create_tables(engine, prefix)
        try:
            baseline = direct(settings, options.turns)
            base_median = statistics.median(baseline)
            p95 = percentile(baseline, 0.95)
            print(f"direct Claw.send: median {base_median * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms")
            runs = [("sqlite", settings)]
            if not options.no_redis:
                runs.append(("redis", settings.replace(queue_url=redis_url)))
            for name, run_settings in runs:
                times, waits, ran = queued(run_settings, options.turns, base)
                median = statistics.median(times)
                print(
                    f"{name}, one turn at a time: median {ms(median)} end to end "
                    f"(p95 {ms(percentile(times, 0.95))}),"
                    f" of which waiting for the worker {ms(statistics.median(waits))} and run by it"
                    f" {ms(statistics.median(ran))}; overhead {ms(median - base_median)}"
                )
                rate = throughput(run_settings, options.burst, 1, 1, base)
                per_turn = 1 / rate
                print(
                    f"{name}, {options.burst} turns queued at once, one worker thread: "
                    f"{ms(per_turn)} a turn;"
                    f" overhead {ms(per_turn - statistics.mean(baseline))} a turn over the direct mean"
                )
            if not options.no_redis:
                redis_settings = settings.replace(queue_url=redis_url)
                for processes in (1, 2):
                    rate = throughput(redis_settings, options.burst, processes, 2, base)
                    print(
                        f"redis, {processes} worker process(es) of 2 threads: {rate:.0f} turns/s "
                        f"({options.burst} queued at once)"
                    )
        finally:
            drop_tables(engine, prefix)
            if not options.no_redis:
                import redis

                client = redis.Redis.from_url(redis_url)
                name = TurnQueue.from_settings(settings.replace(queue_url=redis_url)).huey.storage.name
                for key in client.scan_iter(match=f"*{name}*"):
                    client.delete(key)


if __name__ == "__main__":
    main()
