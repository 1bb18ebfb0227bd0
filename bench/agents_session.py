"""What the OpenAI Agents SDK session costs: ``ClawSession.get_items(limit=20)`` as a session
grows, and an adapter turn against the core calls it makes, on each path the async methods take.

On SQLite (a temporary file), or on ``--database`` (PostgreSQL, MariaDB; tables of a prefix of
their own, dropped at the end). Part 1 fills sessions of 1,000, 10,000 and 100,000 items (user
and assistant messages in the SDK's shapes, stored a thousand at a time, then analysed) and
times ``get_items(limit=20)``: the awaited call on each path, and the core read it makes
(``ConversationLog.newest_messages``) alone. Part 2 times one turn as a run drives the session
(history read, recall and guards, the model-input filter, the input and the reply stored)
against the same core calls made directly: the difference is what the adapter adds
(translation, validation, and the async path: a greenlet on the loop over asyncpg or asyncmy,
or the worker-thread hop). The paths (``--paths``): ``async`` (:mod:`clawmem.integrations.aio`; SQLite
takes the thread there too) and ``thread`` (every call in a worker thread). Medians over
``--repeat`` runs, interleaved, so a busy machine weighs on all alike. Never part of the test
suite.

    .venv/bin/python -m bench.agents_session [--sizes 1000,10000,100000] [--repeat 200]
        [--database postgresql+psycopg://postgres@127.0.0.1:5432/test] [--paths async,thread]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from clawmem.clock import FakeClock  # noqa: E402
from clawmem.integrations import aio  # noqa: E402
from clawmem.integrations.openai_agents import (  # noqa: E402  # noqa: E402
    ITEM_ROLES,
    SESSION_ID_KEY,
    ClawSession,
    conversation_id_for,
    message_for,
)
from clawmem.memory.array import ArrayMemory  # noqa: E402
from clawmem.recall import MessageAugmenter  # noqa: E402
from clawmem.sql.engine import create_engine  # noqa: E402
from clawmem.sql.schema import (  # noqa: E402
    create_tables,  # noqa: E402
    drop_tables,
    tables,
)
from clawmem.turn.conversations import ConversationLog, Message  # noqa: E402
from clawmem.turn.guards import PiiGuard  # noqa: E402
from clawmem.turn.pipeline import recall_record  # noqa: E402

QUESTION = "Where is my order {n}? The tracking page has not changed since Monday."
ANSWER = "It left the Leeds warehouse this morning; the courier delivers tomorrow before noon."


def user_item(n: int) -> dict[str, Any]:
    return {"role": "user", "content": QUESTION.format(n=n)}


def assistant_item(n: int) -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": [], "logprobs": []}],
    }


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(
    call: Callable[[], Awaitable[Any]], repeat: int, cpu: list[float] | None = None
) -> list[float]:
    """Return the wall time of each of ``repeat`` awaited calls; their CPU time goes to ``cpu``."""
    samples = []
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        await call()
        samples.append(time.perf_counter() - started)
        if cpu is not None:
            cpu.append(time.process_time() - used)
    return samples


def timed_sync(call: Callable[[], Any], repeat: int, cpu: list[float] | None = None) -> list[float]:
    """Return the wall time of each of ``repeat`` calls; their CPU time goes to ``cpu``."""
    samples = []
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        call()
        samples.append(time.perf_counter() - started)
        if cpu is not None:
            cpu.append(time.process_time() - used)
    return samples


PATHS = {"async": aio.ASYNC_DRIVER, "thread": aio.THREAD_HOP}
FILL_BATCH = 1000


def on_path(path: str) -> contextlib.AbstractContextManager[None]:
    """The block in which the session's async methods take ``path``."""
    return aio.thread_hop() if path == "thread" else contextlib.nullcontext()


def fill(log: ConversationLog, clock: FakeClock, session_id: str, size: int) -> None:
    """Store ``size`` items of one session, a turn (a question and its answer) a second apart,
    a thousand rows a transaction, so the newest rows are found by the index as in a real one."""
    conversation_id = conversation_id_for(session_id)
    for start in range(0, size, FILL_BATCH):
        batch = []
        for n in range(start, min(size, start + FILL_BATCH), 2):
            batch += [message_for(user_item(n), log.max_value_bytes)]
            batch += [message_for(assistant_item(n + 1), log.max_value_bytes)]
        log.append(conversation_id, batch, metadata={SESSION_ID_KEY: session_id})
        clock.advance(1)


def analyse(log: ConversationLog) -> None:
    """Give PostgreSQL and MariaDB the statistics of the filled tables (else a plan may scan)."""
    dialect = log.engine.dialect.name
    if dialect == "sqlite":
        return
    schema = tables(log.prefix)
    with log.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in (schema.conversations, schema.messages):
            conn.exec_driver_sql(f"ANALYZE {'TABLE ' if dialect != 'postgresql' else ''}{table.name}")


async def get_items_by_size(
    log: ConversationLog, clock: FakeClock, sizes: list[int], repeat: int, paths: list[str]
) -> None:
    print(f"get_items(limit=20) on {log.engine.dialect.name}, median ms")
    print(f"{'items':>8} " + " ".join(f"{path + ' get_items':>18}" for path in paths) + f" {'core read':>10}")
    for size in sizes:
        session_id = f"bench-{size}"
        fill(log, clock, session_id, size)
        analyse(log)
        session = ClawSession(session_id, log)
        samples: dict[str, list[float]] = {path: [] for path in paths}
        core: list[float] = []
        for path in paths:  # warm: each path's connections open, the statement cached
            with on_path(path):
                assert len(await session.get_items(limit=20)) == 20
        for _ in range(repeat):
            for path in paths:
                with on_path(path):
                    samples[path] += await timed(lambda session=session: session.get_items(limit=20), 1)
            core += timed_sync(
                lambda session=session: log.newest_messages(session.conversation_id, ITEM_ROLES, 20), 1
            )
        shown = " ".join(f"{median_ms(samples[path]):>18.3f}" for path in paths)
        print(f"{size:>8} {shown} {median_ms(core):>10.3f}")


async def turn_overhead(log: ConversationLog, repeat: int, paths: list[str]) -> None:
    memory = ArrayMemory()
    for n in range(200):
        memory.set(f"order_{n}", f"Order {n} ships from Leeds")
    augmenter = MessageAugmenter(memory)
    guards = [PiiGuard("block")]
    session = ClawSession("bench-turns", log, memory=memory, augmenter=augmenter, guards=guards)
    core_id = "bench-core"
    filter_data = SimpleNamespace
    counter = iter(range(10**9))

    async def adapter_turn() -> None:
        n = next(counter)
        history = await session.get_items(limit=20)
        new_items = [user_item(n)]
        prepared = await session.session_input_callback(history, new_items)
        await session.add_items(new_items)
        model_data = SimpleNamespace(input=prepared, instructions="Answer the shop's customers.")
        session.call_model_input_filter(filter_data(model_data=model_data))
        await session.add_items([assistant_item(n)])

    def core_turn() -> None:
        n = next(counter)
        log.newest_messages(core_id, ITEM_ROLES, 20)
        augment = augmenter.augment(QUESTION.format(n=n))
        for guard in guards:
            augment = guard.apply(augment)
        log.append(core_id, [recall_record(augment), message_for(user_item(n), log.max_value_bytes)])
        log.append(core_id, [message_for(assistant_item(n), log.max_value_bytes)])

    log.append(core_id, [Message("user", "start")])
    for path in paths:
        with on_path(path):
            await adapter_turn()
    core_turn()
    adapter: dict[str, list[float]] = {path: [] for path in paths}
    adapter_cpu: dict[str, list[float]] = {path: [] for path in paths}
    core: list[float] = []
    core_cpu: list[float] = []
    for _ in range(repeat):  # interleaved, so a busy machine weighs on each alike
        for path in paths:
            with on_path(path):
                adapter[path] += await timed(adapter_turn, 1, adapter_cpu[path])
        core += timed_sync(core_turn, 1, core_cpu)
    print(
        f"\none turn on {log.engine.dialect.name} (history, recall and guard, input and reply stored),"
        " median ms"
    )
    print(f"{'path':>14} {'adapter':>10} {'core calls':>10} {'overhead':>10} {'CPU overhead':>13}")
    for path in paths:
        overhead = median_ms(adapter[path]) - median_ms(core)
        cpu = median_ms(adapter_cpu[path]) - median_ms(core_cpu)
        print(
            f"{PATHS[path]:>14} {median_ms(adapter[path]):>10.3f} {median_ms(core):>10.3f} "
            f"{overhead:>10.3f} {cpu:>13.3f}"
        )


@contextlib.contextmanager
def database(url: str | None) -> Iterator[tuple[Any, str]]:
    """Yield an engine with tables of a prefix of their own (on SQLite, a temporary file)."""
    with tempfile.TemporaryDirectory() as directory:
        engine = create_engine(url or f"sqlite:///{directory}/bench.db")
        prefix = f"bench_{uuid.uuid4().hex[:6]}_" if url else ""
        create_tables(engine, prefix)
        try:
            yield engine, prefix
        finally:
            if url:
                drop_tables(engine, prefix)
            engine.dispose()


async def measure(log: ConversationLog, clock: FakeClock, args: argparse.Namespace) -> None:
    paths = args.paths.split(",")
    sizes = [int(size) for size in args.sizes.split(",")]
    try:
        await get_items_by_size(log, clock, sizes, args.repeat, paths)
        await turn_overhead(log, args.repeat, paths)
    finally:
        await aio.close_engines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="session lengths, comma-separated")
    parser.add_argument("--repeat", type=int, default=200, help="timed calls per measurement")
    parser.add_argument("--database", default=None, help="a database URL (default: a temporary SQLite file)")
    parser.add_argument("--paths", default="async,thread", help="paths to compare: async, thread")
    args = parser.parse_args(argv)
    with database(args.database) as (engine, prefix):
        clock = FakeClock(1_700_000_000.0)
        log = ConversationLog(engine, prefix, clock=clock)
        asyncio.run(measure(log, clock, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
