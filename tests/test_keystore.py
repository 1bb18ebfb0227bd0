"""The key store of per-subject data keys: keys wrapped by the master key and bound to their
subject, one key per subject even when two processes make it at once, erasure that leaves the
subject's sealed text unreadable, re-wrapping under a new master key, and a URL that would keep
the keys beside the data they protect refused in one line."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.crypto import Cipher, Context, Keyring, generate_key
from clawmem.crypto.keystore import (
    DATA_KEY_ID,
    KeyStore,
    RedisKeyBackend,
    WrappedKey,
    check_keystore_url,
    subject_hash,
)
from clawmem.errors import ConfigError, KeyStoreError, Undecryptable
from clawmem.settings import Settings
from clawmem.sql.engine import create_engine
from clawmem.sql.keystore import SqlKeyBackend, generation_table, key_table
from tests.conftest import backend_url

K1 = generate_key("k1")
K2 = generate_key("k2")
PLACE = Context.row("", "messages", "01JABCDEFGHJKMNPQRSTVWXYZ0", "content")


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An empty key store backend: a SQLite file of its own, or a Redis under a prefix of its own."""
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    if request.param == "sqlite":
        engine = create_engine(f"sqlite:///{tmp_path / 'keys.db'}")
        yield SqlKeyBackend(engine, prefix, "sqlite keys.db")
        engine.dispose()
        return
    import redis

    client = redis.Redis.from_url(backend_url("redis"))
    found = RedisKeyBackend(client, prefix, "redis")
    yield found
    client.delete(found.keys_hash, found.subjects_hash, found.generation_key)


def store(backend: Any, keys: str = K1) -> KeyStore:
    return KeyStore(backend, Keyring.from_text(keys), site="wp_")


def test_a_subject_keeps_one_key_and_rows_sealed_with_it_open_in_another_process(backend: Any) -> None:
    first = store(backend)
    key = first.subject_key("user:cust-42")
    assert DATA_KEY_ID.fullmatch(key.key_id)
    assert first.subject_key("user:cust-42") == key
    assert first.subject_key("user:cust-43").key_id != key.key_id
    sealed = Cipher(Keyring.from_text(K1), first).seal("my address is 1 Main St", PLACE, "user:cust-42")
    assert sealed.startswith(f"cm1${key.key_id}$")
    # Another process: the same master key, a fresh cipher and key store over the same backend.
    again = Cipher(Keyring.from_text(K1), store(backend))
    assert again.open(sealed, PLACE) == "my address is 1 Main St"


def test_the_store_holds_neither_the_data_key_nor_the_subject(backend: Any) -> None:
    keys = store(backend)
    key = keys.subject_key("user:cust-42")
    held = backend.by_id(key.key_id)
    assert held.subject == subject_hash("wp_", "user:cust-42") and "cust-42" not in repr(held)
    assert key.secret not in held.wrapped.encode() and len(held.wrapped) > 40
    assert held.master_id == "k1"


def test_two_first_writes_at_once_agree_on_one_key(backend: Any) -> None:
    # The second process made its own key before seeing the first's: the store keeps the first.
    first, second = store(backend), store(backend)
    hashed = subject_hash("wp_", "user:race")
    winner = first.subject_key("user:race")
    loser = WrappedKey("s-" + "0" * 26, hashed, "k1", "x" * 80)
    assert backend.add(loser).key_id == winner.key_id
    assert second.subject_key("user:race") == winner


def test_erasing_the_key_leaves_the_subject_unreadable_and_others_readable(backend: Any) -> None:
    keyring = Keyring.from_text(K1)
    writer = Cipher(keyring, store(backend))
    gone = writer.seal("erase me", PLACE, "user:gone")
    kept = writer.seal("keep me", PLACE, "user:kept")
    assert store(backend).erase("user:gone") != []
    assert store(backend).erase("user:gone") == []  # a second erasure finds nothing
    reader = Cipher(keyring, store(backend))
    with pytest.raises(Undecryptable) as raised:
        reader.open(gone, PLACE)
    assert "erase me" not in str(raised.value) and "messages row" in str(raised.value)
    assert reader.open(kept, PLACE) == "keep me"


def test_another_process_stops_reading_an_erased_subject_at_its_next_read(backend: Any) -> None:
    keyring = Keyring.from_text(K1)
    sealed = Cipher(keyring, store(backend)).seal("erase me", PLACE, "user:gone")
    kept = Cipher(keyring, store(backend)).seal("keep me", PLACE, "user:kept")
    clock = FakeClock(1_000.0)
    reader = Cipher(keyring, KeyStore(backend, keyring, site="wp_", clock=clock))
    assert reader.open(sealed, PLACE) == "erase me" and reader.open(kept, PLACE) == "keep me"
    before = backend.generation()
    assert store(backend).erase("user:gone") != []  # by another process
    assert backend.generation() != before
    after = backend.generation()
    # No time passes: the key this process kept is not used again once the store says one went.
    with pytest.raises(Undecryptable):
        reader.open(sealed, PLACE)
    with reader.reading(), pytest.raises(Undecryptable):
        reader.open(sealed, PLACE)
    assert reader.open(kept, PLACE) == "keep me"
    assert store(backend).erase("user:nobody") == [] and backend.generation() == after


def test_within_one_read_the_store_is_asked_once(backend: Any) -> None:
    keyring = Keyring.from_text(K1)
    sealed = [Cipher(keyring, store(backend)).seal(f"row {n}", PLACE, "user:a") for n in range(5)]
    keys = store(backend)
    reader = Cipher(keyring, keys)
    asked = []
    read = backend.generation
    backend.generation = lambda: asked.append(1) or read()
    assert [reader.open(text, PLACE) for text in sealed[:1]] == ["row 0"]  # first read: a miss
    asked.clear()
    with reader.reading():
        assert [reader.open(text, PLACE) for text in sealed] == [f"row {n}" for n in range(5)]
    assert len(asked) == 1
    asked.clear()
    assert reader.open(sealed[0], PLACE) == "row 0"  # outside a block: once a use
    assert len(asked) == 1


def test_a_sql_store_from_before_the_generation_table_gets_it_at_its_first_erasure(tmp_path: Path) -> None:
    keyring = Keyring.from_text(K1)
    engine = create_engine(f"sqlite:///{tmp_path / 'keys.db'}")

    def process() -> KeyStore:
        return KeyStore(SqlKeyBackend(engine, "wp_", "keys.db"), keyring, site="wp_")

    sealed = Cipher(keyring, process()).seal("erase me", PLACE, "user:gone")
    generation_table("wp_").drop(engine)  # as a store made by an earlier release has it
    reader = Cipher(keyring, process())
    assert reader.open(sealed, PLACE) == "erase me" and reader.open(sealed, PLACE) == "erase me"
    assert process().erase("user:gone") != []
    assert sa.inspect(engine).has_table(generation_table("wp_").name)
    with pytest.raises(Undecryptable):
        reader.open(sealed, PLACE)
    engine.dispose()


def test_a_generation_deleted_by_hand_still_shows_the_next_erasure(backend: Any) -> None:
    keyring = Keyring.from_text(K1)
    sealed = Cipher(keyring, store(backend)).seal("erase me", PLACE, "user:gone")
    store(backend).subject_key("user:first")
    store(backend).erase("user:first")  # the generation is above 0 now
    reader = Cipher(keyring, store(backend))
    assert reader.open(sealed, PLACE) == "erase me" and reader.open(sealed, PLACE) == "erase me"
    if isinstance(backend, RedisKeyBackend):
        backend.client.delete(backend.generation_key)  # deleted, or evicted
    else:
        with backend.engine.begin() as conn:
            conn.execute(sa.delete(generation_table(backend.prefix)))
    assert store(backend).erase("user:gone") != []
    with pytest.raises(Undecryptable):
        reader.open(sealed, PLACE)


def test_a_damaged_generation_in_redis_is_a_clear_error_and_no_key_is_used() -> None:
    import redis

    client = redis.Redis.from_url(backend_url("redis"))
    backend = RedisKeyBackend(client, f"t{uuid.uuid4().hex[:8]}_", "redis")
    keyring = Keyring.from_text(K1)
    try:
        sealed = Cipher(keyring, store(backend)).seal("erase me", PLACE, "user:gone")
        reader = Cipher(keyring, store(backend))
        assert reader.open(sealed, PLACE) == "erase me"
        client.set(backend.generation_key, "not a number")  # another program wrote it
        with pytest.raises(KeyStoreError, match="generation in redis is not a number"):
            reader.open(sealed, PLACE)
    finally:
        client.delete(backend.keys_hash, backend.subjects_hash, backend.generation_key)


def test_a_wrapped_key_copied_to_another_subject_does_not_unwrap(backend: Any) -> None:
    keys = store(backend)
    mine = backend.by_id(keys.subject_key("user:mine").key_id)
    theirs = backend.by_id(keys.subject_key("user:theirs").key_id)
    forged = WrappedKey(theirs.key_id, theirs.subject, theirs.master_id, mine.wrapped)
    assert backend.rewrap([(theirs, forged)]) == 1
    with pytest.raises(KeyStoreError, match=f"{theirs.key_id} does not unwrap under the master key 'k1'"):
        store(backend).key_by_id(theirs.key_id)


def test_rewrapping_moves_every_key_under_the_first_master_key(backend: Any) -> None:
    old = store(backend, K1)
    keys = {name: old.subject_key(f"user:{name}") for name in ("a", "b", "c")}
    sealed = Cipher(Keyring.from_text(K1), old).seal("still here", PLACE, "user:b")
    rotated = store(backend, f"{K2},{K1}")
    assert rotated.counts() == {"k1": 3}
    assert [batch.keys for batch in rotated.rewrap(batch_size=2)] == [2, 1]
    assert rotated.counts() == {"k2": 3}
    assert list(rotated.rewrap()) == []
    # The old master key can go: every data key unwraps under the new one alone.
    alone = store(backend, K2)
    assert {name: alone.subject_key(f"user:{name}") for name in keys} == keys
    assert Cipher(Keyring.from_text(K2), alone).open(sealed, PLACE) == "still here"


def test_a_key_under_a_master_key_no_longer_listed_is_a_clear_error(backend: Any) -> None:
    key = store(backend, K1).subject_key("user:a")
    with pytest.raises(KeyStoreError) as raised:
        store(backend, K2).key_by_id(key.key_id)
    message = str(raised.value)
    assert f"{key.key_id} is wrapped by the master key 'k1', which the keyring does not list" in message
    assert K1.partition(":")[2] not in message and K2.partition(":")[2] not in message


def test_reading_an_empty_sql_store_creates_no_table(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'keys.db'}")
    keys = KeyStore(SqlKeyBackend(engine, "", "keys.db"), Keyring.from_text(K1))
    assert keys.key_by_id("s-" + "0" * 26) is None and keys.counts() == {} and keys.erase("user:x") == []
    assert not sa.inspect(engine).has_table(key_table("").name)
    engine.dispose()


def test_a_sqlite_key_store_that_does_not_exist_is_read_as_empty_and_made_on_first_key(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys" / "keys.db"
    keys = KeyStore(SqlKeyBackend.from_url(f"sqlite:///{path}", "", "keys.db"), Keyring.from_text(K1))
    assert keys.counts() == {} and keys.key_by_id("s-" + "0" * 26) is None and not keys.has_key("cust-1")
    assert not path.exists() and not path.parent.exists()
    keys.subject_key("cust-1")
    assert path.is_file() and (path.stat().st_mode & 0o077) == 0 and keys.counts() == {"k1": 1}


def test_an_unreachable_store_is_a_key_store_error_without_the_password() -> None:
    import redis

    client = redis.Redis.from_url("redis://:hunter2@127.0.0.1:1/0", socket_connect_timeout=1)
    keys = KeyStore(RedisKeyBackend(client, "", "redis://:***@127.0.0.1:1/0"), Keyring.from_text(K1))
    with pytest.raises(KeyStoreError) as raised:
        keys.subject_key("user:a")
    assert "key store" in str(raised.value) and "hunter2" not in str(raised.value)


def test_a_master_key_id_shaped_like_a_data_key_id_is_refused() -> None:
    with pytest.raises(ConfigError, match="has the form of a subject's data key id"):
        KeyStore(RedisKeyBackend(None, "", "x"), Keyring.from_text(generate_key("s-" + "A" * 26)))


# -- the URL ---------------------------------------------------------------------------------------


def settings(tmp_path: Path, **values: str) -> Settings:
    return Settings(instance_path=str(tmp_path), encryption_keys=K1, **values)


@pytest.mark.parametrize(
    ("database", "keystore"),
    [
        ("mysql+pymysql://root@127.0.0.1:3306/test", "mysql+pymysql://root@localhost/test"),
        ("postgresql+psycopg://u:pw@db:5432/app", "postgresql+psycopg://other:pw2@db/app"),
    ],
)
def test_the_database_of_the_tables_is_refused_as_the_key_store(
    tmp_path: Path, database: str, keystore: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        check_keystore_url(settings(tmp_path, database_url=database, keystore_url=keystore))
    message = str(raised.value)
    assert "CLAW_KEYSTORE_URL names the database of CLAW_DATABASE_URL" in message
    assert "pw" not in message.replace("password", "")


def test_the_same_sqlite_file_spelled_another_way_is_refused(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'clawmem.db'}"
    other = f"sqlite:///{tmp_path / 'sub' / '..' / 'clawmem.db'}"
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError, match="names the database of CLAW_DATABASE_URL"):
        check_keystore_url(settings(tmp_path, database_url=database, keystore_url=other))


@pytest.mark.parametrize("keystore", ["sqlite://", "sqlite:///:memory:", "not a url"])
def test_a_key_store_that_would_not_last_or_is_no_url_is_refused(tmp_path: Path, keystore: str) -> None:
    with pytest.raises(ConfigError, match="CLAW_KEYSTORE_URL"):
        check_keystore_url(settings(tmp_path, keystore_url=keystore))


def test_the_redis_of_the_memory_entries_is_refused_but_another_is_taken(tmp_path: Path) -> None:
    mine = settings(
        tmp_path,
        memory_driver="redis",
        redis_url="redis://127.0.0.1:6379/0",
        keystore_url="redis://localhost/3",
    )
    with pytest.raises(ConfigError, match="names the Redis server of CLAW_REDIS_URL"):
        check_keystore_url(mine)
    # With the memory in SQL, the same Redis holds none of the customer's text.
    sql = settings(tmp_path, keystore_url="redis://localhost/3")
    assert check_keystore_url(sql) == "redis://localhost/3"
    elsewhere = settings(tmp_path, keystore_url=f"sqlite:///{tmp_path / 'keys.db'}")
    assert check_keystore_url(elsewhere).endswith("keys.db")
