"""Provider factories that ``clawmem worker`` processes of the tests load by
``CLAW_PROVIDER_FACTORY=tests.job_providers:<name>``; each is called with the worker's settings."""

from __future__ import annotations

import os
import urllib.request
from typing import Any

from clawmem import events
from clawmem.providers import EchoProvider, OpenAICompatibleProvider


def echo(settings: Any) -> EchoProvider:
    """The echo provider: replies ``echo: <message>``, at once."""
    return EchoProvider()


def loopback(settings: Any) -> OpenAICompatibleProvider:
    """The chat-completions server at ``CLAWTEST_PROVIDER_URL`` (a test's local fake server)."""
    return OpenAICompatibleProvider(os.environ["CLAWTEST_PROVIDER_URL"], "test-model", timeout=120)


def echo_then_hold_after_commit(settings: Any) -> EchoProvider:
    """The echo provider, in a worker that stops right after a turn's append has committed: the
    ``conversation.saved`` listener calls ``CLAWTEST_HOLD_URL``, a test server that never answers
    before the test kills the worker. Stands for a worker killed between commit and record."""
    url = os.environ["CLAWTEST_HOLD_URL"]

    def hold(event: dict[str, Any]) -> None:
        if event.get("inserted"):
            urllib.request.urlopen(url, data=b"{}", timeout=300).read()

    events.on("conversation.saved", hold)
    return EchoProvider()
