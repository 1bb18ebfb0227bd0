"""What the OpenAI Agents SDK session costs: ``ClawSession.get_items(limit=20)`` as a session
grows, and an adapter turn against the core calls it makes.

On SQLite (a temporary file). Part 1 fills sessions of 1,000, 10,000 and 100,000 items (user and
assistant messages in the SDK's shapes) and times ``get_items(limit=20)``: the awaited call, and
the core read it makes (``ConversationLog.newest_messages``) alone. Part 2 times one turn as a
run drives the session (history read, recall and guards, the model-input filter, the input and
the reply stored) against the same core calls made directly: the difference is what the adapter
adds (translation, validation, the worker-thread hop). Medians over ``--repeat`` runs. Never part
of the test suite.

    .venv/bin/python -m bench.agents_session [--sizes 1000,10000,100000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from clawmem.clock import FakeClock  # noqa: E402
from clawmem.integrations.openai_agents import ITEM_ROLES, ClawSession, message_for  # noqa: E402
from clawmem.memory.array import ArrayMemory  # noqa: E402
from clawmem.recall import MessageAugmenter  # noqa: E402
from clawmem.sql.engine import create_engine  # noqa: E402
from clawmem.sql.schema import create_tables  # noqa: E402
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


async def timed(call: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def timed_sync(call: Callable[[], Any], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


async def fill(log: ConversationLog, clock: FakeClock, session_id: str, size: int) -> ClawSession:
    """Store ``size`` items as runs do, one turn (a question and its answer) per call, a second
    apart, so the newest rows are found by the index as in a real session."""
    session = ClawSession(session_id, log)
    for n in range(0, size, 2):
        await session.add_items([user_item(n), assistant_item(n + 1)])
        clock.advance(1)
    return session


async def get_items_by_size(log: ConversationLog, clock: FakeClock, sizes: list[int], repeat: int) -> None:
    print("get_items(limit=20) on SQLite, median ms")
    print(f"{'items':>8} {'get_items':>10} {'core read':>10}")
    for size in sizes:
        session = await fill(log, clock, f"bench-{size}", size)
        assert len(await session.get_items(limit=20)) == 20
        awaited = await timed(lambda session=session: session.get_items(limit=20), repeat)
        core = timed_sync(
            lambda session=session: log.newest_messages(session.conversation_id, ITEM_ROLES, 20), repeat
        )
        print(f"{size:>8} {median_ms(awaited):>10.3f} {median_ms(core):>10.3f}")


async def turn_overhead(log: ConversationLog, repeat: int) -> None:
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
    await adapter_turn()
    core_turn()
    adapter, core = [], []
    for _ in range(repeat):  # interleaved, so a busy machine weighs on both alike
        adapter += await timed(adapter_turn, 1)
        core += timed_sync(core_turn, 1)
    print("\none turn (history, recall and guard, input and reply stored), median ms")
    print(f"{'adapter':>10} {'core calls':>10} {'overhead':>10}")
    overhead = median_ms(adapter) - median_ms(core)
    print(f"{median_ms(adapter):>10.3f} {median_ms(core):>10.3f} {overhead:>10.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="session lengths, comma-separated")
    parser.add_argument("--repeat", type=int, default=200, help="timed calls per measurement")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        engine = create_engine(f"sqlite:///{directory}/bench.db")
        create_tables(engine)
        clock = FakeClock(1_700_000_000.0)
        log = ConversationLog(engine, clock=clock)
        asyncio.run(get_items_by_size(log, clock, sizes, args.repeat))
        asyncio.run(turn_overhead(log, args.repeat))
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
