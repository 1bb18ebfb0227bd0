"""``keys generate | status | rotate``: a new key in one line, rows counted per key id and
plaintext rows left, a rotation that seals everything under the first key in audited batches and
carries on after a SIGKILL, after which the old key can be dropped and everything still reads;
and no command but generate ever prints a key."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from clawmem.cli import ClawGroup
from clawmem.clock import FakeClock
from clawmem.crypto import Keyring, generate_key, key_id_of
from clawmem.errors import Undecryptable
from clawmem.ids import new_id
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql import rotation as sql_rotation
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.turn.conversations import Message
from tests.conftest import sql_url
from tests.test_cli_basics import ROOT

OLD = generate_key("old1")
NEW = generate_key("new2")
SECRETS = [OLD.partition(":")[2], NEW.partition(":")[2]]
KEY_LINE = re.compile(r"[A-Za-z0-9_-]{1,32}:[A-Za-z0-9+/]{43}=")


def cli(site: Site, *args: str) -> Any:
    return CliRunner().invoke(ClawGroup("clawmem", lambda: site), list(args), catch_exceptions=False)


def no_key_in(text: str) -> None:
    """Fail when ``text`` holds any key material: a key's base64, or its raw bytes as hex."""
    for secret in SECRETS:
        assert secret not in text
        assert base64.b64decode(secret).hex() not in text


def site_of(tmp_path: Path, prefix: str, backend: str = "sqlite", keys: str = "", **values: Any) -> Site:
    settings = Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=sql_url(backend, tmp_path),
        table_prefix=prefix,
        encryption_keys=keys,
        **values,
    )
    return Site(settings, FakeClock(1_800_000_000.0))


def fill(site: Site, conversations: int, tag: str) -> dict[str, list[str]]:
    """Write conversations with messages (a tool row among them) and memory entries through the
    API; return what each conversation said, by id."""
    said: dict[str, list[str]] = {}
    for n in range(conversations):
        conversation_id = new_id()
        texts = [f"{tag} question {n}", f"{tag} answer {n}"]
        site.conversations.append(
            conversation_id,
            [
                Message("user", texts[0]),
                Message("assistant", texts[1]),
                Message("tool", "ok", "lookup", {"q": n}),
            ],
            user_id=f"cust-{tag}-{n}",
            title=f"{tag} title {n}",
            metadata={"channel": tag},
        )
        said[conversation_id] = [*texts, "ok"]
        site.memory.set(f"{tag}-fact-{n}", {"text": f"{tag} fact {n}"}, "default")
    return said


def read_all(site: Site, said: dict[str, list[str]], tag: str) -> None:
    for conversation_id, texts in said.items():
        loaded = site.conversations.load(conversation_id)
        assert [message.content for message in loaded.messages] == texts
        assert loaded.title.startswith(f"{tag} title") and loaded.metadata == {"channel": tag}
    for n in range(len(said)):
        assert site.memory.get(f"{tag}-fact-{n}", "default") == {"text": f"{tag} fact {n}"}


def stored_key_ids(site: Site) -> set[str | None]:
    """Return the key id of every stored encrypted value (``None`` for plaintext)."""
    schema = tables(site.prefix)
    found: set[str | None] = set()
    with site.engine.connect() as conn:
        for name, columns in sql_rotation.ROTATED.items():
            table = getattr(schema, name)
            for column in columns:
                for (text,) in conn.execute(sa.select(table.c[column]).where(table.c[column].is_not(None))):
                    found.add(key_id_of(text))
    return found


@pytest.fixture
def sqlite_sites(tmp_path: Path, prefix: str) -> Iterator[Any]:
    """Sites on one SQLite database: ``site(keys)`` opens it with a key list."""
    engine = create_engine(sql_url("sqlite", tmp_path))
    create_tables(engine, prefix)
    yield lambda keys="", **values: site_of(tmp_path, prefix, keys=keys, **values)
    drop_tables(engine, prefix)
    engine.dispose()


# -- generate ----------------------------------------------------------------------------------


def test_generate_prints_one_new_key_line_that_the_keyring_takes(sqlite_sites: Any) -> None:
    site = sqlite_sites()
    first, second = cli(site, "keys", "generate"), cli(site, "keys", "generate")
    assert first.exit_code == 0 and KEY_LINE.fullmatch(first.output.strip())
    assert first.output != second.output and first.output.split(":")[0] != second.output.split(":")[0]
    named = cli(site, "keys", "generate", "--id", "k2027").output.strip()
    assert named.startswith("k2027:") and Keyring.from_text(named).primary_id == "k2027"


@pytest.mark.parametrize("key_id", ["", "has space", "x" * 33, "a$b"])
def test_generate_refuses_a_bad_id(sqlite_sites: Any, key_id: str) -> None:
    done = cli(sqlite_sites(), "keys", "generate", "--id", key_id)
    assert done.exit_code == 2 and "key id" in done.output


# -- status and rotate on SQLite -----------------------------------------------------------------


def test_rotation_seals_plaintext_and_old_key_rows_and_the_old_key_can_then_go(sqlite_sites: Any) -> None:
    plain = fill(sqlite_sites(), 3, "plain")  # from before encryption was on
    old = fill(sqlite_sites(OLD), 4, "old")
    rotating = sqlite_sites(f"{NEW},{OLD}")
    before = cli(rotating, "keys", "status", "--json")
    document = json.loads(before.output)
    by_column = {(row["table"].rpartition("_")[2], row["column"]): row for row in document["tables"]}
    assert by_column[("messages", "content")]["rows_per_key_id"] == {"old1": 12}
    assert by_column[("messages", "content")]["plaintext_rows"] == 9
    assert by_column[("memory", "value")]["plaintext_rows"] == 3
    assert document["encrypts_with"] == "new2" and document["key_ids"] == ["new2", "old1"]

    dry = cli(rotating, "keys", "rotate", "--dry-run")
    assert (
        dry.exit_code == 0 and "7 rows of conversations, 21 rows of messages, 7 rows of memory" in dry.output
    )
    assert stored_key_ids(rotating) == {None, "old1"}  # a dry run changes nothing

    done = cli(rotating, "keys", "rotate", "--batch-size", "5")
    assert done.exit_code == 0, done.output
    assert "batch 1: re-encrypted 5 rows of conversations (5 of 35)" in done.output
    assert "re-encrypted under new2 in 9 batches: 7 conversations, 21 messages, 7 memory" in done.output
    assert stored_key_ids(rotating) == {"new2"}
    after = json.loads(cli(rotating, "keys", "status", "--json").output)
    assert all(
        set(row["rows_per_key_id"]) <= {"new2"} and row["plaintext_rows"] == 0 for row in after["tables"]
    )
    assert cli(rotating, "keys", "rotate").output.startswith("re-encrypted under new2 in 0 batches")

    alone = sqlite_sites(NEW)  # the old key dropped from the list
    read_all(alone, plain, "plain")
    read_all(alone, old, "old")
    strict = sqlite_sites(NEW, encryption_strict=True)  # and no plaintext is left to refuse
    read_all(strict, plain, "plain")

    lines = [json.loads(line) for line in Path(alone.audit_path).read_text().splitlines()]
    runs = [line for line in lines if line["command"] == "keys rotate"]
    # The dry run ran before there was an instance folder, which a read never creates.
    assert [line["phase"] for line in runs[:2]] == ["started", "batch"]
    assert runs[0]["plan"] == {"conversations": 7, "messages": 21, "memory": 7}
    assert sum(line["phase"] == "batch" for line in runs) == 9
    finished = [line for line in runs if line["phase"] == "finished"]
    assert finished[0]["counts"] == {"conversations": 7, "messages": 21, "memory": 7}


def test_a_value_that_cannot_be_decrypted_is_named_kept_and_the_rest_is_rotated(sqlite_sites: Any) -> None:
    fill(sqlite_sites(OLD), 2, "old")
    schema = tables(sqlite_sites().prefix)
    engine = sqlite_sites().engine
    with engine.begin() as conn:
        victim, text = conn.execute(sa.select(schema.messages.c.id, schema.messages.c.content).limit(1)).one()
        flipped = text[:-2] + ("A" if text[-2] != "A" else "B") + text[-1]
        conn.execute(sa.update(schema.messages).where(schema.messages.c.id == victim).values(content=flipped))
    rotating = sqlite_sites(f"{NEW},{OLD}")
    done = cli(rotating, "keys", "rotate")
    assert done.exit_code == 1
    assert (
        f"messages row {victim}" in done.output
        and "could not be decrypted and stay as they are" in done.output
    )
    with engine.connect() as conn:
        assert (
            conn.execute(sa.select(schema.messages.c.content).where(schema.messages.c.id == victim)).scalar()
            == flipped
        )
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.messages)).scalar() == 6
    assert stored_key_ids(rotating) == {"new2", "old1"}
    no_key_in(done.output)


def test_a_row_the_agent_writes_during_a_batch_is_left_as_written(sqlite_sites: Any) -> None:
    site = sqlite_sites(OLD)
    site.memory.set("fact", "before", "default")
    rotating = sqlite_sites(f"{NEW},{OLD}")
    with rotating.engine.connect() as conn:
        [row] = sql_rotation.rows_behind(conn, rotating.prefix, "memory", "new2", "", 10)
    # Between the rotation's read and its write, the agent (already on the new keys) writes.
    rotating.memory.set("fact", "after", "default")
    assert sql_rotation.write_rotated(rotating.engine, rotating.prefix, "memory", [(row, ("x", None))]) == 0
    assert sqlite_sites(NEW).memory.get("fact", "default") == "after"


def test_rotation_without_keys_is_refused_in_one_line(sqlite_sites: Any) -> None:
    done = cli(sqlite_sites(), "keys", "rotate")
    assert done.exit_code == 1 and "encryption is off" in done.output and "Traceback" not in done.output


def test_no_command_but_generate_shows_a_key(sqlite_sites: Any, tmp_path: Path) -> None:
    fill(sqlite_sites(OLD), 2, "old")
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"{NEW}\n{OLD}\n")
    key_file.chmod(0o600)
    for site in (sqlite_sites(f"{NEW},{OLD}"), sqlite_sites(encryption_key_file=str(key_file))):
        outputs = [
            cli(site, "keys", "status"),
            cli(site, "keys", "status", "--json"),
            cli(site, "keys", "rotate", "--dry-run"),
            cli(site, "keys", "rotate"),
            cli(site, "keys", "--help"),
        ]
        for done in outputs:
            assert done.exit_code == 0, done.output
            no_key_in(done.output)
        no_key_in(Path(site.audit_path).read_text())
        assert "under new2" in outputs[0].output


def test_status_reads_only(tmp_path: Path, prefix: str) -> None:
    site = site_of(tmp_path, prefix, keys=OLD)
    done = cli(site, "keys", "status")
    assert done.exit_code == 1 and "no clawmem database" in done.output
    assert not (tmp_path / "clawmem.db").exists() and not (tmp_path / "instance").exists()


# -- SIGKILL mid-run ------------------------------------------------------------------------------


def _lines(instance: Path) -> list[dict[str, Any]]:
    path = instance / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _run(tmp_path: Path, url: str, prefix: str, keys: str, *args: str) -> subprocess.Popen[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "CLAW_DATABASE_URL": url,
        "CLAW_TABLE_PREFIX": prefix,
        "CLAW_INSTANCE_PATH": str(tmp_path / "instance"),
        "CLAW_ENCRYPTION_KEYS": keys,
    }
    return subprocess.Popen(
        [sys.executable, "-c", "from clawmem.cli import main; main()", "keys", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("backend", ["mysql", "postgres"])
@pytest.mark.slow
def test_a_rotation_killed_midway_is_carried_on_and_the_old_key_can_go(
    tmp_path: Path, prefix: str, backend: str
) -> None:
    old_site = site_of(tmp_path, prefix, backend, keys=OLD)
    create_tables(old_site.engine, prefix)
    try:
        said = fill(old_site, 4, "old")
        schema = tables(prefix)
        with old_site.engine.connect() as conn:
            ids = sorted(conn.execute(sa.select(schema.conversations.c.id)).scalars())
        url = old_site.engine.url.render_as_string(hide_password=False)
        instance = tmp_path / "instance"
        with old_site.engine.connect() as holder:
            holder.begin()
            # The third batch (one conversation each, by id) waits on this row lock.
            holder.execute(
                sa.select(schema.conversations.c.id)
                .where(schema.conversations.c.id == ids[2])
                .with_for_update()
            )
            process = _run(tmp_path, url, prefix, f"{NEW},{OLD}", "rotate", "--batch-size", "1")
            try:
                deadline = time.monotonic() + 60
                while sum(line["phase"] == "batch" for line in _lines(instance)) < 2:
                    assert process.poll() is None, process.communicate()
                    assert time.monotonic() < deadline, "timed out waiting for 2 batches"
                    time.sleep(0.02)
                process.send_signal(signal.SIGKILL)
            finally:
                if process.poll() is None:
                    process.kill()
                process.communicate(timeout=30)
            holder.rollback()
        assert process.returncode == -signal.SIGKILL
        killed = _lines(instance)
        assert [line["phase"] for line in killed] == ["started", "batch", "batch"]
        assert killed[0]["plan"] == {"conversations": 4, "messages": 12, "memory": 4}
        assert killed[-1]["total"] == {"conversations": 2}
        with old_site.engine.connect() as conn:
            titles = dict(
                conn.execute(sa.select(schema.conversations.c.id, schema.conversations.c.title)).all()
            )
        assert [key_id_of(titles[conversation_id]) for conversation_id in ids] == [
            "new2",
            "new2",
            "old1",
            "old1",
        ]

        rerun = _run(tmp_path, url, prefix, f"{NEW},{OLD}", "rotate")
        out, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, err
        assert "did not finish: it had committed 2 batches (2 conversations)" in out
        assert "re-encrypted under new2" in out and "2 conversations, 12 messages, 4 memory" in out
        after = _lines(instance)[3:]
        assert after[0]["previous_run_interrupted"]["run"] == killed[0]["run"]
        assert after[0]["plan"] == {"conversations": 2, "messages": 12, "memory": 4}
        assert after[-1]["phase"] == "finished" and after[-1]["outcome"] == "ok"

        status = _run(tmp_path, url, prefix, NEW, "status", "--json")
        out, err = status.communicate(timeout=120)
        assert status.returncode == 0, err
        no_key_in(out)
        assert all(set(row["rows_per_key_id"]) <= {"new2"} for row in json.loads(out)["tables"])
        alone = site_of(tmp_path, prefix, backend, keys=NEW)
        read_all(alone, said, "old")
        with pytest.raises(Undecryptable):  # and the old key alone no longer reads anything
            site_of(tmp_path, prefix, backend, keys=OLD).conversations.load(
                ids[0],
            )
    finally:
        drop_tables(old_site.engine, prefix)


# -- Redis and file memory -------------------------------------------------------------------------


@pytest.fixture(params=["file", "redis"])
def driver_sites(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[Any]:
    """Sites whose memory is in files or Redis (conversations on SQLite), by key list."""
    values: dict[str, Any] = {"memory_driver": request.param, "file_dir": str(tmp_path / "memory")}
    if request.param == "redis":
        from tests.conftest import backend_url

        values["redis_url"] = backend_url("redis")
    engine = create_engine(sql_url("sqlite", tmp_path))
    create_tables(engine, prefix)
    yield lambda keys="": site_of(tmp_path, prefix, keys=keys, **values)
    if request.param == "redis":
        import redis

        client = redis.Redis.from_url(values["redis_url"])
        for key in client.scan_iter(match=f"{prefix}phpclaw:*"):
            client.delete(key)
    drop_tables(engine, prefix)
    engine.dispose()


def test_rotation_reaches_redis_and_file_memory_and_keeps_expiry(driver_sites: Any) -> None:
    plain = driver_sites()
    for n in range(3):
        plain.memory.set(f"plain-{n}", {"n": n}, "default")
    old = driver_sites(OLD)
    for n in range(4):
        old.memory.set(f"old-{n}", f"old value {n}", "user:cust-9" if n % 2 else "default")
    old.memory.set("expiring", "soon", "default", ttl=3600)
    expires_at = old.driver.entry("default", "expiring").expires_at  # read while old1 opens it
    rotating = driver_sites(f"{NEW},{OLD}")
    memory_row = [
        row
        for row in json.loads(cli(rotating, "keys", "status", "--json").output)["tables"]
        if "memory" in row["table"] and row["table"].endswith("memory")
    ]
    assert memory_row[0]["rows_per_key_id"] == {"old1": 5} and memory_row[0]["plaintext_rows"] == 3
    assert "8 rows of memory" in cli(rotating, "keys", "rotate", "--dry-run").output

    done = cli(rotating, "keys", "rotate", "--batch-size", "2")
    assert done.exit_code == 0, done.output
    assert "8 memory" in done.output
    after = [
        row
        for row in json.loads(cli(rotating, "keys", "status", "--json").output)["tables"]
        if row["table"].endswith("memory")
    ]
    assert after[0]["rows_per_key_id"] == {"new2": 8} and after[0]["plaintext_rows"] == 0

    alone = driver_sites(NEW)
    assert [alone.memory.get(f"plain-{n}", "default") for n in range(3)] == [{"n": n} for n in range(3)]
    assert alone.memory.get("old-1", "user:cust-9") == "old value 1"
    assert alone.memory.get("old-2", "default") == "old value 2"
    entry = alone.driver.entry("default", "expiring")
    assert entry.value == "soon" and entry.expires_at == expires_at
    if alone.settings.memory_driver == "redis":
        ttl = alone.driver.client.ttl(alone.driver.entry_key("expiring", "default"))
        assert 0 < ttl <= 3600
    no_key_in(done.output)


def test_the_keys_group_is_mounted_as_flask_claw_keys(tmp_path: Path, prefix: str) -> None:
    from dashboard import create_app

    app = create_app(
        {
            "TESTING": True,
            "DATABASE_URL": sql_url("sqlite", tmp_path),
            "TABLE_PREFIX": prefix,
            "ENCRYPTION_KEYS": OLD,
        },
        instance_path=str(tmp_path / "instance"),
    )
    runner = app.test_cli_runner()
    generated = runner.invoke(args=["claw", "keys", "generate", "--id", "k7"])
    assert generated.exit_code == 0 and generated.output.startswith("k7:")
    create_tables(create_engine(sql_url("sqlite", tmp_path)), prefix)
    status = runner.invoke(args=["claw", "keys", "status"])
    assert status.exit_code == 0 and "new values are sealed under old1" in status.output
    no_key_in(status.output)


def test_a_key_store_in_the_tables_database_is_refused_in_one_line(sqlite_sites: Any) -> None:
    site = sqlite_sites(OLD, keystore_url=sqlite_sites().settings.database_url)
    for args in (["keys", "status"], ["keys", "rotate"], ["erase", "--user-id", "cust-1", "--yes"]):
        done = cli(site, *args)
        assert done.exit_code == 1, (args, done.output)
        assert "CLAW_KEYSTORE_URL names the database of CLAW_DATABASE_URL" in done.output
        assert "Traceback" not in done.output and len(done.output.strip().splitlines()) == 1
