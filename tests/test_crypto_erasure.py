"""Crypto-erasure: with a key store, each subject's rows are sealed under their own data key, and
``erase --user-id`` deletes that key after the rows. A copy of the database taken before the
erasure, put back afterwards, then yields nothing of the erased subject (a clear error, never
their text, never an empty result passed off as success), while a second subject's rows in the
same copy still read. On SQLite with a SQLite-file key store, and on MariaDB with a Redis one."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from clawmem.cli import ClawGroup
from clawmem.clock import FakeClock
from clawmem.crypto import generate_key, key_id_of
from clawmem.crypto.keystore import DATA_KEY_ID
from clawmem.encryption.ciphers import cipher_for, keystore_of
from clawmem.errors import Undecryptable
from clawmem.ids import new_id
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql import rotation as sql_rotation
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.turn.conversations import Message
from tests.conftest import backend_url

KEYS = generate_key("site1")
GONE, KEPT = "cust-erased-71", "cust-kept-72"


def secret_of(user_id: str) -> str:
    return f"ZEBRA-{user_id}-address 1 Main St"


def write_subject(site: Site, user_id: str) -> str:
    conversation_id = new_id()
    site.conversations.append(
        conversation_id,
        [Message("user", secret_of(user_id)), Message("tool", "done", "lookup", {"q": secret_of(user_id)})],
        user_id=user_id,
        title=f"about {secret_of(user_id)}",
    )
    site.memory.set("address", secret_of(user_id), f"user:{user_id}")
    return conversation_id


def raw_text(site: Site) -> str:
    """Return every stored encrypted column of the three tables, as stored."""
    schema = tables(site.prefix)
    found = []
    with site.engine.connect() as conn:
        for name, columns in sql_rotation.ROTATED.items():
            table = getattr(schema, name)
            for column in columns:
                found += [text for (text,) in conn.execute(sa.select(table.c[column])) if text]
    return "\n".join(found)


@pytest.fixture(params=["sqlite+file key store", "mariadb+redis key store"])
def world(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[dict[str, Any]]:
    """A site with a key store, and how to back its database up and put the copy back."""
    if request.param.startswith("sqlite"):
        database = f"sqlite:///{tmp_path / 'claw.db'}"
        (tmp_path / "keys").mkdir()
        keystore = f"sqlite:///{tmp_path / 'keys' / 'keys.db'}"
    else:
        database = backend_url("mysql")
        keystore = backend_url("redis")
    settings = Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=database,
        table_prefix=prefix,
        encryption_keys=KEYS,
        keystore_url=keystore,
    )
    engine = create_engine(database)
    create_tables(engine, prefix)
    site = Site(settings, FakeClock(1_800_000_000.0))
    schema = tables(prefix)

    def backup() -> Callable[[], None]:
        if request.param.startswith("sqlite"):
            copy = tmp_path / "backup.db"
            with sqlite3.connect(tmp_path / "claw.db") as source, sqlite3.connect(copy) as target:
                source.backup(target)

            def restore_file() -> None:
                site.engine.dispose()
                for suffix in ("-wal", "-shm"):
                    (tmp_path / f"claw.db{suffix}").unlink(missing_ok=True)
                shutil.copyfile(copy, tmp_path / "claw.db")

            return restore_file
        # A logical dump of the site's three tables, as mysqldump would take it.
        with site.engine.connect() as conn:
            dump = {
                table.name: [dict(row) for row in conn.execute(sa.select(table)).mappings()]
                for table in (schema.conversations, schema.messages, schema.memory)
            }

        def restore_dump() -> None:
            with site.engine.begin() as conn:
                for table in (schema.conversations, schema.messages, schema.memory):
                    conn.execute(sa.delete(table))
                    if dump[table.name]:
                        conn.execute(sa.insert(table), dump[table.name])

        return restore_dump

    yield {"site": site, "backup": backup, "settings": settings}
    store = keystore_of(cipher_for(settings))
    if store is not None and hasattr(store.backend, "keys_hash"):
        backend = store.backend
        backend.client.delete(backend.keys_hash, backend.subjects_hash, backend.generation_key)
    drop_tables(engine, prefix)
    engine.dispose()


def test_an_erased_subjects_rows_in_an_older_backup_cannot_be_read(world: dict[str, Any]) -> None:
    site: Site = world["site"]
    gone, kept = write_subject(site, GONE), write_subject(site, KEPT)
    stored = raw_text(site)
    assert secret_of(GONE) not in stored and "ZEBRA" not in stored
    # Each subject's rows are under a data key of their own, not the site key.
    with site.engine.connect() as conn:
        titles = dict(
            conn.execute(
                sa.select(tables(site.prefix).conversations.c.id, tables(site.prefix).conversations.c.title)
            ).all()
        )
    assert DATA_KEY_ID.fullmatch(key_id_of(titles[gone]) or "") and DATA_KEY_ID.fullmatch(
        key_id_of(titles[kept]) or ""
    )
    assert key_id_of(titles[gone]) != key_id_of(titles[kept])

    restore = world["backup"]()
    erased = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["erase", "--user-id", GONE, "--yes"])
    assert erased.exit_code == 0, erased.output
    assert "deleted 1 conversation, 2 messages and 1 memory entry" in erased.output
    assert "deleted the subject's data key from the key store" in erased.output
    audit = [json.loads(line) for line in Path(site.audit_path).read_text().splitlines()]
    assert audit[0]["plan"]["subject_keys"] == 1
    assert audit[-1]["phase"] == "finished" and audit[-1]["counts"]["subject_keys"] == 1
    assert GONE not in Path(site.audit_path).read_text()

    restore()  # the old copy of the database is back, the erased subject's rows with it
    for reader in (site, Site(world["settings"], FakeClock(1_800_000_100.0))):
        assert reader.conversations.get(gone) is not None  # the rows are there...
        with pytest.raises(Undecryptable) as raised:  # ...and cannot be read
            reader.conversations.load(gone)
        assert "ZEBRA" not in str(raised.value) and "conversations" in str(raised.value)
        with pytest.raises(Undecryptable):
            reader.memory.get("address", f"user:{GONE}")
        kept_back = reader.conversations.load(kept)
        assert [message.content for message in kept_back.messages][0] == secret_of(KEPT)
        assert kept_back.title == f"about {secret_of(KEPT)}"
        assert reader.memory.get("address", f"user:{KEPT}") == secret_of(KEPT)
    # Lists skip the unreadable entry rather than hand back its ciphertext as its value.
    listed = {row.key: row for row in site.driver.records(f"user:{GONE}")}
    assert "address" not in listed or listed["address"].unreadable
    assert all("ZEBRA" not in json.dumps(row.value, default=str) for row in listed.values())


def test_erase_dry_run_says_the_key_would_go_and_keeps_it(world: dict[str, Any]) -> None:
    site: Site = world["site"]
    conversation = write_subject(site, GONE)
    dry = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["erase", "--user-id", GONE, "--dry-run"])
    assert dry.exit_code == 0 and "would delete the subject's data key from the key store" in dry.output
    assert keystore_of(cipher_for(world["settings"])).has_key(GONE)
    assert site.conversations.load(conversation).messages[0].content == secret_of(GONE)


def test_a_second_erase_finds_no_key_and_says_so(world: dict[str, Any]) -> None:
    site: Site = world["site"]
    write_subject(site, GONE)
    group = ClawGroup("clawmem", lambda: site)
    assert CliRunner().invoke(group, ["erase", "--user-id", GONE, "--yes"]).exit_code == 0
    again = CliRunner().invoke(group, ["erase", "--user-id", GONE, "--yes"])
    assert again.exit_code == 0 and "holds no data key of this subject" in again.output


def test_status_counts_subject_keys_per_master_key(world: dict[str, Any]) -> None:
    site: Site = world["site"]
    write_subject(site, GONE)
    write_subject(site, KEPT)
    done = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["keys", "status", "--json"])
    document = json.loads(done.output)
    assert document["key_store"]["subject_keys_per_master_key_id"] == {"site1": 2}
    text = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["keys", "status"]).output
    assert "2 subject keys wrapped by site1" in text and "under subjects' data keys" in text
    assert KEYS.partition(":")[2] not in done.output + text


def test_rotation_moves_rows_from_before_the_key_store_under_the_subjects_key(world: dict[str, Any]) -> None:
    site: Site = world["site"]
    before = Site(world["settings"].replace(keystore_url=""), FakeClock(1_800_000_000.0))
    conversation = write_subject(before, GONE)
    before.memory.set("policy", "30 days", "default")  # nobody's: stays under the site key
    group = ClawGroup("clawmem", lambda: site)
    dry = CliRunner().invoke(group, ["keys", "rotate", "--dry-run"])
    assert "1 row of conversations, 2 rows of messages, 1 row of memory" in dry.output, dry.output
    done = CliRunner().invoke(group, ["keys", "rotate"])
    assert done.exit_code == 0 and "1 conversations, 2 messages, 1 memory" in done.output, done.output
    schema = tables(site.prefix)
    with site.engine.connect() as conn:
        title = conn.execute(sa.select(schema.conversations.c.title)).scalar()
        values = dict(conn.execute(sa.select(schema.memory.c.namespace, schema.memory.c.value)).all())
    assert DATA_KEY_ID.fullmatch(key_id_of(title) or "") and DATA_KEY_ID.fullmatch(
        key_id_of(values[f"user:{GONE}"]) or ""
    )
    assert key_id_of(values["default"]) == "site1"
    again = CliRunner().invoke(group, ["keys", "rotate"])
    assert "in 0 batches" in again.output, again.output
    # And so the erasure now reaches a backup of them too.
    restore = world["backup"]()
    assert CliRunner().invoke(group, ["erase", "--user-id", GONE, "--yes"]).exit_code == 0
    restore()
    with pytest.raises(Undecryptable):
        Site(world["settings"], FakeClock(1_800_000_200.0)).conversations.load(conversation)
