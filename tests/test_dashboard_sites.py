"""One dashboard, several sites (``CLAW_SITES``, SPEC 4.2 and 9).

Two sites and the commands' own site hold distinct data in one database (SQL prefixes), each
with its own memory (SQL table, directory or Redis key prefix). Every page and fragment of the
dashboard, found from ``app.url_map`` and by following every link and form, is requested on each
site: nothing of another site may appear, and every link and form must keep the site.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from clawmem.clock import FakeClock
from clawmem.errors import ConfigError
from clawmem.providers.base import ToolCall
from clawmem.providers.echo import EchoProvider
from clawmem.settings import PHPCLAW_SCHEMA
from clawmem.sites.site import Site
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables
from clawmem.turn.pipeline import Claw
from dashboard import accounts, create_app, state
from tests.conftest import backend_url
from tests.dashboard_helpers import ADMIN, PASSWORD, claw_words, csrf_from, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent

# The first site is the one shown without ?site=; the commands' own site is in no CLAW_SITES pair.
MARKERS = {"alpha": "aardvarkish", "beta": "bumblebeeish", "commands": "chameleonish"}
# Endpoints that never show a site's data or take part in switching.
NOT_CRAWLED = {"static", "auth.logout", "memory.stored_namespace"}  # the last: only for foreign rows
SITE_SWITCHER = re.compile(r'<nav class="sites".*?</nav>', re.S)


@dataclass
class Controls(HTMLParser):
    """The URLs a page leads to: links, htmx requests (with their target) and GET forms filled
    with their current values."""

    links: list[str] = field(default_factory=list)
    fragments: list[tuple[str, str]] = field(default_factory=list)
    forms: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    _form: list[tuple[str, str]] | None = None
    _textarea: str | None = None
    _select: str | None = None
    _options: list[tuple[str, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "a" and "href" in attributes:
            self.links.append(attributes["href"])
        if "hx-get" in attributes and tag != "form":
            self.fragments.append((attributes["hx-get"], attributes.get("hx-target", "").lstrip("#")))
        if tag == "form" and attributes.get("method", "get").lower() == "get":
            self._form = []
            self.forms.append((attributes.get("action", ""), self._form))
            if "hx-get" in attributes:
                self.fragments.append((attributes["hx-get"], attributes.get("hx-target", "").lstrip("#")))
        if self._form is None or not attributes.get("name"):
            return
        if tag == "input" and attributes.get("type", "text") not in ("submit", "checkbox", "radio"):
            self._form.append((attributes["name"], attributes.get("value", "")))
        elif tag == "textarea":
            self._textarea = attributes["name"]
            self._form.append((self._textarea, ""))
        elif tag == "select":
            self._select, self._options = attributes["name"], []
        elif tag == "option":
            self._options.append((attributes.get("value", ""), "selected" in attributes))

    def handle_data(self, data: str) -> None:
        if self._form is not None and self._textarea is not None:
            name, text = self._form.pop()
            self._form.append((name, text + data))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "select" and self._form is not None and self._select and self._options:
            chosen = next((value for value, selected in self._options if selected), self._options[0][0])
            self._form.append((self._select, chosen))
            self._select = None


def _load(site: Site, marker: str, clock: FakeClock) -> set[str]:
    """Give ``site`` data that names ``marker`` everywhere (keys, values, namespaces, subjects,
    titles, messages, tools, recall records); return its distinctive strings: the marker and
    every conversation and message id."""
    memory = site.memory
    memory.set(f"{marker}_policy", f"{marker} orders ship on tuesdays", "default")
    memory.set(f"{marker}_hours", f"{marker} orders desk opens at nine", "default", ttl=86_400)
    memory.set(f"{marker}_promo", f"{marker} orders promo ends soon", "default", ttl=60)
    memory.set(f"{marker}_fact", {"note": f"{marker} fact"}, f"{marker}-ns")
    memory.set("likes", f"{marker} tea", f"user:{marker}-user")
    provider = EchoProvider(tool_calls=[ToolCall(f"{marker}_lookup", {"order": marker})])
    claw = Claw.from_settings(site.settings, provider, clock)
    first = claw.send(f"where are my {marker} orders", user_id=f"{marker}-user")
    clock.advance(5)
    claw.send(f"and the {marker} orders desk hours", first.conversation_id, user_id=f"{marker}-user")
    claw.send(f"a {marker} question about orders", user_id=f"{marker}-guest")
    conversations = site.conversations.list(limit=100).items
    messages = [message for c in conversations for message in site.conversations.messages(c.id).items]
    return {marker} | {c.id for c in conversations} | {m.id for m in messages}


@pytest.fixture(params=["sql", "file", "redis"])
def sites_app(
    request: pytest.FixtureRequest, make_app: Callable[..., Flask], prefix: str, clock: FakeClock
) -> Iterator[tuple[Flask, dict[str, set[str]]]]:
    """An app with sites alpha and beta beside the commands' own site, each loaded with its own
    data on memory driver ``sql``, ``file`` or ``redis``; yields it and each site's strings."""
    config: dict[str, Any] = {"SITES": f"alpha={prefix}a_,beta={prefix}b_", "MEMORY_DRIVER": request.param}
    if request.param == "redis":
        config["REDIS_URL"] = backend_url("redis")
    app = make_app(**config)
    with app.app_context():
        sites = {**state.sites_of(app), "commands": state.site_of(app)}
        strings = {}
        for label, site in sites.items():
            create_tables(site.engine, site.prefix)
            strings[label] = _load(site, MARKERS[label], clock)
        accounts.create_admin(ADMIN, PASSWORD, clock())
    clock.advance(120)  # the promos expire, unswept
    yield app, strings
    if request.param == "redis":
        client = redis.Redis.from_url(backend_url("redis"))
        for key in client.scan_iter(f"{prefix}*", count=1000):
            client.delete(key)


def _site_of(url: str) -> str | None:
    return parse_qs(urlsplit(url).query).get("site", [None])[0]


def _local(base: str, url: str) -> str | None:
    # The path and query of a URL of this dashboard (not a static file), else None.
    parts = urlsplit(urljoin(base, url))
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        return None
    if parts.path.startswith("/static/"):
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


@dataclass
class Crawl:
    """A walk of one site's pages from a signed-in client, checking every answer as it goes."""

    app: Flask
    client: FlaskClient
    label: str
    expected_site: str | None
    foreign: set[str]
    own_marker: str
    seen: set[tuple[str, str]] = field(default_factory=set)
    endpoints: set[str] = field(default_factory=set)
    queue: deque[tuple[str, str]] = field(default_factory=deque)

    def endpoint(self, url: str) -> str:
        parts = urlsplit(url)
        adapter = self.app.url_map.bind("localhost")
        return adapter.match(parts.path, method="GET", query_args=parts.query)[0]

    def enqueue(self, base: str, url: str, target: str = "") -> None:
        local = _local(base, url)
        if local is None:
            return
        assert _site_of(local) == self.expected_site, f"{url!r} on {base} loses the site {self.label}"
        self.queue.append((local, target))

    def check(self, url: str, target: str, response: TestResponse) -> None:
        body = page_text(response)
        leaked = sorted(text for text in self.foreign if text in body)
        assert not leaked, f"{url} (target {target!r}) on site {self.label} shows another site's {leaked}"
        endpoint = self.endpoint(url)
        if (
            endpoint
            in {
                "conversations.index",
                "conversations.detail",
                "conversations.turn",
                "memory.index",
                "memory.namespace",
                "memory.entry",
            }
            and not target
        ):
            assert self.own_marker in body, f"{url} on site {self.label} does not show its own data"

    def visit(self, url: str, target: str) -> None:
        headers = {"HX-Request": "true", "HX-Target": target} if target else {}
        response = self.client.get(url, headers=headers)
        self.check(url, target, response)
        endpoint = self.endpoint(url)
        self.endpoints.add(endpoint)
        if endpoint == "auth.login":  # signed in: sent on, still on the site
            assert response.status_code == 302, url
            assert _site_of(response.headers["Location"]) == self.expected_site
            return
        assert response.status_code == 200, (url, target, response.status_code)
        if response.mimetype != "text/html":
            return
        body = page_text(response)
        switcher = SITE_SWITCHER.findall(body)
        assert len(switcher) == (0 if target else 1), url
        self.follow(url, SITE_SWITCHER.sub("", body))

    def follow(self, url: str, body: str) -> None:
        controls = Controls()
        controls.feed(body)
        for link in controls.links:
            self.enqueue(url, link)
        for hx_url, target in controls.fragments:
            self.enqueue(url, hx_url, target)
        for action, fields in controls.forms:
            sites = [value for name, value in fields if name == "site"]
            assert sites == ([self.expected_site] if self.expected_site else []), (url, action, fields)
            query = urlencode(fields)
            # A browser replaces the action's query with the form's fields, as here.
            self.enqueue(url, urlsplit(urljoin(url, action)).path + (f"?{query}" if query else ""))

    def run(self, starts: list[str], limit: int = 400) -> None:
        for start in starts:
            self.queue.append((start, ""))
        visited = 0
        while self.queue:
            url, target = self.queue.popleft()
            if (url, target) in self.seen:
                continue
            self.seen.add((url, target))
            self.visit(url, target)
            visited += 1
            assert visited <= limit, "the crawl did not settle"


def _starts(app: Flask, site: str | None) -> list[str]:
    """The address of every page that takes no path value, on ``site``; the rest are found by links."""
    query = f"?site={site}" if site else ""
    return [
        rule.rule + query
        for rule in app.url_map.iter_rules()
        if rule.endpoint not in NOT_CRAWLED and not rule.arguments
    ]


@pytest.mark.parametrize("label", ["alpha", "beta"])
@pytest.mark.slow
def test_no_page_or_fragment_of_one_site_shows_another_sites_data(
    sites_app: tuple[Flask, dict[str, set[str]]], label: str
) -> None:
    app, strings = sites_app
    client = app.test_client()
    assert sign_in(client).status_code == 302
    expected_site = None if label == "alpha" else label
    foreign = set().union(*(texts for other, texts in strings.items() if other != label))
    crawl = Crawl(app, client, label, expected_site, foreign, MARKERS[label])
    crawl.run(_starts(app, expected_site))
    every_page = {rule.endpoint for rule in app.url_map.iter_rules()} - NOT_CRAWLED
    assert crawl.endpoints == every_page, f"never reached: {every_page - crawl.endpoints}"
    assert any(target for _, target in crawl.seen), "no fragment was requested"
    assert len(crawl.seen) >= 30, len(crawl.seen)


def _switch_links(body: str) -> dict[str, str]:
    (switcher,) = SITE_SWITCHER.findall(body)
    links = re.findall(r'<a href="([^"]*)"[^>]*>([^<]+)</a>', switcher)
    return {label: html.unescape(href) for href, label in links}


@pytest.fixture
def two_sites(make_app: Callable[..., Flask], prefix: str, clock: FakeClock) -> tuple[Flask, FlaskClient]:
    """Sites alpha and beta with their data on the SQL driver, and a signed-in client."""
    app = make_app(SITES=f"alpha={prefix}a_,beta={prefix}b_")
    with app.app_context():
        for label, site in state.sites_of(app).items():
            create_tables(site.engine, site.prefix)
            _load(site, MARKERS[label], clock)
        accounts.create_admin(ADMIN, PASSWORD, clock())
    client = app.test_client()
    assert sign_in(client).status_code == 302
    return app, client


def test_the_header_names_the_site_and_switching_keeps_the_page_and_its_query(
    two_sites: tuple[Flask, FlaskClient], prefix: str
) -> None:
    _, client = two_sites
    body = page_text(client.get("/conversations/?q=orders&site=beta"))
    assert re.search(rf"Site: <strong>beta</strong>\s*<code[^>]*>{prefix}b_</code>", body)
    assert _switch_links(body) == {"alpha": "/conversations/?q=orders"}
    alpha = page_text(client.get("/conversations/?q=orders"))
    assert "Site: <strong>alpha</strong>" in alpha and MARKERS["alpha"] in alpha
    assert MARKERS["beta"] not in alpha
    assert _switch_links(alpha) == {"beta": "/conversations/?q=orders&site=beta"}
    cold = page_text(client.get("/cold?n=7&namespace=aardvarkish-ns"))
    assert _switch_links(cold) == {"beta": "/cold?n=7&namespace=aardvarkish-ns&site=beta"}


def test_switching_from_a_page_that_names_one_record_shows_its_list(
    two_sites: tuple[Flask, FlaskClient],
) -> None:
    app, client = two_sites
    with app.app_context():
        beta = state.sites_of(app)["beta"].conversations
        conversation = beta.list(limit=1).items[0].id
        turn = next(m.id for m in beta.messages(conversation).items if m.role == "user")
    cases = {
        f"/conversations/{conversation}?max_messages=3&site=beta": "/conversations/",
        f"/conversations/{conversation}/turns/{turn}?site=beta": "/conversations/",
        "/memory/default/entry?key=bumblebeeish_policy&site=beta": "/memory/default/",
        "/memory/bumblebeeish-ns/?state=live&site=beta": "/memory/bumblebeeish-ns/?state=live",
    }
    for url, expected in cases.items():
        response = client.get(url)
        assert response.status_code == 200, url
        link = _switch_links(page_text(response))["alpha"]
        assert link == expected, url
        assert client.get(link).status_code == 200, link


def test_load_more_and_the_sign_in_redirect_keep_the_site(
    two_sites: tuple[Flask, FlaskClient], clock: FakeClock
) -> None:
    app, client = two_sites
    with app.app_context():
        beta = state.sites_of(app)["beta"]
        for number in range(60):
            beta.memory.set(f"bulk_{number:02}", "bumblebeeish bulk", "bulk")
    page = page_text(client.get("/memory/bulk/?site=beta"))
    (more,) = re.findall(r'<a href="([^"]+)" hx-get', page)
    more = html.unescape(more)
    assert _site_of(more) == "beta" and "cursor=" in more
    rest = page_text(client.get(more, headers={"HX-Request": "true", "HX-Target": "memory-more"}))
    assert "bulk_59" in rest and MARKERS["alpha"] not in rest
    # A cursor belongs to its site's list: switching starts the other site's list from the top.
    switch = urlsplit(_switch_links(page_text(client.get(more)))["alpha"])
    kept = set(parse_qs(urlsplit(more).query)) - {"cursor", "site"}
    assert switch.path == "/memory/bulk/" and set(parse_qs(switch.query)) == kept

    stranger = app.test_client()
    gate = stranger.get("/memory/bulk/?site=beta")
    assert gate.status_code == 302
    form = page_text(stranger.get(gate.headers["Location"]))
    (next_url,) = re.findall(r'name="next" value="([^"]*)"', form)
    fields = {
        "csrf_token": csrf_from(stranger.get("/login")),
        "username": ADMIN,
        "password": PASSWORD,
        "next": html.unescape(next_url),
    }
    assert stranger.post("/login", data=fields).headers["Location"] == "/memory/bulk/?site=beta"


def test_an_unknown_site_is_a_404_naming_the_sites(two_sites: tuple[Flask, FlaskClient]) -> None:
    _, client = two_sites
    response = client.get("/conversations/?site=gamma")
    assert response.status_code == 404
    body = page_text(response)
    assert "No site is called &#39;gamma&#39;. This dashboard shows: alpha, beta." in body
    assert MARKERS["alpha"] not in body and MARKERS["beta"] not in body
    assert client.get("/?site=alpha").status_code == 200  # the first site may be named too


def test_a_command_shown_on_another_site_acts_on_that_site(
    two_sites: tuple[Flask, FlaskClient], prefix: str
) -> None:
    app, client = two_sites
    body = page_text(client.get("/settings?site=beta"))
    commands = re.findall(r'<td data-label="Command"><code class="command">([^<]*)</code></td>', body)
    assert commands
    assert all(claw_words(command)[0]["CLAW_TABLE_PREFIX"] == f"{prefix}b_" for command in commands)
    assert "<td>CLAW_SITES (beta)</td>" in body
    assert f"alpha={prefix}a_,beta={prefix}b_" in body
    with app.app_context():
        conversation = state.sites_of(app)["beta"].conversations.list(limit=1).items[0].id
    environment, words = claw_words(next(c for c in commands if "--conversation" in c))
    words = [conversation if word == "CONVERSATION_ID" else word for word in words]
    beta_app = create_app(
        {
            "TESTING": True,
            "DATABASE_URL": app.extensions["clawmem.settings"].database_url,
            "TABLE_PREFIX": environment["CLAW_TABLE_PREFIX"],
        },
        instance_path=app.instance_path,
    )
    result = beta_app.test_cli_runner().invoke(args=["claw", *words])
    assert result.exit_code == 0, result.output
    assert f"would delete conversation {conversation}" in result.output
    alpha = page_text(client.get("/settings"))  # the commands' site is in no pair, so alpha needs it too
    assert re.search(rf"CLAW_TABLE_PREFIX={prefix}a_ \S+/flask --app \S+ claw forget", alpha)


def test_one_site_keeps_every_address_as_it_was(
    app: Flask, demo: None, signed_in: FlaskClient, prefix: str
) -> None:
    body = page_text(signed_in.get("/conversations/"))
    # The one site is named as an operator would call it, with its prefix beside it.
    assert re.search(rf"Site: <strong>default</strong>\s*<code[^>]*>{prefix}</code>", body)
    assert "switch to" not in body and "site=" not in body and 'name="site"' not in body
    settings = page_text(signed_in.get("/settings"))
    # The commands carry only what the app was configured with (here, its test prefix and database).
    commands = re.findall(r'<code class="command">([^<]*)</code>', settings)
    assert commands and all(claw_words(c)[0].get("CLAW_TABLE_PREFIX") == prefix for c in commands)
    assert signed_in.get("/?site=other").status_code == 404


@pytest.mark.parametrize(
    ("sites", "message"),
    [
        ("shop", "CLAW_SITES item 'shop' must be label=prefix, such as shop=wp_"),
        ("shop=wp_,blog", "CLAW_SITES item 'blog' must be label=prefix, such as shop=wp_"),
        (
            "=wp_",
            "CLAW_SITES item '=wp_': a label is 1-40 ASCII letters, digits, _ . or -, starting with "
            "a letter or digit",
        ),
        (
            "my shop=wp_",
            "CLAW_SITES item 'my shop=wp_': a label is 1-40 ASCII letters, digits, _ . or -, "
            "starting with a letter or digit",
        ),
        (
            "shop=wp-2",
            "CLAW_SITES item 'shop=wp-2': table prefix must be at most 20 ASCII letters, digits "
            "or underscores, got 'wp-2'",
        ),
        ("shop=wp_,shop=wp_2_", "CLAW_SITES names the site 'shop' twice"),
        ("shop=wp_,blog=wp_", "CLAW_SITES item 'blog=wp_': the prefix 'wp_' already has a label"),
    ],
)
def test_a_malformed_sites_setting_stops_the_start_in_one_line(
    sites: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as refused:
        create_app({"TESTING": True, "SITES": sites}, instance_path=str(tmp_path / "instance"))
    assert str(refused.value) == message
    environment = {"CLAW_SITES": sites, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    started = subprocess.run(
        [sys.executable, "-c", "import wsgi"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 1
    assert started.stderr.strip().splitlines() == [f"Error: {message}"]


def test_a_site_whose_tables_have_the_other_shape_stops_the_start(
    make_app: Callable[..., Flask], prefix: str, tmp_path: Path
) -> None:
    app = make_app()
    create_tables(engine_for(app.extensions["clawmem.settings"].database_url), f"{prefix}wp_", PHPCLAW_SCHEMA)
    refusal = f"^CLAW_SCHEMA is clawmem but the existing tables of prefix '{prefix}wp_'"
    with pytest.raises(ConfigError, match=refusal):
        make_app(SITES=f"main={prefix},wp={prefix}wp_", SCHEMA="clawmem")
    # Unset, each site's existing tables decide its shape.
    assert make_app(SITES=f"main={prefix},wp={prefix}wp_") is not None


def test_flask_claw_under_a_dashboard_of_several_sites_acts_on_the_table_prefix(
    two_sites: tuple[Flask, FlaskClient],
) -> None:
    app, _ = two_sites
    with app.app_context():
        beta = state.sites_of(app)["beta"].conversations.list(limit=1).items[0].id
    runner = app.test_cli_runner()
    result = runner.invoke(args=["claw", "forget", "--conversation", beta, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"nothing to delete: no conversation {beta}" in result.output
