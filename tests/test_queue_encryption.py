"""A queued turn's payload holds the customer's message: with encryption on, the queue's own
storage (Huey's SQLite file, or Redis) never holds it in plain, a payload moved to another turn's
key does not open, and a worker still runs the turn."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawmem.clock import FakeClock
from clawmem.crypto import Cipher, Keyring, generate_key
from clawmem.errors import Undecryptable
from clawmem.jobs import TurnQueue
from clawmem.jobs.backend import PayloadSeal, open_huey, queue_location
from clawmem.providers import EchoProvider
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables
from clawmem.turn.pipeline import Claw

MESSAGE = "my card is 4242 ZEBRAQUEUE-7731, please refund"
DISTINCTIVE = b"ZEBRAQUEUE-7731"
KEYS = generate_key("q1")


@pytest.fixture(params=["sqlite", "redis"])
def settings(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[Settings]:
    """An encrypted site on SQLite with its queue in a SQLite file, then on Redis."""
    instance = tmp_path / "instance"
    instance.mkdir()
    built = Settings(
        instance_path=str(instance),
        database_url=f"sqlite:///{tmp_path / 'claw.db'}",
        table_prefix=prefix,
        encryption_keys=KEYS,
    )
    if request.param == "redis":
        url = os.environ.get("CLAW_TEST_REDIS_URL")
        if not url:
            pytest.skip("CLAW_TEST_REDIS_URL is not set")
        built = built.replace(queue_url=url)
    engine = engine_for(built.database_url)
    create_tables(engine, prefix)
    yield built
    drop_tables(engine, prefix)
    if request.param == "redis":
        import redis

        client = redis.Redis.from_url(built.queue_url)
        for key in client.scan_iter(match=f"*{prefix}*"):
            client.delete(key)


def raw_queue(settings: Settings) -> bytes:
    """Return every byte the queue's storage holds for this site: the SQLite file and its WAL
    as they are on disk, or every value of the site's Redis keys."""
    location = queue_location(settings)
    if location.kind == "sqlite":
        found = b""
        for suffix in ("", "-wal"):
            path = Path(location.where + suffix)
            if path.exists():
                found += path.read_bytes()
        with sqlite3.connect(location.where) as conn:
            found += b"".join(bytes(value) for (value,) in conn.execute("select value from kv"))
        return found
    import redis

    client = redis.Redis.from_url(settings.queue_url)
    found = b""
    for key in client.scan_iter(match=f"*{location.name}*"):
        kind = client.type(key)
        if kind == b"string":
            found += client.get(key) or b""
        elif kind == b"hash":
            found += b"".join(k + v for k, v in client.hgetall(key).items())
        elif kind == b"list":
            found += b"".join(client.lrange(key, 0, -1))
        found += key
    return found


def test_the_queue_never_holds_the_message_and_a_worker_still_runs_the_turn(settings: Settings) -> None:
    clock = FakeClock(1_800_000_000.0)
    queue = TurnQueue(
        Site(settings, clock), open_huey(settings), lambda: Claw.from_settings(settings, EchoProvider())
    )
    job_id = queue.enqueue(MESSAGE, user_id="cust-4242")
    record = queue.job(job_id)
    raw = raw_queue(settings)
    assert record.conversation_id.encode() in raw  # the storage was read: the turn's key is there
    assert DISTINCTIVE not in raw and b"refund" not in raw
    # The worker's path: the payload opens, the turn runs and is stored.
    assert queue.store.turn(job_id, record.conversation_id, record.position)["message"] == MESSAGE
    done = queue.run(job_id, record.conversation_id, record.position)
    assert isinstance(done, dict) and done["job_id"] == job_id
    assert queue.job(job_id).status == "done"
    loaded = Site(settings, clock).conversations.load(record.conversation_id)
    said = {message.role: message.content for message in loaded.messages}
    assert said["user"] == MESSAGE and MESSAGE in said["assistant"]  # the echo provider's reply


def test_without_keys_the_payload_is_the_json_it_always_was() -> None:
    sealed = PayloadSeal().seal("clawmem.turn.c1.1", {"message": MESSAGE})
    assert DISTINCTIVE in sealed and PayloadSeal().open("clawmem.turn.c1.1", sealed) == {"message": MESSAGE}


def test_a_payload_moved_to_another_turn_or_site_or_key_does_not_open() -> None:
    cipher = Cipher(Keyring.from_text(KEYS))
    seal = PayloadSeal(cipher, "wp_")
    sealed = seal.seal("clawmem.turn.c1.1", {"message": MESSAGE})
    assert DISTINCTIVE not in sealed and sealed.startswith(b"cm1$q1$")
    assert seal.open("clawmem.turn.c1.1", sealed) == {"message": MESSAGE}
    for other_seal, key in [
        (seal, "clawmem.turn.c1.2"),
        (PayloadSeal(cipher, "wp_2_"), "clawmem.turn.c1.1"),
        (PayloadSeal(Cipher(Keyring.from_text(generate_key("q1")))), "clawmem.turn.c1.1"),
        (PayloadSeal(), "clawmem.turn.c1.1"),
    ]:
        with pytest.raises(Undecryptable) as raised:
            other_seal.open(key, sealed)
        assert MESSAGE not in str(raised.value) and "q1" in str(raised.value)


def test_a_damaged_payload_is_refused(tmp_path: Path) -> None:
    seal = PayloadSeal(Cipher(Keyring.from_text(KEYS)))
    with pytest.raises(ValueError, match="damaged"):
        seal.open("clawmem.turn.c1.1", b"\xff\xfe")
    flipped = bytearray(seal.seal("clawmem.turn.c1.1", {"message": MESSAGE}))
    flipped[-3] ^= 0x01
    with pytest.raises(Undecryptable):
        seal.open("clawmem.turn.c1.1", bytes(flipped))
