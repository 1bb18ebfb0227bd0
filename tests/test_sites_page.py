"""The Sites page: the prefixes the database holds and which are configured, how each memory
driver keeps sites apart, and a live check, on every driver, that this site's stores see none of
another configured site's entries; the check itself finds stores that do share."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from clawmem.privacy.isolation import check_separation
from clawmem.settings import PHPCLAW_SCHEMA, Settings
from clawmem.sites.site import Site
from clawmem.sql.schema import create_tables, drop_tables
from dashboard import state
from tests.dashboard_helpers import page_text
from tests.test_dashboard_sites import MARKERS, sites_app, two_sites  # noqa: F401

pytest_plugins = ["tests.dashboard_fixtures"]

RULE = "a store opened for one site never reads, writes, sweeps or deletes another site's data, on any driver"


def _text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return " ".join(page_text(response).split())


def _checks(body: str) -> dict[str, list[str]]:
    """The check table's rows: the other site's label -> its cells as text."""
    section = body.split('id="check-heading"', 1)[1].split("</section>", 1)[0]
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>", 1)[1]):
        cells = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        rows[cells[0].split()[0]] = cells
    return rows


def _prefix_rows(body: str) -> dict[str, str]:
    section = body.split('id="prefixes-heading"', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr[^>]*><td data-label=\"Prefix\"><code>([^<]*)</code>(.*?)</tr>", section)
    return {prefix: re.sub(r"<[^>]+>", "", rest) for prefix, rest in rows}


def test_one_site_says_default_and_states_the_rule(
    app: Flask, demo: None, signed_in: FlaskClient, prefix: str
) -> None:
    body = _text(signed_in.get("/sites/"))
    assert "Site: <strong>default</strong>" in body
    assert RULE in body
    assert "Only one site is configured, so there is no other site to check against." in body
    assert "Set <code>CLAW_SITES</code>" in body
    rows = _prefix_rows(body)
    assert "yes, as default" in rows[prefix] and "(this page)" in rows[prefix]
    assert "clawmem" in rows[prefix]
    # Each memory driver's rule, the one in use marked.
    drivers = body.split('id="drivers-heading"', 1)[1]
    for name in ("sql", "redis", "file", "array"):
        assert f"<code>{name}</code>" in drivers
    assert '<code>sql</code> <span class="tag permanent">in use</span>' in drivers
    assert "{table prefix}phpclaw:" in drivers


def test_the_live_check_finds_every_other_site_apart_on_each_driver(
    sites_app: tuple[Flask, dict[str, set[str]]],
    prefix: str,
) -> None:
    app, strings = sites_app
    client = app.test_client()
    from tests.dashboard_helpers import sign_in

    assert sign_in(client).status_code == 302
    with app.app_context():
        beta = state.sites_of(app)["beta"]
        entries = sum(len(beta.driver.entries(ns, limit=100).items) for ns in beta.driver.namespaces())
        conversations = len(beta.conversations.list(limit=100).items)
        driver = beta.settings.memory_driver
    body = _text(client.get("/sites/"))
    assert "No: this site's stores saw none of the other sites' entries or conversations." in body
    assert "the first 25 keys of each of its first 20 namespaces and its 50 newest conversations" in body
    checks = _checks(body)
    assert set(checks) == {"beta"}
    assert checks["beta"][2:4] == [str(entries), str(conversations)]
    assert checks["beta"][4].startswith("apart")
    assert entries >= 5 and conversations == 2
    # Where the other site's memory is: its own table, key prefix or directory.
    place = checks["beta"][1]
    expected = {
        "sql": f"table {prefix}b_phpclaw_memory",
        "redis": f"Redis keys starting {prefix}b_phpclaw:",
        "file": f"site-{prefix}b_",
    }[driver]
    assert expected in place
    # The commands' own site has tables but is in no CLAW_SITES pair: found, not configured.
    rows = _prefix_rows(body)
    assert rows[f"{prefix}a_"].rstrip().endswith("yes, as alpha")
    assert "no" in rows[prefix].split("clawmem", 1)[1] and "the commands' site" in rows[prefix]
    # From beta, alpha is the other site.
    assert set(_checks(_text(client.get("/sites/?site=beta")))) == {"alpha"}


def test_prefixes_of_phpclaw_and_unconfigured_and_hostile_tables_are_listed_escaped(
    two_sites: tuple[Flask, FlaskClient],
    prefix: str,
) -> None:
    app, client = two_sites
    with app.app_context():
        engine = state.engine()
    create_tables(engine, f"{prefix}wp_", PHPCLAW_SCHEMA)
    hostile = "<img src=x onerror=alert(1)>"
    quoted = engine.dialect.identifier_preparer.quote(f"{hostile}phpclaw_memory")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {quoted} (id INTEGER)")
    try:
        body = _text(client.get("/sites/"))
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {quoted}")
        drop_tables(engine, f"{prefix}wp_")
    rows = _prefix_rows(body)
    assert "phpclaw" in rows[f"{prefix}wp_"] and rows[f"{prefix}wp_"].rstrip().endswith("no")
    assert hostile not in body and "&lt;img src=x onerror=alert(1)&gt;" in body
    assert "neither clawmem&#39;s nor phpClaw&#39;s shape" in body
    assert "(not all three)" in body


def test_a_configured_prefix_without_tables_says_how_to_make_them(
    make_app: Callable[..., Flask], prefix: str, clock: FakeClock
) -> None:
    from dashboard import accounts
    from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in

    app = make_app(SITES=f"shop={prefix},blog={prefix}blog_")
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, clock())
    client = app.test_client()
    assert sign_in(client).status_code == 302
    body = _text(client.get("/sites/"))
    rows = _prefix_rows(body)
    assert "none yet: run" in rows[f"{prefix}blog_"] and "init-db" in rows[f"{prefix}blog_"]
    assert _checks(body)["blog"][2:4] == ["0", "0"]
    assert "that site holds nothing yet, so nothing could be seen" in body


@pytest.mark.parametrize("driver", ["sql", "file", "array"])
def test_the_check_finds_stores_that_share_one_place(
    tmp_path: Any, clock: FakeClock, prefix: str, driver: str
) -> None:
    settings = Settings.from_mapping(
        {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "TABLE_PREFIX": prefix,
            "MEMORY_DRIVER": driver,
            "FILE_DIR": str(tmp_path / "files"),
        },
        tmp_path,
    )
    first, second = Site(settings, clock), Site(settings.replace(table_prefix=f"{prefix}2_"), clock)
    create_tables(first.engine, first.prefix)
    create_tables(second.engine, second.prefix)
    first.memory.set("policy", "returns within 30 days", "default")
    first.memory.set("<b>x</b>", {"a": 1}, "shop")
    clock.advance(1)
    second.memory.set("policy", "returns within 30 days", "default")  # the same key, its own row
    apart = check_separation(second, first)
    assert apart.apart and apart.entries_checked == 2
    # Without write times, the same key and value in two sites is alike, not seen.
    assert apart.alike_entries == ([("default", "policy")] if driver != "sql" else [])
    assert not apart.seen_entries
    if driver == "array":
        return  # each array store is its own, even on one prefix: nothing to share
    # The same place read twice: a site that shares the other's store is caught.
    shared = check_separation(Site(settings, clock), first)
    assert shared.shared_place and not shared.apart
    found = sorted(shared.seen_entries + shared.alike_entries)
    assert found == [("default", "policy"), ("shop", "<b>x</b>")]
    assert bool(shared.seen_entries) == (driver == "sql")
