"""Nothing leaks: no customer text in access logs, browser history, cron logs or terminals; the
audit log holds keyed hashes only; commands shown for copying are quoted; right-to-left text is
isolated; passwords in URLs and SQLite's files stay private. One test per finding of the review.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from clawmem.cli.audit import AUDIT_KEY_FILE, audit_key, subject_hash
from clawmem.errors import redact
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import drop_tables
from clawmem.turn.conversations import Message
from dashboard import accounts, create_app, state
from dashboard.devserver import PathOnlyRequestHandler, closing_bodies
from dashboard.views.settings import deletion_commands
from tests.conftest import backend_url
from tests.dashboard_helpers import ADMIN, PASSWORD, page_text, sign_in
from tests.hostile import conversation_row, memory_row, write_rows

pytest_plugins = ["tests.dashboard_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
ESCAPES = "evil\x1b]0;PWNED\x07\x1b[2J"
SECRET_TEXT = "Bob Lindqvist"


def _claw(app: Flask, *args: str, stdin: str | None = None) -> Any:
    return app.test_cli_runner().invoke(args=["claw", *args], input=stdin)


def _audit_lines(app: Flask) -> list[dict[str, Any]]:
    path = Path(app.instance_path) / "audit.log"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line["phase"] == "finished"]  # one per run


# -- access logs and browser history ------------------------------------------------------------


def _procfile_command() -> list[str]:
    line = (ROOT / "Procfile").read_text().strip()
    assert line.startswith("web: ")
    return shlex.split(line[len("web: ") :])


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)


@pytest.mark.slow
def test_the_procfile_access_log_leaves_out_query_strings(tmp_path: Path) -> None:
    command = _procfile_command()
    assert command[:2] == ["gunicorn", "wsgi:app"]
    instance = tmp_path / "instance"
    app = f"dashboard:create_app(instance_path={str(instance)!r})"
    environment = {**os.environ, "CLAW_DATABASE_URL": f"sqlite:///{tmp_path / 'claw.db'}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", app, *command[2:], "--bind", "127.0.0.1:0", "--workers", "1"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    readers = [
        threading.Thread(target=_read_lines, args=(stream, lines), daemon=True)
        for stream in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    try:
        address = None
        while address is None:
            found = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", lines.get(timeout=60))
            address = found.group(1) if found else None
        secret = f"/login?next=/conversations/%3Fq%3D{SECRET_TEXT.replace(' ', '+')}&user_id=cust-2002"
        with urllib.request.urlopen(address + secret, timeout=30) as response:
            assert response.status == 200
        logged = ""
        while "GET /login " not in logged:
            logged += lines.get(timeout=30)
    finally:
        process.terminate()
        process.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=30)
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
    assert '"GET /login HTTP/1.1" 200' in logged
    assert "Bob" not in logged and "cust-2002" not in logged and "?" not in logged


def test_the_development_server_logs_paths_without_query_strings(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="werkzeug")
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=PathOnlyRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/healthz?q=Bob+Lindqvist&user_id=cust-2002"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
    finally:
        server.shutdown()
        thread.join(timeout=30)
    logged = "\n".join(record.getMessage() for record in caplog.records if record.name == "werkzeug")
    assert "GET /healthz HTTP/1.1" in logged
    assert "Bob" not in logged and "cust-2002" not in logged


def test_makefile_serves_through_the_quiet_development_server() -> None:
    assert "-m dashboard.devserver" in (ROOT / "Makefile").read_text()


def test_typing_in_the_preview_never_writes_the_message_into_the_address_bar(signed_in: FlaskClient) -> None:
    body = page_text(signed_in.get("/preview?message=my+email+is+bob%40example.com"))
    form = re.search(r'<form class="preview".*?</form>', body, re.S)
    assert form and 'hx-get="/preview"' in form.group(0)
    assert "hx-push-url" not in form.group(0) and "hx-replace-url" not in form.group(0)


# -- the audit log and the CLI's output -------------------------------------------------------------


def test_the_audit_hash_is_keyed_per_install_and_audit_hash_finds_a_subjects_lines(
    app: Flask, make_app: Any, tmp_path: Path
) -> None:
    write_rows(
        "sqlite",
        tmp_path,
        state_prefix(app),
        conversations=[conversation_row(1, user_id="cust-1001")],
        memory=[memory_row(1, namespace="customer:cust-1001", lookup_key="phone", value='"555"')],
    )
    # A dry run makes no audit key: until a command that deletes has made one, it logs no hash.
    assert _claw(app, "erase", "--user-id", "cust-1001", "--dry-run").exit_code == 0
    assert not (Path(app.instance_path) / AUDIT_KEY_FILE).exists()
    unhashed = _audit_lines(app)[0]
    assert unhashed["arguments"]["user_id"] is None and "no audit key yet" in unhashed["unhashed"]
    assert _claw(app, "forget", "nothing-here", "--yes").exit_code == 0  # deletes, so makes the key
    assert _claw(app, "erase", "--user-id", "cust-1001", "--dry-run").exit_code == 0
    assert _claw(app, "flush", "--namespace", "customer:cust-1001", "--dry-run").exit_code == 0
    log = (Path(app.instance_path) / "audit.log").read_text()
    assert "cust-1001" not in log and "customer:" not in log
    erase_line, flush_line = _audit_lines(app)[2:]
    hashed = erase_line["arguments"]["user_id"]
    assert re.fullmatch(r"hmac-sha256:[0-9a-f]{32}", hashed)
    # Unkeyed, the id would fall to trying cust-0000 ... cust-9999; keyed, no candidate matches.
    unkeyed = {hashlib.sha256(f"cust-{n:04d}".encode()).hexdigest() for n in range(10_000)}
    assert not any(digest.startswith(hashed.split(":")[1][:16]) for digest in unkeyed)
    key_file = Path(app.instance_path) / AUDIT_KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    found = _claw(app, "audit-hash", "cust-1001")
    assert found.exit_code == 0 and found.stdout.strip() == hashed
    assert (
        _claw(app, "audit-hash", stdin="customer:cust-1001\n").stdout.strip()
        == flush_line["arguments"]["namespace"]
    )
    assert subject_hash("cust-1001", audit_key(app.instance_path)) == hashed
    other = tmp_path / "other-install"
    assert subject_hash("cust-1001", audit_key(other)) != hashed


def state_prefix(app: Flask) -> str:
    """Return the app's table prefix."""
    with app.app_context():
        return state.settings().table_prefix


def test_erase_prints_the_subjects_hash_never_the_subject(app: Flask, tmp_path: Path) -> None:
    rows = [conversation_row(1, user_id="cust-1001")]
    write_rows("sqlite", tmp_path, state_prefix(app), conversations=rows)
    first = _claw(app, "erase", "--user-id", "cust-1001", "--dry-run")
    assert "subject: user id (no hash shown: the install has no audit key yet" in first.output
    for args in (["--yes"], ["--dry-run"]):
        result = _claw(app, "erase", "--user-id", "cust-1001", *args)
        assert result.exit_code == 0, result.output
        assert "cust-1001" not in result.output
        assert re.search(r"subject: user id hmac-sha256:[0-9a-f]{32}", result.output)


def test_keys_namespaces_and_ids_reach_the_terminal_with_control_characters_escaped(
    app: Flask, tmp_path: Path
) -> None:
    write_rows(
        "sqlite",
        tmp_path,
        state_prefix(app),
        conversations=[
            conversation_row(1, id="conv\x1b[31m", user_id="cust-7", created_at="2001-01-01 00:00:00")
        ],
        memory=[
            memory_row(1, lookup_key=ESCAPES, value='"mentions cust-7"'),
            memory_row(2, namespace="ns\x1b[2J", lookup_key="gone", expires_at=1),
        ],
    )
    runs = [
        ["flush", "--namespace", "default", "--dry-run", "-v"],
        ["erase", "--user-id", "cust-7", "--dry-run", "-v"],
        ["sweep", "--dry-run"],
        ["prune", "--older-than", "1d", "--dry-run", "-v"],
    ]
    for args in runs:
        result = _claw(app, *args)
        assert result.exit_code == 0, (args, result.output)
        assert "\x1b" not in result.output and "\x07" not in result.output, args
    assert "evil\\x1b]0;PWNED\\x07\\x1b[2J" in _claw(app, *runs[0]).output
    assert "ns\\x1b[2J: would delete 1" in _claw(app, *runs[2]).output
    assert "conv\\x1b[31m" in _claw(app, *runs[3]).output


# -- commands shown for copying, right-to-left text ------------------------------------------------


def test_the_overviews_commands_are_quoted_so_a_namespace_stays_one_argument(
    make_app: Any, tmp_path: Path, prefix: str
) -> None:
    app = make_app(STORE_MESSAGES=False)
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    write_rows("sqlite", tmp_path, prefix, memory=[memory_row(1, namespace="default --yes #")])
    client = app.test_client()
    sign_in(client)
    body = page_text(client.get("/"))
    shown = "claw flush --namespace &#39;default --yes #&#39; --dry-run"
    assert shown in body
    words = shlex.split(shown.replace("&#39;", "'"))
    result = _claw(app, *words[1:])
    assert result.exit_code == 0, result.output
    assert "would delete 1 entry of namespace 'default --yes #' (dry run: nothing deleted)" in result.output
    with app.app_context():
        assert state.driver().stored_records("default --yes #"), "a dry run deletes nothing"


def test_every_settings_command_is_shell_quoted(app: Flask) -> None:
    with app.app_context():
        for row in deletion_commands(state.settings()):
            assert shlex.join(shlex.split(row["command"])) == row["command"]


def test_right_to_left_overrides_are_isolated(signed_in: FlaskClient, app: Flask, tmp_path: Path) -> None:
    override = "\u202eexe.tnemyap"
    write_rows(
        "sqlite",
        tmp_path,
        state_prefix(app),
        conversations=[conversation_row(1, user_id=override, title=override)],
        memory=[memory_row(1, lookup_key=override)],
    )
    keys = page_text(signed_in.get("/memory/default/"))
    assert f"<code>{override}</code>" in keys
    listing = page_text(signed_in.get("/conversations/"))
    assert listing.count(f"<bdi>{override}</bdi></a>") == 2, "the title and the subject's link"
    css = (ROOT / "static" / "app.css").read_text()
    assert re.search(r"^code, bdi[^{]*\{ unicode-bidi: isolate; \}", css, re.M)


# -- passwords in URLs, SQLite's files ---------------------------------------------------------------


def test_a_password_in_a_query_parameter_is_never_shown(make_app: Any, tmp_path: Path) -> None:
    assert redact("redis://cache:6379/0?password=S3cretPW&db=1") == "redis://cache:6379/0?password=***&db=1"
    url = backend_url("postgres") + "?password=S3cretPW"
    app = make_app(DATABASE_URL=url, REDIS_URL="redis://127.0.0.1:6379/0?password=S3cretPW")
    try:
        with app.app_context():
            accounts.create_admin(ADMIN, PASSWORD, 0)
        client = app.test_client()
        sign_in(client)
        for page in ("/", "/settings"):
            body = page_text(client.get(page))
            assert "S3cretPW" not in body and "password=***" in body, page
        stats = _claw(app, "stats")
        assert stats.exit_code == 0 and "S3cretPW" not in stats.output and "password=***" in stats.output
    finally:
        with app.app_context():
            drop_tables(state.engine(), state.settings().table_prefix)


def test_sqlite_files_are_private_and_erased_rows_leave_the_file(tmp_path: Path) -> None:
    instance = tmp_path / "instance"
    app = create_app({"TESTING": True}, instance_path=str(instance))
    assert instance.stat().st_mode & 0o777 == 0o700
    assert _claw(app, "init-db").exit_code == 0
    with app.app_context():
        state.conversations().append("c1", [Message("user", "call me at 555-0100")], user_id="cust-9")
        state.memory().set("phone", "555-0100 belongs to cust-9")
        engine = state.engine()
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA secure_delete").scalar() == 1
    database = instance / "clawmem.db"
    for path in (database, Path(f"{database}-wal")):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert _claw(app, "erase", "--user-id", "cust-9", "--mentions", "--yes").exit_code == 0
    assert Path(f"{database}-wal").stat().st_size == 0, "erase checkpoints the WAL into the file"
    assert b"555-0100" not in database.read_bytes()


def test_invalid_utf8_from_another_program_reads_as_replacement_characters(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT CAST(X'63c3' AS TEXT)")).scalar() == "c\ufffd"


class _Body:
    """A response body that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield b"one"
        yield b"two"

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("chunks_sent", [0, 1, 2])
def test_a_body_is_closed_whether_it_was_sent_whole_dropped_half_way_or_closed(chunks_sent: int) -> None:
    # Werkzeug's server skips close() when the client's reset breaks its read of the rest of the
    # request; a static file left open that way failed a browser test with a ResourceWarning.
    body = _Body()
    served = closing_bodies(lambda environ, start_response: body)({}, None)
    chunks = iter(served)
    sent = [next(chunks) for _ in range(chunks_sent)]
    if chunks_sent == 0:
        served.close()
    elif chunks_sent == 2:
        assert list(chunks) == [] and body.closed
    del chunks
    assert body.closed and sent == [b"one", b"two"][:chunks_sent]
