"""Another process of a site, for tests/test_erasure_elsewhere.py: it serves a subject's turns
and reads as a site's web or queue worker would, for as long as it lives, so the data keys it
read stay in it.

    python -m tests.subject_reader '<settings as JSON>'

Each line of stdin is one command as JSON, answered by one line of JSON on stdout:
``{"do": "turn", "conversation_id": ..., "user_id": ..., "message": ...}`` runs a turn and
answers what the provider was sent and replied; ``{"do": "read", "conversation_id": ...,
"user_id": ..., "query": ...}`` answers what a load of the conversation, a read of the subject's
``address`` fact and a search for ``query`` gave. A read that fails answers the error's kind and
message in place of its result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from clawmem.providers import EchoProvider
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.turn.pipeline import Claw


def attempt(read: Callable[[], Any]) -> dict[str, Any]:
    """Return ``{"value": read()}``, or the kind and message of what it raised."""
    try:
        return {"value": read()}
    except Exception as exc:  # the test reads the kind: any failure is an answer here
        return {"error": type(exc).__name__, "message": str(exc)}


def main() -> None:
    settings = Settings(**json.loads(sys.argv[1]))
    site = Site(settings)
    provider = EchoProvider()
    claw = Claw.from_settings(settings, provider)

    def turn(command: dict[str, Any]) -> dict[str, Any]:
        reply = claw.send(command["message"], command["conversation_id"], command["user_id"])
        return {"reply": reply.text, "sent": provider.requests[-1]}

    def read(command: dict[str, Any]) -> dict[str, Any]:
        conversation_id, user_id = command["conversation_id"], command["user_id"]

        def load() -> dict[str, Any]:
            found = site.conversations.load(conversation_id)
            assert found is not None
            return {"title": found.title, "contents": [message.content for message in found.messages]}

        def search() -> dict[str, Any]:
            page = site.conversations.list(query=command["query"], user_id=user_id)
            ids = [row.id for row in page.items]
            return {"ids": ids, "snippets": site.conversations.first_matches(ids, command["query"])}

        return {
            "load": attempt(load),
            "memory": attempt(lambda: site.memory.get("address", f"user:{user_id}")),
            "search": attempt(search),
        }

    answers = {"turn": lambda command: attempt(lambda: turn(command)), "read": read}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        print(json.dumps(answers[command["do"]](command), default=str), flush=True)


if __name__ == "__main__":
    main()
