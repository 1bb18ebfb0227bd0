"""What keeping a long conversation coherent costs: compaction with checkpoints on against off.

A 200-turn conversation on SQLite (a temporary file) under a 20-message threshold, compacted by
``ProviderSummarizer`` over a local provider that sends nothing anywhere and counts the bytes of
every request as the chat-completions body ``OpenAICompatibleProvider`` would POST. Prints, per
mode, the provider calls, the bytes sent per turn (the turn's request plus any summary request;
median and maximum) and the summariser's input in total and per half of the conversation: with
checkpoints on the halves match (linear in total), with them off the second half costs far more
(quadratic). Never part of the test suite.

    .venv/bin/python -m bench.compaction [--turns 200] [--max-messages 20] [--max-tokens 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from clawmem.clock import FakeClock
from clawmem.memory.array import ArrayMemory
from clawmem.providers.base import ChatMessage, ProviderReply
from clawmem.providers.openai import to_wire
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables
from clawmem.turn.compaction import SUMMARY_INSTRUCTION, HistoryCompactor, ProviderSummarizer
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.pipeline import Claw

QUESTIONS = [
    "Where is my order {n}? The tracking page has not changed since Monday.",
    "Can I change the delivery slot for order {n} to Friday afternoon instead?",
    "The jacket in order {n} is too small; how do I return it and get the larger size?",
    "Is express delivery available to Leeds for order {n}, and what does it cost?",
    "My parcel for order {n} arrived damaged. Do you need photos of the box and the item?",
    "How many loyalty points will order {n} earn, and when can I use them?",
]
ANSWER = (
    "Thanks for your patience. I have checked the order: it left the Leeds warehouse this morning "
    "and the courier expects to deliver it tomorrow between 9:00 and 13:00."
)
SUMMARY = (
    "The customer asked about several orders: tracking, delivery slots, a return of a jacket that "
    "was too small, express delivery to Leeds and a damaged parcel. The agent answered each and "
    "promised delivery tomorrow morning."
)


def wire_bytes(messages: Sequence[ChatMessage]) -> int:
    """Return the size of the chat-completions body an HTTP provider would send for ``messages``."""
    body = json.dumps({"model": "bench", "messages": to_wire(messages)}, ensure_ascii=False)
    return len(body.encode("utf-8"))


@dataclass
class CountingProvider:
    """A local provider: answers at once and counts calls and request bytes, turn and summary apart."""

    name: str = "counting"
    model: str = "bench"
    turn_calls: int = 0
    summary_calls: int = 0
    sent: list[int] = field(default_factory=list)  # bytes of every request, in order
    summary_sent: list[int] = field(default_factory=list)

    def complete(self, messages: Sequence[ChatMessage]) -> ProviderReply:
        size = wire_bytes(messages)
        self.sent.append(size)
        if messages and messages[-1].get("content") == SUMMARY_INSTRUCTION:
            self.summary_calls += 1
            self.summary_sent.append(size)
            text = SUMMARY
        else:
            self.turn_calls += 1
            text = ANSWER
        return ProviderReply(text, (), {"prompt_tokens": size // 4, "completion_tokens": len(text) // 4})


@dataclass
class Outcome:
    """What one run cost."""

    mode: str
    turn_calls: int
    summary_calls: int
    per_turn: list[int]  # bytes sent in each turn, summary request included
    summariser_halves: tuple[int, int]  # summariser input bytes in the first and the second half
    summary_rows: int
    seconds: float

    @property
    def summariser_total(self) -> int:
        return sum(self.summariser_halves)


def run(checkpoints: bool, turns: int, max_messages: int, max_tokens: int, directory: str) -> Outcome:
    clock = FakeClock(1_700_000_000.0)
    engine = create_engine(f"sqlite:///{directory}/compaction-{'on' if checkpoints else 'off'}.db")
    create_tables(engine)
    log = ConversationLog(engine, clock=clock)
    provider = CountingProvider()
    compactor = HistoryCompactor(ProviderSummarizer(provider), max_messages, max_tokens)
    claw = Claw(
        ArrayMemory(clock=clock),
        log,
        provider,
        compactor=compactor,
        guards=[],
        clock=clock,
        checkpoints=checkpoints,
    )
    per_turn: list[int] = []
    halves = [0, 0]
    conversation_id = None
    started = time.perf_counter()
    for turn in range(turns):
        requests_before, summaries_before = len(provider.sent), len(provider.summary_sent)
        text = QUESTIONS[turn % len(QUESTIONS)].format(n=f"A-{20000 + turn}")
        conversation_id = claw.send(text, conversation_id).conversation_id
        per_turn.append(sum(provider.sent[requests_before:]))
        halves[0 if turn < turns // 2 else 1] += sum(provider.summary_sent[summaries_before:])
        clock.advance(45)
    seconds = time.perf_counter() - started
    summary_rows, cursor = 0, None
    while True:
        page = log.messages(conversation_id, limit=1000, cursor=cursor)
        summary_rows += sum(1 for message in page.items if message.role == "summary")
        if (cursor := page.next_cursor) is None:
            break
    engine.dispose()
    return Outcome(
        "on" if checkpoints else "off",
        provider.turn_calls,
        provider.summary_calls,
        per_turn,
        (halves[0], halves[1]),
        summary_rows,
        seconds,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--max-messages", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=0)
    args = parser.parse_args(argv)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as directory:
        for checkpoints in (True, False):
            outcome = run(checkpoints, args.turns, args.max_messages, args.max_tokens, directory)
            outcomes.append(outcome)
            print(f"  checkpoints {outcome.mode}: {outcome.seconds:.1f} s", file=sys.stderr)
    half = args.turns // 2
    print(
        f"{args.turns} turns on SQLite, max_messages={args.max_messages}, max_tokens={args.max_tokens}, "
        "ProviderSummarizer; bytes are chat-completions request bodies"
    )
    header = (
        f"{'checkpoints':<12}{'calls':>7}{'summaries':>10}{'sent/turn median':>18}{'sent/turn max':>15}"
        f"{'summariser in':>15}{f'1-{half}':>12}{f'{half + 1}-{args.turns}':>12}{'rows':>6}"
    )
    print(header)
    for o in outcomes:
        print(
            f"{o.mode:<12}{o.turn_calls + o.summary_calls:>7}{o.summary_calls:>10}"
            f"{statistics.median(o.per_turn):>18,.0f}{max(o.per_turn):>15,}{o.summariser_total:>15,}"
            f"{o.summariser_halves[0]:>12,}{o.summariser_halves[1]:>12,}"
            f"{o.summary_rows:>6}"
        )
    print(
        "calls: provider calls in all (turns and summaries); summariser in: bytes sent to the summariser "
        "in all, then per half of the conversation; rows: summary checkpoints stored"
    )


if __name__ == "__main__":
    main()
