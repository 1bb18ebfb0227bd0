"""Values another program wrote into Redis or into a file namespace, the same set the SQL tables
take (:data:`tests.hostile.HOSTILE_VALUES`): recall skips each it cannot read with a warning
naming the key (never the value), pages mark it unreadable, and no turn, page, export or erase
fails on it. The Redis entries and the namespace files are written as another program would:
raw commands and hand-made JSON, no clawmem code.

A namespace file that is no JSON object at all makes its namespace unreadable: every read of it
names the file, and nothing writes over it.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from clawmem.clock import FakeClock
from clawmem.codecs import decode_json_value
from clawmem.memory.file import FileMemory
from clawmem.memory.redis import RedisMemory
from clawmem.providers.echo import EchoProvider
from clawmem.settings import Settings
from clawmem.sql.engine import create_engine
from clawmem.sql.lenient import read_value
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.turn.pipeline import Claw
from dashboard import accounts, state
from tests.conftest import backend_url, sql_url
from tests.dashboard_helpers import ADMIN, PASSWORD
from tests.hostile import (
    HOSTILE_VALUES,
    MARK,
    TRACEBACK,
    assert_answered,
    conversation_row,
    memory_row,
    message_row,
    signed_in_client,
    write_rows,
)

pytest_plugins = ["tests.dashboard_fixtures"]

DRIVERS = ["sql", "redis", "file"]
GOOD = {"good": '"abc good words"'}
# What the SQL tables make of each value: the verdict every driver must give too.
UNREADABLE = {name for name, text in HOSTILE_VALUES.items() if read_value(decode_json_value, text)[1]}
# A namespace file is JSON written by another program: a value that is no JSON at all (or nested
# past what a parser takes) makes the whole file unreadable, tested below; the rest are entries.
NOT_IN_A_FILE = {"deep", "empty", "not_json", "marked_text"}
# Entries of a namespace file, or Redis entries, that break the layout rather than the value.
FILE_ENTRIES = {
    "number": "1",
    "no_value": '{"expires_at": null}',
    "soon": '{"value": 1, "expires_at": "soon"}',
    "true_expiry": '{"value": 1, "expires_at": true}',
    "sealed_number": '{"value": null, "sealed": 5, "expires_at": null}',
}
REDIS_ENTRIES = {
    "bare": b"order shipped",
    "object": b'{"value": 1}',
    "three": b"[1, 2, 3]",
    "soon": b'["soon", 1]',
    "sealed_number": b"[null, null, 5]",
    "not_utf8": b'[null, "\xff\xfe"]',
}


def values_for(driver: str) -> dict[str, str]:
    """Return the hostile values (name -> stored text) ``driver`` can hold as values."""
    if driver == "file":
        return {name: text for name, text in HOSTILE_VALUES.items() if name not in NOT_IN_A_FILE}
    return dict(HOSTILE_VALUES)


def layout_breakers(driver: str) -> set[str]:
    """Return the names of the entries that break ``driver``'s layout (all unreadable)."""
    return set({"file": FILE_ENTRIES, "redis": REDIS_ENTRIES}.get(driver, {}))


def plant(
    memory: Any, namespace: str, values: dict[str, str], tmp_path: Path, prefix: str, layout: bool = True
) -> None:
    """Write ``values`` (key -> value text) into ``namespace`` as another program would, and
    with ``layout`` the driver's layout breakers too."""
    if isinstance(memory, RedisMemory):
        client = memory.client
        stored = {key: f"[null,{text}]".encode() for key, text in values.items()}
        if layout:
            stored.update(REDIS_ENTRIES)
        for key, raw in stored.items():
            client.set(memory.entry_key(key, namespace), raw)
            client.zadd(memory.index_key(namespace), {key: math.inf})
            client.xadd(memory.log_key(namespace), {"k": key})
        client.sadd(memory.namespaces_key, namespace)
    elif isinstance(memory, FileMemory):
        entries = {key: f'{{"value": {text}, "expires_at": null}}' for key, text in values.items()}
        if layout:
            entries.update(FILE_ENTRIES)
        memory.directory.mkdir(parents=True, exist_ok=True)
        body = ",\n".join(f"{json.dumps(key)}: {entry}" for key, entry in entries.items())
        memory.path_for(namespace).write_text("{\n" + body + "\n}\n", encoding="utf-8")
    else:
        rows = [
            memory_row(number, id=uuid.uuid4().hex[:26], namespace=namespace, lookup_key=key, value=text)
            for number, (key, text) in enumerate(values.items())
        ]
        write_rows("sqlite", tmp_path, prefix, memory=rows)


def _settings(driver: str, tmp_path: Path, prefix: str, scoring: str = "clawmem") -> Settings:
    return Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=sql_url("sqlite", tmp_path),
        table_prefix=prefix,
        memory_driver=driver,
        redis_url=backend_url("redis") if driver == "redis" else "redis://127.0.0.1:6379/0",
        recall_scoring=scoring,
    )


def _remove_redis_keys(memory: Any, prefix: str) -> None:
    if isinstance(memory, RedisMemory):
        for key in list(memory.client.scan_iter(match=f"{prefix}phpclaw:*")):
            memory.client.delete(key)


@pytest.fixture
def make_claw(tmp_path: Path, prefix: str, clock: FakeClock) -> Iterator[Callable[..., Claw]]:
    """Return ``make(driver, scoring)``: a Claw on this test's SQLite tables and ``driver``."""
    engine = create_engine(sql_url("sqlite", tmp_path))
    create_tables(engine, prefix)
    made: list[Claw] = []

    def make(driver: str, scoring: str = "clawmem") -> Claw:
        claw = Claw.from_settings(_settings(driver, tmp_path, prefix, scoring), EchoProvider(), clock=clock)
        made.append(claw)
        return claw

    yield make
    for claw in made:
        _remove_redis_keys(claw.memory.inner, prefix)  # type: ignore[attr-defined]
    drop_tables(engine, prefix)
    engine.dispose()


def _skipped(caplog: Any) -> set[str]:
    return {
        record.args[0]
        for record in caplog.records
        if record.name == "clawmem.recall" and record.msg.startswith("recall skips key")
    }


@pytest.mark.parametrize("scoring", ["clawmem", "phpclaw"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_turn_recalls_what_it_reads_and_names_each_key_it_skips(
    make_claw: Callable[..., Claw], tmp_path: Path, prefix: str, driver: str, scoring: str, caplog: Any
) -> None:
    claw = make_claw(driver, scoring)
    values = values_for(driver)
    plant(claw.memory.inner, "default", {**GOOD, **values}, tmp_path, prefix)  # type: ignore[attr-defined]
    expected = (UNREADABLE & set(values)) | layout_breakers(driver)
    for turn in range(2):  # the first reads the namespace whole, the second follows its changes
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="clawmem.recall"):
            reply = claw.send("abc good ring twice order shipped")
        text = reply.augment.text
        assert reply.augment.error is None, (turn, caplog.text)
        assert "- good: abc good words" in text
        assert "- bell: abc ring \\x07 twice" in text and "\x07" not in text
        assert not [key for key in expected if f"- {key}:" in text]
        if turn == 0:
            assert _skipped(caplog) == expected
        # The warning names the key, never the value.
        assert (
            "order shipped" not in caplog.text and "1e999" not in caplog.text and "\\ud800" not in caplog.text
        )
    assert claw.conversations.load(reply.conversation_id) is not None


OVERWRITTEN = '{"code": "zebra-7", "n": NaN}'


@pytest.mark.parametrize("driver", ["redis", "file"])
def test_a_value_another_program_overwrites_leaves_recall_at_the_next_turn(
    make_claw: Callable[..., Claw], tmp_path: Path, prefix: str, driver: str, caplog: Any
) -> None:
    claw = make_claw(driver)
    memory = claw.memory.inner  # type: ignore[attr-defined]
    memory.set("policy", "abc orders ship in two days")
    memory.set("other", "abc other words")
    assert "- policy: abc orders ship in two days" in claw.send("abc orders ship").augment.text
    if isinstance(memory, RedisMemory):
        plant(memory, "default", {"policy": OVERWRITTEN}, tmp_path, prefix, layout=False)
    else:
        path = memory.path_for("default")
        text = path.read_text(encoding="utf-8").replace('"abc orders ship in two days"', OVERWRITTEN)
        path.write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="clawmem.recall"):
        reply = claw.send("abc orders ship")
    assert reply.augment.error is None
    assert "- policy:" not in reply.augment.text and "- other: abc other words" in reply.augment.text
    assert _skipped(caplog) == {"policy"}
    with pytest.raises(Exception, match="policy") as raised:
        memory.get("policy")
    assert type(raised.value).__name__ == "StorageError" and "zebra" not in str(raised.value)


def test_a_write_keeps_what_another_program_left_as_it_was(tmp_path: Path, clock: FakeClock) -> None:
    memory = FileMemory(tmp_path / "memory", clock=clock)
    values = values_for("file")
    plant(memory, "default", values, tmp_path, "")
    before = {row.key: row for row in memory.records()}
    memory.set("new", "written by clawmem")
    memory.forget("number")
    after = {row.key: row for row in memory.records()}
    assert set(after) == set(before) - {"number"} | {"new"}
    for key, row in after.items():
        if key != "new":
            assert (row.value, row.unreadable) == (before[key].value, before[key].unreadable), key
    again = FileMemory(tmp_path / "memory", clock=clock)  # what the file now holds, read afresh
    assert {row.key: row.unreadable for row in again.records()} == {
        key: row.unreadable for key, row in after.items()
    }


# -- pages ---------------------------------------------------------------------------------------


@pytest.fixture
def driver_app(make_app: Callable[..., Flask], driver: str, prefix: str) -> Iterator[Flask]:
    """A dashboard app on ``driver`` with an admin; Redis keys are removed after."""
    config = {"MEMORY_DRIVER": driver}
    if driver == "redis":
        config["REDIS_URL"] = backend_url("redis")
    app = make_app(**config)
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    yield app
    with app.app_context():
        _remove_redis_keys(state.driver(), prefix)


def _driver(app: Flask) -> Any:
    with app.app_context():
        return state.driver()


@pytest.mark.parametrize("driver", DRIVERS)
def test_pages_mark_each_value_they_cannot_read_and_never_fail(
    driver_app: Flask, tmp_path: Path, prefix: str, driver: str
) -> None:
    values = values_for(driver)
    plant(_driver(driver_app), "default", {**GOOD, **values}, tmp_path, prefix)
    client = signed_in_client(driver_app)
    expected = (UNREADABLE & set(values)) | layout_breakers(driver)
    listing = assert_answered(client.get("/memory/default/"), "namespace")
    for key in {*values, *layout_breakers(driver), "good"}:
        row = listing.split(f'key={key}"', 1)[1].split("</tr>", 1)[0]
        assert ('class="tag unreadable"' in row) == (key in expected), key
        entry = assert_answered(client.get("/memory/default/entry", query_string={"key": key}), key)
        assert ("Parts of this row cannot be read" in entry) == (key in expected), key
    fragment = client.get("/memory/default/", headers={"HX-Request": "true", "HX-Target": "memory-results"})
    assert assert_answered(fragment, "fragment").count('class="tag unreadable"') == len(expected)
    for url in ["/", "/memory/", "/memory/?q=abc", "/cold", "/cold?namespace=default", "/settings"]:
        assert_answered(client.get(url), url)
    preview = assert_answered(client.get("/preview?message=abc+good+ring"), "preview")
    assert "- good: abc good words" in preview and "\x07" not in preview and MARK not in preview


# -- export and erase ----------------------------------------------------------------------------


def _claw_command(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["claw", *args])


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"the export holds {name}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("driver", DRIVERS)
def test_export_lists_what_it_cannot_read_and_erase_deletes_it(
    driver_app: Flask, tmp_path: Path, prefix: str, driver: str
) -> None:
    memory = _driver(driver_app)
    values = values_for(driver)
    plant(memory, "user:raw-user", values, tmp_path, prefix)
    mention = {"note": '{"who": "raw-user", "n": NaN}', "plain": '"ask raw-user about it"'}
    plant(memory, "default", mention, tmp_path, prefix, layout=False)
    conversation = conversation_row(1, user_id="raw-user")
    write_rows(
        "sqlite",
        tmp_path,
        prefix,
        conversations=[conversation],
        messages=[message_row(1, conversation["id"])],
    )
    held = {*values, *layout_breakers(driver)}
    expected = (UNREADABLE & set(values)) | layout_breakers(driver)

    result = _claw_command(driver_app, "export", "--user-id", "raw-user")
    assert result.exit_code == 0 and TRACEBACK not in result.output, result.output
    document = _strict(result.stdout)
    assert {entry["key"] for entry in document["memory"]} == held
    assert {(entry["namespace"], entry["key"]) for entry in document["mentions"]} == {
        ("default", "note"),
        ("default", "plain"),
    }
    listed = {row["key"] for row in document["unreadable"] if row["table"] == "memory"}
    assert listed == expected | {"note"}

    result = _claw_command(driver_app, "erase", "--user-id", "raw-user", "--mentions", "--yes")
    assert result.exit_code == 0 and TRACEBACK not in result.output, result.output
    with driver_app.app_context():
        assert state.driver().stored_records("user:raw-user") == []
        assert state.driver().stored_records("default") == []
    if isinstance(memory, FileMemory):
        assert not memory.path_for("user:raw-user").exists()


# -- a namespace file that is no store at all -----------------------------------------------------

# A value that is no JSON inside the file, and files that are no object of entries.
NO_STORE = [
    *(
        f'{{"k": {{"value": {HOSTILE_VALUES[name]}, "expires_at": null}}}}'.encode()
        for name in ("empty", "not_json", "marked_text")
    ),
    b"[1, 2]",
    b"\xff\xfe{}",
]


@pytest.mark.parametrize("content", NO_STORE, ids=[repr(c)[:24] for c in NO_STORE])
@pytest.mark.parametrize("driver", ["file"])
def test_a_namespace_file_that_is_no_store_is_unreadable_named_and_left_as_it_was(
    driver_app: Flask,
    make_claw: Callable[..., Claw],
    tmp_path: Path,
    prefix: str,
    driver: str,
    content: bytes,
    caplog: Any,
) -> None:
    memory = _driver(driver_app)
    memory.set("fine", "abc other words", "other")
    plant(memory, "user:raw-user", {"note": '"abc about raw-user"'}, tmp_path, prefix, layout=False)
    conversation = conversation_row(1, user_id="raw-user")
    write_rows(
        "sqlite",
        tmp_path,
        prefix,
        conversations=[conversation],
        messages=[message_row(1, conversation["id"])],
    )
    path = memory.path_for("default")
    path.write_bytes(content)
    subject_path = memory.path_for("user:raw-user")
    subject_file = subject_path.read_bytes()

    # A turn answers without recall from the namespace, and says so.
    claw = make_claw(driver)
    with caplog.at_level(logging.WARNING):
        reply = claw.send("abc other words")
    assert reply.text and reply.augment.error == "StorageError"
    assert "memory recall skipped for namespaces default" in caplog.text

    # The site's pages answer and name the file; the namespace's own pages say why they cannot.
    client = signed_in_client(driver_app)
    for url in ["/", "/memory/", "/memory/other/", "/conversations/"]:
        body = assert_answered(client.get(url), url)
        if url in ("/", "/memory/"):
            assert str(path) in body, url
    for url in ["/memory/default/", "/memory/default/entry?key=k"]:
        body = assert_answered(client.get(url), url, allowed=(503,))
        assert str(path) in body and "repair the file or move it away; nothing was changed" in body

    # An export or an erasure that would have to read it stops before anything, naming the file.
    path.rename(subject_path.with_name("held.json"))
    subject_path.write_bytes(content)
    for args in (["export", "--user-id", "raw-user"], ["erase", "--user-id", "raw-user", "--yes"]):
        result = _claw_command(driver_app, *args)
        assert result.exit_code != 0 and TRACEBACK not in result.output, (args, result.output)
        assert str(subject_path) in result.output, (args, result.output)
    assert subject_path.read_bytes() == content and subject_file  # nothing written over
    with driver_app.app_context():
        assert conversation["id"] in [c.id for c in state.conversations().list().items]  # not erased


def test_a_key_that_is_no_text_is_left_out_and_kept(tmp_path: Path, clock: FakeClock, caplog: Any) -> None:
    memory = FileMemory(tmp_path / "memory", clock=clock)
    memory.directory.mkdir(parents=True)
    path = memory.path_for("default")
    path.write_text(
        '{"\\ud800": {"value": "abc hidden", "expires_at": null}, "k": {"value": 1, "expires_at": null}}'
    )
    with caplog.at_level(logging.WARNING):
        assert [row.key for row in memory.records()] == ["k"]
        assert memory.all() == {"k": 1}
    assert f"a key in {path} is not text" in caplog.text
    memory.set("new", "abc")
    assert json.loads(path.read_text(encoding="utf-8"))["\ud800"] == {
        "value": "abc hidden",
        "expires_at": None,
    }
    assert [row.key for row in memory.records()] == ["k", "new"]
