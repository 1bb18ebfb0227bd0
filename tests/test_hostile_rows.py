"""Rows another program wrote with plain SQL: every page, fragment and command still answers,
shows each such row marked unreadable, and never fails, shows a traceback or unescaped text.

The deterministic tests are one per finding of the review; the Hypothesis suite at the end
writes arbitrary rows on SQLite, MariaDB and PostgreSQL and then walks every page.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from clawmem.rules import MAX_NESTING
from clawmem.sql.engine import create_engine
from dashboard import accounts, state
from tests.conftest import sql_url
from tests.dashboard_helpers import ADMIN, PASSWORD
from tests.hostile import (
    DEEP,
    HOSTILE_VALUES,
    MARK,
    STAMP,
    TRACEBACK,
    assert_answered,
    conversation_row,
    memory_row,
    message_row,
    signed_in_client,
    wipe,
    write_rows,
)

pytest_plugins = ["tests.dashboard_fixtures"]

BACKENDS = ["sqlite", "mysql", "postgres"]
on_every_backend = pytest.mark.parametrize("dashboard_backend", BACKENDS, indirect=True)
# What each database takes in a DATETIME column that is no readable time.
ABSURD_TIMES = {
    "sqlite": ["soon", 0, "2024-13-45 99:99:99"],
    "mysql": ["0000-00-00 00:00:00", "2024-00-00 00:00:00"],
    "postgres": ["infinity", "-infinity", "294276-01-01 00:00:00", "0044-03-15 00:00:00 BC"],
}


def _claw(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["claw", *args])


# -- one test per finding -------------------------------------------------------------------------


@on_every_backend
def test_a_conversation_whose_metadata_is_not_json_is_listed_and_marked(
    app: Flask, signed_in: FlaskClient, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    bad = conversation_row(1, metadata="{nope", title="Broken metadata")
    write_rows(
        dashboard_backend,
        tmp_path,
        prefix,
        conversations=[bad, conversation_row(2)],
        messages=[message_row(1, bad["id"])],
    )
    listing = assert_answered(signed_in.get("/conversations/"), "list")
    assert "Broken metadata" in listing and "Hostile 2" in listing
    assert 'title="metadata is not JSON">unreadable' in listing
    detail = assert_answered(signed_in.get(f"/conversations/{bad['id']}"), "detail")
    assert "{nope" in detail  # shown as stored


@on_every_backend
def test_a_time_no_datetime_holds_is_marked_and_the_overview_still_answers(
    app: Flask, signed_in: FlaskClient, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    rows = [
        conversation_row(number, created_at=moment, updated_at=moment, title=f"Absurd {number}")
        for number, moment in enumerate(ABSURD_TIMES[dashboard_backend])
    ]
    good = conversation_row(99, created_at="2023-02-03 04:05:06", updated_at="2023-02-03 04:05:06")
    messages = [
        message_row(number, row["id"], created_at=row["created_at"]) for number, row in enumerate(rows)
    ]
    write_rows(dashboard_backend, tmp_path, prefix, conversations=[*rows, good], messages=messages)
    overview = assert_answered(signed_in.get("/"), "overview")
    assert "Oldest conversation: 2023-02-03 04:05:06 UTC" in overview  # the oldest readable one
    listing = assert_answered(signed_in.get("/conversations/"), "list")
    assert all(f"Absurd {number}" in listing for number in range(len(rows)))
    assert "unreadable time" in listing
    for row in rows:
        detail = assert_answered(signed_in.get(f"/conversations/{row['id']}"), "detail")
        assert "message" in detail
    assert assert_answered(signed_in.get("/settings"), "settings")


@pytest.mark.parametrize("dashboard_backend", ["sqlite"], indirect=True)
def test_invalid_utf8_in_a_title_reads_as_replacement_characters(
    app: Flask, signed_in: FlaskClient, tmp_path: Any, prefix: str
) -> None:
    engine = create_engine(sql_url("sqlite", tmp_path))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {prefix}phpclaw_conversations "
            "(id, namespace, user_id, title, metadata, created_at, updated_at) VALUES "
            f"('c1', 'default', 'u1', CAST(X'636166c3206f6b' AS TEXT), NULL, '{STAMP}', '{STAMP}')"
        )
    listing = assert_answered(signed_in.get("/conversations/"), "list")
    assert "caf\ufffd ok" in listing


def test_a_storage_failure_page_never_quotes_a_rows_text(
    app: Flask, signed_in: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    row_text = "Bob Lindqvist, 14 Acacia Road"

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.DataError("SELECT ...", {}, ValueError(f"could not decode {row_text!r}"))

    with app.app_context():
        monkeypatch.setattr(type(state.conversations()), "list", failing)
    response = signed_in.get("/conversations/")
    assert response.status_code == 503
    assert "Bob" not in response.get_data(as_text=True) and "DataError" in response.get_data(as_text=True)


@on_every_backend
def test_a_value_that_is_not_json_is_shown_as_stored_and_never_recalled(
    app: Flask, signed_in: FlaskClient, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    write_rows(
        dashboard_backend,
        tmp_path,
        prefix,
        memory=[
            memory_row(1, lookup_key="order_note", value="order shipped {not json"),
            memory_row(2, lookup_key="order_policy", value='"orders ship in two days"'),
        ],
    )
    namespace = assert_answered(signed_in.get("/memory/default/"), "namespace")
    assert "order shipped {not json" in namespace
    assert 'title="value cannot be decoded">unreadable' in namespace
    entry = assert_answered(signed_in.get("/memory/default/entry?key=order_note"), "entry")
    assert "value cannot be decoded" in entry and "order shipped {not json" in entry
    assert_answered(signed_in.get("/cold"), "cold")
    preview = assert_answered(signed_in.get("/preview?message=when+do+orders+ship"), "preview")
    assert "- order_policy: orders ship in two days" in preview
    assert "- order_note" not in preview  # a value recall cannot read is never injected


@on_every_backend
def test_an_expiry_past_the_calendar_is_said_not_a_failure(
    app: Flask, signed_in: FlaskClient, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    rows = [memory_row(1, lookup_key="far", expires_at=99999999999999999)]
    if dashboard_backend == "sqlite":  # only SQLite keeps text in a BIGINT column
        rows.append(memory_row(2, lookup_key="soon", expires_at="soon"))
    write_rows(dashboard_backend, tmp_path, prefix, memory=rows)
    namespace = assert_answered(signed_in.get("/memory/default/"), "namespace")
    assert 'title="expires_at is beyond the calendar">unreadable' in namespace
    entry = assert_answered(signed_in.get("/memory/default/entry?key=far"), "entry")
    assert "99999999999999999 (beyond the calendar)" in entry
    if dashboard_backend == "sqlite":
        entry = assert_answered(signed_in.get("/memory/default/entry?key=soon"), "entry")
        assert "expires_at is not a whole number of seconds" in entry
    assert_answered(signed_in.get("/cold"), "cold")
    assert_answered(signed_in.get("/"), "overview")


@on_every_backend
def test_a_value_nested_past_the_limit_is_refused_at_set_and_shown_raw_when_written_raw(
    app: Flask, signed_in: FlaskClient, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    deep: list[Any] = []
    for _ in range(990):
        deep = [deep]
    with app.app_context(), pytest.raises(ValueError, match=f"more than {MAX_NESTING} levels"):
        state.memory().set("d990", deep, "deep")
    write_rows(
        dashboard_backend,
        tmp_path,
        prefix,
        memory=[
            memory_row(1, namespace="deep", lookup_key="d990", value=DEEP),
            memory_row(2, namespace="deep", lookup_key="d65", value="[" * 66 + "]" * 66),
        ],
        conversations=[conversation_row(1, metadata=DEEP)],
        messages=[message_row(1, conversation_row(1)["id"], role="tool", tool_input=DEEP)],
    )
    for url in [
        "/memory/deep/",
        "/memory/deep/entry?key=d990",
        "/memory/deep/entry?key=d65",
        "/cold?namespace=deep",
        "/preview?namespace=deep&message=d990+d65",
        "/conversations/",
        f"/conversations/{conversation_row(1)['id']}",
    ]:
        assert_answered(signed_in.get(url), url)
    entry = signed_in.get("/memory/deep/entry?key=d65").get_data(as_text=True)
    assert f"value is nested more than {MAX_NESTING} levels deep" in entry


@on_every_backend
def test_export_of_a_subject_with_unreadable_rows_completes_and_lists_them(
    app: Flask, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    moment = ABSURD_TIMES[dashboard_backend][0]
    conversation = conversation_row(1, user_id="raw-user", metadata="{nope")
    write_rows(
        dashboard_backend,
        tmp_path,
        prefix,
        conversations=[conversation],
        messages=[
            message_row(1, conversation["id"], tool_input="not json", created_at=moment),
            message_row(2, conversation["id"]),
        ],
        memory=[
            memory_row(1, namespace="user:raw-user", lookup_key="note", value="{broken"),
            memory_row(2, namespace="user:raw-user", lookup_key="deep", value=DEEP),
            memory_row(3, lookup_key="plain", value='"ask raw-user about it"'),
        ],
    )
    result = _claw(app, "export", "--user-id", "raw-user")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [c["id"] for c in document["conversations"]] == [conversation["id"]]
    assert len(document["conversations"][0]["messages"]) == 2
    assert {(e["namespace"], e["key"]) for e in document["memory"]} == {
        ("user:raw-user", "note"),
        ("user:raw-user", "deep"),
    }
    assert [(e["namespace"], e["key"]) for e in document["mentions"]] == [("default", "plain")]
    listed = {
        (row["table"], row.get("id") or row.get("key")): row["reason"] for row in document["unreadable"]
    }
    assert listed == {
        ("conversations", conversation["id"]): "metadata is not JSON",
        ("messages", message_row(1, "")["id"]): "tool_input is not JSON; created_at is not a readable time",
        ("memory", "note"): "value cannot be decoded",
        ("memory", "deep"): "value cannot be decoded",
    }
    assert document["memory"][0]["value"] in ("{broken", DEEP)  # as stored
    for args in (["erase", "--user-id", "raw-user", "--dry-run"], ["stats"], ["sweep", "--dry-run"]):
        result = _claw(app, *args)
        assert result.exit_code == 0 and TRACEBACK not in result.output, (args, result.output)


# What another program might leave in a checkpoint's tool_input or a recall record's content.
CHECKPOINT_RECORDS = [
    '{"usage": {"prompt_tokens": "x", "completion_tokens": [1]}, "covers": {"from": 5, "to": [1]}}',
    '{"usage": [], "covers": "all", "provider_calls": "many"}',
]
RECALL_RECORDS = [
    '[{"key": "k", "namespace": "bad ns", "bytes": "x", "score": []}]',
    '[{"key": 5}, "x", {"key": "order_note", "namespace": "default"}]',
    '{"key": "k"}',
]


@pytest.mark.parametrize("dashboard_backend", ["sqlite"], indirect=True)
def test_checkpoint_and_recall_records_another_program_wrote_leave_the_conversation_readable(
    app: Flask, signed_in: FlaskClient, tmp_path: Any, prefix: str
) -> None:
    conversation = conversation_row(1)
    rows = [
        message_row(1, conversation["id"], role="summary", tool_input=CHECKPOINT_RECORDS[0]),
        message_row(2, conversation["id"], role="summary", tool_input=CHECKPOINT_RECORDS[1]),
        *(
            message_row(3 + n, conversation["id"], role="recall", content=record, created_at="soon")
            for n, record in enumerate(RECALL_RECORDS)
        ),
        message_row(9, conversation["id"], role="user", content="hello"),
    ]
    write_rows("sqlite", tmp_path, prefix, conversations=[conversation], messages=rows)
    assert_answered(signed_in.get(f"/conversations/{conversation['id']}"), "detail")
    turn = f"/conversations/{conversation['id']}/turns/{message_row(9, '')['id']}"
    assert_answered(signed_in.get(turn), turn)


# -- any row at all ---------------------------------------------------------------------------------

# Column sizes of the strictest database (MariaDB refuses nothing without strict mode, but cuts).
_NAMES = st.text(min_size=1, max_size=12)
_NUMBERS = st.integers() | st.floats(allow_nan=False, allow_infinity=False)
_SCALAR = st.none() | st.booleans() | _NUMBERS | st.text()
_JSON = (
    _SCALAR
    | st.lists(_SCALAR, max_size=3)
    | st.dictionaries(st.text(max_size=5), _SCALAR | st.lists(_SCALAR, max_size=2), max_size=3)
)


def _text(backend: str, max_size: int = 40) -> st.SearchStrategy[Any]:
    """Any text the database keeps in a text column (no NUL on PostgreSQL), sometimes with markup;
    on SQLite also bytes and numbers, which it keeps as they come."""
    characters = st.characters(codec="utf-8", blacklist_characters="\x00" if backend == "postgres" else "")
    text = st.text(characters, max_size=max_size)
    text = text | text.map(lambda t: t[: max_size - len(MARK)] + MARK)
    if backend == "sqlite":
        return text | st.binary(max_size=12) | st.integers(-(2**40), 2**40)
    return text


def _json_column(backend: str) -> st.SearchStrategy[Any]:
    """What another program may leave in a JSON column: JSON, anything else, deep nesting."""
    valid = _JSON.map(lambda value: json.dumps(value, ensure_ascii=False))
    special = st.sampled_from(["null", *HOSTILE_VALUES.values(), *CHECKPOINT_RECORDS, *RECALL_RECORDS])
    return st.none() | valid | special | _text(backend, 30)


def _moment(backend: str) -> st.SearchStrategy[Any]:
    readable = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1))
    readable_text = readable.map(lambda moment: moment.strftime("%Y-%m-%d %H:%M:%S.%f"))
    return readable_text | st.sampled_from(ABSURD_TIMES[backend])


def _expiry(backend: str) -> st.SearchStrategy[Any]:
    numbers = st.none() | st.integers(-(2**62), 2**62) | st.sampled_from([99999999999999999, 1_700_000_100])
    return numbers | st.sampled_from(["soon", 1.5, b"\x01"]) if backend == "sqlite" else numbers


@st.composite
def hostile_rows(draw: st.DrawFn, backend: str) -> dict[str, list[dict[str, Any]]]:
    ids = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=26).filter(
        lambda text: text == text.strip()
    )
    conversation_ids = draw(st.lists(ids, min_size=1, max_size=4, unique=True))
    text = _text(backend)
    conversations = [
        {
            "id": cid,
            "namespace": draw(_text(backend, 12) if backend != "sqlite" else _NAMES),
            "user_id": draw(st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=12)),
            "title": draw(st.none() | text),
            "metadata": draw(_json_column(backend)),
            "created_at": draw(_moment(backend)),
            "updated_at": draw(_moment(backend)),
        }
        for cid in conversation_ids
    ]
    messages = [
        {
            "id": f"m{number:025d}",
            "conversation_id": draw(st.sampled_from(conversation_ids)),
            "role": draw(
                st.sampled_from(["user", "assistant", "tool", "summary", "recall", "system"])
                | _text(backend, 20)
            ),
            "content": draw(st.none() | text | _json_column(backend)),
            "tool_name": draw(st.none() | _text(backend, 20)),
            "tool_input": draw(_json_column(backend)),
            "created_at": draw(_moment(backend)),
        }
        for number in range(draw(st.integers(0, 6)))
    ]
    names = st.sampled_from(["default", "user:raw-user", "deep"]) | st.text(
        st.characters(codec="utf-8", blacklist_characters="\x00"), min_size=1, max_size=12
    )
    keys = st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), min_size=1, max_size=20)
    pairs = draw(st.lists(st.tuples(names, keys), max_size=6, unique=True))
    memory = [
        {
            "id": f"k{number:025d}",
            "namespace": namespace,
            "lookup_key": key,
            "value": draw(_json_column(backend).filter(lambda value: value is not None)),
            "metadata": draw(_json_column(backend)),
            "expires_at": draw(_expiry(backend)),
            "created_at": draw(_moment(backend)),
            "updated_at": draw(_moment(backend)),
        }
        for number, (namespace, key) in enumerate(pairs)
    ]
    return {"conversations": conversations, "messages": messages, "memory": memory}


FRAGMENTS = [
    ("/conversations/", "conversation-results"),
    ("/memory/default/", "memory-results"),
    ("/preview?message=raw-user+value+order", "preview-result"),
]


def _walk(app: Flask, client: FlaskClient, rows: dict[str, list[dict[str, Any]]]) -> None:
    """Request every page and fragment for ``rows``; check each answer and that every
    conversation and every entry of a valid namespace is shown."""
    listing = assert_answered(client.get("/conversations/"), "list")
    assert len(re.findall(r'<td><a href="/conversations/[^"?]', listing)) == len(rows["conversations"])
    for url in [
        "/",
        "/memory/",
        "/cold",
        "/settings",
        "/preview?message=raw-user+value+order",
        f"/conversations/?q={MARK}",
        "/conversations/?user_id=raw-user",
    ]:
        assert_answered(client.get(url), url)
    for url, target in FRAGMENTS:
        assert_answered(client.get(url, headers={"HX-Request": "true", "HX-Target": target}), url)
    # An id that is no path segment (a slash in it) answers 404, or 308 to a merged path.
    for conversation in rows["conversations"]:
        url = f"/conversations/{quote(conversation['id'], safe='')}"
        assert_answered(client.get(url), url, allowed=(200, 308, 404))
    for message in rows["messages"]:
        url = f"/conversations/{quote(message['conversation_id'], safe='')}/turns/{message['id']}"
        assert_answered(client.get(url), url, allowed=(200, 308, 404))  # 404 unless a user message
    with app.app_context():
        from clawmem.rules import validate_namespace

        valid = set()
        for row in rows["memory"]:
            with contextlib.suppress(ValueError):
                valid.add(validate_namespace(row["namespace"]))
    for namespace in sorted(valid):
        shown = [row for row in rows["memory"] if row["namespace"] == namespace]
        page = assert_answered(client.get(f"/memory/{namespace}/"), namespace)
        assert page.count('<tr class="state-') == len(shown), namespace
        for row in shown:
            url = f"/memory/{namespace}/entry"
            assert_answered(client.get(url, query_string={"key": row["lookup_key"]}), url, allowed=(200, 400))
        assert_answered(client.get("/cold", query_string={"namespace": namespace}), "cold")


def _commands(app: Flask, rows: dict[str, list[dict[str, Any]]]) -> None:
    users = [c["user_id"] for c in rows["conversations"] if c["user_id"].strip()] or ["raw-user"]
    runner = app.test_cli_runner()
    export = runner.invoke(args=["claw", "export", "--user-id", users[0]])
    assert export.exit_code == 0 and TRACEBACK not in export.output, export.output
    document = json.loads(export.stdout)
    listed = {row.get("id") for row in document["unreadable"]}
    for conversation in document["conversations"]:
        assert "unreadable" not in conversation or conversation["id"] in listed
        assert all("unreadable" not in m or m["id"] in listed for m in conversation["messages"])
    for args in (["erase", "--user-id", users[0], "--dry-run"], ["stats"], ["sweep", "--dry-run"]):
        result = runner.invoke(args=["claw", *args])
        assert result.exit_code == 0 and TRACEBACK not in result.output, (args, result.output)


EXAMPLES = {"sqlite": 30, "mysql": 12, "postgres": 12}


@pytest.mark.slow  # a state machine on every backend: in make test, not make test-fast
@on_every_backend
def test_any_rows_leave_every_page_and_command_answering(
    make_app: Any, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    with make_app().app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)

    # No shrinking: one page walk per example is slow, and the failing rows are printed anyway.
    @settings(
        max_examples=EXAMPLES[dashboard_backend],
        deadline=None,
        derandomize=True,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
    @given(rows=hostile_rows(dashboard_backend))
    def check(rows: dict[str, list[dict[str, Any]]]) -> None:
        wipe(dashboard_backend, tmp_path, prefix)
        write_rows(dashboard_backend, tmp_path, prefix, **rows)
        app = make_app()  # a fresh app: nothing cached from the last example
        _walk(app, signed_in_client(app), rows)
        _commands(app, rows)

    check()


RULE_BREAKING_NAMESPACES = ["..", "%2e%2e", "a/b", "a b", "ns\x1b[2J"]


@on_every_backend
def test_every_listed_namespace_opens_read_only_under_an_encoded_name(
    app: Flask, signed_in: FlaskClient, dashboard_backend: str, tmp_path: Any, prefix: str
) -> None:
    write_rows(
        dashboard_backend,
        tmp_path,
        prefix,
        memory=[
            memory_row(number, namespace=namespace, lookup_key="k", value='"stored by another program"')
            for number, namespace in enumerate(RULE_BREAKING_NAMESPACES)
        ],
    )
    index = signed_in.get("/memory/").get_data(as_text=True)
    links = re.findall(r'href="(/memory/~/[^"/]+/)"', index)
    assert len(links) == len(RULE_BREAKING_NAMESPACES), index
    for link in links:
        page = signed_in.get(link)
        assert page.status_code == 200, link
        text = page.get_data(as_text=True)
        assert "stored by another program" in text and "breaks the naming rule" in text
    assert signed_in.get("/memory/~/bm90LXRoZXJl/").status_code == 404  # "not-there"
    assert signed_in.get("/memory/~/%%%/").status_code == 404
