"""The ``flask claw`` data commands as an operator meets them: help, refusals without a terminal,
confirmation on a real terminal, one-line errors with the right exit code, and the audit log.

The helpers at the top are shared by the other ``test_cli_*`` files.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import Result
from flask import Flask

from clawmem.clock import FakeClock, utc_datetime
from clawmem.ids import new_id
from clawmem.memory.file import FileMemory
from clawmem.sql.schema import tables
from dashboard import create_app
from tests.conftest import backend_url

ROOT = Path(__file__).resolve().parent.parent
FLASK = ROOT / ".venv" / "bin" / "flask"
UNREACHABLE = "mysql+pymysql://u:secretpw@127.0.0.1:1/x"

# -- helpers shared by the CLI tests -------------------------------------------------------------


def url_of(engine: sa.engine.Engine) -> str:
    """Return the engine's URL with its password, as CLAW_DATABASE_URL takes it."""
    return engine.url.render_as_string(hide_password=False)


def build_app(url: str, prefix: str, clock: FakeClock, instance: Path, **config: Any) -> Flask:
    """Return the dashboard app on ``url``/``prefix`` with the fake clock and a private instance."""
    app = create_app(
        {"TESTING": True, "DATABASE_URL": url, "TABLE_PREFIX": prefix, **config}, instance_path=str(instance)
    )
    app.extensions["clawmem.clock"] = clock
    return app


def build_file_app(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> tuple[Flask, FileMemory]:
    """Return an app whose key/value driver is ``file``, and a FileMemory on the same site's directory."""
    directory = tmp_path / "files"
    app = build_app(
        url_of(engine), prefix, clock, tmp_path / "instance", MEMORY_DRIVER="file", FILE_DIR=str(directory)
    )
    return app, FileMemory(directory, clock=clock, site=prefix)


# Every key/value driver an app can run on, each with the SQL backend that holds conversations.
KV_DRIVERS = [
    pytest.param("sqlite", "sql", id="sql-sqlite"),
    pytest.param("mysql", "sql", id="sql-mysql"),
    pytest.param("postgres", "sql", id="sql-postgres"),
    pytest.param("sqlite", "file", id="file"),
    pytest.param("sqlite", "redis", id="redis"),
]


def build_driver_app(
    request: pytest.FixtureRequest, url: str, prefix: str, clock: FakeClock, tmp_path: Path, driver: str
) -> Flask:
    """Return the app of site ``prefix`` with key/value driver ``driver`` (conversations on ``url``).

    Every site of a test shares ``tmp_path/files`` and the test Redis database, as sites of one
    install do; each has its own instance folder. The site's Redis keys go at teardown.
    """
    config = {"MEMORY_DRIVER": driver, "FILE_DIR": str(tmp_path / "files")}
    if driver == "redis":
        import redis

        client = redis.Redis.from_url(backend_url("redis"))
        config["REDIS_URL"] = backend_url("redis")
        request.addfinalizer(
            lambda: [client.delete(key) for key in client.scan_iter(match=f"{prefix}phpclaw:*")]
        )
    return build_app(url, prefix, clock, tmp_path / f"instance-{prefix}", **config)


def stored_entries(app: Flask) -> dict[tuple[str, str], Any]:
    """Return every key/value entry of the app's site as its driver stores it, by (namespace, key):
    the SQL row, the file's line, the Redis DUMP with index score and absolute expiry."""
    from clawmem.memory.file import namespace_of_stem
    from clawmem.memory.redis import RedisMemory
    from clawmem.memory.sql import SqlMemory
    from dashboard import state

    site = state.site_of(app)
    driver = site.driver
    found: dict[tuple[str, str], Any] = {}
    if isinstance(driver, SqlMemory):
        table = tables(site.prefix).memory
        with site.engine.connect() as conn:
            for row in conn.execute(sa.select(table)):
                found[(row.namespace, row.lookup_key)] = tuple(row)
    elif isinstance(driver, FileMemory):
        for path in sorted(driver.directory.glob("*.json")):
            namespace = namespace_of_stem(path.stem)
            assert namespace is not None, f"{path} is not a namespace file"
            # One entry per line between "{" and "}" (see clawmem.memory.file.dump_store).
            for line in path.read_bytes().split(b"\n")[1:-2]:
                entry = line.removesuffix(b",")
                (key,) = json.loads(b"{" + entry + b"}")
                found[(namespace, key)] = entry
    elif isinstance(driver, RedisMemory):
        client = driver.client
        for namespace in driver.namespaces():
            for member, score in client.zrange(driver.index_key(namespace), 0, -1, withscores=True):
                key = member.decode()
                redis_key = driver.entry_key(key, namespace)
                found[(namespace, key)] = (client.dump(redis_key), score, client.expiretime(redis_key))
    else:
        for namespace in driver.namespaces():
            found.update({(namespace, row.key): row for row in driver.records(namespace)})
    return found


def claw(app: Flask, *args: str, stdin: str | None = None) -> Result:
    """Run ``flask claw ARGS`` in-process (stdin is never a terminal here)."""
    return app.test_cli_runner().invoke(args=["claw", *args], input=stdin)


def add_conversation(
    engine: sa.engine.Engine,
    prefix: str,
    created_at: datetime,
    *,
    updated_at: datetime | None = None,
    user_id: str = "",
    title: str | None = None,
    namespace: str = "default",
    metadata: str | None = None,
    messages: list[dict[str, Any]] | int = 2,
    conversation_id: str | None = None,
) -> str:
    """Insert a conversation and its messages directly, at chosen times; return its id."""
    schema = tables(prefix)
    conversation_id = conversation_id or new_id()
    if isinstance(messages, int):
        messages = [{"role": "user", "content": f"message {n}"} for n in range(messages)]
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.conversations).values(
                id=conversation_id,
                namespace=namespace,
                user_id=user_id,
                title=title,
                metadata=metadata,
                created_at=created_at,
                updated_at=updated_at or created_at,
            )
        )
        if messages:
            rows = [
                {
                    "id": new_id(),
                    "conversation_id": conversation_id,
                    "role": message["role"],
                    "content": message.get("content"),
                    "tool_name": message.get("tool_name"),
                    "tool_input": json.dumps(message["tool_input"]) if "tool_input" in message else None,
                    "created_at": created_at + timedelta(seconds=index),
                }
                for index, message in enumerate(messages)
            ]
            conn.execute(sa.insert(schema.messages), rows)
    return conversation_id


def dump(engine: sa.engine.Engine, prefix: str) -> dict[str, list[tuple[Any, ...]]]:
    """Return every row of the prefix's three tables, ordered by id."""
    schema = tables(prefix)
    with engine.connect() as conn:
        return {
            table.name: [tuple(row) for row in conn.execute(sa.select(table).order_by(table.c.id))]
            for table in (schema.conversations, schema.messages, schema.memory)
        }


def counts(engine: sa.engine.Engine, prefix: str) -> tuple[int, int, int]:
    """Return the row counts of conversations, messages and memory."""
    return tuple(len(rows) for rows in dump(engine, prefix).values())  # type: ignore[return-value]


def orphans(engine: sa.engine.Engine, prefix: str) -> int:
    """Return how many messages belong to no conversation."""
    schema = tables(prefix)
    conversations, messages = schema.conversations, schema.messages
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(
                    messages.outerjoin(conversations, conversations.c.id == messages.c.conversation_id)
                )
                .where(conversations.c.id.is_(None))
            ).scalar()
            or 0
        )


def all_audit_lines(app: Flask) -> list[dict[str, Any]]:
    """Return every parsed line of the app's audit log: started, batch and finished lines."""
    path = Path(app.instance_path) / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def audit_lines(app: Flask) -> list[dict[str, Any]]:
    """Return the "finished" line of each run in the app's audit log: what each run did."""
    return [line for line in all_audit_lines(app) if line["phase"] == "finished"]


def assert_one_line_error(result: Result, exit_code: int, *needles: str) -> str:
    """Assert a clean failure: the exit code, exactly one ``Error:`` line, no traceback."""
    assert result.exit_code == exit_code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def write_app_module(directory: Path, instance: Path) -> None:
    """Write ``cliapp.py``: the real app with its instance folder in ``instance``."""
    (directory / "cliapp.py").write_text(
        f"from dashboard import create_app\napp = create_app(instance_path={str(instance)!r})\n"
    )


def subprocess_env(directory: Path, **settings: str) -> dict[str, str]:
    """Return a clean environment for ``flask --app cliapp`` run in ``directory``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CLAW_")}
    env.update(PYTHONPATH=str(ROOT), FLASK_APP="cliapp", **{f"CLAW_{k}": v for k, v in settings.items()})
    return env


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def app(engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path) -> Flask:
    """The app on the current SQL backend, this test's prefix and the fake clock."""
    return build_app(url_of(engine), prefix, clock, tmp_path / "instance")


@pytest.fixture
def sqlite_app(tmp_path: Path, prefix: str, clock: FakeClock) -> Iterator[Flask]:
    """The app on a fresh SQLite file with this test's tables created."""
    app = build_app(f"sqlite:///{tmp_path / 'claw.db'}", prefix, clock, tmp_path / "instance")
    assert claw(app, "init-db").exit_code == 0
    yield app


STOCKED_CONVERSATION = "conv-alice"


def _stocked(app: Flask, clock: FakeClock) -> None:
    """One old conversation, one memory entry, one expired entry."""
    from dashboard import state

    with app.app_context():
        add_conversation(
            state.engine(),
            state.settings().table_prefix,
            utc_datetime(clock) - timedelta(days=400),
            user_id="alice",
            conversation_id=STOCKED_CONVERSATION,
        )
        state.memory().set("user:alice", "likes tea")
        state.memory().set("soon", 1, ttl=10)
    clock.advance(60)


# -- help -------------------------------------------------------------------------------------

COMMANDS = ["forget", "flush", "sweep", "prune", "export", "erase", "stats", "uninstall"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(sqlite_app: Flask, command: str) -> None:
    result = claw(sqlite_app, command, "--help")
    assert result.exit_code == 0
    assert "Usage: claw " + command in result.output or f"claw {command}" in result.output
    if command not in ("stats", "export"):
        assert "--dry-run" in result.output and "--yes" in result.output
    if command == "forget":
        assert "--conversation" in result.output


# -- refusing without a terminal ---------------------------------------------------------------

DELETING = {
    "forget": ["forget", "user:alice"],
    "forget-conversation": ["forget", "--conversation", STOCKED_CONVERSATION],
    "flush": ["flush", "--namespace", "default"],
    "sweep": ["sweep"],
    "prune": ["prune", "--older-than", "30d"],
    "erase": ["erase", "--user-id", "alice"],
    "uninstall": ["uninstall"],
}


@pytest.mark.parametrize("command", list(DELETING))
def test_deleting_without_yes_and_without_a_terminal_is_refused(
    sqlite_app: Flask, clock: FakeClock, prefix: str, command: str
) -> None:
    _stocked(sqlite_app, clock)
    with sqlite_app.app_context():
        from dashboard import state

        before = dump(state.engine(), prefix)
    result = claw(sqlite_app, *DELETING[command])
    assert_one_line_error(result, 1, "refusing to delete without --yes")
    with sqlite_app.app_context():
        assert dump(state.engine(), prefix) == before
    (line,) = audit_lines(sqlite_app)
    assert (line["command"], line["outcome"], line["dry_run"]) == (DELETING[command][0], "refused", False)


@pytest.mark.parametrize("command", list(DELETING))
def test_dry_run_needs_no_yes_and_changes_nothing(
    sqlite_app: Flask, clock: FakeClock, prefix: str, command: str
) -> None:
    _stocked(sqlite_app, clock)
    from dashboard import state

    with sqlite_app.app_context():
        before = dump(state.engine(), prefix)
    result = claw(sqlite_app, *DELETING[command], "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would" in result.output and "nothing deleted" in result.output
    with sqlite_app.app_context():
        assert dump(state.engine(), prefix) == before
    (line,) = audit_lines(sqlite_app)
    assert (line["outcome"], line["dry_run"]) == ("ok", True)
    assert any(line["counts"].values()), line


# -- confirmation on a real terminal -------------------------------------------------------------


def _run_on_terminal(directory: Path, env: dict[str, str], args: list[str], answer: str) -> tuple[int, str]:
    """Run ``flask claw ARGS`` with a pseudo-terminal as stdin and stdout; answer the question."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(FLASK), "claw", *args],
        cwd=directory,
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        close_fds=True,
    )
    os.close(terminal)
    output, answered, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if not answered and b"[y/N]" in output:
                os.write(controller, answer.encode() + b"\n")
                answered = True
        elif process.poll() is not None:
            break
    os.close(controller)
    return process.wait(timeout=30), output.decode(errors="replace")


@pytest.mark.parametrize("answer", ["n", "y"])
def test_a_terminal_is_asked_and_no_means_nothing_is_deleted(tmp_path: Path, answer: str) -> None:
    database = f"sqlite:///{tmp_path / 'claw.db'}"
    instance = tmp_path / "instance"
    write_app_module(tmp_path, instance)
    env = subprocess_env(tmp_path, DATABASE_URL=database, TABLE_PREFIX="tty_")
    engine = sa.create_engine(database)
    from clawmem.sql.schema import create_tables

    create_tables(engine, "tty_")
    add_conversation(engine, "tty_", datetime(2001, 1, 1), messages=3)
    code, output = _run_on_terminal(tmp_path, env, ["prune", "--older-than", "30d"], answer)
    assert "Delete 1 conversation and 3 messages? [y/N]" in output
    line = json.loads((instance / "audit.log").read_text().splitlines()[-1])  # the run's "finished" line
    if answer == "n":
        assert code == 1 and "Aborted" in output
        assert counts(engine, "tty_") == (1, 3, 0)
        assert line["outcome"] == "aborted"
    else:
        assert code == 0 and "deleted 1 conversation and 3 messages" in output
        assert counts(engine, "tty_") == (0, 0, 0)
        assert (line["outcome"], line["counts"]) == ("ok", {"conversations": 1, "messages": 3})
    engine.dispose()


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window", ["90x", "-5d", "0d", "d", "5", "1.5d", "90 days", "", "99999999999d", "876001h", "٣d"]
)
def test_a_malformed_window_is_a_usage_error(
    sqlite_app: Flask, clock: FakeClock, prefix: str, window: str
) -> None:
    _stocked(sqlite_app, clock)
    result = claw(sqlite_app, "prune", "--older-than", window, "--yes")
    assert_one_line_error(result, 2, "--older-than")
    with sqlite_app.app_context():
        from dashboard import state

        assert counts(state.engine(), prefix)[0] == 1


def test_prune_without_any_window_says_how_to_give_one(sqlite_app: Flask) -> None:
    result = claw(sqlite_app, "prune", "--yes")
    assert_one_line_error(result, 2, "--older-than", "CLAW_RETENTION_DAYS")


def test_a_configured_window_beyond_the_calendar_is_refused(tmp_path: Path, clock: FakeClock) -> None:
    app = build_app(
        f"sqlite:///{tmp_path / 'c.db'}", "", clock, tmp_path / "instance", RETENTION_DAYS="99999999"
    )
    assert_one_line_error(claw(app, "prune", "--yes"), 2, "CLAW_RETENTION_DAYS", "longest retention window")


@pytest.mark.parametrize(
    "args",
    [
        ["forget", "k", "--namespace", "a..b", "--yes"],
        ["forget", "k", "--namespace", "bad/ns", "--yes"],
        ["flush", "--namespace", "", "--yes"],
        ["flush", "--namespace", "x" * 101, "--yes"],
        ["forget", "bad\x01key", "--yes"],
        ["flush", "--yes"],
        ["forget", "--yes"],
        ["forget", "k", "--conversation", STOCKED_CONVERSATION, "--yes"],
        ["forget", "--conversation", "not a conversation id", "--yes"],
        ["forget", "--conversation", "x" * 27, "--yes"],
        ["export"],
        ["export", "--user-id", "a", "--match", "b"],
        ["erase", "--yes"],
        ["erase", "--user-id", "a", "--match", "b", "--yes"],
        ["erase", "--match", "   ", "--yes"],
        ["prune", "--older-than", "9d", "--batch-size", "0", "--yes"],
        ["prune", "--older-than", "9d", "--by", "title", "--yes"],
    ],
)
def test_bad_arguments_are_usage_errors(
    sqlite_app: Flask, clock: FakeClock, prefix: str, args: list[str]
) -> None:
    _stocked(sqlite_app, clock)
    from dashboard import state

    with sqlite_app.app_context():
        before = dump(state.engine(), prefix)
    assert_one_line_error(claw(sqlite_app, *args), 2)
    with sqlite_app.app_context():
        assert dump(state.engine(), prefix) == before


UNREACHABLE_RUNS = [
    ["prune", "--older-than", "9d", "--yes"],
    ["sweep", "--yes"],
    ["forget", "k", "--yes"],
    ["forget", "--conversation", "c1", "--yes"],
    ["flush", "--namespace", "crm", "--yes"],
    ["erase", "--user-id", "alice", "--yes"],
    ["export", "--user-id", "alice"],
    ["stats"],
    ["uninstall", "--yes"],
    ["init-db"],
    ["demo"],
]


@pytest.mark.parametrize("args", UNREACHABLE_RUNS, ids=lambda args: args[0])
def test_an_unreachable_database_is_one_line_without_the_password(
    tmp_path: Path, clock: FakeClock, args: list[str]
) -> None:
    app = build_app(UNREACHABLE, "", clock, tmp_path / "instance")
    error = assert_one_line_error(claw(app, *args), 1, "OperationalError", "Can't connect")
    assert "secretpw" not in error
    if args[0] not in ("stats", "init-db"):  # those two delete nothing and keep no audit line
        (line,) = audit_lines(app)
        assert line["outcome"] == "error"
        assert line["error"] in ("OperationalError", "StorageError")  # StorageError: a driver's wrapper
        assert "secretpw" not in json.dumps(line)


def test_an_unreachable_database_from_a_real_process(tmp_path: Path) -> None:
    write_app_module(tmp_path, tmp_path / "instance")
    env = subprocess_env(tmp_path, DATABASE_URL=UNREACHABLE)
    done = subprocess.run(
        [str(FLASK), "claw", "prune", "--older-than", "90d", "--yes"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        line for line in done.stderr.splitlines() if line.startswith("Error: database error")
    ]
    assert "secretpw" not in done.stderr + done.stdout


def test_a_malformed_setting_is_one_line_from_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "CLAW_STORE_MESSAGES": "maybe", "CLAW_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"}
    done = subprocess.run(
        [str(FLASK), "--app", "wsgi", "claw", "stats"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: CLAW_STORE_MESSAGES must be true or false, got 'maybe'"
    assert done.stdout == ""


def test_a_missing_table_is_one_line_naming_it(tmp_path: Path, clock: FakeClock) -> None:
    app = build_app(f"sqlite:///{tmp_path / 'empty.db'}", "none_", clock, tmp_path / "instance")
    assert_one_line_error(claw(app, "prune", "--older-than", "1d", "--yes"), 1, "none_phpclaw_conversations")


# -- the audit log ----------------------------------------------------------------------------


def test_the_audit_log_is_private_and_gets_one_line_per_run(sqlite_app: Flask, clock: FakeClock) -> None:
    _stocked(sqlite_app, clock)
    runs = [
        ["sweep", "--yes"],
        ["forget", "user:alice", "--yes"],
        ["erase", "--user-id", "alice", "--yes"],
        ["erase", "--user-id", "alice", "--yes"],
        ["prune", "--older-than", "1d", "--dry-run"],
    ]
    for args in runs:
        assert claw(sqlite_app, *args).exit_code == 0
    path = Path(sqlite_app.instance_path) / "audit.log"
    assert path.stat().st_mode & 0o777 == 0o600
    lines = audit_lines(sqlite_app)
    assert [line["command"] for line in lines] == ["sweep", "forget", "erase", "erase", "prune"]
    assert lines[0]["time"] == "2023-11-14T22:14:20+00:00"  # the app's clock, in UTC
    assert lines[1]["arguments"]["key"].startswith("hmac-sha256:")
    assert lines[2]["arguments"]["user_id"] == lines[3]["arguments"]["user_id"]
    assert lines[2]["counts"]["conversations"] == 1 and lines[3]["counts"] == {
        "conversations": 0,
        "messages": 0,
        "memory": 0,
        "mentions_kept": 0,
    }
    text = path.read_text()
    for secret in ("alice", "likes tea", "message 0"):
        assert secret not in text


def test_an_unwritable_audit_log_stops_the_run_before_it_deletes(
    sqlite_app: Flask, clock: FakeClock, prefix: str
) -> None:
    _stocked(sqlite_app, clock)
    (Path(sqlite_app.instance_path) / "audit.log").mkdir()
    assert_one_line_error(claw(sqlite_app, "prune", "--older-than", "1d", "--yes"), 1, "audit log")
    with sqlite_app.app_context():
        from dashboard import state

        assert counts(state.engine(), prefix)[0] == 1
