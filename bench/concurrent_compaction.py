"""Two agents with compaction on, sending to one conversation at once: are messages summarised
into two stored checkpoints?

Two threads, each with its own ``Claw`` (and engine), send turns to one conversation on the
database of ``--url`` (default: a temporary SQLite file) under a message threshold. A recording
summariser keeps what every compaction summarised; the stored ``summary`` rows then say which
compactions became checkpoints. Prints the turns, the compactions run, the checkpoints stored,
and how many stored messages were summarised into more than one stored checkpoint, with the
checkpoint guard of ``ConversationLog.append`` and (``--unguarded``) without it, as before.
Never part of the test suite.

    .venv/bin/python -m bench.concurrent_compaction [--turns 80] [--max-messages 10] [--url URL]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from clawmem.ids import new_id
from clawmem.memory.array import ArrayMemory
from clawmem.providers.echo import EchoProvider
from clawmem.recall import MessageAugmenter
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.turn.compaction import ExtractiveSummarizer, HistoryCompactor
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.pipeline import Claw


class Recording:
    """A summariser that numbers its summaries and keeps what each one summarised."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[list[str]] = []

    def __call__(self, old: Sequence[dict[str, Any]]) -> str:
        with self.lock:
            self.calls.append([str(message.get("content")) for message in old])
            number = len(self.calls)
        return f"summary {number}: " + ExtractiveSummarizer()(old)


class Unguarded(ConversationLog):
    """The log as it was: a checkpoint is stored whatever another writer stored meanwhile."""

    def append(self, *args: Any, checkpoint_after: Any = None, **options: Any) -> list[str]:
        return super().append(*args, **options)


def run(url: str, turns: int, max_messages: int, guarded: bool) -> dict[str, int]:
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    setup = create_engine(url)
    create_tables(setup, prefix)
    conversation_id = new_id()
    summaries = Recording()
    log_class = ConversationLog if guarded else Unguarded

    def agent(name: str) -> None:
        engine = create_engine(url)
        memory = ArrayMemory()
        claw = Claw(
            memory,
            log_class(engine, prefix),
            EchoProvider(),
            MessageAugmenter(memory, 0),
            HistoryCompactor(summaries, max_messages=max_messages),
            [],
        )
        for turn in range(turns // 2):
            claw.send(f"{name} turn {turn}", conversation_id)
        engine.dispose()

    threads = [threading.Thread(target=agent, args=(name,)) for name in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    table = tables(prefix).messages
    with setup.connect() as conn:
        stored = conn.execute(
            sa.select(table.c.content).where(
                table.c.conversation_id == conversation_id, table.c.role == "summary"
            )
        ).scalars()
        numbers = [int(text.split("summary ", 1)[1].split(":", 1)[0]) for text in stored]
    seen = collections.Counter(
        content
        for number in numbers
        for content in summaries.calls[number - 1]
        if not content.startswith("[Conversation summary]")  # a folded checkpoint, not a message
    )
    drop_tables(setup, prefix)
    setup.dispose()
    return {
        "turns": turns,
        "compactions": len(summaries.calls),
        "checkpoints stored": len(numbers),
        "messages in 2+ stored checkpoints": sum(1 for count in seen.values() if count > 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=80)
    parser.add_argument("--max-messages", type=int, default=10)
    parser.add_argument("--url", default=None, help="a SQLAlchemy URL (default: a temporary SQLite file)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = options.url or f"sqlite:///{directory}/bench.db"
        for guarded in (False, True):
            label = "guarded  " if guarded else "unguarded"
            print(label, run(url, options.turns, options.max_messages, guarded))


if __name__ == "__main__":
    main()
