"""An erasure seen by every process of the site at its next read: a second process that served
the subject before ``erase --user-id`` (so it holds their data key and opened rows), reading a
copy of the database taken before the erasure and put back right after it, gets a clear error
for every read of the subject and none of their text, in a load, a memory read, a search or a
turn, while the other subject's rows in the same copy still read. No clock moves in between.

On SQLite with a SQLite-file key store, on MariaDB with the key store on PostgreSQL, and on
PostgreSQL with the key store on Redis. Also: a search another process kept drops the subject's
matches, and the check costs a turn two reads of the key store, however long its history.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from clawmem.cli import ClawGroup
from clawmem.clock import FakeClock
from clawmem.crypto import Cipher, Keyring, generate_key
from clawmem.encryption.ciphers import cipher_for, keystore_of, open_keystore
from clawmem.errors import Undecryptable
from clawmem.ids import new_id
from clawmem.providers import EchoProvider
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql.engine import create_engine
from clawmem.sql.keystore import generation_table, key_table
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.turn.conversations import ConversationLog, Message
from clawmem.turn.pipeline import Claw
from tests.conftest import backend_url

ROOT = Path(__file__).resolve().parent.parent
KEYS = generate_key("site1")
GONE, KEPT = "cust-erased-81", "cust-kept-82"
# The database, then where the key store is ("servers" marks the MariaDB and PostgreSQL ones).
WORLDS = ["sqlite-keys-sqlite", "mysql-keys-postgres", "postgres-keys-redis"]


def secret_of(user_id: str) -> str:
    return f"ZEBRA-{user_id}-lives at 1 Main St"


@dataclass
class Reader:
    """The second process: one JSON command a line in, one JSON answer a line out."""

    process: subprocess.Popen[str]

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the reader exited: {self.process.stderr.read() if self.process.stderr else ''}"
        return json.loads(line)

    def read(self, conversation_id: str, user_id: str) -> dict[str, Any]:
        return self.ask(
            {"do": "read", "conversation_id": conversation_id, "user_id": user_id, "query": "ZEBRA"}
        )

    def turn(self, conversation_id: str, user_id: str) -> dict[str, Any]:
        message = "where do I live? address"
        return self.ask(
            {"do": "turn", "conversation_id": conversation_id, "user_id": user_id, "message": message}
        )


@pytest.fixture(params=WORLDS)
def world(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[dict[str, Any]]:
    """A site with a key store, a way to copy its database and put the copy back in place."""
    kind = request.param.split("-")[0]
    if kind == "sqlite":
        database = f"sqlite:///{tmp_path / 'claw.db'}"
        (tmp_path / "keys").mkdir()
        keystore = f"sqlite:///{tmp_path / 'keys' / 'keys.db'}"
    elif kind == "mysql":
        database, keystore = backend_url("mysql"), backend_url("postgres")
    else:
        database, keystore = backend_url("postgres"), backend_url("redis")
    fields = {
        "instance_path": str(tmp_path / "instance"),
        "database_url": database,
        "table_prefix": prefix,
        "encryption_keys": KEYS,
        "keystore_url": keystore,
    }
    settings = Settings(**fields)
    engine = create_engine(database)
    create_tables(engine, prefix)
    schema = tables(prefix)
    site = Site(settings, FakeClock(1_800_000_000.0))

    def backup() -> Callable[[], None]:
        if kind == "sqlite":
            copy = tmp_path / "backup.db"
            with sqlite3.connect(tmp_path / "claw.db") as source, sqlite3.connect(copy) as target:
                source.backup(target)

            def restore_file() -> None:
                # Put back in place, as the reader keeps its connections open: SQLite's backup
                # into the live database, which every connection to it then reads.
                with sqlite3.connect(copy) as source, sqlite3.connect(tmp_path / "claw.db") as target:
                    source.backup(target)

            return restore_file
        with engine.connect() as conn:  # a logical dump of the site's three tables
            dump = {
                table.name: [dict(row) for row in conn.execute(sa.select(table)).mappings()]
                for table in (schema.conversations, schema.messages, schema.memory)
            }

        def restore_dump() -> None:
            with engine.begin() as conn:
                for table in (schema.messages, schema.conversations, schema.memory):
                    conn.execute(sa.delete(table))
                for table in (schema.conversations, schema.messages, schema.memory):
                    if dump[table.name]:
                        conn.execute(sa.insert(table), dump[table.name])

        return restore_dump

    process = subprocess.Popen(
        [sys.executable, "-m", "tests.subject_reader", json.dumps(fields)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reader = Reader(process)
    try:
        assert process.stdout is not None and json.loads(process.stdout.readline() or "{}") == {
            "ready": True
        }, process.stderr.read() if process.stderr else ""
        yield {"site": site, "backup": backup, "reader": reader}
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        store = keystore_of(cipher_for(settings))
        assert store is not None
        backend: Any = store.backend
        if hasattr(backend, "keys_hash"):
            backend.client.delete(backend.keys_hash, backend.subjects_hash, backend.generation_key)
        elif kind != "sqlite":
            for table in (key_table(prefix), generation_table(prefix)):
                table.drop(backend.engine, checkfirst=True)
        drop_tables(engine, prefix)
        engine.dispose()


def write_subject(site: Site, user_id: str) -> str:
    conversation_id = new_id()
    site.conversations.append(
        conversation_id,
        [Message("user", secret_of(user_id)), Message("assistant", "noted")],
        user_id=user_id,
        title=f"about {secret_of(user_id)}",
    )
    site.memory.set("address", secret_of(user_id), f"user:{user_id}")
    return conversation_id


def test_a_process_that_served_the_subject_reads_nothing_of_them_from_a_copy_put_back(
    world: dict[str, Any],
) -> None:
    site: Site = world["site"]
    reader: Reader = world["reader"]
    gone, kept = write_subject(site, GONE), write_subject(site, KEPT)
    # The reader serves both subjects: their data keys and opened rows are now in it.
    for conversation_id, user_id in ((gone, GONE), (kept, KEPT)):
        served = reader.turn(conversation_id, user_id)
        assert "error" not in served and secret_of(user_id) in json.dumps(served["value"]["sent"])
        before = reader.read(conversation_id, user_id)
        assert secret_of(user_id) in before["load"]["value"]["contents"]
        assert before["memory"] == {"value": secret_of(user_id)}
        assert before["search"]["value"]["ids"] == [conversation_id]

    restore = world["backup"]()
    erased = CliRunner().invoke(ClawGroup("clawmem", lambda: site), ["erase", "--user-id", GONE, "--yes"])
    assert erased.exit_code == 0, erased.output
    assert "deleted the subject's data key from the key store" in erased.output
    restore()  # the copy from before the erasure is back, the erased subject's rows with it

    after = reader.read(gone, GONE)
    assert "ZEBRA" not in json.dumps(after), after
    assert after["load"]["error"] == "Undecryptable" and "conversations row" in after["load"]["message"]
    assert after["memory"]["error"] == "Undecryptable"
    assert after["search"] == {"value": {"ids": [], "snippets": {}}}
    turn = reader.turn(gone, GONE)
    assert turn["error"] == "Undecryptable" and "ZEBRA" not in json.dumps(turn)
    # A new conversation of theirs recalls nothing of their facts: the entry is skipped.
    fresh = reader.turn(new_id(), GONE)
    assert "error" not in fresh and "ZEBRA" not in json.dumps(fresh), fresh
    # The other subject, in the same copy, still reads in that process.
    other = reader.read(kept, KEPT)
    assert secret_of(KEPT) in other["load"]["value"]["contents"]
    assert other["memory"] == {"value": secret_of(KEPT)}
    assert other["search"]["value"]["ids"] == [kept]
    assert secret_of(KEPT) in json.dumps(reader.turn(kept, KEPT)["value"]["sent"])


def test_a_search_kept_by_another_process_drops_the_erased_subjects_matches(tmp_path: Path) -> None:
    # The other process is this one's second key store and cipher: the state a process keeps.
    settings = Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=f"sqlite:///{tmp_path / 'claw.db'}",
        encryption_keys=KEYS,
        keystore_url=f"sqlite:///{tmp_path / 'keys.db'}",
    )
    create_tables(create_engine(settings.database_url))
    site = Site(settings, FakeClock(1_800_000_000.0))
    gone = write_subject(site, GONE)
    keyring = Keyring.from_settings(settings)
    elsewhere = ConversationLog(
        site.engine, cipher=Cipher(keyring, open_keystore(settings, keyring)), clock=site.clock
    )
    assert [row.id for row in elsewhere.list(query="ZEBRA").items] == [gone]
    assert elsewhere.first_matches([gone], "ZEBRA") == {gone: secret_of(GONE)}
    # Erased here; the rows stay, as in a copy put back. No clock moves.
    assert keystore_of(site.cipher).erase(GONE) != []
    assert elsewhere.first_matches([gone], "ZEBRA") == {}
    assert elsewhere.list(query="ZEBRA").items == []
    with pytest.raises(Undecryptable):
        elsewhere.load(gone)


def test_a_turn_asks_the_key_store_about_erasures_twice_whatever_its_history(tmp_path: Path) -> None:
    # Once for the turn's reads (history, recall) and once for its write: not once a message.
    settings = Settings(
        instance_path=str(tmp_path / "instance"),
        database_url=f"sqlite:///{tmp_path / 'claw.db'}",
        encryption_keys=KEYS,
        keystore_url=f"sqlite:///{tmp_path / 'keys.db'}",
    )
    create_tables(create_engine(settings.database_url))
    claw = Claw.from_settings(settings, EchoProvider(), clock=FakeClock(1_800_000_000.0))
    conversation_id = write_subject(Site(settings), GONE)
    claw.conversations.append(
        conversation_id, [Message("user", f"note {n}") for n in range(40)], user_id=GONE
    )
    claw.send("where do I live? address", conversation_id, GONE)  # the keys are kept from here on
    store = keystore_of(cipher_for(settings))
    assert store is not None
    asked = []
    read = store.backend.generation
    store.backend.generation = lambda: asked.append(1) or read()  # type: ignore[method-assign]
    reply = claw.send("where do I live? address", conversation_id, GONE)
    assert secret_of(GONE) in reply.text and len(asked) == 2
