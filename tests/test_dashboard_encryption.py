"""The dashboard on an encrypted site (SPEC 13): it shows the decrypted text, never a key; a wrong
key is said at start-up and on the pages, which still render with the rows marked; the searches
say how far they decrypted; titles are not sorted by ciphertext."""

from __future__ import annotations

import base64
import html
import logging
import os
import re
from collections.abc import Callable

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from clawmem.clock import FakeClock
from clawmem.crypto import generate_key
from dashboard import accounts, state
from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

SECRET = "Zanzibar-Quokka-7731"
KEYS = generate_key("k1")
WRONG = f"k1:{base64.b64encode(os.urandom(32)).decode()}"


def page_text(response: TestResponse) -> str:
    """Return what a reader of the page sees: its text without tags, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", response.get_data(as_text=True))).split())


def _written(app: Flask) -> str:
    with app.app_context():
        state.memory().set("fact", f"{SECRET} drinks green tea")
        log = state.conversations()
        log.append(
            "c1",
            [
                {"role": "user", "content": f"hello from {SECRET}"},
                {"role": "assistant", "content": "hi there"},
            ],
            user_id="ada",
            title=f"About {SECRET}",
        )
        log.append("c2", [{"role": "user", "content": "nothing special"}], title="Another one")
    return "c1"


def _client(app: Flask, clock: FakeClock) -> FlaskClient:
    with app.app_context():
        if not accounts.admin_count():  # apps of one test share the instance and its admin
            accounts.create_admin(ADMIN, PASSWORD, clock())
    client = app.test_client()
    assert sign_in(client).status_code == 302
    return client


def test_pages_show_decrypted_text_and_never_a_key(make_app: Callable[..., Flask], clock: FakeClock) -> None:
    app = make_app(ENCRYPTION_KEYS=KEYS)
    _written(app)
    client = _client(app, clock)
    listed = page_text(client.get("/conversations/"))
    assert f"About {SECRET}" in listed
    detail = page_text(client.get("/conversations/c1"))
    assert f"hello from {SECRET}" in detail and "hi there" in detail and "cm1$" not in detail
    memory = page_text(client.get("/memory/default/"))
    assert f"{SECRET} drinks green tea" in memory
    settings = page_text(client.get("/settings"))
    secret = KEYS.partition(":")[2]
    assert secret not in settings and "key ids k1" in settings
    assert "messages.content k1 : 3 0" in settings and "Encryption is on" in settings
    overview = page_text(client.get("/"))
    assert "Encryption at rest: on , new text under key id k1" in overview and secret not in overview


def test_searches_decrypt_and_say_how_far_they_read(make_app: Callable[..., Flask], clock: FakeClock) -> None:
    app = make_app(ENCRYPTION_KEYS=KEYS)
    _written(app)
    client = _client(app, clock)
    found = page_text(client.get(f"/conversations/?q={SECRET.lower()}"))
    assert f"About {SECRET}" in found and "Another one" not in found
    assert "decrypted and read all 2 conversation titles and 3 messages" in found
    memory = page_text(client.get("/memory/default/?q=green"))
    assert "drinks green tea" in memory and "decrypted and read all 1 entries" in memory
    by_title = page_text(client.get("/conversations/?sort=title"))
    assert "Titles are encrypted, so the database cannot sort by them" in by_title


def test_a_wrong_key_is_said_at_start_up_and_on_the_pages_which_still_render(
    make_app: Callable[..., Flask], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    _written(make_app(ENCRYPTION_KEYS=KEYS))
    with caplog.at_level(logging.ERROR):
        app = make_app(ENCRYPTION_KEYS=WRONG)
    assert "encryption keys do not open this site's rows" in caplog.text and "'k1'" in caplog.text
    assert SECRET not in caplog.text
    client = _client(app, clock)
    overview = client.get("/")
    assert overview.status_code == 200
    assert "The encryption keys do not open every row" in page_text(overview)
    listed = client.get("/conversations/")
    assert listed.status_code == 200 and SECRET not in page_text(listed)
    detail = client.get("/conversations/c1")
    assert detail.status_code == 200 and "content cannot be decrypted" in page_text(detail)
    assert "title cannot be decrypted" in page_text(detail) and "cm1$" not in page_text(detail)
    memory = client.get("/memory/default/")
    assert memory.status_code == 200 and "unreadable" in page_text(memory) and "cm1$" not in page_text(memory)
    assert "value cannot be decrypted" in memory.get_data(as_text=True)  # the tag's title says why
    settings = page_text(client.get("/settings"))
    assert "The start-up check failed" in settings
    with app.app_context():  # nothing was deleted for failing to decrypt
        assert state.conversations().counts() == {"conversations": 2, "messages": 3}
