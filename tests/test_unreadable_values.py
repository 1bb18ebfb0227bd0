"""Stored rows that another program wrote never block a turn or a page.

An undecodable value is skipped by recall with a warning naming the key (never the value) and
marked unreadable on pages; NUL and other control characters are escaped in the injected line
under every scoring, and the preview says so; non-finite floats and PHP integers beyond 64 bits
read as unreadable, and an export stays strict JSON. phpClaw's shape runs on MariaDB; our own
on SQLite, MariaDB and PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from flask import Flask
from flask.testing import FlaskClient

from clawmem import php
from clawmem.clock import FakeClock
from clawmem.codecs import decode_json_value
from clawmem.php import PhpFormatError
from clawmem.providers.echo import EchoProvider
from clawmem.settings import CLAWMEM_SCHEMA, PHPCLAW_SCHEMA, Settings
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.turn.pipeline import Claw
from dashboard import accounts, create_app
from tests.conftest import sql_url
from tests.dashboard_helpers import ADMIN, PASSWORD, sign_in

# (key, value column as another program stored it) in phpClaw's serialize() text.
PHP_ROWS = [
    ("good", 's:14:"abc good words";'),
    ("broken", 's:5:"abc";'),  # the string is 3 bytes, not 5: phpClaw itself could not read it
    ("nul", 's:7:"abc a\x00b";'),
    ("ansi", 's:13:"abc \x1b[31mred!";'),
    ("infinite", "d:1e999;"),
    ("huge", "i:99999999999999999999;"),
]
UNREADABLE = {"broken", "infinite", "huge"}


def _insert(engine: sa.engine.Engine, prefix: str, rows: list[tuple[str, str]], shape: str) -> None:
    table = f"{prefix}phpclaw_memory"
    with engine.begin() as conn:
        for number, (key, value) in enumerate(rows):
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (id, namespace, lookup_key, value, created_at, updated_at) "
                    "VALUES (:id, 'default', :key, :value, :moment, :moment)"
                ),
                {
                    "id": f"01HXBR0KEN{number:016d}",
                    "key": key,
                    "value": value,
                    "moment": "2026-01-01 00:00:00",
                },
            )


@pytest.fixture
def phpclaw_url(tmp_path: Path, prefix: str) -> Iterator[str]:
    """MariaDB with phpClaw-shaped tables under this test's prefix, holding the hostile rows."""
    url = sql_url("mysql", tmp_path)
    engine = create_engine(url)
    create_tables(engine, prefix, PHPCLAW_SCHEMA)
    _insert(engine, prefix, PHP_ROWS, PHPCLAW_SCHEMA)
    yield url
    drop_tables(engine, prefix)
    engine.dispose()


def _settings(url: str, prefix: str, tmp_path: Path, scoring: str, schema: str) -> Settings:
    return Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=url,
        table_prefix=prefix,
        schema=schema,
        recall_scoring=scoring,
    )


@pytest.mark.parametrize("scoring", ["phpclaw", "clawmem"])
def test_no_stored_row_fails_a_turn_and_control_characters_are_escaped(
    phpclaw_url: str, prefix: str, tmp_path: Path, clock: FakeClock, scoring: str, caplog: Any
) -> None:
    claw = Claw.from_settings(
        _settings(phpclaw_url, prefix, tmp_path, scoring, PHPCLAW_SCHEMA), EchoProvider(), clock=clock
    )
    with caplog.at_level(logging.WARNING, logger="clawmem.recall"):
        reply = claw.send("abc broken infinite huge please")

    text = reply.augment.text
    assert reply.augment.error is None, caplog.text
    assert "- good: abc good words" in text
    assert "- nul: abc a\\x00b" in text and "\x00" not in text
    assert "- ansi: abc \\x1b[31mred!" in text and "\x1b" not in text
    assert not any(f"- {key}:" in text for key in UNREADABLE)
    assert "Infinity" not in text and "inf" not in text.lower().replace("infinite", "")
    # The warning names each skipped key, never the value.
    for key in UNREADABLE:
        assert f"recall skips key {key!r} in namespace 'default'" in caplog.text
    assert 's:5:"abc"' not in caplog.text and "1e999" not in caplog.text
    stored = claw.conversations.load(reply.conversation_id)
    assert stored is not None and "\x00" not in json.dumps([m.content for m in stored.messages])


def _signed_in(app: Flask, clock: FakeClock) -> FlaskClient:
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, clock())
    client = app.test_client()
    assert sign_in(client, ADMIN, PASSWORD).status_code == 302
    return client


@pytest.mark.parametrize("scoring", ["phpclaw", "clawmem"])
def test_every_page_answers_and_marks_what_it_cannot_read(
    phpclaw_url: str, prefix: str, tmp_path: Path, clock: FakeClock, scoring: str
) -> None:
    app = create_app(
        {
            "TESTING": True,
            "ARGON2_PROFILE": "CHEAPEST",
            "DATABASE_URL": phpclaw_url,
            "TABLE_PREFIX": prefix,
            "SCHEMA": PHPCLAW_SCHEMA,
            "RECALL_SCORING": scoring,
        },
        instance_path=str(tmp_path / "instance"),
    )
    app.extensions["clawmem.clock"] = clock
    client = _signed_in(app, clock)
    for url in ("/", "/cold", "/preview/unmatched?message=abc", "/memory/default/"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    listing = client.get("/memory/default/").get_data(as_text=True)
    assert listing.count("unreadable") >= len(UNREADABLE)
    preview = client.get("/preview?message=abc").get_data(as_text=True)
    assert "abc a\\x00b" in preview and "\x00" not in preview and "\x1b" not in preview
    assert "control characters escaped" in preview


def test_phpclaw_non_finite_and_oversized_numbers_read_as_unreadable() -> None:
    for text in ("d:1e999;", "d:-1e999;", "i:99999999999999999999;", "i:-9223372036854775809;"):
        with pytest.raises(PhpFormatError):
            php.unserialize(text)
    assert php.unserialize("i:9223372036854775807;") == 2**63 - 1
    assert php.unserialize("d:1.5e300;") == 1.5e300


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"the export holds {name}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_export_of_phpclaw_rows_is_strict_json(
    phpclaw_url: str, prefix: str, tmp_path: Path, clock: FakeClock
) -> None:
    from clawmem.cli import ClawGroup
    from clawmem.sites.site import Site

    site = Site(_settings(phpclaw_url, prefix, tmp_path, "phpclaw", PHPCLAW_SCHEMA), clock)
    result = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["export", "--match", "abc"])
    assert result.exit_code == 0, result.output
    document = _strict(result.stdout)
    assert {row["key"] for row in document["unreadable"]} >= {"broken"}
    result = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["export", "--match", "1e999"])
    document = _strict(result.stdout)
    assert [(row["key"], row["unreadable"]) for row in document["mentions"]] == [
        ("infinite", "value cannot be decoded")
    ]


OUR_ROWS = [
    ("good", '"abc good words"'),
    ("infinite", "1e999"),
    ("nan", "NaN"),
    ("bell", '"abc ring \\u0007 twice"'),
]


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "postgres"])
def test_our_shape_reads_non_finite_numbers_as_unreadable_and_escapes_controls(
    backend: str, prefix: str, tmp_path: Path, clock: FakeClock, caplog: Any
) -> None:
    url = sql_url(backend, tmp_path)
    engine = create_engine(url)
    create_tables(engine, prefix)
    try:
        _insert(engine, prefix, OUR_ROWS, CLAWMEM_SCHEMA)
        for scoring in ("clawmem", "phpclaw"):
            claw = Claw.from_settings(
                _settings(url, prefix, tmp_path, scoring, CLAWMEM_SCHEMA), EchoProvider(), clock=clock
            )
            with caplog.at_level(logging.WARNING, logger="clawmem.recall"):
                text = claw.send("abc ring infinite nan").augment.text
            assert "- bell: abc ring \\x07 twice" in text and "\x07" not in text, scoring
            assert "Infinity" not in text and "NaN" not in text and "- infinite:" not in text, scoring
            assert "recall skips key 'infinite'" in caplog.text and "recall skips key 'nan'" in caplog.text
        with pytest.raises(ValueError):
            decode_json_value("1e999")
    finally:
        drop_tables(engine, prefix)
        engine.dispose()
