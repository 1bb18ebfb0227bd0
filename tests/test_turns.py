"""What each turn was given and what it would be given now, on the conversation page (SPEC 9)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.providers import EchoProvider
from clawmem.turn.pipeline import Claw
from dashboard import state
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

GIVEN = re.compile(r'<li class="now-(\w+)">(?:<a href="([^"]+)">)?<code>([^<]+)</code>')


def _turns(app: Flask, clock: FakeClock) -> tuple[str, list[str]]:
    """Run two real turns for cust-9; return the conversation id and the user message ids."""
    with app.app_context():
        site = state.site()
        site.memory.set("returns_policy", "returns within 30 days with the receipt")
        site.memory.set("delivery_note", "parcels go to the back door", namespace="user:cust-9")
        claw = Claw(site.memory, site.conversations, EchoProvider(), guards=[], clock=clock)
        first = claw.send("what is the returns policy for parcels?", user_id="cust-9")
        claw.send("and the receipt?", first.conversation_id, user_id="cust-9")
        users = [m.id for m in site.conversations.messages(first.conversation_id).items if m.role == "user"]
    return first.conversation_id, users


def test_each_turn_shows_the_entries_it_was_given_linked_to_them_as_they_are_now(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    conversation_id, _ = _turns(app, clock)
    body = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    found = GIVEN.findall(body)
    assert ("unchanged", "/memory/default/entry?key=returns_policy", "returns_policy") in found
    assert ("unchanged", "/memory/user:cust-9/entry?key=delivery_note", "delivery_note") in found
    recall_rows = re.findall(
        r'<li class="message role-recall".*?</li>\s*</ul>|<li class="message role-recall".*?</li>', body, re.S
    )
    assert recall_rows and not any("back door" in row for row in recall_rows)  # names, never values
    assert signed_in.get("/memory/user:cust-9/entry?key=delivery_note").status_code == 200


def test_an_entry_changed_expired_or_deleted_since_is_marked_so(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    conversation_id, _ = _turns(app, clock)
    clock.advance(60)
    with app.app_context():
        memory = state.memory()
        memory.set("returns_policy", "returns within 14 days only")
        memory.forget("delivery_note", "user:cust-9")
    body = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    states = {key: now for now, _, key in GIVEN.findall(body)}
    assert states == {"returns_policy": "changed", "delivery_note": "gone"}
    assert "changed since" in body and "deleted since" in body
    with app.app_context():
        state.memory().set("returns_policy", "returns within 14 days only", ttl=10)
    clock.advance(20)
    body = page_text(signed_in.get(f"/conversations/{conversation_id}"))
    assert {key: now for now, _, key in GIVEN.findall(body)}["returns_policy"] == "expired"


def test_the_per_turn_preview_says_what_the_message_would_be_given_now_and_what_changed(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    conversation_id, users = _turns(app, clock)
    with app.app_context():
        memory = state.memory()
        memory.forget("returns_policy")
        memory.set("parcel_lockers", "parcels can wait in a locker for 3 days")
    url = f"/conversations/{conversation_id}/turns/{users[0]}"
    assert f'href="{url}"' in page_text(signed_in.get(f"/conversations/{conversation_id}"))
    full = page_text(signed_in.get(url))  # a plain link, without JavaScript: a page of its own
    assert "<h1>One turn</h1>" in full
    assert re.search(r'class="gained">Would gain: <code>parcel_lockers</code>', full)
    assert re.search(r'class="lost">Would lose: <code>returns_policy</code>', full)
    fragment = page_text(signed_in.get(url, headers={"HX-Request": "true", "HX-Target": f"turn-{users[0]}"}))
    assert "<html" not in fragment and "Would gain" in fragment


def test_a_turn_that_is_not_a_user_message_of_the_conversation_is_a_404(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    conversation_id, users = _turns(app, clock)
    assert signed_in.get(f"/conversations/{conversation_id}/turns/NOPE").status_code == 404
    assert signed_in.get(f"/conversations/01ZZZZZZZZZZZZZZZZZZZZZZZZ/turns/{users[0]}").status_code == 404
    assert signed_in.get(f"/conversations/bad%20id/turns/{users[0]}").status_code == 404


@pytest.mark.parametrize("path", ["/conversations/x/turns/y"])
def test_turn_pages_need_a_login(client: FlaskClient, path: str) -> None:
    assert client.get(path).status_code in (302, 401)


def test_a_long_conversation_page_stays_fast_enough_to_serve(
    app: Flask, signed_in: FlaskClient, clock: Any
) -> None:
    with app.app_context():
        site = state.site()
        site.memory.set("tea", "green tea")
        claw = Claw(site.memory, site.conversations, EchoProvider(), guards=[], clock=clock)
        cid = claw.send("tea one").conversation_id
        for turn in range(60):
            claw.send(f"tea {turn}", cid)
    body = page_text(signed_in.get(f"/conversations/{cid}"))
    shown = body.count('class="message role-user')
    assert shown >= 30 and body.count('class="turn-preview"') == shown
    assert "Given now" not in body  # every turn's preview is a link, computed only when asked
