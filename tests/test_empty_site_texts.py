"""What every page says on an empty site (the tables made, nothing stored) and with one row of
each kind: "No …" where nothing is there, singulars for one, and no sentence about things that
do not exist."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from flask import Flask
from flask.testing import FlaskClient

from clawmem.turn.conversations import Message
from dashboard import state
from tests.dashboard_helpers import page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

PAGES = [
    "/",
    "/conversations/",
    "/subjects/",
    "/subjects/nobody",
    "/memory/",
    "/memory/default/",
    "/memory/?q=refund",
    "/preview?message=hello",
    "/cold",
    "/jobs",
    "/sites/",
    "/tokens",
    "/settings",
]
# Counts of nothing, "no user messages" said as a number, and plurals of one.
AWKWARD = re.compile(
    r"\b0 (?:of 0|messages|conversations|rows|entries|user messages|recall records|checkpoints)\b"
    r"|up to 0\b|over the last 0\b|checked against 0\b|\b1 (?:messages|conversations|rows|entries|"
    r"user messages)\b|prefix \(no prefix\)|\d+ s after|\bin the last \d+ s\b"
)


def _main(client: FlaskClient, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, path
    body = page_text(response).split("<main>", 1)[1].split("</main>", 1)[0]
    words = re.sub(r"<(?:table|details)\b.*?</(?:table|details)>", " ", body, flags=re.S)  # the day tables
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", words)))


def test_no_page_of_an_empty_site_counts_nothing_in_numbers(signed_in: FlaskClient) -> None:
    for path in PAGES:
        text = _main(signed_in, path)
        assert not AWKWARD.search(text), (path, AWKWARD.search(text).group(0), text[:2000])


def test_an_empty_site_says_no_where_nothing_is_stored(signed_in: FlaskClient, prefix: str) -> None:
    overview = _main(signed_in, "/")
    for said in (
        "Messages per day no messages in these days",
        "Conversations stored none now",
        "Memory rows stored none now",
        "No turn was stored in these 30 days.",
        "Tokens billed: none, as no conversation is stored.",
        "with no user message stored yet",
        "No conversation is stored.",
        "No memory entries are stored.",
    ):
        assert said in overview, said
    assert "not reported" not in overview, "nothing was asked of a provider to report"
    assert "No entries are stored in this namespace." in _main(signed_in, "/memory/default/")
    assert "No entries match" not in _main(signed_in, "/memory/default/"), "nothing was filtered"
    search = _main(signed_in, "/memory/?q=refund")
    assert "No memory entries are stored." in search and "No entry in any namespace holds" not in search
    cold = _main(signed_in, "/cold")
    assert "There are no live entries in default , so nothing is cold." in cold and "are cold (" not in cold
    preview = _main(signed_in, "/preview?message=hi")
    assert "No entry injected: there is no live entry to choose from." in preview
    assert f"This page shows site default (table prefix {prefix} )." in _main(signed_in, "/sites/")
    assert "ages out 1 h after its last change" in _main(signed_in, "/jobs")
    subject = _main(signed_in, "/subjects/nobody")
    assert "No conversation carries this user id and its namespace holds no entries" in subject
    assert "Mentioned elsewhere listed below" in subject
    subject = _main(signed_in, "/subjects/nobody?mentions=1")  # the page with its mentions searched
    assert "Nothing is stored about this user id" in subject
    for fact in (
        "Conversations none",
        "Messages none",
        "Records no recall records or checkpoints",
        "Tokens billed none: no conversation is stored",
        "Own namespace user:nobody : no entries",
        "Mentioned elsewhere none",
    ):
        assert fact in subject, fact


def test_one_of_each_is_said_in_the_singular(app: Flask, signed_in: FlaskClient) -> None:
    with app.app_context():
        state.conversations().append("c-1", [Message("user", "hello")], user_id="cust-1", title="Hi")
        state.memory().set("refund", "within 30 days")
        state.memory().set("likes", "tea", "user:cust-1")
    overview = _main(signed_in, "/")
    assert "up to 1 message a day" in overview and "Conversations stored 1 conversation now" in overview
    assert "over the last 1 user message" in overview
    assert "not reported" in overview, "a stored turn whose provider reported no usage"
    assert "1 live entry" not in overview and "2 live entries" in overview
    assert "1 of 1 live entry in default is cold" in _main(
        signed_in, "/cold"
    ) or "0 of 1 live entry in default are cold" in _main(signed_in, "/cold")
    subject = _main(signed_in, "/subjects/cust-1")
    assert "Nothing is stored" not in subject
    assert "Conversations 1 " in subject and "Own namespace user:cust-1 : 1 entry" in subject
    for path in PAGES:
        text = _main(signed_in, path)
        assert not AWKWARD.search(text), (path, AWKWARD.search(text).group(0))


def test_a_site_without_a_prefix_says_so_in_words(
    make_app: Callable[..., Flask], admin: tuple[str, str]
) -> None:
    client = make_app(TABLE_PREFIX="").test_client()
    sign_in(client, *admin)
    assert "This page shows site default (no table prefix)." in _main(client, "/sites/")
