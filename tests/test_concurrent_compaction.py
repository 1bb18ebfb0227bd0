"""Two agents with compaction on, sending to one conversation: no message is summarised into
two stored checkpoints.

The race is made deterministic: agent A's provider call runs agent B's whole turn, so B loads
the same checkpoint A loaded, compacts and stores its checkpoint first; A's checkpoint, made on
top of the older one, must then be left out while A's messages are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.ids import new_id
from clawmem.memory.array import ArrayMemory
from clawmem.providers.base import ProviderReply
from clawmem.providers.echo import EchoProvider
from clawmem.recall import MessageAugmenter
from clawmem.sql.schema import tables
from clawmem.turn.compaction import ExtractiveSummarizer, HistoryCompactor
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.pipeline import Claw

MAX_MESSAGES = 10


class Recording:
    """A summariser that keeps what each call summarised, by message content."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, old: Sequence[dict[str, Any]]) -> str:
        self.calls.append([str(message.get("content")) for message in old])
        return f"summary {len(self.calls)}: " + ExtractiveSummarizer()(old)


class Interleaving:
    """A provider that, on its ``at``-th call, first runs ``other`` (the second agent's turn)."""

    def __init__(self, other: Any = None, at: int = 0) -> None:
        self.other, self.at, self.calls = other, at, 0
        self.echo = EchoProvider()

    def complete(self, messages: Sequence[Any]) -> ProviderReply:
        self.calls += 1
        if self.calls == self.at and self.other is not None:
            self.other()
        return self.echo.complete(messages)


def _agent(engine: sa.engine.Engine, prefix: str, clock: FakeClock, provider: Any, summariser: Any) -> Claw:
    log = ConversationLog(engine, prefix, clock=clock)
    memory = ArrayMemory(clock=clock)
    return Claw(
        memory,
        log,
        provider,
        MessageAugmenter(memory, 0),
        HistoryCompactor(summariser, max_messages=MAX_MESSAGES),
        [],
        clock=clock,
    )


def _stored_checkpoints(engine: sa.engine.Engine, prefix: str, conversation_id: str) -> list[str]:
    table = tables(prefix).messages
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(table.c.content)
                .where(table.c.conversation_id == conversation_id, table.c.role == "summary")
                .order_by(table.c.created_at, table.c.id)
            ).scalars()
        )


def test_two_agents_compacting_one_conversation_never_summarise_a_message_twice(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    conversation_id = new_id()
    summaries = Recording()
    second = _agent(engine, prefix, clock, Interleaving(), summaries)
    turn = {"n": 0}

    def say(agent: Claw, who: str) -> None:
        turn["n"] += 1
        clock.advance(1)
        agent.send(f"{who} says {turn['n']}", conversation_id)

    first_provider = Interleaving(lambda: say(second, "B"))
    first = _agent(engine, prefix, clock, first_provider, summaries)
    for _ in range(5):  # 10 messages: the next turn's history is over the threshold
        say(first, "A")
    first_provider.at = first_provider.calls + 1  # B's turn runs inside A's next provider call
    say(first, "A")

    assert len(summaries.calls) == 2  # both agents compacted the same loaded history
    assert summaries.calls[0] == summaries.calls[1]
    stored = _stored_checkpoints(engine, prefix, conversation_id)
    # A summarised first, then its provider call ran B's turn: B's checkpoint ("summary 2") is
    # the one stored, and A's, made on top of the same older state, was left out.
    assert len(stored) == 1 and stored[0].startswith("[Conversation summary]\nsummary 2:")
    # Every turn's own messages were stored, A's included.
    loaded = ConversationLog(engine, prefix, clock=clock).get(conversation_id)
    assert loaded is not None and (loaded.message_count, loaded.recall_count, loaded.checkpoint_count) == (
        2 * 7,
        7,
        1,
    )  # user and reply said, a recall record per turn, one summary
    # The conversation goes on from B's checkpoint, and the next compaction folds it in once.
    for _ in range(6):
        say(first, "A")
    stored = _stored_checkpoints(engine, prefix, conversation_id)
    summarised = [content for call in summaries.calls[2:] for content in call]
    assert len(stored) >= 2 and len(summarised) == len(set(summarised))


@pytest.mark.parametrize("sql_backend", ["sqlite"])
def test_a_single_agent_still_stores_each_checkpoint(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    conversation_id = new_id()
    summaries = Recording()
    agent = _agent(engine, prefix, clock, Interleaving(), summaries)
    for n in range(20):
        clock.advance(1)
        agent.send(f"turn {n}", conversation_id)
    assert len(_stored_checkpoints(engine, prefix, conversation_id)) == len(summaries.calls) >= 2
