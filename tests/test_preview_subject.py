"""The injection preview with a subject reproduces exactly what that subject's turn is given."""

from __future__ import annotations

import json
import re

from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.providers.echo import EchoProvider
from clawmem.turn.pipeline import Claw
from dashboard import state
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

INJECTED_KEY = re.compile(
    r'<tr class="decision (?:injected|truncated)">\s*<td><a href="[^"]+"><code>([^<]+)</code></a>'
    r'(?: <span class="namespace">in <code>([^<]+)</code></span>)?'
)


def _turn(app: Flask, clock: FakeClock, message: str, user_id: str) -> list[tuple[str, str]]:
    with app.app_context():
        claw = Claw.from_settings(state.settings(), EchoProvider(), clock=clock)
        reply = claw.send(message, user_id=user_id)
        stored = state.conversations().messages(reply.conversation_id).items
        (record,) = [m for m in stored if m.role == "recall"]
    return [(given["key"], given["namespace"]) for given in json.loads(record.content)]


def test_a_subjects_preview_is_what_their_turn_is_given(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("tea", "We sell green tea and black tea", "default")
        memory.set("tea-order", "Prefers green tea, loose leaf", "user:cust-77")
        memory.set("tea-elsewhere", "green tea sample sent", "user:cust-88")
    message = "Do you have green tea?"
    body = page_text(signed_in.get("/preview", query_string={"message": message, "user_id": "cust-77"}))
    shown = [(key, namespace or "default") for key, namespace in INJECTED_KEY.findall(body)]
    assert ("tea-order", "user:cust-77") in shown and all(ns != "user:cust-88" for _, ns in shown)
    assert "their own namespace <code>user:cust-77</code>" in body
    assert shown == _turn(app, clock, message, "cust-77")
    anonymous = page_text(signed_in.get("/preview", query_string={"message": message}))
    assert [(k, ns or "default") for k, ns in INJECTED_KEY.findall(anonymous)] == [("tea", "default")]
    hostile = page_text(signed_in.get("/preview", query_string={"message": message, "user_id": "<b>x</b>"}))
    assert "<b>x</b>" not in hostile and 'value="&lt;b&gt;x&lt;/b&gt;"' in hostile
