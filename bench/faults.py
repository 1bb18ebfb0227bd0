"""Network faults under a steady load: a TCP proxy between clawmem and each server (MariaDB,
PostgreSQL, Redis) injects latency, a bandwidth limit, a stall (timeout), a reset and the server
gone for a few seconds, one after another, while threads run turns through ``Claw.send``, memory
writes and recalls, the dashboard's pages (Flask's test client, signed in) and MCP recalls
(``tools/call recall`` over ``clawmem mcp --http``'s app, served by uvicorn in a thread, with a
token scoped to the written namespace: the answer must hold the value last written). Never part
of the test suite; loopback only.

    .venv/bin/python -m bench.faults [--servers mariadb,postgres,redis] [--fault-seconds 4]

The proxy is a small asyncio relay in this module (Toxiproxy's server is not installable here):

- ``latency``: every chunk waits 300 ms before it is passed on;
- ``bandwidth``: 4 KiB/s each way;
- ``timeout``: nothing is passed on, the connections stay open; when the fault ends they are
  closed, as a firewall that dropped them would leave them;
- ``reset``: every open connection is closed abruptly (RST) on both sides, at the start of the
  fault and once a second while it lasts;
- ``commit``: a connection that sends ``COMMIT`` is reset once the server has answered it, and
  the answer is dropped (the commit is done; the client cannot tell);
- ``down``: the listener closes (new connections are refused) and every open one is reset.

Each turn carries a unique marker; afterwards the stored rows are read straight from the server
(not through the proxy) and counted: a turn that succeeded and has no row is lost, a turn with
two rows was stored twice (whether or not it reported an error). A failed turn is sent again
with its job id, with the queue worker's attempts and backoff. Each memory write is a unique key
whose value is read back, and its entry page must show that value. For each fault it prints the
operations that ended while it was on or in the settle time after it (``SETTLE_SECONDS``), their
errors by kind, the turns retried and given up (and of those, stored anyway: the commit had
landed), lost and doubled turns, wrong answers, and the seconds from the end of the fault to
the last failure (``recovery``). ``CLAW_BENCH_VERBOSE=1`` lists every failure.

On MariaDB and PostgreSQL both the conversation log and the memory are on the proxied server;
on Redis the memory and the queue are (the conversation log is a local SQLite file), and a
``clawmem worker`` process runs turns queued every 0.2 s through the same proxy: after the
faults, every job enqueued without error must end ``done`` with its turn stored once. URLs come from
``CLAW_BENCH_MYSQL_URL``, ``CLAW_BENCH_POSTGRES_URL`` and ``CLAW_BENCH_REDIS_URL`` (defaults:
the services on 127.0.0.1, Redis db 14). Everything lives under a table/key prefix of its own,
removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import make_url

DEFAULT_URLS = {
    "mariadb": ("CLAW_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "postgres": ("CLAW_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "redis": ("CLAW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
FAULTS = ("latency", "bandwidth", "timeout", "reset", "commit", "down")
# A COMMIT statement, not a word holding it (MariaDB's handshake sends SET AUTOCOMMIT).
COMMIT_STATEMENT = re.compile(rb"(?<![a-z_])commit(?![a-z_])", re.IGNORECASE)
LATENCY_SECONDS = 0.3
BANDWIDTH_BYTES = 4096
# Driver timeouts: a stalled server fails the statement instead of hanging the thread forever.
DRIVER_TIMEOUT = 5
TURN_THREADS = 3
MEMORY_THREADS = 1
SETTLE_SECONDS = 6.0


# -- the proxy ---------------------------------------------------------------------------------------


class FaultProxy:
    """A TCP relay on 127.0.0.1 (its own event loop in a thread) to ``upstream``, whose
    :attr:`fault` (``None`` or one of :data:`FAULTS`) changes how bytes pass."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.fault: str | None = None
        self.port = 0
        self.connections = 0
        self.commits_cut = 0
        # A client whose commit is being cut, and the event set once the server has answered it.
        self._muted: dict[asyncio.StreamWriter, asyncio.Event] = {}
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> FaultProxy:
        """Start listening on a free port (:attr:`port`); return the proxy."""
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and end the loop."""
        self._call(self._close_all(listener=True))
        self._call(self._drain_tasks())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def set_fault(self, fault: str | None) -> None:
        """Turn ``fault`` on (``None``: pass everything); ending ``timeout`` or ``down`` closes
        the connections it held, and ending ``down`` listens again on the same port."""
        previous, self.fault = self.fault, fault
        if fault in ("reset", "down"):
            self._call(self._close_all(listener=fault == "down"))
        if previous == "timeout" and fault != "timeout":
            self._call(self._close_all(listener=False))
        if previous == "down" and fault != "down":
            self._call(self._listen())

    def reset_all(self) -> None:
        """Reset every open connection now."""
        self._call(self._close_all(listener=False))

    def url_for(self, url: str) -> str:
        """Return ``url`` with its host and port replaced by the proxy's."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _drain_tasks(self) -> None:
        # Every relay ends once its sockets are aborted: let them finish before the loop stops.
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        await asyncio.wait(tasks, timeout=2) if tasks else None

    async def _close_all(self, listener: bool) -> None:
        if listener and self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.fault == "down":
            _abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        self.connections += 1
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer, True, writer), self._pipe(up_reader, writer, False, up_writer)
        )
        for end in (writer, up_writer):
            self._writers.discard(end)
            with contextlib.suppress(Exception):
                end.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: bool,
        peer: asyncio.StreamWriter,
    ) -> None:
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                while self.fault == "timeout" and writer in self._writers:
                    await asyncio.sleep(0.05)
                if writer not in self._writers:
                    break
                if self.fault == "latency":
                    await asyncio.sleep(LATENCY_SECONDS)
                elif self.fault == "bandwidth":
                    await asyncio.sleep(len(chunk) / BANDWIDTH_BYTES)
                if writer in self._muted:
                    self._muted[writer].set()  # the server's answer to the commit: dropped
                    continue
                cut = self.fault == "commit" and upstream and COMMIT_STATEMENT.search(chunk) is not None
                if cut:
                    answered = self._muted[peer] = asyncio.Event()
                    self.commits_cut += 1
                writer.write(chunk)
                await writer.drain()
                if cut:
                    # Reset once the server has answered: the commit is done, the client never knows.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(answered.wait(), timeout=DRIVER_TIMEOUT)
                    for end in (writer, peer):
                        self._writers.discard(end)
                        self._muted.pop(end, None)
                        _abort(end)
                    break
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with an RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- the load -----------------------------------------------------------------------------------------


@dataclass
class Op:
    """One operation: its kind (turn/write/recall), marker, monotonic start and end, outcome."""

    kind: str
    marker: str
    started: float
    ended: float
    error: str | None = None
    wrong: bool = False
    conversation_id: str = ""
    final: bool = True  # False: a failed turn that is sent again


@dataclass
class Load:
    """Every operation the load threads ran."""

    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    written: list[tuple[str, str]] = field(default_factory=list)  # (key, value) stored

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)


def error_kind(exc: BaseException) -> str:
    """Return ``refused``, ``timeout``, ``reset`` or ``other`` for a failed operation."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    text = " ".join(f"{type(item).__name__} {item}" for item in seen).lower()
    if any(isinstance(item, ConnectionRefusedError) for item in seen) or "refused" in text:
        return "refused"
    if any(isinstance(item, TimeoutError) for item in seen) or "timed out" in text or "timeout" in text:
        return "timeout"
    if "reset" in text or "lost connection" in text or "closed" in text or "broken pipe" in text:
        return "reset"
    return f"other:{type(exc).__name__}"


def run_turns(claw: Any, number: int, load: Load) -> None:
    """Send turns on one conversation until the load stops; check each reply names its marker.

    A failed turn is sent again with the same job id, as the queue's worker retries it (its
    attempts and backoff): a run whose commit did reach the server must then find its turn
    stored, not store a second copy.
    """
    from clawmem.ids import new_id
    from clawmem.jobs.turns import MAX_ATTEMPTS, RETRY_DELAY_SECONDS

    conversation_id = new_id()
    count = 0
    while not load.stop.is_set():
        count += 1
        marker = f"m{number}x{count}x{uuid.uuid4().hex[:8]}"
        job_id = new_id()
        for attempt in range(MAX_ATTEMPTS):
            started = time.monotonic()
            try:
                reply = claw.send(
                    f"please note {marker}",
                    conversation_id=conversation_id,
                    user_id=f"u{number}",
                    job_id=job_id,
                )
            except Exception as exc:  # every failure is counted by kind
                last = attempt == MAX_ATTEMPTS - 1
                kind = error_kind(exc)
                load.add(
                    Op(
                        "turn",
                        marker,
                        started,
                        time.monotonic(),
                        kind,
                        conversation_id=conversation_id,
                        final=last,
                    )
                )
                if not last:
                    time.sleep(RETRY_DELAY_SECONDS * 2**attempt)  # the worker's backoff
                continue
            wrong = reply.text != f"echo: please note {marker}" or reply.conversation_id != conversation_id
            load.add(
                Op("turn", marker, started, time.monotonic(), wrong=wrong, conversation_id=conversation_id)
            )
            break


def run_memory(memory: Any, number: int, load: Load) -> None:
    """Write a unique key and read it back until the load stops."""
    count = 0
    while not load.stop.is_set():
        count += 1
        key, marker = f"k{number}x{count}", f"v{uuid.uuid4().hex}"
        started = time.monotonic()
        try:
            memory.set(key, marker, "bench")
        except Exception as exc:
            load.add(Op("write", key, started, time.monotonic(), error_kind(exc)))
            time.sleep(0.05)
            continue
        load.add(Op("write", key, started, time.monotonic()))
        with load.lock:
            load.written.append((key, marker))
        started = time.monotonic()
        try:
            value = memory.get(key, "bench")
        except Exception as exc:
            load.add(Op("recall", key, started, time.monotonic(), error_kind(exc)))
            time.sleep(0.05)
            continue
        load.add(Op("recall", key, started, time.monotonic(), wrong=value != marker))


PAGES = ("/", "/conversations/", "/memory/", "/memory/bench/")
PASSWORD = "bench password long enough"


def dashboard_client(config: dict[str, Any], instance: str) -> Any:
    """Return a Flask test client of the dashboard on ``config``, signed in as a new admin."""
    from dashboard import accounts, create_app

    app = create_app({"ARGON2_PROFILE": "CHEAPEST", **config}, instance_path=instance)
    with app.app_context():
        accounts.create_admin("admin", PASSWORD, time.time())
    client = app.test_client()
    form = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert token, "the sign-in page has no form token"
    signed = client.post(
        "/login", data={"csrf_token": token.group(1), "username": "admin", "password": PASSWORD}
    )
    assert signed.status_code == 302, "sign-in failed"
    return client


def run_pages(client: Any, load: Load) -> None:
    """Fetch the dashboard's pages in turn until the load stops; an entry page of a key whose
    write succeeded before the request must show its value (else the answer was wrong)."""
    count = 0
    while not load.stop.is_set():
        count += 1
        with load.lock:
            known = load.written[-1] if load.written else None
        if count % 2 and known is not None:
            path, expected = f"/memory/bench/entry?key={known[0]}", known[1]
        else:
            path, expected = PAGES[count % len(PAGES)], None
        started = time.monotonic()
        try:
            response = client.get(path)
        except Exception as exc:
            load.add(Op("page", path, started, time.monotonic(), error_kind(exc)))
            time.sleep(0.05)
            continue
        if response.status_code >= 500:
            load.add(Op("page", path, started, time.monotonic(), str(response.status_code)))
            time.sleep(0.05)
            continue
        wrong = response.status_code != 200 or (
            expected is not None and expected not in response.get_data(as_text=True)
        )
        load.add(Op("page", path, started, time.monotonic(), wrong=wrong))


@contextlib.contextmanager
def mcp_server(settings: Any, instance: str) -> Any:
    """Serve ``clawmem mcp --http``'s app on ``settings`` (so through the proxy) from a uvicorn
    thread on a free loopback port; yield its URL and a token scoped to the ``bench`` namespace."""
    import uvicorn

    from clawmem.integrations.mcp.http import asgi_app
    from clawmem.sql import tokens as store
    from clawmem.sql.engine import engine_for

    app = asgi_app(settings)
    token = store.create_token(
        engine_for(store.accounts_url(instance)),
        f"bench-{uuid.uuid4().hex[:6]}",
        time.time(),
        namespace="bench",
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        raise SystemExit("the MCP HTTP server did not start")
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp", token
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def run_mcp(url: str, token: str, load: Load) -> None:
    """Recall, as an MCP client does (``tools/call recall``, one JSON-RPC POST each), the value
    of the last memory write that succeeded until the load stops: the answer must hold it."""
    import httpx

    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    count = 0
    with httpx.Client(headers=headers, timeout=DRIVER_TIMEOUT * 4) as client:
        while not load.stop.is_set():
            count += 1
            with load.lock:
                known = load.written[-1] if load.written else None
            if known is None:
                time.sleep(0.05)
                continue
            key, marker = known
            body = {
                "jsonrpc": "2.0",
                "id": count,
                "method": "tools/call",
                "params": {"name": "recall", "arguments": {"message": f"what is {marker}"}},
            }
            started = time.monotonic()
            try:
                response = client.post(url, json=body)
            except Exception as exc:
                load.add(Op("mcp", key, started, time.monotonic(), error_kind(exc)))
                time.sleep(0.05)
                continue
            if response.status_code >= 500:
                load.add(Op("mcp", key, started, time.monotonic(), str(response.status_code)))
                time.sleep(0.05)
                continue
            result = response.json().get("result") if response.status_code == 200 else None
            if isinstance(result, dict) and result.get("isError"):
                text = " ".join(str(part.get("text", "")) for part in result.get("content", []))
                # A tool error names its cause in text only: refused, timeout or reset when it says so.
                kind = error_kind(Exception(text))
                kind = "tool error" if kind.startswith("other:") else kind
                load.add(Op("mcp", key, started, time.monotonic(), kind))
                time.sleep(0.05)
                continue
            wrong = result is None or marker not in json.dumps(result)
            load.add(Op("mcp", key, started, time.monotonic(), wrong=wrong))


@dataclass
class Queued:
    """The turns handed to the queue: ``(job_id, marker, conversation_id)`` of each enqueued."""

    jobs: list[tuple[str, str, str]] = field(default_factory=list)


def run_enqueue(queue: Any, load: Load, queued: Queued) -> None:
    """Hand a turn with a unique marker to the queue every 0.2 s until the load stops."""
    from clawmem.ids import new_id

    conversations = [new_id() for _ in range(3)]
    count = 0
    while not load.stop.is_set():
        count += 1
        marker, conversation_id = f"q{count}x{uuid.uuid4().hex[:8]}", conversations[count % 3]
        started = time.monotonic()
        try:
            job_id = queue.enqueue(f"please note {marker}", conversation_id=conversation_id)
        except Exception as exc:
            load.add(Op("enqueue", marker, started, time.monotonic(), error_kind(exc)))
        else:
            load.add(Op("enqueue", marker, started, time.monotonic()))
            queued.jobs.append((job_id, marker, conversation_id))
        time.sleep(0.2)


@contextlib.contextmanager
def worker(settings: Any, folder: str) -> Any:
    """Run one ``clawmem worker`` process (two threads) on ``settings``, stopped at the end."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    env.update(
        CLAW_DATABASE_URL=settings.database_url,
        CLAW_TABLE_PREFIX=settings.table_prefix,
        CLAW_INSTANCE_PATH=settings.instance_path,
        CLAW_MEMORY_DRIVER=settings.memory_driver,
        CLAW_REDIS_URL=settings.redis_url,
        CLAW_QUEUE_URL=settings.queue_url,
        CLAW_PII_GUARD="off",
        CLAW_PROVIDER_FACTORY="tests.job_providers:echo",
        PYTHONPATH=str(root),
    )
    with open(os.environ.get("CLAW_BENCH_WORKER_LOG") or Path(folder) / "worker.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", "from clawmem.cli import main; main()", "worker", "--workers", "2"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def queue_outcome(direct_settings: Any, queued: Queued, wait: float) -> dict[str, int]:
    """Wait up to ``wait`` s for every queued job to finish; return how the jobs ended and
    whether each done job's turn is stored once (read straight from the servers)."""
    from clawmem.jobs import TurnQueue
    from clawmem.turn.conversations import ConversationLog

    queue = TurnQueue.from_settings(direct_settings)
    deadline = time.monotonic() + wait
    records = {}
    for job_id, _, _ in queued.jobs:
        while True:
            record = queue.job(job_id)
            if (record is not None and record.finished) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        records[job_id] = record
    log = ConversationLog.from_settings(direct_settings)
    stored: Counter[str] = Counter()
    for conversation_id in {conversation for _, _, conversation in queued.jobs}:
        found = log.load(conversation_id)
        for message in found.messages if found else []:
            if message.role == "user":
                stored[message.content.removeprefix("please note ")] += 1
    statuses = Counter(record.status if record else "missing" for record in records.values())
    if os.environ.get("CLAW_BENCH_VERBOSE"):
        ours = {(r.conversation_id, r.position) for r in records.values() if r is not None}
        for job_id, _, conversation_id in queued.jobs:
            record = records[job_id]
            if record is not None and not record.finished:
                earlier = (conversation_id, record.position - 1)
                waiting = queue.store.turn_waiting(*earlier)
                before = next(
                    (r for r in records.values() if r and (r.conversation_id, r.position) == earlier), None
                )
                print(
                    f"  stuck {job_id} at {record.position}: the turn before it waiting {waiting},"
                    f" enqueued without error {earlier in ours}, its job {before.status if before else None}"
                )

    done = [marker for job_id, marker, _ in queued.jobs if getattr(records[job_id], "status", None) == "done"]
    return {
        "enqueued": len(queued.jobs),
        **{f"jobs {status}": count for status, count in sorted(statuses.items())},
        "lost": sum(1 for marker in done if stored[marker] == 0),
        "twice": sum(1 for _, marker, _ in queued.jobs if stored[marker] > 1),
    }


# -- one server ---------------------------------------------------------------------------------------


def _with_timeouts(server: str, url: str) -> str:
    parsed = make_url(url)
    timeouts = {
        "mariadb": {"connect_timeout": "5", "read_timeout": "5", "write_timeout": "5"},
        "postgres": {"connect_timeout": "5"},
        "redis": {},
    }[server]
    return parsed.update_query_dict(timeouts).render_as_string(hide_password=False)


def _redis_url(url: str, port: int) -> str:
    host_part = url.split("//", 1)[1].split("/", 1)
    database = host_part[1] if len(host_part) > 1 else "0"
    return f"redis://127.0.0.1:{port}/{database}?socket_timeout={DRIVER_TIMEOUT}&socket_connect_timeout={DRIVER_TIMEOUT}"


def run_server(
    server: str, url: str, faults: list[str], fault_seconds: float
) -> tuple[list[dict[str, Any]], dict[str, int] | None]:
    """Run the load against ``server`` through a proxy and inject each of ``faults``; return a
    row per fault (and one for the quiet start), and on Redis how the queued turns ended."""
    from clawmem.providers.echo import EchoProvider
    from clawmem.settings import Settings
    from clawmem.turn.pipeline import Claw

    parsed = make_url(url) if server != "redis" else None
    host = (parsed.host if parsed else url.split("//", 1)[1].split(":")[0].split("/")[0]) or ""
    if host not in LOOPBACK:
        raise SystemExit(f"{server} must be on the loopback interface, not {host!r}")
    default_port = {"mariadb": 3306, "postgres": 5432, "redis": 6379}[server]
    port = (parsed.port if parsed else _port_of(url)) or default_port
    proxy = FaultProxy(("127.0.0.1", port)).start()
    prefix = f"flt{uuid.uuid4().hex[:6]}_"
    with tempfile.TemporaryDirectory(prefix="clawmem-faults-") as folder:
        if server == "redis":
            direct = {
                "database_url": f"sqlite:///{folder}/claw.db",
                "memory_driver": "redis",
                "redis_url": url,
            }
            direct["queue_url"] = url
            proxied = {
                **direct,
                "redis_url": _redis_url(url, proxy.port),
                "queue_url": _redis_url(url, proxy.port),
            }
        else:
            direct = {"database_url": url, "memory_driver": "sql"}
            proxied = {**direct, "database_url": _with_timeouts(server, proxy.url_for(url))}
        common = {"instance_path": folder, "table_prefix": prefix, "pii_guard": "off"}
        direct_settings = Settings(**common, **direct)
        settings = Settings(**common, **proxied)
        _create_tables(direct_settings)
        claws = [Claw.from_settings(settings, EchoProvider()) for _ in range(TURN_THREADS)]
        from clawmem.memory.registry import open_memory

        memories = [open_memory(settings) for _ in range(MEMORY_THREADS)]
        client = dashboard_client(
            {name.upper(): value for name, value in {**common, **proxied}.items()}, folder
        )
        load = Load()
        threads = (
            [
                threading.Thread(target=run_turns, args=(claw, number, load), daemon=True)
                for number, claw in enumerate(claws)
            ]
            + [
                threading.Thread(target=run_memory, args=(memory, number, load), daemon=True)
                for number, memory in enumerate(memories)
            ]
            + [threading.Thread(target=run_pages, args=(client, load), daemon=True)]
        )
        queued = Queued()
        stack = contextlib.ExitStack()
        mcp_url, mcp_token = stack.enter_context(mcp_server(settings, folder))
        threads.append(threading.Thread(target=run_mcp, args=(mcp_url, mcp_token, load), daemon=True))
        if server == "redis":
            from clawmem.jobs import TurnQueue

            stack.enter_context(worker(settings, folder))
            queue = TurnQueue.from_settings(settings)
            threads.append(threading.Thread(target=run_enqueue, args=(queue, load, queued), daemon=True))
        for thread in threads:
            thread.start()
        windows: list[tuple[str, float, float, float]] = []  # fault, on, off, window end
        outcome = None
        try:
            start = time.monotonic()
            time.sleep(3)
            windows.append(("none", start, time.monotonic(), time.monotonic()))
            for fault in faults:
                on = time.monotonic()
                proxy.set_fault(fault)
                _hold(proxy, fault, on + fault_seconds)
                proxy.set_fault(None)
                off = time.monotonic()
                time.sleep(SETTLE_SECONDS)
                windows.append((fault, on, off, time.monotonic()))
        finally:
            load.stop.set()
            for thread in threads:
                thread.join(timeout=DRIVER_TIMEOUT * 4)
            if server == "redis":
                # A task lost in flight (a fault cut the worker's pop) is handed over again once
                # its lease has run out, at the reaper's next minute: wait for that too.
                from clawmem.jobs.turns import LEASE_SECONDS

                outcome = queue_outcome(direct_settings, queued, wait=LEASE_SECONDS + 90)
            stack.close()
            proxy.stop()
        rows = _rows(server, windows, load.ops, direct_settings)
        if server == "redis":
            _drop_queue(direct_settings)
        _drop(direct_settings)
    return rows, outcome


def _drop_queue(settings: Any) -> None:
    import redis

    from clawmem.jobs import TurnQueue
    from clawmem.jobs.records import JOBS_NAMESPACE
    from clawmem.memory.registry import open_memory

    open_memory(settings).flush(JOBS_NAMESPACE)
    client = redis.Redis.from_url(settings.queue_url)
    name = TurnQueue.from_settings(settings).huey.storage.name
    for key in client.scan_iter(match=f"*{name}*"):
        client.delete(key)


def _port_of(url: str) -> int | None:
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    return int(netloc.rsplit(":", 1)[1]) if ":" in netloc else None


def _hold(proxy: FaultProxy, fault: str, until: float) -> None:
    while time.monotonic() < until:
        time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        if fault == "reset" and time.monotonic() < until:
            proxy.reset_all()


def _create_tables(settings: Any) -> None:
    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import create_tables

    create_tables(engine_for(settings.database_url), settings.table_prefix)


def _drop(settings: Any) -> None:
    from clawmem.memory.registry import open_memory
    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import drop_tables

    if settings.memory_driver == "redis":
        open_memory(settings).flush("bench")
    drop_tables(engine_for(settings.database_url), settings.table_prefix)


def _stored_markers(settings: Any, ops: list[Op]) -> Counter[str]:
    """Count, straight from the server, the user rows that hold each turn's marker."""
    from clawmem.turn.conversations import ConversationLog

    log = ConversationLog.from_settings(settings)
    counts: Counter[str] = Counter()
    for conversation_id in {op.conversation_id for op in ops if op.kind == "turn"}:
        stored = log.load(conversation_id)
        for message in stored.messages if stored else []:
            if message.role == "user":
                counts[message.content.removeprefix("please note ")] += 1
    return counts


def _rows(
    server: str, windows: list[tuple[str, float, float, float]], ops: list[Op], settings: Any
) -> list[dict[str, Any]]:
    from clawmem.memory.registry import open_memory

    stored = _stored_markers(settings, ops)
    memory = open_memory(settings)
    last_of_turn = {op.marker: op for op in ops if op.kind == "turn"}  # ops are in end order per thread
    rows = []
    for fault, on, off, end in windows:
        # An operation belongs to the window it ended in: a failure shows where it was noticed.
        inside = [op for op in ops if on <= op.ended < end]
        failed = [op for op in inside if op.error]
        turns = {op.marker for op in inside if op.kind == "turn" and last_of_turn[op.marker] is op}
        succeeded = {marker for marker in turns if not last_of_turn[marker].error}
        lost = sum(1 for marker in succeeded if stored[marker] == 0)
        twice = sum(1 for marker in turns if stored[marker] > 1)
        writes_lost = sum(
            1
            for op in inside
            if op.kind == "write" and not op.error and memory.get(op.marker, "bench") is None
        )
        last_failure = max((op.ended for op in failed), default=None)
        if os.environ.get("CLAW_BENCH_VERBOSE"):
            for op in failed:
                span = f"{op.started - off:+.1f}..{op.ended - off:+.1f} s"
                print(f"  {server} {fault}: {op.kind} {op.error} {span}")
        rows.append(
            {
                "server": server,
                "fault": fault,
                "ops": len(inside),
                "turns": len(turns),
                "pages": sum(1 for op in inside if op.kind == "page"),
                "mcp": sum(1 for op in inside if op.kind == "mcp"),
                "failed": len(failed),
                "retried": sum(1 for op in failed if op.kind == "turn" and not op.final),
                "gave up": len(turns - succeeded),
                "stored anyway": sum(1 for marker in turns - succeeded if stored[marker] == 1),
                "errors": dict(Counter(op.error for op in failed)),
                "lost": lost + writes_lost,
                "twice": twice,
                "wrong": sum(1 for op in inside if op.wrong),
                "recovery": None if last_failure is None else max(0.0, last_failure - off),
            }
        )
    return rows


COLUMNS = (
    ("server", 8),
    ("fault", 9),
    ("ops", 5),
    ("turns", 5),
    ("pages", 5),
    ("mcp", 5),
    ("failed", 6),
    ("retried", 7),
    ("gave up", 7),
    ("stored anyway", 13),
    ("lost", 4),
    ("twice", 5),
    ("wrong", 5),
    ("recovery", 8),
)


def _print(rows: list[dict[str, Any]]) -> None:
    """Print one line per server and fault: counts, then the errors by kind."""
    print(" ".join(f"{name:>{width}}" for name, width in COLUMNS), " errors")
    for row in rows:
        shown = {**row, "recovery": "-" if row["recovery"] is None else f"{row['recovery']:.1f} s"}
        errors = ", ".join(f"{kind} {count}" for kind, count in sorted(row["errors"].items())) or "-"
        print(" ".join(f"{shown[name]!s:>{width}}" for name, width in COLUMNS), "", errors, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run every fault against every server and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="mariadb,postgres,redis")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--fault-seconds", type=float, default=4.0)
    options = parser.parse_args(argv)
    servers = [name for name in options.servers.split(",") if name]
    faults = [name for name in options.faults.split(",") if name]
    unknown = sorted(set(servers) - set(DEFAULT_URLS)) + sorted(set(faults) - set(FAULTS))
    if unknown:
        raise SystemExit(f"unknown server or fault: {', '.join(unknown)}")
    if not 1 <= options.fault_seconds <= 60:
        raise SystemExit("--fault-seconds is 1-60")
    # A reset connection's rollback is logged with its traceback by the pool; the table counts it.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    rows: list[dict[str, Any]] = []
    outcomes = []
    for server in servers:
        variable, default = DEFAULT_URLS[server]
        found, outcome = run_server(server, os.environ.get(variable, default), faults, options.fault_seconds)
        rows += found
        if outcome is not None:
            outcomes.append((server, outcome))
    _print(rows)
    for server, outcome in outcomes:
        print(
            f"{server} queue (a worker on the proxy, all faults): "
            + ", ".join(f"{k} {v}" for k, v in outcome.items())
        )


if __name__ == "__main__":
    main()
