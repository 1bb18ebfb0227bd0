"""A turn stores its provider's usage on its assistant row and adds its tokens to the
conversation's total in the same append; a provider that reports none leaves it not reported."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.memory.array import ArrayMemory
from clawmem.providers.base import ProviderReply
from clawmem.sql.schema import create_tables
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.pipeline import Claw, billed_tokens


class Billing:
    """A provider that reports ``usage`` with every reply."""

    name = "billing"
    model = "billing"

    def __init__(self, usage: dict[str, int] | None) -> None:
        self.usage = usage

    def complete(self, messages: Sequence[Any]) -> ProviderReply:
        return ProviderReply("ok", (), self.usage)


def _log(tmp_path: Any, clock: FakeClock) -> ConversationLog:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    create_tables(engine, "")
    return ConversationLog(engine, clock=clock)


def test_each_turns_usage_is_stored_and_totalled(tmp_path: Any, clock: FakeClock) -> None:
    log = _log(tmp_path, clock)
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    claw = Claw(ArrayMemory(clock), log, Billing(usage), guards=[], clock=clock)
    first = claw.send("hello", user_id="cust-1")
    claw.send("again", first.conversation_id, user_id="cust-1")
    assert log.get(first.conversation_id).total_tokens == 30
    assistants = [m for m in log.messages(first.conversation_id).items if m.role == "assistant"]
    assert [m.metadata for m in assistants] == [{"usage": usage}] * 2
    assert log.subject_totals("cust-1").total_tokens == 30


def test_no_usage_is_not_reported_never_zero(tmp_path: Any, clock: FakeClock) -> None:
    log = _log(tmp_path, clock)
    reply = Claw(ArrayMemory(clock), log, Billing(None), guards=[], clock=clock).send("hello")
    assert log.get(reply.conversation_id).total_tokens is None
    assert log.subject_totals("").total_tokens is None or log.subject_totals("").conversations == 1
    assert billed_tokens({"prompt_tokens": 3, "completion_tokens": 4}) == 7
    assert billed_tokens({"messages": 2}) is None and billed_tokens(None) is None
