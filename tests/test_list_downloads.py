"""CSV and JSON downloads of the filtered conversation and key lists: the rows the list shows,
in its order, streamed and capped at a stated limit, and safe to open in a spreadsheet."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from datetime import timedelta

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.sql.schema import tables
from clawmem.turn.conversations import Message
from dashboard import state
from dashboard.views.downloads import DOWNLOAD_LIMIT, spreadsheet_safe
from tests.dashboard_helpers import page_text

pytest_plugins = ["tests.dashboard_fixtures"]

FORMULAS = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tpadded", "\rreturned"]


def _csv(client: FlaskClient, url: str) -> list[dict[str, str]]:
    response = client.get(url)
    assert response.status_code == 200, page_text(response)
    assert response.mimetype == "text/csv" and "attachment" in response.headers["Content-Disposition"]
    assert response.is_streamed
    return list(csv.DictReader(io.StringIO(page_text(response), newline="")))


def _json(client: FlaskClient, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200, page_text(response)
    assert response.mimetype == "application/json" and response.is_streamed
    return json.loads(page_text(response))


def _listed_ids(client: FlaskClient, url: str) -> list[str]:
    return re.findall(r'href="/conversations/([0-9A-Z]{26})"', page_text(client.get(url)))


def test_the_conversation_download_holds_the_filtered_list_in_its_order(
    app: Flask, demo: None, signed_in: FlaskClient
) -> None:
    body = page_text(signed_in.get("/conversations/?user_id=cust-1001&sort=tokens"))  # fewest first
    links = dict(re.findall(r'<a href="([^"]*export\.(csv|json)[^"]*)" download>', body))
    assert set(links.values()) == {"csv", "json"}
    assert f"at most {DOWNLOAD_LIMIT} rows" in body
    csv_url = next(url for url, kind in links.items() if kind == "csv").replace("&amp;", "&")
    assert "user_id=cust-1001" in csv_url and "sort=tokens" in csv_url
    rows = _csv(signed_in, csv_url)
    with app.app_context():
        schema = tables(state.settings().table_prefix)
        with state.engine().connect() as conn:
            stored = conn.execute(
                sa.select(schema.conversations.c.id, schema.conversations.c.total_tokens).where(
                    schema.conversations.c.user_id == "cust-1001"
                )
            ).all()
    assert sorted(row["id"] for row in rows) == sorted(row.id for row in stored)
    assert [row["id"] for row in rows][:50] == _listed_ids(signed_in, csv_url.replace("export.csv", ""))
    tokens = {row.id: row.total_tokens for row in stored}
    shown = {row["id"]: row["total_tokens"] for row in rows}
    assert shown == {key: "" if value is None else str(value) for key, value in tokens.items()}
    document = _json(signed_in, csv_url.replace("export.csv", "export.json"))
    assert [row["id"] for row in document["rows"]] == [row["id"] for row in rows]
    assert document["truncated"] is False and document["limit"] == DOWNLOAD_LIMIT
    assert document["filters"] == {"user_id": "cust-1001"} and document["sort"] == "tokens"
    reported = [tokens[row["id"]] for row in document["rows"] if tokens[row["id"]] is not None]
    assert reported == sorted(reported) and len(set(reported)) > 1, "fewest first"
    turned = _json(signed_in, "/conversations/export.json?user_id=cust-1001&sort=-tokens")
    assert turned["sort"] == "-tokens"
    assert [tokens[row["id"]] for row in turned["rows"] if tokens[row["id"]] is not None] == reported[::-1]
    # Tokens not reported are null, never 0.
    assert {row["total_tokens"] for row in document["rows"] if tokens[row["id"]] is None} <= {None}


def test_cells_that_a_spreadsheet_would_run_get_a_quote(
    app: Flask, signed_in: FlaskClient, clock: FakeClock
) -> None:
    with app.app_context():
        log = state.conversations()
        for title in [*FORMULAS, 'plain, with "quotes"\nand a line']:
            log.append(new_id(), [Message("user", "hi")], title=title, user_id="=cmd|' /C calc'!A0")
            clock.advance(1)
    rows = _csv(signed_in, "/conversations/export.csv")
    titles = {row["title"] for row in rows}
    assert titles == {"'" + title for title in FORMULAS} | {'plain, with "quotes"\nand a line'}
    assert {row["user_id"] for row in rows} == {"'=cmd|' /C calc'!A0"}
    # JSON is data, not a spreadsheet: kept exactly.
    assert {row["title"] for row in _json(signed_in, "/conversations/export.json")["rows"]} >= set(FORMULAS)
    assert spreadsheet_safe(-5) == -5 and spreadsheet_safe("") == "" and spreadsheet_safe("a=b") == "a=b"


def test_a_download_stops_at_its_stated_limit(app: Flask, signed_in: FlaskClient, clock: FakeClock) -> None:
    start = utc_datetime(clock)
    rows = [
        {
            "id": new_id(),
            "namespace": "web",
            "user_id": "",
            "title": f"t{number}",
            "created_at": start + timedelta(seconds=number),
            "updated_at": start + timedelta(seconds=number),
        }
        for number in range(DOWNLOAD_LIMIT + 3)
    ]
    with app.app_context(), state.engine().begin() as conn:
        conn.execute(sa.insert(tables(state.settings().table_prefix).conversations), rows)
    listed = _csv(signed_in, "/conversations/export.csv?sort=-created")
    assert len(listed) == DOWNLOAD_LIMIT
    assert [row["title"] for row in listed[:2]] == [f"t{DOWNLOAD_LIMIT + 2}", f"t{DOWNLOAD_LIMIT + 1}"]
    document = _json(signed_in, "/conversations/export.json?sort=-created")
    assert len(document["rows"]) == DOWNLOAD_LIMIT and document["truncated"] is True
    exact = _json(signed_in, f"/conversations/export.json?sort=-created&until={start.date().isoformat()}")
    assert exact["truncated"] is False


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        ("/conversations/export.csv?since=yesterday", 400, "From: 'yesterday' is not a date"),
        ("/conversations/export.json?sort=size", 400, "sort"),
        ("/conversations/export.json?order=up", 400, "order is not read"),
        ("/conversations/export.json?sort=--tokens", 400, "sort must be one of"),
        ("/conversations/export.xlsx", 404, ""),
        ("/memory/default/export.csv?state=soon", 400, "state"),
        ("/memory/default/export.csv?sort=size", 400, "sort"),
        ("/memory/default/export.csv?sort=-size", 400, "sort must be one of key, -key, updated, -updated"),
        ("/memory/..%2fx/export.csv", 404, ""),
    ],
)
def test_a_bad_download_request_says_what_is_wrong(
    signed_in: FlaskClient, url: str, status: int, message: str
) -> None:
    response = signed_in.get(url)
    assert response.status_code in (status, 400 if status == 404 else status), url
    assert message in html.unescape(page_text(response))


def test_the_key_download_holds_the_filtered_namespace(
    app: Flask, demo: None, signed_in: FlaskClient, clock: FakeClock
) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("=formula", "@risky", "default")
        memory.set("soon-gone", "x", "default", ttl=60)
        driver = state.driver()
        everything = driver.entries("default", limit=500).items
    clock.advance(120)
    body = page_text(signed_in.get("/memory/default/?state=expired&sort=updated"))
    assert 'href="/memory/default/export.csv?state=expired&amp;sort=updated"' in body
    expired = _csv(signed_in, "/memory/default/export.csv?state=expired&sort=updated")
    assert "soon-gone" in {row["key"] for row in expired} and {row["state"] for row in expired} == {"expired"}
    rows = _csv(signed_in, "/memory/default/export.csv")
    assert [row["key"].lstrip("'") for row in rows] == [row.key for row in everything]
    backwards = _csv(signed_in, "/memory/default/export.csv?sort=-key")
    assert [row["key"] for row in backwards] == [row["key"] for row in rows][::-1]
    assert _json(signed_in, "/memory/default/export.json?sort=-key")["sort"] == "-key"
    risky = next(row for row in rows if row["key"] == "'=formula")
    assert risky["value"] == '"@risky"'  # the value as JSON text: it starts with a quote already
    document = _json(signed_in, "/memory/default/export.json?q=formula")
    assert [(row["key"], row["value"]) for row in document["rows"]] == [("=formula", '"@risky"')]
    assert document["namespace"] == "default" and document["truncated"] is False


def _search_rows(body: str) -> list[tuple[str, str]]:
    section = body.split('id="search-heading"', 1)[1].split("</section>", 1)[0]
    cells = r"<tr[^>]*>\s*<td><code>([^<]*)</code></td>\s*<td data-label=\"Key\"><a [^>]*><code>(.*?)</code>"
    return [
        (html.unescape(namespace), html.unescape(re.sub(r"<[^>]+>", "", key)))
        for namespace, key in re.findall(cells, section)
    ]


def test_one_search_finds_entries_in_every_namespace(app: Flask, demo: None, signed_in: FlaskClient) -> None:
    with app.app_context():
        memory = state.memory()
        memory.set("note", "the parcel <script>alert(1)</script> went to Leeds", "user:cust-77")
        memory.set("parcel-rule", "parcels over 30 kg ship by freight", "default")
        driver = state.driver()
        expected = sorted(
            (row.namespace, row.key)
            for namespace in driver.namespaces()
            for row in driver.stored_records(namespace)
            if "parcel" in row.key or "parcel" in json.dumps(row.value, ensure_ascii=False)
        )
    body = page_text(signed_in.get("/memory/?q=parcel"))
    found = _search_rows(body)
    assert found == expected and len({namespace for namespace, _ in found}) >= 2
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;" in body
    assert 'name="q" value="parcel"' in body
    empty = page_text(signed_in.get("/memory/?q=" + "zz-not-anywhere"))
    assert "No entry in any namespace holds this text." in empty


def test_the_search_across_namespaces_lists_at_most_its_limit(app: Flask, signed_in: FlaskClient) -> None:
    from dashboard.views.memory import SEARCH_LIMIT

    with app.app_context():
        memory = state.memory()
        for number in range(SEARCH_LIMIT + 5):
            memory.set(f"k{number:04d}", "needle", f"ns-{number % 3}")
    body = " ".join(page_text(signed_in.get("/memory/?q=needle")).split())
    assert len(_search_rows(body)) == SEARCH_LIMIT
    assert f"more entries match (at most {SEARCH_LIMIT} are listed, by namespace then key)" in body
