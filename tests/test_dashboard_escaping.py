"""Customer text is shown as text on every page it reaches, never as markup or a live link."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest
from flask import Flask, g, url_for
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from clawmem.ids import new_id
from clawmem.rules import subject_namespace
from clawmem.turn.conversations import Message
from dashboard import create_app, state
from dashboard.views.rendering import url_maker
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert(1)</script>"
IMAGE = "<img src=x onerror=alert(1)>"
LINK = "javascript:alert(1)"
# A subject id that is not plain: its namespace is encoded, and the pages decode it back to text.
SUBJECT_NAMESPACE = subject_namespace(SCRIPT)
HOSTILE = f"order {SCRIPT} {IMAGE} {LINK}"
UNESCAPING = (r"\|\s*safe\b", r"\bMarkup\s*\(", r"autoescape\s+false", r"\bmarkupsafe\b", r"\|\s*urlize")


@pytest.fixture
def hostile(app: Flask) -> str:
    """Memory and a conversation full of markup; returns the conversation id."""
    conversation_id = new_id()
    with app.app_context():
        memory = state.memory()
        memory.set(SCRIPT, HOSTILE, "default")
        memory.set("order_note", {"note": HOSTILE, "link": LINK}, "default")
        memory.set("unrelated", "nothing to see", "default")
        state.conversations().append(
            conversation_id,
            [
                Message("user", HOSTILE),
                Message("assistant", f"see {LINK}", SCRIPT, {"url": LINK, "html": IMAGE}),
                Message("tool", IMAGE, tool_name=SCRIPT),
            ],
            user_id=IMAGE,
            title=f"{SCRIPT} order",
            metadata={"source": LINK},
        )
        memory.set("profile", {"note": HOSTILE}, SUBJECT_NAMESPACE)
    return conversation_id


def _pages(conversation_id: str) -> dict[str, str]:
    return {
        "conversation list": "/conversations/",
        "conversation search": f"/conversations/?q={quote(SCRIPT)}",
        "conversation": f"/conversations/{conversation_id}",
        "memory index": "/memory/",
        "subject namespace": f"/memory/{SUBJECT_NAMESPACE}/",
        "memory list": "/memory/default/",
        "memory search": f"/memory/default/?q={quote(SCRIPT)}",
        "key detail": f"/memory/default/entry?key={quote(SCRIPT)}",
        "value detail": "/memory/default/entry?key=order_note",
        "preview": f"/preview?message={quote(HOSTILE)}",
        "cold memory": "/cold",
    }


@pytest.mark.parametrize("page", list(_pages("x")))
def test_markup_is_shown_as_text(signed_in: FlaskClient, hostile: str, page: str) -> None:
    response = signed_in.get(_pages(hostile)[page])
    assert response.status_code == 200
    body = page_text(response)
    assert SCRIPT not in body and "<script>alert" not in body
    assert IMAGE not in body and "<img" not in body
    assert not re.search(r"""(href|src|action)\s*=\s*["']?\s*javascript:""", body, re.I)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body, "the text must still be shown, escaped"


def test_preview_shows_hostile_memory_inside_the_augmented_text_as_text(
    signed_in: FlaskClient, hostile: str
) -> None:
    body = page_text(signed_in.get(_pages(hostile)["preview"]))
    augmented = re.search(r'<pre class="augmented">(.*?)</pre>', body, re.S)
    assert augmented and "&lt;img src=x onerror=alert(1)&gt;" in augmented.group(1)


# The one module that builds markup (a <time> element, <mark> around matches), every piece of it
# escaped first; the hostile-text tests of its filters hold it to that.
MARKUP_BUILDER = ROOT / "dashboard" / "views" / "rendering.py"


def test_no_template_or_view_turns_autoescaping_off() -> None:
    offenders = []
    for path in [*ROOT.joinpath("templates").rglob("*.html"), *ROOT.joinpath("dashboard").rglob("*.py")]:
        if path == MARKUP_BUILDER:
            continue
        text = path.read_text()
        for pattern in UNESCAPING:
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(ROOT)}: {pattern}")
    assert offenders == []


def test_templates_have_no_inline_handlers_or_styles() -> None:
    for path in ROOT.joinpath("templates").rglob("*.html"):
        text = path.read_text()
        assert not re.search(r"\son[a-z]+\s*=", text), path
        assert " style=" not in text and "<style" not in text, path
        assert "hx-on" not in text, path


@pytest.fixture(scope="module")
def routes_only(tmp_path_factory: pytest.TempPathFactory) -> Flask:
    """An app whose routes alone are used: nothing reaches a database."""
    return create_app(
        {"TESTING": True, "DATABASE_URL": "sqlite://"}, instance_path=str(tmp_path_factory.mktemp("instance"))
    )


@given(user_id=st.text(min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_links_built_once_per_list_equal_url_for(routes_only: Flask, user_id: str) -> None:
    """A list builds its rows' links from one URL; each equals url_for's, whatever the text,
    with the site the request chose kept."""
    with routes_only.test_request_context("/conversations/"):
        g.clawmem_site = "second site"
        to_subject = url_maker("subjects.detail", "user_id")
        assert to_subject(user_id) == url_for("subjects.detail", user_id=user_id)
        to_conversation = url_maker("conversations.detail", "conversation_id")
        assert to_conversation(user_id) == url_for("conversations.detail", conversation_id=user_id)
        assert "site=second" in to_subject(user_id)
