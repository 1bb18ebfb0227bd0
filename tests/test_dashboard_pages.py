"""Every page: reachable signed in, gated signed out, GET-only, read-only, and with the
security headers; htmx gets a fragment only when it targets one."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.settings import Settings
from dashboard import accounts, create_app, state
from dashboard.security import CONTENT_SECURITY_POLICY
from dashboard.views.memory import stored_token
from dashboard.views.settings import deletion_commands, shown_value
from tests.dashboard_helpers import claw_words, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

PUBLIC = {"auth.login", "health.healthz", "health.readyz", "static"}
SIGN_IN_OUT = {"auth.login", "auth.logout"}
ALLOWED = {"auth.login": {"GET", "HEAD", "POST"}, "auth.logout": {"POST"}}
WRITING_HTMX = {"hx-post", "hx-put", "hx-patch", "hx-delete"}


def first_conversation_id(app: Flask) -> str:
    with app.app_context():
        return state.conversations().list(limit=1).items[0].id


def first_user_message_id(app: Flask, conversation: str) -> str:
    with app.app_context():
        return next(m.id for m in state.conversations().messages(conversation).items if m.role == "user")


def example_urls(app: Flask) -> dict[str, str]:
    """A URL for every endpoint, with its parameters filled from the demo data."""
    conversation = first_conversation_id(app)
    turn = first_user_message_id(app, conversation)
    return {
        "overview.index": "/",
        "conversations.index": "/conversations/",
        "conversations.detail": f"/conversations/{conversation}",
        "conversations.turn": f"/conversations/{conversation}/turns/{turn}",
        "conversations.download": "/conversations/export.csv?user_id=cust-1001",
        "subjects.index": "/subjects/",
        "subjects.detail": "/subjects/cust-1001",
        "subjects.export": "/subjects/cust-1001/export.json",
        "memory.index": "/memory/",
        "memory.namespace": "/memory/default/",
        "memory.entry": "/memory/default/entry?key=shipping_policy",
        "memory.download": "/memory/default/export.json?state=live",
        "memory.stored_namespace": f"/memory/~/{stored_token('a/b')}/",
        "recall.preview": "/preview?message=where+is+my+order",
        "recall.unmatched": "/preview/unmatched?message=where+is+my+order",
        "recall.cold": "/cold",
        "jobs.index": "/jobs",
        "sites.index": "/sites/",
        "tokens.index": "/tokens",
        "settings.index": "/settings",
        "health.healthz": "/healthz",
        "health.readyz": "/readyz",
        "static": "/static/app.css",
        "auth.login": "/login",
        "auth.logout": "/logout",
    }


# Pages that exist only for rows another program wrote (the demo has none): tested with such
# rows in tests/test_hostile_rows.py.
FOREIGN_ROWS_ONLY = {"memory.stored_namespace"}

GATED = [
    "overview.index",
    "conversations.index",
    "conversations.detail",
    "conversations.turn",
    "conversations.download",
    "subjects.index",
    "subjects.detail",
    "subjects.export",
    "memory.index",
    "memory.namespace",
    "memory.entry",
    "memory.download",
    "recall.preview",
    "recall.unmatched",
    "recall.cold",
    "jobs.index",
    "sites.index",
    "tokens.index",
    "settings.index",
]


def test_every_rule_has_an_example(app: Flask, demo: None) -> None:
    endpoints = {rule.endpoint for rule in app.url_map.iter_rules()}
    assert endpoints == set(example_urls(app))
    assert endpoints - PUBLIC - SIGN_IN_OUT - FOREIGN_ROWS_ONLY == set(GATED)


@pytest.mark.parametrize("endpoint", GATED)
def test_page_is_200_when_signed_in(demo_app: Flask, demo_signed_in: FlaskClient, endpoint: str) -> None:
    response = demo_signed_in.get(example_urls(demo_app)[endpoint])
    assert response.status_code == 200
    mimetypes = {
        "subjects.export": "application/json",
        "memory.download": "application/json",
        "conversations.download": "text/csv",
    }
    assert response.mimetype == mimetypes.get(endpoint, "text/html")


@pytest.mark.parametrize("endpoint", GATED)
def test_page_redirects_to_sign_in_when_signed_out(demo_app: Flask, endpoint: str) -> None:
    url = example_urls(demo_app)[endpoint]
    response = demo_app.test_client().get(url)
    assert response.status_code == 302
    location = urlsplit(response.headers["Location"])
    assert location.path == "/login"
    assert "Alice" not in page_text(response)


@pytest.mark.parametrize("endpoint", sorted(PUBLIC))
def test_public_endpoints_answer_without_a_session(demo_app: Flask, endpoint: str) -> None:
    url = example_urls(demo_app)[endpoint]
    with demo_app.test_client().get(url) as response:  # closes a static file's handle
        assert response.status_code == 200


def test_only_sign_in_and_out_accept_post_and_nothing_accepts_delete_put_patch(app: Flask) -> None:
    for rule in app.url_map.iter_rules():
        methods = set(rule.methods or ())
        assert not methods & {"DELETE", "PUT", "PATCH"}, rule
        if rule.endpoint == "auth.login":
            assert methods == {"GET", "HEAD", "POST"}
        elif rule.endpoint == "auth.logout":
            assert methods == {"POST"}
        else:
            assert methods == {"GET", "HEAD"}, rule


@pytest.mark.parametrize("signed", [True, False], ids=["signed-in", "signed-out"])
def test_every_other_method_gets_405(
    app: Flask, demo: None, client: FlaskClient, admin: tuple[str, str], signed: bool
) -> None:
    if signed:
        sign_in(client, *admin)
    for endpoint, url in example_urls(app).items():
        allowed = ALLOWED.get(endpoint, {"GET", "HEAD"})
        for method in {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"} - allowed:
            response = client.open(url, method=method)
            assert response.status_code == 405, (method, url, response.status_code)


class _Controls(HTMLParser):
    """Collects links, forms and every control of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.forms: list[dict[str, str]] = []
        self.controls: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []
        self._in_button = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "a" and "href" in attributes:
            self.links.append(attributes["href"])
        if tag == "form":
            self.forms.append(attributes)
        if tag in ("button", "input", "select", "textarea", "a", "form"):
            self.controls.append((tag, attributes))
        self._in_button = tag == "button"

    def handle_data(self, data: str) -> None:
        if self._in_button:
            self.texts.append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        if tag == "button":
            self._in_button = False


DESTRUCTIVE = re.compile(r"delet|flush|eras|edit|remov|drop|purge|forget|sweep|prune|uninstall", re.I)


def test_no_page_has_a_control_that_deletes_or_edits(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    seen: set[str] = set()
    queue = deque(["/"])
    pages = 0
    while queue and pages < 150:
        url = queue.popleft()
        if url in seen:
            continue
        seen.add(url)
        response = signed_in.get(url)
        assert response.status_code == 200, url
        pages += 1
        parser = _Controls()
        parser.feed(page_text(response))
        for form in parser.forms:
            method = form.get("method", "get").lower()
            if method != "get":
                assert (method, form.get("action")) == ("post", "/logout"), (url, form)
        for tag, attributes in parser.controls:
            assert not WRITING_HTMX & set(attributes), (url, tag, attributes)
            for name in ("name", "value", "href", "action", "hx-get", "formaction"):
                assert not DESTRUCTIVE.search(urlsplit(attributes.get(name, "")).path), (url, tag, attributes)
        for text in parser.texts:
            assert not DESTRUCTIVE.search(text), (url, text)
        for link in parser.links:
            target = urljoin(url, link)
            parts = urlsplit(target)
            if parts.netloc or not parts.path.startswith("/") or parts.path.startswith("/static/"):
                continue
            queue.append(parts.path + (f"?{parts.query}" if parts.query else ""))
    assert pages >= 30, f"the crawl reached only {pages} pages"


@pytest.mark.parametrize("endpoint", GATED + ["auth.login"])
def test_data_pages_carry_the_security_headers(
    demo_app: Flask, demo_signed_in: FlaskClient, endpoint: str
) -> None:
    response = demo_signed_in.get(example_urls(demo_app)[endpoint], follow_redirects=True)
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert "'unsafe-inline'" not in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert response.headers["Cache-Control"] == "no-store"
    assert {"HX-Request", "HX-Target"} <= set(response.vary)


def test_pages_hold_no_inline_script_or_style(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    for endpoint in GATED:
        body = page_text(signed_in.get(example_urls(app)[endpoint]))
        assert "<style" not in body and " style=" not in body
        for script in re.findall(r"<script[^>]*>(.*?)</script>", body, re.S):
            assert script == "", "scripts must be files, the CSP forbids inline code"
        assert not re.search(r"\son[a-z]+=", body)


def test_static_files_stay_cacheable(client: FlaskClient) -> None:
    with client.get("/static/app.css") as response:
        assert response.status_code == 200
        assert response.headers.get("Cache-Control") != "no-store"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def _htmx(target: str, **extra: str) -> dict[str, str]:
    return {"HX-Request": "true", "HX-Target": target, **extra}


def test_fragment_only_for_its_own_target(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    full = page_text(signed_in.get("/conversations/"))
    assert "<html" in full and 'id="conversation-results"' in full
    fragment = page_text(signed_in.get("/conversations/?q=order", headers=_htmx("conversation-results")))
    assert "<html" not in fragment and "<table" in fragment and "<nav" not in fragment
    other = page_text(signed_in.get("/conversations/", headers=_htmx("somewhere-else")))
    assert "<html" in other


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/preview?message=order", "preview-result"),
        ("/conversations/?q=order", "conversation-results"),
    ],
)
def test_fragments_do_not_list_the_namespaces_only_the_full_page_shows(
    app: Flask, demo: None, signed_in: FlaskClient, path: str, target: str
) -> None:
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    with app.app_context():
        engine = state.engine()
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        # A DISTINCT, or the recursive walk that finds the conversations' namespaces.
        signed_in.get(path, headers=_htmx(target))
        fragment_queries = [s for s in statements if re.search(r"DISTINCT|WITH RECURSIVE", s, re.I)]
        statements.clear()
        signed_in.get(path)
        page_queries = [s for s in statements if re.search(r"DISTINCT|WITH RECURSIVE", s, re.I)]
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    assert page_queries and not fragment_queries


@pytest.mark.parametrize("header", ["HX-Boosted", "HX-History-Restore-Request"])
def test_boosted_and_history_restore_requests_get_the_full_page(
    app: Flask, demo: None, signed_in: FlaskClient, header: str
) -> None:
    response = signed_in.get("/conversations/", headers=_htmx("conversation-results", **{header: "true"}))
    assert "<html" in page_text(response)


def test_load_more_fragment_holds_only_rows(app: Flask, signed_in: FlaskClient) -> None:
    with app.app_context():
        memory = state.memory()
        for number in range(60):
            memory.set(f"k{number:03}", "value", "bulk")
    page = page_text(signed_in.get("/memory/bulk/"))
    more = re.search(r'id="memory-more".*?href="([^"]+)"', page, re.S)
    assert more, "60 keys need a second page"
    fragment = page_text(signed_in.get(more.group(1).replace("&amp;", "&"), headers=_htmx("memory-more")))
    assert fragment.lstrip().startswith("<tr") and "<table" not in fragment and "<html" not in fragment
    assert "k050" in fragment and "k049" not in fragment


BAD_NAMESPACES = {"dots": "a..b", "space": "has space", "too long": "n" * 101, "brace": "x{y}"}
NAMESPACE_PAGES = ["memory", "entry", "preview", "cold", "conversations"]


def _namespace_cases() -> list[Any]:
    return [pytest.param(page, bad, id=f"{page}-{bad}") for page in NAMESPACE_PAGES for bad in BAD_NAMESPACES]


@pytest.mark.parametrize(("page", "bad"), _namespace_cases())
def test_an_invalid_namespace_is_a_400_on_every_page(signed_in: FlaskClient, page: str, bad: str) -> None:
    namespace = BAD_NAMESPACES[bad]
    quoted = quote(namespace, safe="")
    url = {
        "memory": f"/memory/{quoted}/",
        "entry": f"/memory/{quoted}/entry?key=x",
        "preview": f"/preview?message=order&namespace={quoted}",
        "cold": f"/cold?namespace={quoted}",
        "conversations": f"/conversations/?namespace={quoted}",
    }[page]
    response = signed_in.get(url)
    assert response.status_code == 400, (url, response.status_code)
    body = page_text(response)
    assert "namespace" in body and "Traceback" not in body
    fragment = signed_in.get(url, headers=_htmx("memory-results"))
    assert fragment.status_code == 400
    as_json = signed_in.get(url, headers={"Accept": "application/json"})
    assert as_json.status_code == 400 and as_json.get_json()["error"] == "Bad Request"


def test_signed_out_htmx_request_is_told_to_load_the_sign_in_page(client: FlaskClient) -> None:
    response = client.get("/conversations/", headers=_htmx("conversation-results"))
    assert response.status_code == 401
    assert urlsplit(response.headers["HX-Redirect"]).path == "/login"


def test_settings_show_every_setting_with_its_source(
    make_app: Callable[..., Flask], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAW_RECALL_TOP_K", "5")
    app = make_app(COMPACT_MAX_MESSAGES=40)
    client = app.test_client()
    with app.app_context():
        accounts.create_admin("admin", "correct horse battery staple", 0)
    sign_in(client)
    body = page_text(client.get("/settings"))
    row = r"<tr><td><code>CLAW_(\w+)</code></td><td><code>(.*?)</code></td><td>([^<]+)</td>"
    rows = re.findall(row, body)
    found = {name: (value, source) for name, value, source in rows}
    assert set(found) == set(Settings.setting_names())
    assert found["RECALL_TOP_K"] == ("5", "environment")
    assert found["COMPACT_MAX_MESSAGES"] == ("40", "test config")
    assert found["MEMORY_DRIVER"] == ("sql", "default")


def test_settings_name_the_source_that_won(
    make_app: Callable[..., Flask], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    (tmp_path / "instance").mkdir()
    (tmp_path / "instance" / "config.py").write_text("RETENTION_DAYS = 30\nRECALL_TOP_K = 7\n")
    monkeypatch.setenv("CLAW_COMPACT_MAX_MESSAGES", "5")
    monkeypatch.setenv("CLAW_RETENTION_DAYS", "60")
    app = make_app(COMPACT_MAX_MESSAGES=40)
    client = app.test_client()
    with app.app_context():
        accounts.create_admin("admin", "correct horse battery staple", 0)
    sign_in(client)
    body = page_text(client.get("/settings"))
    row = r"<tr><td><code>CLAW_(\w+)</code></td><td><code>(.*?)</code></td><td>([^<]+)</td>"
    found = {name: (value, source) for name, value, source in re.findall(row, body)}
    assert found["COMPACT_MAX_MESSAGES"] == ("40", "test config")
    assert found["RETENTION_DAYS"] == ("60", "environment")
    assert found["RECALL_TOP_K"] == ("7", "instance config file")


def test_settings_never_show_a_database_password() -> None:
    assert (
        shown_value("mysql+pymysql://clawmem:s3cret@db/clawmem") == "mysql+pymysql://clawmem:***@db/clawmem"
    )


def test_every_deletion_command_shown_exists_with_its_options(app: Flask) -> None:
    runner = app.test_cli_runner()
    with app.app_context():
        commands = deletion_commands(state.settings())
    assert len(commands) >= 8
    for row in commands:
        _, words = claw_words(row["command"])
        result = runner.invoke(args=["claw", words[0], "--help"])
        assert result.exit_code == 0, row
        for option in (word for word in words[1:] if word.startswith("--")):
            assert option in result.output, (row, option)
        if words[0] in ("forget", "flush", "prune", "sweep", "erase", "uninstall"):
            assert "--dry-run" in words, ("a deleting command is offered as its dry run first", row)


def test_the_conversation_deletion_commands_shown_reach_conversations(
    app: Flask, demo: None, clock: FakeClock
) -> None:
    # Conversations are not a key/value namespace: the commands shown must act on the log itself.
    conversation = first_conversation_id(app)
    with app.app_context():
        commands = {row["task"]: row["command"] for row in deletion_commands(state.settings())}
        messages = state.conversations().get(conversation).row_count  # every row goes: records too
    assert not any("--namespace conversations" in command for command in commands.values())
    runner = app.test_cli_runner()
    _, one = claw_words(commands["Delete one conversation and its messages"])
    result = runner.invoke(args=["claw", *(conversation if w == "CONVERSATION_ID" else w for w in one)])
    assert result.exit_code == 0, result.output
    assert f"would delete conversation {conversation} and its {messages} messages" in result.output
    every = commands["Delete every conversation written until an hour ago, with its messages"]
    clock.advance(2 * 3600)
    result = runner.invoke(args=["claw", *claw_words(every)[1]])
    assert result.exit_code == 0, result.output
    assert "30 conversations" in result.output


def test_overview_shows_what_was_stored_before_the_switch_went_off(
    make_app: Callable[..., Flask], demo: None
) -> None:
    off = make_app(STORE_MESSAGES=False)
    with off.app_context():
        accounts.create_admin("admin", "correct horse battery staple", 0)
        counts = state.conversations().counts()
        memory_rows = sum(n.total for n in state.driver().namespace_counts())
        expired = sum(n.expired for n in state.driver().namespace_counts())
    client = off.test_client()
    sign_in(client)
    body = page_text(client.get("/"))
    assert "Message storage is off, but earlier data is still here" in body
    assert f"<strong>{counts['conversations']}</strong> conversations" in body
    assert f"<strong>{counts['messages']}</strong> messages" in body
    assert "newest activity 20" in body
    assert f"<strong>{memory_rows}</strong> memory rows" in body
    assert "newest write 20" in body
    assert expired >= 2, "expired-but-unswept rows count as written before"
    assert "claw prune --older-than 1h --dry-run" in body
    # Subjects one at a time (conversations and namespace); default is the operator's, said apart.
    assert "claw erase --user-id cust-1001 --dry-run" in body
    assert "claw flush --namespace user:cust-1001" not in body
    assert "claw flush --namespace default" not in body
    assert "Namespace <code>default</code>, which recall reads for every turn, holds your own content" in body
    assert "--namespace conversations" not in body, "conversations are not a key/value namespace"


def test_overview_with_storage_on_does_not_warn(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    body = page_text(signed_in.get("/"))
    assert "earlier data is still here" not in body
    assert "Message storage is <strong>on</strong>" in body


@pytest.mark.parametrize("path", ["/", "/conversations/", "/memory/", "/preview?message=order", "/cold"])
def test_an_unreachable_database_is_a_clear_503_without_the_password(tmp_path: Any, path: str) -> None:
    app = create_app(
        {
            "TESTING": True,
            "ARGON2_PROFILE": "CHEAPEST",
            "DATABASE_URL": "mysql+pymysql://u:s3cretpw@127.0.0.1:1/x",
        },
        instance_path=str(tmp_path / "instance"),
    )
    with app.app_context():
        accounts.create_admin("admin", "correct horse battery staple", 0)
    client = app.test_client()
    sign_in(client)
    response = client.get(path)
    body = response.get_data(as_text=True)
    assert response.status_code == 503
    assert "The storage behind this page failed" in body
    assert "s3cretpw" not in body
    assert "Traceback" not in body
