"""A cluster on one machine: H hosts on one database and one Redis queue, loaded by locust.

Each host is a process group of its own with its own instance folder (``CLAW_INSTANCE_PATH``):
a preloaded gunicorn dashboard (``gunicorn -c python:dashboard.preload wsgi:app``), a ``clawmem
worker`` (the Huey queue worker, with the echo provider, so no network is needed) and ``clawmem
mcp --http`` (with a token from ``clawmem tokens create``). Every host shares the database
(``--url``, under a fresh table prefix dropped at the end) and the Redis queue (``--queue-url``,
its keys deleted at the end). For each H of ``--hosts`` it runs, for ``--seconds``:

- locust, headless through its Python API, with three kinds of users: agents enqueueing turns
  through ``TurnQueue`` and waiting for each result; operators signed in to the dashboards,
  browsing the Overview, the lists and conversation pages; MCP clients calling ``recall``;
- halfway, host 1's worker is SIGKILLed and started again.

Then, with the workers still running, it measures freshness across hosts (a fact written by host
1's MCP ``remember`` is in host 2's next recall, ``--freshness-tries`` times, and in the next
turns host 2's worker runs), erasure across hosts (``clawmem erase --user-id`` on host 1 leaves
nothing of the subject in host 2's recall, turn or pages), waits for every queued turn to end
(``--drain``: the reaper requeues a killed worker's turns within two minutes), and counts the
agents' job ids against the stored user messages: none lost, none stored twice. It prints one
table per H, with the CPU each kind of process used during the load. Never part of the tests.

    .venv/bin/python -m bench.cluster [--hosts 1,2,4] [--seconds 30] [--url URL]
        [--queue-url redis://127.0.0.1:6379/14] [--freshness-tries 1000]

``--url`` is MariaDB/MySQL (default ``mysql+pymysql://root@127.0.0.1:3306/test``) or PostgreSQL
(``postgresql+psycopg://postgres@127.0.0.1:5432/test``); one that cannot be reached stops the
run at once with one line naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
DEFAULT_QUEUE_URL = "redis://127.0.0.1:6379/14"
CLAWMEM = [sys.executable, "-c", "from clawmem.cli import main; main()"]
FLASK = [sys.executable, "-m", "flask", "--app", "wsgi", "claw"]
PROVIDER_FACTORY = "tests.job_providers:echo"
START_SECONDS = 90
POLL_SECONDS = 0.025  # how often an agent reads its job's record while it waits
TURN_WAIT_SECONDS = 30.0  # an agent stops waiting after this long (the drain still counts the job)
AGENT_MESSAGES = [
    "Where is my parcel? It was due on Friday.",
    "Can I still change the delivery address of my order?",
    "The kettle arrived damaged, how do I return it?",
    "Do you ship to Leeds on weekends?",
    "When do orders ship, and how long does delivery take?",
]
RECALL_MESSAGES = [
    "When will my order ship?",
    "What is the returns policy for damaged items?",
    "Do you deliver on weekends?",
    "How do I change my delivery address?",
]
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
CONVERSATION_LINK = re.compile(r'href="(/conversations/[0-9A-Z]{26})"')
MACHINE = "the whole machine"
DATABASE_PROCESSES = {
    "mariadbd": "mariadb",
    "mysqld": "mariadb",
    "postgres": "postgres",
    "redis-server": "redis",
}


# -- the hosts -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _command(env: dict[str, str], *args: str) -> str:
    """Run one command of a host (``clawmem ...`` or ``flask claw ...``) and return its output;
    a failure stops the bench with the command's last line."""
    result = subprocess.run(
        list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    if result.returncode:
        last = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise SystemExit(f"{' '.join(args[3:] if args[0] == sys.executable else args)} failed: {last}")
    return result.stdout


@dataclass
class Host:
    """One host: its instance folder, environment, addresses, credentials and processes."""

    number: int
    folder: Path
    env: dict[str, str]
    dashboard: str = ""
    mcp: str = ""
    token: str = ""
    password: str = ""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    group: int = 0

    def spawn(self, role: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start one process of this host in the host's process group (the first one leads it)."""
        log = (self.folder / f"{role}.log").open("ab")
        options: dict[str, Any] = {"process_group": self.group}  # 0 for the first: a new group
        process = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **options,
        )
        self.group = self.group or process.pid
        self.processes[role] = process
        return process

    def start_worker(self, threads: int) -> None:
        """Start (or start again) the host's ``clawmem worker`` and wait until it consumes."""
        log = self.folder / "worker.log"
        offset = log.stat().st_size if log.exists() else 0
        process = self.spawn("worker", [*CLAWMEM, "worker", "--workers", str(threads)])
        _wait_for(
            lambda: "worker: redis queue" in log.read_bytes()[offset:].decode(errors="replace"), process, log
        )

    def stop(self) -> None:
        """SIGTERM the host's process group, then SIGKILL what is left after 30 s."""
        if not self.group:
            return
        try:
            os.killpg(self.group, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.group, signal.SIGKILL)


def _wait_for(ready: Any, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not ready():
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise SystemExit(f"{' '.join(map(str, process.args[3:]))} exited: {' | '.join(tail)}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{log.name} did not come up within {START_SECONDS} s")
        time.sleep(0.1)  # waiting for a process to start


def listening(port: int) -> bool:
    """Return whether something accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def start_host(
    number: int, base_env: dict[str, str], folder: Path, options: argparse.Namespace, hosts: list[Host]
) -> None:
    """Set up host ``number`` (its admin and MCP token in its own instance folder), add it to
    ``hosts`` (so that it is stopped whatever happens next) and start its dashboard, worker and
    MCP server."""
    host_folder = folder / f"host{number}"
    instance = host_folder / "instance"
    instance.mkdir(parents=True)
    host = Host(number, host_folder, {**base_env, "CLAW_INSTANCE_PATH": str(instance)})
    hosts.append(host)
    made = _command(host.env, *FLASK, "create-admin", "--generate")
    host.password = re.search(r"password: (\S+)", made).group(1)  # type: ignore[union-attr]
    host.token = _command(host.env, *CLAWMEM, "tokens", "create", "--name", f"bench-host{number}").strip()
    web, mcp = _free_port(), _free_port()
    gunicorn = host.spawn(
        "gunicorn",
        [
            sys.executable, "-m", "gunicorn", "-c", "python:dashboard.preload", "wsgi:app",
            "--workers", str(options.web_workers), "--bind", f"127.0.0.1:{web}", "--timeout", "60",
        ],
    )  # fmt: skip
    host.dashboard = f"http://127.0.0.1:{web}"
    server = host.spawn("mcp", [*CLAWMEM, "mcp", "--http", f"127.0.0.1:{mcp}"])
    host.mcp = f"http://127.0.0.1:{mcp}"
    host.start_worker(options.worker_threads)
    _wait_for(lambda: listening(web), gunicorn, host_folder / "gunicorn.log")
    _wait_for(lambda: listening(mcp), server, host_folder / "mcp.log")


# -- talking to a host -----------------------------------------------------------------------------


def mcp_call(session: Any, host: Host, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call one MCP tool on ``host`` over HTTP and return its structured result; a tool error
    raises ``RuntimeError`` with its text."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    response = session.post(
        f"{host.mcp}/mcp",
        data=json.dumps(body),
        headers={
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "authorization": f"Bearer {host.token}",
        },
        timeout=30,
    )
    response.raise_for_status()
    result = response.json().get("result") or {}
    if result.get("isError") or "structuredContent" not in result:
        raise RuntimeError(f"{tool} on host {host.number}: {json.dumps(result)[:200]}")
    return result["structuredContent"]


def sign_in(session: Any, base: str, password: str) -> None:
    """Sign ``session`` in to the dashboard at ``base`` as its admin."""
    token = CSRF.search(session.get(f"{base}/login", timeout=30).text)
    assert token, "the sign-in page has no form token"
    form = {"csrf_token": token.group(1), "username": "admin", "password": password}
    response = session.post(f"{base}/login", data=form, timeout=30)
    if response.url.rstrip("/") != base:
        raise SystemExit(f"signing in to {base} failed")


def wait_done(queue: Any, job_id: str, timeout: float, stop: Any = lambda: False) -> Any:
    """Return the job's record once it has ended, or the last one read after ``timeout`` s or
    once ``stop()`` is true."""
    deadline = time.monotonic() + timeout
    while True:
        record = queue.job(job_id)
        if (record is not None and record.finished) or time.monotonic() > deadline or stop():
            return record
        time.sleep(POLL_SECONDS)


def _worker_pid(record: Any) -> int | None:
    parts = (record.worker or "").split(":") if record is not None else []
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def turn_on(queue: Any, conversations: Any, host: Host, message: str, user_id: str) -> str | None:
    """Queue turns of ``message`` until one is run by ``host``'s worker; return its reply text
    (``None`` when twenty tries all went to other hosts)."""
    for _ in range(20):
        record = wait_done(queue, queue.enqueue(message, user_id=user_id), 60)
        if record is None or record.status != "done":
            raise SystemExit(f"a probe turn ended {getattr(record, 'status', 'unknown')}")
        if _worker_pid(record) == host.processes["worker"].pid:
            stored = conversations.load(record.conversation_id)
            return next(m.content for m in reversed(stored.messages) if m.role == "assistant")
    return None


# -- the load ----------------------------------------------------------------------------------------


@dataclass
class Load:
    """What the load phase saw: every request event, the agents' job ids, the kill."""

    requests: list[tuple[str, str, float, bool]] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0  # when the load was told to stop (users then finish what they are doing)
    killed_pid: int = 0
    killed_at: float = 0.0
    stopping: bool = False


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def run_load(hosts: list[Host], queue: Any, options: argparse.Namespace) -> Load:
    """Run locust's users against the hosts for ``options.seconds``, killing host 1's worker
    halfway and starting it again."""
    import gevent
    from locust import HttpUser, User, between, constant, task
    from locust.env import Environment

    load = Load()
    numbers = itertools.count(1)
    chooser = random.Random(11)

    class Agent(User):
        """Enqueues a turn, waits for it to end, and goes on in the same conversation for five."""

        fixed_count = options.agents
        wait_time = constant(0)

        def on_start(self) -> None:
            self.user_id = f"cust-agent-{next(numbers)}"
            self.conversation: str | None = None
            self.turns = 0

        @task
        def turn(self) -> None:
            started = time.perf_counter()
            job_id = queue.enqueue(chooser.choice(AGENT_MESSAGES), self.conversation, self.user_id)
            load.jobs.append(job_id)
            record = wait_done(queue, job_id, TURN_WAIT_SECONDS, lambda: load.stopping)
            ok = record is not None and record.status == "done"
            if load.stopping and not ok:
                return  # the load ended while it waited: the drain counts the job
            self.environment.events.request.fire(
                request_type="TURN",
                name="enqueue to done",
                response_time=1000 * (time.perf_counter() - started),
                response_length=0,
                exception=None if ok else RuntimeError(getattr(record, "status", "no record")),
                context={},
            )
            self.turns += 1
            self.conversation = record.conversation_id if ok and self.turns % 5 else None

    class Operator(HttpUser):
        """Signs in to one host's dashboard and browses the Overview, lists and conversations."""

        abstract = True
        wait_time = between(0.2, 1.0)
        password = ""

        def on_start(self) -> None:
            token = CSRF.search(self.client.get("/login", name="sign-in").text)
            form = {
                "csrf_token": token.group(1) if token else "",
                "username": "admin",
                "password": self.password,
            }
            self.client.post("/login", data=form, name="sign-in")
            self.conversations: list[str] = []

        @task(2)
        def overview(self) -> None:
            self.client.get("/", name="overview")

        @task(2)
        def conversation_list(self) -> None:
            page = self.client.get("/conversations/", name="conversations")
            self.conversations = CONVERSATION_LINK.findall(page.text)[:20] or self.conversations

        @task(1)
        def memory_list(self) -> None:
            self.client.get("/memory/", name="memory")

        @task(1)
        def namespace_list(self) -> None:
            self.client.get("/memory/default/", name="memory/default")

        @task(3)
        def conversation(self) -> None:
            if self.conversations:
                self.client.get(chooser.choice(self.conversations), name="conversation")

    class McpClient(HttpUser):
        """Calls one host's MCP ``recall`` tool over HTTP."""

        abstract = True
        wait_time = between(0.05, 0.2)
        token = ""

        @task
        def recall(self) -> None:
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "recall", "arguments": {"message": chooser.choice(RECALL_MESSAGES)}},
            }
            headers = {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
                "authorization": f"Bearer {self.token}",
            }
            with self.client.post(
                "/mcp", data=json.dumps(body), headers=headers, name="mcp recall", catch_response=True
            ) as response:
                # A connection the server closed (status 0) is a failure too, never an exception.
                result = (response.json() or {}).get("result") if response.status_code == 200 else None
                if not result or result.get("isError"):
                    response.failure(f"recall failed: {response.text[:120]}")

    classes: list[type] = [Agent]
    for host, count in zip(hosts, _split(options.operators, len(hosts)), strict=True):
        if count:
            classes.append(
                type(
                    f"Operator{host.number}",
                    (Operator,),
                    {"host": host.dashboard, "password": host.password, "fixed_count": count},
                )
            )
    for host, count in zip(hosts, _split(options.mcp_clients, len(hosts)), strict=True):
        if count:
            classes.append(
                type(
                    f"Mcp{host.number}",
                    (McpClient,),
                    {"host": host.mcp, "token": host.token, "fixed_count": count},
                )
            )
    # Users finish their task when the load ends (an agent stops waiting), never cut mid-query.
    environment = Environment(user_classes=classes, stop_timeout=10)

    def record(request_type: str, name: str, response_time: float, exception: Any, **_: Any) -> None:
        if name != "sign-in":
            load.requests.append((request_type, name, response_time, exception is None))

    environment.events.request.add_listener(record)
    runner = environment.create_local_runner()

    def kill_and_restart() -> None:
        victim = hosts[0].processes["worker"]
        load.killed_pid, load.killed_at = victim.pid, time.time()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        hosts[0].start_worker(options.worker_threads)

    def stop() -> None:
        load.stopping, load.ended = True, time.time()
        runner.quit()

    users = sum(getattr(user, "fixed_count", 0) for user in classes)
    load.started = time.time()
    runner.start(users, spawn_rate=users)
    gevent.spawn_later(options.seconds / 2, kill_and_restart)
    gevent.spawn_later(options.seconds, stop)
    runner.greenlet.join()
    return load


# -- after the load ----------------------------------------------------------------------------------


def freshness(
    hosts: list[Host], queue: Any, conversations: Any, options: argparse.Namespace
) -> dict[str, Any]:
    """Write a new value with host 1's MCP ``remember``, then look for it in host 2's next recall
    (``--freshness-tries`` times) and in turns host 2's worker runs (``--freshness-turns``)."""
    import requests

    writer, reader = hosts[0], hosts[1]
    session = requests.Session()
    salt = uuid.uuid4().hex[:6]
    misses, started = 0, time.perf_counter()
    for attempt in range(options.freshness_tries):
        word = f"route{salt}{attempt}"
        value = f"Parcels on {word} leave the depot at {attempt % 24}:00"
        mcp_call(session, writer, "remember", {"key": "depot_route", "value": value})
        recalled = mcp_call(session, reader, "recall", {"message": f"When does {word} leave the depot?"})
        misses += value not in recalled["text"]
    seconds = time.perf_counter() - started
    turn_misses, turns = 0, 0
    for attempt in range(options.freshness_turns):
        word = f"van{salt}{attempt}"
        value = f"The {word} collects returns at {attempt % 12 + 1} pm"
        mcp_call(session, writer, "remember", {"key": "returns_van", "value": value})
        reply = turn_on(queue, conversations, reader, f"When does the {word} collect returns?", "cust-fresh")
        if reply is not None:
            turns += 1
            turn_misses += value not in reply
    return {
        "tries": options.freshness_tries,
        "misses": misses,
        "seconds": seconds,
        "turns": turns,
        "turn_misses": turn_misses,
    }


def erasure(hosts: list[Host], queue: Any, conversations: Any) -> dict[str, Any]:
    """Give a subject a fact (host 1's MCP) and two turns, check host 2 sees them, erase the
    subject on host 1 with ``clawmem erase --user-id``, and look for any trace on host 2: its
    recall, its worker's next turn, the subject, memory and conversation pages."""
    import requests

    from clawmem.rules import subject_namespace

    writer, reader = hosts[0], hosts[1]
    salt = uuid.uuid4().hex[:8]
    subject, marker = f"cust-erase-{salt}", f"erasemark{salt}"
    namespace = subject_namespace(subject)
    session = requests.Session()
    mcp_call(
        session,
        writer,
        "remember",
        {"key": "delivery_note", "value": f"{marker}: deliveries after noon", "namespace": namespace},
    )
    stored = []
    for _ in range(2):
        record = wait_done(
            queue, queue.enqueue(f"Note for my order, {marker}: after noon", user_id=subject), 60
        )
        stored.append(record.conversation_id)
    browser = requests.Session()
    sign_in(browser, reader.dashboard, reader.password)
    pages = {
        "subject page": f"/subjects/{subject}",
        "memory page": f"/memory/{namespace}/",
        "conversation search": "/conversations/?q=noon",
        **{f"conversation {number + 1}": f"/conversations/{cid}" for number, cid in enumerate(stored)},
    }

    def traces() -> dict[str, bool]:
        seen = {
            "recall": marker
            in mcp_call(session, reader, "recall", {"message": "deliveries after noon", "subject": subject})[
                "text"
            ]
        }
        for name, path in pages.items():
            response = browser.get(reader.dashboard + path, timeout=30)
            seen[name] = response.status_code == 200 and marker in response.text
        return seen

    before = traces()
    _command(writer.env, *CLAWMEM, "erase", "--user-id", subject, "--yes")
    after = traces()
    reply = turn_on(queue, conversations, reader, "Any note about deliveries after noon?", subject)
    after["host 2's next turn"] = reply is not None and marker in reply
    return {
        "seen_before": [name for name, seen in before.items() if seen],
        "traces": [name for name, seen in after.items() if seen],
        "probes": len(after),
    }


def drain(queue: Any, job_ids: list[str], seconds: float) -> dict[str, Any]:
    """Wait up to ``seconds`` for every job to end; return each job's last record."""
    records: dict[str, Any] = {}
    open_jobs = list(job_ids)
    deadline = time.monotonic() + seconds
    while True:
        still = []
        for job_id in open_jobs:
            records[job_id] = queue.job(job_id)
            if records[job_id] is None or not records[job_id].finished:
                still.append(job_id)
        open_jobs = still
        if not open_jobs or time.monotonic() > deadline:
            return records
        time.sleep(1.0)


def stored_jobs(url: str, prefix: str) -> dict[str, int]:
    """Return, per job id, how many stored user messages carry it in their metadata."""
    import sqlalchemy as sa

    from clawmem.sql.schema import tables

    messages = tables(prefix).messages
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    counts: dict[str, int] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(messages.c.metadata).where(
                messages.c.role == "user", messages.c.metadata.like('%"job_id"%')
            )
        )
        for (metadata,) in rows:
            value = json.loads(metadata) if isinstance(metadata, str) else metadata
            if isinstance(value, dict) and isinstance(value.get("job_id"), str):
                counts[value["job_id"]] = counts.get(value["job_id"], 0) + 1
    engine.dispose()
    return counts


# -- where the time goes -------------------------------------------------------------------------


def cpu_seconds(hosts: list[Host]) -> dict[str, float]:
    """Return the CPU seconds used so far by each kind of process: every host's gunicorn (master
    and workers), workers and MCP servers, the database and Redis servers, and this bench."""
    ticks = os.sysconf("SC_CLK_TCK")
    roles: dict[int, str] = {os.getpid(): "bench (locust, agents)"}
    for host in hosts:
        for role, process in host.processes.items():
            roles[process.pid] = {"gunicorn": "gunicorn", "worker": "clawmem worker", "mcp": "clawmem mcp"}[
                role
            ]
    masters = {host.processes["gunicorn"].pid for host in hosts}
    used: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        command = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        pid, parent = int(entry.name), int(fields[1])
        role = roles.get(pid) or ("gunicorn" if parent in masters else DATABASE_PROCESSES.get(command))
        if role:
            used[role] = used.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    machine = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    used[MACHINE] = (sum(machine) - machine[3] - machine[4]) / ticks  # all but idle and iowait
    return used


# -- the run -----------------------------------------------------------------------------------------


def check_services(url: str, queue_url: str) -> str:
    """Return the database's dialect name, or stop with one line naming what cannot be reached."""
    import redis
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise SystemExit(f"--url {url!r} is not a database URL") from None
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() not in ("mysql", "postgresql"):
        raise SystemExit(f"--url {shown}: the cluster runs on MariaDB/MySQL or PostgreSQL")
    timeout = {"connect_timeout": 5}
    try:
        engine = sa.create_engine(parsed, poolclass=sa.pool.NullPool, connect_args=timeout)
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except (sa.exc.SQLAlchemyError, ModuleNotFoundError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise SystemExit(f"cannot reach --url {shown}: {reason}") from None
    try:
        redis.Redis.from_url(queue_url, socket_connect_timeout=5).ping()
    except (redis.RedisError, ValueError) as exc:
        raise SystemExit(f"cannot reach --queue-url {queue_url}: {exc}") from None
    return "mariadb" if parsed.get_backend_name() == "mysql" else "postgresql"


def run_cluster(count: int, options: argparse.Namespace, dialect: str) -> dict[str, Any]:
    """Run one cluster of ``count`` hosts and return its measurements."""
    import redis

    from clawmem.jobs import TurnQueue
    from clawmem.jobs.backend import queue_name
    from clawmem.settings import Settings
    from clawmem.sql.engine import engine_for
    from clawmem.sql.sizes import drop_prefix_tables
    from clawmem.turn.conversations import ConversationLog
    from dashboard.demo import DEMO_ALLOWED_KEY

    prefix = f"cl{uuid.uuid4().hex[:6]}_"
    base_env = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    base_env.update(
        CLAW_DATABASE_URL=options.url,
        CLAW_TABLE_PREFIX=prefix,
        CLAW_QUEUE_URL=options.queue_url,
        CLAW_PROVIDER_FACTORY=PROVIDER_FACTORY,
        CLAW_PII_ALLOW_KEYS=DEMO_ALLOWED_KEY,
        PYTHONPATH=str(ROOT),
    )
    hosts: list[Host] = []
    with tempfile.TemporaryDirectory(prefix="clawmem-cluster-") as folder:
        settings = Settings(
            instance_path=str(Path(folder) / "bench"),
            database_url=options.url,
            table_prefix=prefix,
            queue_url=options.queue_url,
        )
        try:
            first_env = {**base_env, "CLAW_INSTANCE_PATH": str(Path(folder) / "setup")}
            _command(first_env, *CLAWMEM, "init-db")
            _command(first_env, *FLASK, "demo")
            for number in range(1, count + 1):
                start_host(number, base_env, Path(folder), options, hosts)
            queue = TurnQueue.from_settings(settings)
            conversations = ConversationLog.from_settings(settings)
            wait_done(queue, queue.enqueue("Is the queue up?"), 60)
            cpu_before = cpu_seconds(hosts)
            load = run_load(hosts, queue, options)
            cpu_after = cpu_seconds(hosts)
            result_load_average = os.getloadavg()[0]
            result: dict[str, Any] = {"hosts": count, "dialect": dialect, "load": load}
            result["load_average"] = result_load_average
            result["cpu"] = {role: cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0) for role in cpu_after}
            if count >= 2:
                result["freshness"] = freshness(hosts, queue, conversations, options)
                result["erasure"] = erasure(hosts, queue, conversations)
            result["records"] = drain(queue, load.jobs, max(0.0, options.drain - (time.time() - load.ended)))
            result["stored"] = stored_jobs(options.url, prefix)
            return result
        finally:
            for host in hosts:
                host.stop()
            drop_prefix_tables(engine_for(options.url), prefix)  # the vectors table too
            client = redis.Redis.from_url(options.queue_url)
            for key in client.scan_iter(match=f"*{queue_name(settings)}*"):
                client.delete(key)


def _percentile(values: list[float], share: int) -> str:
    """Return the ``share`` percentile of ``values`` in whole milliseconds, or ``-`` for none."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{statistics.quantiles(values, n=100, method='inclusive')[share - 1]:.0f}"


def report(result: dict[str, Any], options: argparse.Namespace) -> list[tuple[str, str]]:
    """Print the table of one cluster and return its rows."""
    load: Load = result["load"]
    records, stored = result["records"], result["stored"]
    window = load.ended - load.started
    done = [r for r in records.values() if r is not None and r.status == "done"]
    in_window = [r for r in done if load.started <= (r.finished_at or 0) <= load.ended]
    latencies = [1000 * (r.finished_at - r.queued_at) for r in done]
    dashboard = [ms for kind, _, ms, ok in load.requests if kind == "GET" and ok]
    dashboard_failed = sum(1 for kind, _, _, ok in load.requests if kind == "GET" and not ok)
    recall = [ms for _, name, ms, ok in load.requests if name == "mcp recall" and ok]
    recall_failed = sum(1 for _, name, _, ok in load.requests if name == "mcp recall" and not ok)
    stuck = [r for r in records.values() if r is None or not r.finished]
    failed = [r for r in records.values() if r is not None and r.status in ("failed", "cancelled")]
    lost = [job for job, r in records.items() if r is not None and r.status == "done" and not stored.get(job)]
    doubled = [job for job in records if stored.get(job, 0) > 1]
    requeued = [job for job, r in records.items() if r is not None and r.attempts > 1]
    rows = [
        ("turns/s", f"{len(in_window) / window:.1f} ({len(in_window)} turns done in {window:.0f} s)"),
        (
            "turn p50 / p95, enqueue to done",
            f"{_percentile(latencies, 50)} / {_percentile(latencies, 95)} ms",
        ),
        (
            "dashboard p95",
            f"{_percentile(dashboard, 95)} ms ({len(dashboard)} pages, {dashboard_failed} failed)",
        ),
        ("MCP recall p95", f"{_percentile(recall, 95)} ms ({len(recall)} calls, {recall_failed} failed)"),
    ]
    if "freshness" in result:
        fresh = result["freshness"]
        rows.append(
            (
                "freshness across hosts",
                f"{fresh['misses']} misses of {fresh['tries']} (host 2's recall, {fresh['seconds']:.0f} s); "
                f"{fresh['turn_misses']} of {fresh['turns']} host 2 worker turns",
            )
        )
        erased = result["erasure"]
        traces = ", ".join(erased["traces"]) or "none"
        rows.append(
            (
                "erasure across hosts",
                f"traces on host 2: {traces} ({erased['probes']} probes, "
                f"{len(erased['seen_before'])} of which showed the subject before)",
            )
        )
    else:
        rows += [("freshness across hosts", "n/a (one host)"), ("erasure across hosts", "n/a (one host)")]
    rows.append(
        (
            "turns lost / duplicated / stuck",
            f"{len(lost)} / {len(doubled)} / {len(stuck)} of {len(records)} job ids "
            f"({len(failed)} failed; {len(requeued)} run again after the SIGKILL)",
        )
    )
    cpu = dict(result["cpu"])
    machine = cpu.pop(MACHINE, 0.0)
    cpu["everything else on the machine"] = max(0.0, machine - sum(cpu.values()))
    shares = sorted(cpu.items(), key=lambda item: -item[1])
    rows.append(
        (
            "CPU during the load (cores)",
            ", ".join(f"{role} {seconds / window:.2f}" for role, seconds in shares if seconds >= 0.5),
        )
    )
    print(
        f"\nH={result['hosts']} on {result['dialect']}: {options.seconds:.0f} s, {options.agents} agents, "
        f"{options.operators} operators, {options.mcp_clients} MCP clients; per host "
        f"{options.web_workers} gunicorn workers, a worker of {options.worker_threads} threads, "
        "an MCP server; "
        f"{os.cpu_count()} cores, load average {result['load_average']:.1f} at the end of the load"
    )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    for record in stuck:
        if record is not None:
            print(
                f"  stuck: job {record.job_id} {record.status}, attempts {record.attempts}, "
                f"worker {record.worker}, {record.reason}"
            )
    for job in lost + doubled:
        print(f"  job {job}: stored {stored.get(job, 0)} times, record {records[job].status}")
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run a cluster for each H of ``--hosts`` and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,2,4", help="host counts, comma-separated (default 1,2,4)")
    parser.add_argument("--seconds", type=float, default=30.0, help="load per H (default 30)")
    parser.add_argument("--url", default=os.environ.get("CLAW_BENCH_MYSQL_URL", DEFAULT_URL))
    parser.add_argument("--queue-url", default=DEFAULT_QUEUE_URL)
    parser.add_argument("--freshness-tries", type=int, default=1000)
    parser.add_argument("--freshness-turns", type=int, default=20, help="turns run by host 2's worker")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--operators", type=int, default=4)
    parser.add_argument("--mcp-clients", type=int, default=4)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers per host")
    parser.add_argument("--worker-threads", type=int, default=2, help="threads of each host's worker")
    parser.add_argument(
        "--drain", type=float, default=150.0, help="seconds after the load for every turn to end"
    )
    options = parser.parse_args(argv)
    try:
        counts = [int(part) for part in options.hosts.split(",")]
    except ValueError:
        raise SystemExit(f"--hosts {options.hosts!r}: give host counts such as 1,2,4") from None
    if not all(1 <= count <= 8 for count in counts) or not 1 <= options.seconds <= 600:
        raise SystemExit("--hosts are 1-8 each and --seconds 1-600")
    import locust  # noqa: F401  (first: it patches the standard library for gevent)

    dialect = check_services(options.url, options.queue_url)
    for count in counts:
        report(run_cluster(count, options, dialect), options)


if __name__ == "__main__":
    main()
