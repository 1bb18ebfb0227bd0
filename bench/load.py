"""A real load with faults: the dashboard behind two gunicorn workers on MariaDB, crawled by
signed-in clients while an agent writes turns and the CLI prunes and sweeps, and one worker is
killed with SIGKILL halfway. Never part of the test suite; loopback only.

    .venv/bin/python -m bench.load [--seconds 60] [--clients 20] [--database-url URL]

Everything lives under a table prefix and an instance folder of its own, removed at the end.
The run is bounded: ``--seconds`` (at most 300) of load, ``--clients`` (at most 50) crawlers, one
agent, and each request times out after 30 s. It prints requests served, p50/p95/p99 per page,
errors (apart from the requests in flight on the killed worker, which are counted on their own),
the CLI runs, and whether every turn the agent completed is stored with no orphan messages.

MariaDB/MySQL: ``--database-url`` or ``CLAW_BENCH_MYSQL_URL`` (default
``mysql+pymysql://root@127.0.0.1:3306/test``); its host must be the loopback interface.
"""

from __future__ import annotations

import argparse
import http.client
import http.cookiejar
import json
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
PASSWORD = "bench password long enough"
REQUEST_TIMEOUT = 30
# Requests that fail within this long after the kill, having started before it, were in flight
# on the killed worker (or queued on its socket).
KILL_GRACE_SECONDS = 2.0
AGENT_CONVERSATIONS = 10
AGENT_MESSAGES = [
    "Where is my parcel? It was due on Friday.",
    "Can I still change the delivery address of my order?",
    "The kettle arrived damaged, how do I return it?",
    "Do you ship to Leeds on weekends?",
]


# -- the agent: a process of its own, writing turns to the same database ----------------------------


def run_agent(seconds: float, out: Path) -> None:
    """Run turns for ``seconds`` (settings from ``CLAW_*``), appending one JSON line per turn
    completed (its conversation and the id of the run) to ``out``."""
    from clawmem.errors import GuardBlocked
    from clawmem.providers.echo import EchoProvider
    from clawmem.settings import Settings
    from clawmem.turn.pipeline import Claw

    settings = Settings.from_env(instance_path=os.environ["CLAW_INSTANCE_PATH"])
    claw = Claw.from_settings(settings, EchoProvider())
    chooser = random.Random(7)
    conversations = [f"load{index:02d}{uuid.uuid4().hex[:8]}" for index in range(AGENT_CONVERSATIONS)]
    deadline = time.monotonic() + seconds
    number = 0
    with out.open("a", encoding="utf-8") as log:
        while time.monotonic() < deadline:
            index = number % AGENT_CONVERSATIONS
            number += 1
            try:
                reply = claw.send(
                    chooser.choice(AGENT_MESSAGES),
                    conversation_id=conversations[index],
                    user_id=f"cust-load-{index}",
                )
            except GuardBlocked:  # the guard stopped the turn: nothing stored, as it should be
                log.write(json.dumps({"blocked": True}) + "\n")
                log.flush()
                continue
            log.write(json.dumps({"conversation_id": reply.conversation_id, "run_id": reply.run_id}) + "\n")
            log.flush()


# -- the crawlers ----------------------------------------------------------------------------------


@dataclass
class Sample:
    """One request: its page, path, when it started and ended (monotonic), status or error."""

    page: str
    path: str
    started: float
    ended: float
    status: int | None
    error: str | None = None


@dataclass
class Crawl:
    """What every crawler saw."""

    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sample: Sample) -> None:
        with self.lock:
            self.samples.append(sample)


def _browser() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def sign_in(base: str) -> urllib.request.OpenerDirector:
    """Return a browser signed in as the bench admin."""
    browser = _browser()
    with browser.open(f"{base}/login", timeout=REQUEST_TIMEOUT) as response:
        token = re.search(r'name="csrf_token" value="([^"]+)"', response.read().decode())
    assert token, "the sign-in page has no form token"
    form = urllib.parse.urlencode({"csrf_token": token.group(1), "username": "admin", "password": PASSWORD})
    with browser.open(f"{base}/login", data=form.encode(), timeout=REQUEST_TIMEOUT) as response:
        assert response.url.rstrip("/") == base, "sign-in failed"
    return browser


def pages(base: str, browser: urllib.request.OpenerDirector) -> list[tuple[str, str, dict[str, str]]]:
    """Return ``(label, url, headers)`` of every page and fragment a crawler visits."""
    with browser.open(f"{base}/conversations/", timeout=REQUEST_TIMEOUT) as response:
        listing = response.read().decode()
    conversations = re.findall(r'href="(/conversations/[0-9A-Z]{26})"', listing)
    fragment = {"HX-Request": "true"}
    found = [
        ("overview", "/", {}),
        ("conversations", "/conversations/", {}),
        ("conversations?q", "/conversations/?q=parcel", {}),
        (
            "conversations fragment",
            "/conversations/?q=order",
            {**fragment, "HX-Target": "conversation-results"},
        ),
        ("memory", "/memory/", {}),
        ("memory/default", "/memory/default/", {}),
        ("memory/user", "/memory/user:cust-1001/", {}),
        ("memory entry", "/memory/default/entry?key=shipping_policy", {}),
        ("preview", "/preview?message=where+is+my+parcel", {}),
        (
            "preview fragment",
            "/preview?message=refund+for+a+damaged+kettle",
            {**fragment, "HX-Target": "preview-result"},
        ),
        ("cold", "/cold", {}),
        ("settings", "/settings", {}),
    ]
    found += [("conversation", path, {}) for path in conversations[:10]]
    return found


def crawl(
    base: str,
    browser: urllib.request.OpenerDirector,
    visits: list[tuple[str, str, dict[str, str]]],
    until: float,
    seed: int,
    crawl_log: Crawl,
) -> None:
    """Visit pages in random order until ``until`` (monotonic), recording every request."""
    chooser = random.Random(seed)
    while time.monotonic() < until:
        label, path, headers = chooser.choice(visits)
        request = urllib.request.Request(base + path, headers=headers)
        started = time.monotonic()
        try:
            with browser.open(request, timeout=REQUEST_TIMEOUT) as response:
                response.read()
                crawl_log.add(Sample(label, path, started, time.monotonic(), response.status))
        except urllib.error.HTTPError as exc:
            crawl_log.add(Sample(label, path, started, time.monotonic(), exc.code, f"HTTP {exc.code}"))
        except (OSError, http.client.HTTPException) as exc:  # reset, cut short: a killed worker
            crawl_log.add(Sample(label, path, started, time.monotonic(), None, type(exc).__name__))


# -- the run -----------------------------------------------------------------------------------------


def _check_loopback(url: str) -> None:
    host = make_url(url).host or ""
    if host not in LOOPBACK:
        raise SystemExit(f"the database must be on the loopback interface, not {host!r}")


Served = tuple[subprocess.Popen[str], str, list[int], queue.Queue[str]]


def _start_gunicorn(instance: Path, environment: dict[str, str]) -> Served:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--workers",
            "2",
            "--bind",
            "127.0.0.1:0",
            "--log-level",
            "info",
            "--timeout",
            "60",
            f"dashboard:create_app(instance_path={str(instance)!r})",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in iter(process.stderr.readline, ""):  # type: ignore[union-attr]
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    address, workers = None, []
    deadline = time.monotonic() + 60
    while address is None or len(workers) < 2:
        line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
        found = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", line)
        address = found.group(1) if found else address
        booted = re.search(r"Booting worker with pid: (\d+)", line)
        if booted:
            workers.append(int(booted.group(1)))
    return process, address, workers, lines


def _claw(environment: dict[str, str], *args: str) -> tuple[str, int, float, str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", "from clawmem.cli import main; main()", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    last = (result.stdout.strip().splitlines() or result.stderr.strip().splitlines() or [""])[-1]
    return " ".join(args), result.returncode, time.monotonic() - started, last


def _percentile(values: list[float], share: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[share - 1]


def _stored(url: str, prefix: str, completed: list[dict[str, str]]) -> dict[str, Any]:
    from clawmem.sql.schema import tables

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    schema = tables(prefix)
    conversations, messages = schema.conversations, schema.messages
    expected: dict[str, int] = {}
    for turn in completed:
        expected[turn["conversation_id"]] = expected.get(turn["conversation_id"], 0) + 1
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                sa.select(messages.c.conversation_id, sa.func.count())
                .where(messages.c.role == "user", messages.c.conversation_id.in_(list(expected)))
                .group_by(messages.c.conversation_id)
            ).all()
        )
        orphans = conn.execute(
            sa.select(sa.func.count())
            .select_from(messages)
            .where(~sa.exists().where(conversations.c.id == messages.c.conversation_id))
        ).scalar()
        present = set(conn.execute(sa.select(conversations.c.id)).scalars())
    engine.dispose()
    return {
        "turns": len(completed),
        "stored": sum(min(count, stored.get(cid, 0)) for cid, count in expected.items()),
        "missing": sum(max(0, count - stored.get(cid, 0)) for cid, count in expected.items()),
        "orphans": int(orphans or 0),
        "present": present,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the load and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--database-url", default=os.environ.get("CLAW_BENCH_MYSQL_URL", DEFAULT_MYSQL_URL))
    parser.add_argument("--agent", metavar="OUT", help=argparse.SUPPRESS)  # the agent process itself
    options = parser.parse_args(argv)
    if options.agent:
        run_agent(options.seconds, Path(options.agent))
        return
    if not 1 <= options.seconds <= 300 or not 1 <= options.clients <= 50:
        raise SystemExit("--seconds is 1-300 and --clients 1-50")
    _check_loopback(options.database_url)

    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import drop_tables
    from dashboard import accounts, create_app
    from dashboard.demo import DEMO_ALLOWED_KEY

    prefix = f"load{uuid.uuid4().hex[:6]}_"
    with tempfile.TemporaryDirectory(prefix="clawmem-load-") as folder:
        instance = Path(folder) / "instance"
        config = {"DATABASE_URL": options.database_url, "TABLE_PREFIX": prefix}
        app = create_app(config, instance_path=str(instance))
        result = app.test_cli_runner().invoke(args=["claw", "demo"])
        assert result.exit_code == 0, result.output
        with app.app_context():
            accounts.create_admin("admin", PASSWORD, time.time())
        # The demo shop's own escalation address is allowed past the PII guard, as in make run.
        environment = {
            **os.environ,
            "CLAW_INSTANCE_PATH": str(instance),
            "CLAW_PII_ALLOW_KEYS": DEMO_ALLOWED_KEY,
            **{f"CLAW_{name}": value for name, value in config.items()},
        }
        gunicorn, base, workers, log_lines = _start_gunicorn(instance, environment)
        try:
            _run(options, base, workers, environment, Path(folder), prefix)
        finally:
            gunicorn.terminate()
            try:
                gunicorn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                gunicorn.kill()
                gunicorn.wait()
            drop_tables(engine_for(options.database_url), prefix)
            del log_lines


def _run(
    options: argparse.Namespace,
    base: str,
    workers: list[int],
    environment: dict[str, str],
    folder: Path,
    prefix: str,
) -> None:
    browsers = [sign_in(base) for _ in range(options.clients)]  # one after another: attempts count
    visits = pages(base, browsers[0])
    turns_file = folder / "turns.jsonl"
    agent = subprocess.Popen(
        [sys.executable, "-m", "bench.load", "--agent", str(turns_file), "--seconds", str(options.seconds)],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    crawl_log = Crawl()
    start = time.monotonic()
    until = start + options.seconds
    crawlers = [
        threading.Thread(target=crawl, args=(base, browser, visits, until, number, crawl_log))
        for number, browser in enumerate(browsers)
    ]
    for crawler in crawlers:
        crawler.start()
    cli_runs = []
    # The demo's conversations span three weeks: each prune deletes the older ones.
    plan = [
        (0.25, ("prune", "--older-than", "14d", "--yes")),
        (0.4, ("sweep", "--yes")),
        (0.5, "kill"),
        (0.75, ("prune", "--older-than", "10d", "--yes")),
        (0.85, ("sweep", "--yes")),
    ]
    killed_at = None
    for share, action in plan:
        time.sleep(max(0.0, start + share * options.seconds - time.monotonic()))
        if action == "kill":
            os.kill(workers[0], signal.SIGKILL)
            killed_at = time.monotonic()
        else:
            cli_runs.append(_claw(environment, *action))
    for crawler in crawlers:
        crawler.join()
    agent_errors = agent.communicate(timeout=options.seconds + 120)[1]
    lines = turns_file.read_text().splitlines() if turns_file.exists() else []
    turns = [json.loads(line) for line in lines]
    completed = [turn for turn in turns if "conversation_id" in turn]
    stored = _stored(options.database_url, prefix, completed)
    stored["blocked"] = len(turns) - len(completed)
    _report(
        crawl_log.samples,
        killed_at,
        cli_runs,
        stored,
        agent.returncode,
        agent_errors,
        options,
        time.monotonic() - start,
    )


def _report(
    samples: list[Sample],
    killed_at: float | None,
    cli_runs: list[tuple[str, int, float, str]],
    stored: dict[str, Any],
    agent_code: int | None,
    agent_errors: str,
    options: argparse.Namespace,
    elapsed: float,
) -> None:
    def in_flight(sample: Sample) -> bool:
        return (
            killed_at is not None
            and sample.status is None
            and sample.started <= killed_at + KILL_GRACE_SECONDS
            and killed_at <= sample.ended <= killed_at + KILL_GRACE_SECONDS
        )

    def pruned(sample: Sample) -> bool:
        # A conversation prune deleted meanwhile answers 404: correct, not an error.
        found = re.fullmatch(r"/conversations/([0-9A-Z]{26})", sample.path)
        return sample.status == 404 and found is not None and found.group(1) not in stored["present"]

    def failed(sample: Sample) -> bool:
        return sample.status != 200 and not in_flight(sample) and not pruned(sample)

    by_page: dict[str, list[Sample]] = {}
    for sample in samples:
        by_page.setdefault(sample.page, []).append(sample)
    print(
        f"{options.clients} signed-in clients for {options.seconds:.0f} s against 2 gunicorn workers on "
        f"MariaDB (ran {elapsed:.1f} s); one worker SIGKILLed at {options.seconds / 2:.0f} s"
    )
    print(f"{'page':<24} {'requests':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for page in sorted(by_page):
        rows = by_page[page]
        ok = [1000 * (s.ended - s.started) for s in rows if s.status == 200]
        errors = sum(1 for s in rows if failed(s))
        if ok:
            print(
                f"{page:<24} {len(rows):>8} {_percentile(ok, 50):>8.1f} {_percentile(ok, 95):>8.1f} "
                f"{_percentile(ok, 99):>8.1f} {errors:>6}"
            )
        else:
            print(f"{page:<24} {len(rows):>8} {'-':>8} {'-':>8} {'-':>8} {errors:>6}")
    every = [1000 * (s.ended - s.started) for s in samples if s.status == 200]
    lost = sum(1 for s in samples if in_flight(s))
    gone = sum(1 for s in samples if pruned(s))
    errors = sum(1 for s in samples if failed(s))
    print(
        f"{'all pages':<24} {len(samples):>8} {_percentile(every, 50):>8.1f} "
        f"{_percentile(every, 95):>8.1f} {_percentile(every, 99):>8.1f} {errors:>6}"
    )
    print(
        f"requests served: {len(every)} of {len(samples)}; errors: {errors}; "
        f"in flight on the killed worker: {lost}; 404 for conversations pruned meanwhile: {gone}"
    )
    kinds: dict[str, int] = {}
    for sample in samples:
        if sample.status != 200:
            kinds[sample.error or str(sample.status)] = kinds.get(sample.error or str(sample.status), 0) + 1
    if kinds:
        print("failures by kind: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())))
    for command, code, seconds, last in cli_runs:
        print(f"clawmem {command}: exit {code} in {seconds:.1f} s ({last})")
    print(
        f"agent: exit {agent_code}, {stored['turns']} turns completed, {stored['stored']} stored, "
        f"{stored['missing']} missing, {stored['blocked']} blocked by the PII guard; "
        f"orphan messages: {stored['orphans']}"
    )
    if agent_code:
        print(agent_errors.strip().splitlines()[-1] if agent_errors.strip() else "(no error output)")


if __name__ == "__main__":
    main()
