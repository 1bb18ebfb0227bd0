"""The MCP server over HTTP under many clients: ``recall`` at 100,000 entries, through uvicorn.

It loads N entries (as :mod:`bench.mcp` does: 12 Zipf words each, one namespace) into tables of
a prefix of their own on ``--database-url`` (default: the local PostgreSQL), makes one access
token in the accounts database (``--accounts``: the same server database, so the token check
takes the async path, or ``sqlite``, the default file in the instance folder, checked in a
worker thread), and starts ``--processes`` real uvicorn processes (of ``--workers`` workers
each) serving ``clawmem.integrations.mcp.http:environment_app``, each on a port of its own with
the clients spread evenly over them, as a load balancer in front would (workers of one process
share its socket, and keep-alive connections then pile up on one of them). Then:

- where a request's time goes (on unless ``--no-profile``): in a process of its own, the same
  app in-process, warm, one request at a time: the token check alone, ``recall`` alone (on the
  async path), the SDK's ``call_tool`` (argument validation, the typed result), and a whole
  request through the ASGI app (HTTP, JSON-RPC, transport): wall medians, CPU means;
- the load: locust, headless through its Python API, ``--users`` clients (``FastHttpUser``)
  each calling ``recall`` over HTTP (``--protocol``: ``legacy``, as a client after the
  ``initialize`` handshake, each call served in a session of its own; or ``modern``, the
  stateless revision's per-request envelope that the MCP SDK's client speaks by default, each
  call one exchange), a uniform wait of 0 to ``2 * --wait`` seconds between
  calls; ``--warmup`` seconds first (each worker builds its recall index), then ``--seconds``
  counted: requests/s, p50/p95/p99, errors (a status other than 200, a JSON-RPC or tool error),
  the servers' CPU per request and the cores each used, and those of locust and the database.

The target (issue 36): 200 clients, p95 <= 50 ms and no error at 100,000 entries on PostgreSQL.
Tables and token are removed at the end. Never part of the test suite.

    .venv/bin/python -m bench.mcp_http [--entries 100000] [--users 200] [--seconds 60]
        [--processes 4] [--workers 1] [--wait 1.0] [--accounts database|sqlite] [--database-url URL]
        [--protocol legacy|modern]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import LATEST_MODERN_VERSION

from bench.cluster import listening

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = os.environ.get("CLAW_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
START_SECONDS = 120
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
# What the modern protocol's client adds to a recall: the revision and the call, named in headers.
MODERN_HEADERS = {
    "mcp-protocol-version": LATEST_MODERN_VERSION,
    "mcp-method": "tools/call",
    "mcp-name": "recall",
}


def recall_body(message: str, protocol: str = "legacy") -> bytes:
    """Return the JSON-RPC ``tools/call`` of ``recall`` for ``message``: as a client after the
    ``initialize`` handshake sends it (``legacy``), or with the per-request envelope of the
    stateless revision (``modern``) that the MCP SDK's own client speaks by default."""
    call: dict[str, Any] = {"name": "recall", "arguments": {"message": message}}
    if protocol == "modern":
        call["_meta"] = {PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION, CLIENT_CAPABILITIES_META_KEY: {}}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}).encode()


def recall_headers(token: str, protocol: str = "legacy") -> dict[str, str]:
    """Return the headers of a ``recall`` call with ``token`` in ``protocol`` (see :func:`recall_body`)."""
    return {**HEADERS, "authorization": f"Bearer {token}", **(MODERN_HEADERS if protocol == "modern" else {})}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(env: dict[str, str], workers: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start uvicorn serving the environment's app with ``workers`` workers; return it and its port."""
    port = _free_port()
    command = [
        sys.executable, "-m", "uvicorn", "--factory", "clawmem.integrations.mcp.http:environment_app",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--log-level", "warning", "--no-access-log", "--backlog", "4096",
    ]  # fmt: skip
    with log.open("ab") as output:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, process_group=0
        )
    deadline = time.monotonic() + START_SECONDS
    while not listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"uvicorn did not come up: {log.read_text(errors='replace')[-400:]}")
        time.sleep(0.1)  # waiting for a process to listen
    return process, port


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM uvicorn's process group, then SIGKILL what is left after 20 s."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def server_cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> dict[int, float]:
    """Return the CPU seconds used so far by each process that serves (a uvicorn process
    without workers, or each worker of one with workers), by pid."""
    import psutil

    used = {}
    for process in processes:
        parent = psutil.Process(process.pid)
        for found in parent.children(recursive=True) or [parent]:
            times = found.cpu_times()
            used[found.pid] = times.user + times.system
    return used


def database_cpu_seconds() -> float:
    """Return the CPU seconds used so far by the machine's PostgreSQL and MariaDB processes."""
    import psutil

    total = 0.0
    for found in psutil.process_iter(["name", "cpu_times"]):
        if found.info["name"] in ("postgres", "mariadbd", "mysqld") and found.info["cpu_times"]:
            total += found.info["cpu_times"].user + found.info["cpu_times"].system
    return total


def percentile(values: list[float], share: int) -> float:
    """Return the ``share``-th percentile of ``values`` (ms)."""
    return statistics.quantiles(values, n=100)[share - 1] if len(values) > 1 else values[0]


def run_load(urls: list[str], token: str, messages: list[str], options: argparse.Namespace) -> dict[str, Any]:
    """Run ``options.users`` locust clients calling ``recall``, spread evenly over ``urls`` (the
    uvicorn processes, as a load balancer would): warm-up, then the counted load."""
    import gevent
    from locust import between, task
    from locust.contrib.fasthttp import FastHttpUser
    from locust.env import Environment

    chooser = random.Random(7)
    bodies = [recall_body(message, options.protocol) for message in messages]
    headers = recall_headers(token, options.protocol)
    counted: list[tuple[float, bool]] = []
    errors: dict[str, int] = {}
    counting = False

    class McpClient(FastHttpUser):
        """An MCP client calling ``recall`` with its token, a wait between calls."""

        abstract = True
        wait_time = between(0, 2 * options.wait)
        network_timeout = 30.0
        connection_timeout = 30.0

        @task
        def recall(self) -> None:
            with self.client.post(
                "/mcp", data=chooser.choice(bodies), headers=headers, name="recall", catch_response=True
            ) as response:
                problem = None
                if response.status_code != 200:
                    problem = f"HTTP {response.status_code}"
                else:
                    answer = json.loads(response.content or b"{}")
                    result = answer.get("result")
                    if not result or result.get("isError"):
                        problem = "tool error" if result else "JSON-RPC error"
                if problem is not None:
                    response.failure(problem)

    def record(response_time: float, exception: Any, **_: Any) -> None:
        if counting:
            counted.append((response_time, exception is None))
            if exception is not None:
                errors[str(exception)[:60]] = errors.get(str(exception)[:60], 0) + 1

    shares = [
        options.users // len(urls) + (number < options.users % len(urls)) for number in range(len(urls))
    ]
    classes = [
        type(f"McpClient{number}", (McpClient,), {"host": url, "fixed_count": share})
        for number, (url, share) in enumerate(zip(urls, shares, strict=True))
    ]
    environment = Environment(user_classes=classes, stop_timeout=30)
    environment.events.request.add_listener(record)
    runner = environment.create_local_runner()
    runner.start(options.users, spawn_rate=max(1, options.users / 5))
    gevent.sleep(options.warmup)
    counting = True
    started, cpu = time.perf_counter(), server_cpu_seconds(options.servers)
    own, database = time.process_time(), database_cpu_seconds()
    gevent.sleep(options.seconds)
    counting = False
    elapsed, after = time.perf_counter() - started, server_cpu_seconds(options.servers)
    own, database = time.process_time() - own, database_cpu_seconds() - database
    per_process = sorted(after[pid] - cpu.get(pid, 0.0) for pid in after)
    runner.quit()
    runner.greenlet.join()
    times = [response_time for response_time, _ in counted]
    return {
        "requests": len(counted),
        "errors": sum(1 for _, ok in counted if not ok),
        "kinds": errors,
        "per_second": len(counted) / elapsed,
        "p50": percentile(times, 50) if times else float("nan"),
        "p95": percentile(times, 95) if times else float("nan"),
        "p99": percentile(times, 99) if times else float("nan"),
        "cpu_ms": 1000 * sum(per_process) / max(1, len(counted)),
        "worker_cores": [used / elapsed for used in per_process],
        "client_cores": own / elapsed,
        "database_cores": database / elapsed,
    }


# -- where a request's time goes (run in a process of its own: locust patches the standard library)


async def _profile(
    settings: Any, accounts_url: str, token: str, messages: list[str], calls: int, protocol: str
) -> None:
    import httpx2

    from clawmem.ids import new_id
    from clawmem.integrations import aio
    from clawmem.integrations.mcp import build_server, memory_tools
    from clawmem.integrations.mcp.http import asgi_app

    gate = asgi_app(settings, accounts_url=accounts_url)
    tools = memory_tools(settings)
    server = build_server(lambda: tools, "")
    on_loop = aio.every_driver_on_loop(tools.memory)
    transport = httpx2.ASGITransport(app=gate, client=("127.0.0.1", 1))
    timings: dict[str, list[float]] = {name: [] for name in ("token", "recall", "call_tool", "request")}
    cpu: dict[str, list[float]] = {name: [] for name in timings}
    headers = recall_headers(token, protocol)
    async with (
        gate.inner.router.lifespan_context(gate.inner),
        httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        for warm in messages[:3]:  # both indexes built, the pools' connections open
            await aio.run(on_loop, tools.recall, new_id(), warm, None)
            answer = await client.post("/mcp", content=recall_body(warm, protocol), headers=headers)
            assert answer.status_code == 200 and "result" in answer.json(), answer.text[:200]
        for number in range(calls):
            message = messages[number % len(messages)]
            body = recall_body(message, protocol)
            steps = (
                ("token", lambda: aio.run(gate.on_loop, gate._admit, "127.0.0.1", token, time.time())),
                ("recall", lambda m=message: aio.run(on_loop, tools.recall, new_id(), m, None)),
                ("call_tool", lambda m=message: server.call_tool("recall", {"message": m})),
                ("request", lambda b=body: client.post("/mcp", content=b, headers=headers)),
            )
            for name, step in steps:
                started, used = time.perf_counter(), time.process_time()
                await step()
                timings[name].append(1000 * (time.perf_counter() - started))
                cpu[name].append(1000 * (time.process_time() - used))
        await aio.close_engines()
    wall = {name: statistics.median(values) for name, values in timings.items()}
    used = {name: statistics.mean(values) for name, values in cpu.items()}
    print(f"one {protocol} request at a time, in-process, warm, {calls} requests: wall median, CPU mean (ms)")
    rows = (
        (f"token check ({aio.path_name(gate.on_loop)})", "token", None),
        (f"recall ({aio.path_name(on_loop)})", "recall", None),
        ("SDK call_tool over recall", "call_tool", "recall"),
        ("JSON-RPC and transport (the rest)", "request", "call_tool"),
        ("whole request (ASGI, in-process)", "request", None),
    )
    for label, name, less in rows:
        taken = (wall["token"] if name == "request" and less else 0) + (wall[less] if less else 0)
        spent = (used["token"] if name == "request" and less else 0) + (used[less] if less else 0)
        print(f"  {label:36} {wall[name] - taken:7.2f} {used[name] - spent:7.2f}")


def profile_main(args: argparse.Namespace) -> None:
    from bench import mcp as mcp_bench
    from clawmem import Settings

    settings = Settings(instance_path=args.instance, database_url=args.database_url, table_prefix=args.prefix)
    messages = mcp_bench.texts(200, mcp_bench.WORDS_PER_MESSAGE, seed=args.entries + 1)
    asyncio.run(_profile(settings, args.accounts_url, args.token, messages, args.calls, args.protocol))


# -- the run --------------------------------------------------------------------------------------


def load_average() -> str:
    return f"load average {' '.join(f'{value:.2f}' for value in os.getloadavg())} on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0, help="counted load (default 60)")
    parser.add_argument("--warmup", type=float, default=15.0, help="load before counting (default 15)")
    parser.add_argument("--wait", type=float, default=1.0, help="mean seconds between a client's calls")
    parser.add_argument("--processes", type=int, default=4, help="uvicorn processes (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="workers of each (default 1)")
    parser.add_argument("--accounts", choices=("database", "sqlite"), default="database")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument(
        "--protocol",
        choices=("legacy", "modern"),
        default="legacy",
        help="legacy: calls after the initialize handshake; modern: a per-request envelope (default legacy)",
    )
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--calls", type=int, default=200, help="requests timed by the profile")
    parser.add_argument("--profile-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--instance", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--accounts-url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.profile_only:
        profile_main(args)
        return
    if not 1 <= args.users <= 2000 or not 1 <= args.seconds <= 600 or not 1 <= args.workers <= 8:
        raise SystemExit("--users are 1-2000, --seconds 1-600 and --workers 1-8")
    if not 1 <= args.processes <= 8 or args.processes > args.users:
        raise SystemExit("--processes are 1-8, and no more than --users")
    run(args)


def run(args: argparse.Namespace) -> None:
    from bench import mcp as mcp_bench
    from clawmem.sql import tokens as store
    from clawmem.sql.engine import create_engine
    from clawmem.sql.schema import create_tables, drop_tables

    print(f"start: {load_average()}")
    with tempfile.TemporaryDirectory() as directory:
        instance = Path(directory) / "instance"
        instance.mkdir(mode=0o700)
        prefix, name = f"mh{uuid.uuid4().hex[:6]}_", f"bench-{uuid.uuid4().hex[:8]}"
        engine = create_engine(args.database_url)
        accounts_url = (
            args.database_url if args.accounts == "database" else store.default_accounts_url(instance)
        )
        accounts = create_engine(accounts_url)
        create_tables(engine, prefix)
        servers: list[subprocess.Popen[bytes]] = []
        urls: list[str] = []
        try:
            started = time.perf_counter()
            mcp_bench.load(engine, prefix, args.entries)
            seconds = time.perf_counter() - started
            print(f"loaded {args.entries:,} entries in {seconds:.1f} s ({engine.dialect.name})")
            token = store.create_token(accounts, name, time.time())
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "CLAW_DATABASE_URL": args.database_url,
                "CLAW_TABLE_PREFIX": prefix,
                "CLAW_INSTANCE_PATH": str(instance),
                store.ACCOUNTS_URL_VARIABLE: accounts_url,
            }
            if args.profile:
                subprocess.run(
                    [
                        sys.executable, "-m", "bench.mcp_http", "--profile-only", "--instance", str(instance),
                        "--prefix", prefix, "--accounts-url", accounts_url, "--token", token,
                        "--database-url", args.database_url, "--entries", str(args.entries),
                        "--calls", str(args.calls), "--protocol", args.protocol,
                    ],
                    cwd=ROOT, env=env, check=True,
                )  # fmt: skip
                print(f"after the profile: {load_average()}")
            for number in range(args.processes):
                log = Path(directory) / f"uvicorn{number}.log"
                process, port = start_server(env, args.workers, log)
                servers.append(process)
                urls.append(f"http://127.0.0.1:{port}")
            args.servers = servers
            messages = mcp_bench.texts(500, mcp_bench.WORDS_PER_MESSAGE, seed=args.entries + 1)
            import locust  # noqa: F401  (after the loading: it patches the standard library for gevent)

            result = run_load(urls, token, messages, args)
            serving = f"{args.processes} uvicorn processes of {args.workers} worker(s)"
            print(
                f"{args.users} {args.protocol} clients recalling over HTTP ({serving}, token check on "
                f"{accounts.dialect.name}, mean wait {args.wait:g} s), {args.seconds:g} s counted:"
            )
            rate = f"{result['per_second']:.1f}/s"
            print(f"  requests {result['requests']:,}   {rate}   errors {result['errors']}")
            print(f"  p50 {result['p50']:.1f} ms   p95 {result['p95']:.1f} ms   p99 {result['p99']:.1f} ms")
            cores = ", ".join(f"{share:.2f}" for share in result["worker_cores"])
            print(f"  server CPU per request {result['cpu_ms']:.2f} ms; cores used by each server: {cores}")
            print(
                f"  cores used by locust (this process) {result['client_cores']:.2f}, "
                f"by the database server {result['database_cores']:.2f}"
            )
            for kind, count in result["kinds"].items():
                print(f"  error: {kind} x{count}")
        finally:
            for process in servers:
                stop_server(process)
            drop_tables(engine, prefix)
            with accounts.begin() as conn:
                conn.execute(sa.delete(store.tokens_table).where(store.tokens_table.c.name == name))
            engine.dispose()
            accounts.dispose()
    print(f"end: {load_average()}")


if __name__ == "__main__":
    main()
