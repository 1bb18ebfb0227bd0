"""Encryption at rest on real stores (SPEC 13): customer text is nowhere in the raw tables, Redis
keys or files, reads back equal, cannot be moved, fails closed on a missing or wrong key or an
altered byte (at start-up, on one read, and as a marked row in lists), and strict mode refuses
plaintext. Nothing is deleted for failing to decrypt."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.crypto import Cipher, Keyring, generate_key, key_id_of
from clawmem.encryption.state import check_keys, encryption_state
from clawmem.errors import ConfigError, PlaintextRefused, StorageError, Undecryptable
from clawmem.memory.file import FileMemory
from clawmem.memory.redis import RedisMemory
from clawmem.memory.sql import SqlMemory
from clawmem.privacy.erasure import erase_subject, export_subject
from clawmem.privacy.subjects import Subject
from clawmem.providers import EchoProvider
from clawmem.providers.base import ToolCall
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql.engine import create_engine, engine_for
from clawmem.sql.schema import create_tables, drop_tables, tables
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.pipeline import Claw
from tests.conftest import backend_url, sql_url

SECRET = "Zanzibar-Quokka-7731"  # distinctive: found in raw storage only if something leaked
KEY_ONE = generate_key("k1")
KEY_TWO = generate_key("k2")
WRONG_ONE = f"k1:{base64.b64encode(os.urandom(32)).decode()}"


def settings_for(tmp_path: Path, keys: str = KEY_ONE, **more: Any) -> Settings:
    return Settings(instance_path=str(tmp_path), encryption_keys=keys, **more)


def raw_rows(engine: sa.engine.Engine, prefix: str) -> str:
    """Every row of the three tables as the database holds them, as one text."""
    schema = tables(prefix)
    with engine.connect() as conn:
        rows = [
            repr(tuple(row))
            for table in (schema.conversations, schema.messages, schema.memory)
            for row in conn.execute(sa.select(table))
        ]
    return "\n".join(rows)


def sealed_cipher(keys: str = KEY_ONE, strict: bool = False) -> Cipher:
    return Cipher(Keyring.from_text(keys), strict=strict)


@pytest.fixture
def sqlite_site(tmp_path: Path, clock: FakeClock) -> Site:
    settings = settings_for(tmp_path, compact_max_messages=4)
    create_tables(engine_for(settings.database_url))
    return Site(settings, clock)


# -- nothing readable at rest, everything readable through the API ----------------------------


def test_a_distinctive_string_through_every_path_is_nowhere_in_the_raw_tables(
    sqlite_site: Site, clock: FakeClock
) -> None:
    settings = sqlite_site.settings
    provider = EchoProvider(tool_calls=[ToolCall("track_order", {"note": SECRET}, "call_1")])
    claw = Claw.from_settings(settings, provider, clock=clock)
    claw.memory.set("fact", f"{SECRET} likes green tea")
    claw.memory.set("city", {"name": SECRET}, namespace="user:ada")
    first = claw.send(f"hello, I am {SECRET}", user_id="ada")
    for turn in range(4):  # enough turns for a compaction checkpoint (summary row)
        claw.send(f"turn {turn} from {SECRET} about green tea", first.conversation_id, user_id="ada")

    raw = raw_rows(sqlite_site.engine, "")
    assert SECRET not in raw and "green tea" not in raw
    assert "cm1$k1$" in raw

    log = sqlite_site.conversations
    conversation = log.load(first.conversation_id)
    assert conversation.title == f"hello, I am {SECRET}"
    roles = {message.role for message in log.messages(first.conversation_id, limit=100).items}
    assert {"summary", "recall", "tool", "user", "assistant"} <= roles
    said = [m.content for m in log.messages(first.conversation_id, limit=100).items if m.role == "user"]
    assert said[0] == f"hello, I am {SECRET}"
    tools = [m.tool_input for m in log.messages(first.conversation_id, limit=100).items if m.role == "tool"]
    assert tools[0] == {"note": SECRET}
    assert claw.memory.get("fact") == f"{SECRET} likes green tea"
    assert claw.memory.get("city", namespace="user:ada") == {"name": SECRET}
    # Recall built its index from the decrypted values.
    assert [hit.key for hit in claw.memory.search("green tea")] == ["fact"]
    assert not any(m.unreadable for m in log.messages(first.conversation_id, limit=100).items)


def test_the_export_holds_the_decrypted_text_and_erase_deletes_without_decrypting(
    sqlite_site: Site, clock: FakeClock
) -> None:
    claw = Claw.from_settings(sqlite_site.settings, EchoProvider(), clock=clock)
    claw.memory.set("city", SECRET, namespace="user:ada")
    claw.memory.set("note", f"ada-77 said {SECRET}", namespace="notes")
    reply = claw.send(f"I am {SECRET}", user_id="ada-77")
    out = io.StringIO()
    export_subject(sqlite_site, Subject(user_id="ada-77"), out)
    document = json.loads(out.getvalue())
    assert document["conversations"][0]["title"] == f"I am {SECRET}"
    assert document["mentions"][0]["value"] == f"ada-77 said {SECRET}"  # found by a complete scan
    assert document["unreadable"] == []

    # A text match (no user id) finds the conversation by its decrypted content.
    matched = io.StringIO()
    export_subject(sqlite_site, Subject(match=SECRET), matched)
    assert [c["id"] for c in json.loads(matched.getvalue())["conversations"]] == [reply.conversation_id]

    # Without any key, erasure still deletes: it needs no decryption.
    keyless = Site(sqlite_site.settings.replace(encryption_keys=WRONG_ONE), clock)
    erased = erase_subject(keyless, Subject(user_id="ada-77"))
    assert erased.conversations == 1
    assert keyless.conversations.counts() == {"conversations": 0, "messages": 0}


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "postgres"])
def test_sql_memory_values_are_sealed_on_every_dialect(
    backend: str, tmp_path: Path, clock: FakeClock
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    engine = create_engine(sql_url(backend, tmp_path))
    create_tables(engine, prefix)
    try:
        memory = SqlMemory(engine, prefix=prefix, clock=clock)
        memory.use_cipher(sealed_cipher(), prefix)
        memory.set("fact", {"who": SECRET, "n": 7})
        memory.set("short", "x", ttl=60)
        assert SECRET not in raw_rows(engine, prefix)
        assert memory.get("fact") == {"who": SECRET, "n": 7}
        assert memory.all() == {"fact": {"who": SECRET, "n": 7}, "short": "x"}
        assert memory.entry("default", "fact").value == {"who": SECRET, "n": 7}
        assert [row.key for row in memory.entries(query=SECRET.lower()).items] == ["fact"]
        assert memory.count_entries(query=SECRET) == 1
        log = ConversationLog(engine, prefix, clock, cipher=sealed_cipher())
        log.append("c1", [{"role": "user", "content": SECRET}], title=SECRET * 12, metadata={"k": SECRET})
        assert SECRET not in raw_rows(engine, prefix)
        found = log.find("c1")
        assert found.title.startswith(SECRET) and len(found.title.encode()) <= 163  # clipped to fit
        assert found.metadata == {"k": SECRET}
        assert log.load("c1").messages[0].content == SECRET
    finally:
        drop_tables(engine, prefix)
        engine.dispose()


def test_redis_entries_are_sealed_and_read_back(redis_client: Any, clock: FakeClock) -> None:
    key_prefix = f"clawtest:{uuid.uuid4().hex[:8]}:"
    memory = RedisMemory(client=redis_client, prefix=key_prefix, clock=clock)
    memory.use_cipher(sealed_cipher(), "")
    try:
        memory.set("fact", f"{SECRET} drinks tea")
        memory.set("list", [SECRET], ttl=30)
        stored = b"".join(
            redis_client.dump(key) or b"" for key in redis_client.scan_iter(match=f"{key_prefix}*")
        )
        names = b"".join(redis_client.scan_iter(match=f"{key_prefix}*"))
        assert SECRET.encode() not in stored + names and b"tea" not in stored
        assert memory.get("fact") == f"{SECRET} drinks tea"
        assert memory.all() == {"fact": f"{SECRET} drinks tea", "list": [SECRET]}
        assert [hit.key for hit in memory.search("tea")] == ["fact"]
        # Moved to another key, the envelope does not open: get raises, lists mark it.
        raw = redis_client.get(memory.entry_key("fact", "default"))
        redis_client.set(memory.entry_key("moved", "default"), raw)
        redis_client.zadd(memory.index_key("default"), {"moved": "+inf"})
        with pytest.raises(Undecryptable, match="key 'moved'.*'k1'"):
            memory.get("moved")
        rows = {row.key: row for row in memory.records()}
        assert rows["moved"].unreadable and rows["moved"].value is None
        assert "moved" not in memory.all()
    finally:
        for key in redis_client.scan_iter(match=f"{key_prefix}*"):
            redis_client.delete(key)


def test_file_entries_are_sealed_and_read_back(tmp_path: Path, clock: FakeClock) -> None:
    memory = FileMemory(tmp_path / "memory", clock=clock)
    memory.use_cipher(sealed_cipher(), "")
    memory.set("fact", f"{SECRET} drinks tea")
    memory.update("counter", lambda current: (current or 0) + 1)
    memory.update("counter", lambda current: (current or 0) + 1)
    on_disk = b"".join(path.read_bytes() for path in (tmp_path / "memory").rglob("*") if path.is_file())
    assert SECRET.encode() not in on_disk and b"tea" not in on_disk
    assert memory.get("fact") == f"{SECRET} drinks tea" and memory.get("counter") == 2
    assert [hit.key for hit in memory.search("tea")] == ["fact"]
    other = FileMemory(tmp_path / "memory", clock=clock)
    other.use_cipher(sealed_cipher(WRONG_ONE), "")
    with pytest.raises(Undecryptable, match="key 'fact'"):
        other.get("fact")
    assert {row.key: bool(row.unreadable) for row in other.records()} == {"counter": True, "fact": True}
    assert other.all() == {} and other.search("tea") == []
    other.forget("fact")  # deleting needs no decryption
    assert memory.records()[0].key == "counter"


# -- a ciphertext cannot be moved ------------------------------------------------------------


def test_a_ciphertext_copied_to_another_row_or_column_fails(sqlite_site: Site, clock: FakeClock) -> None:
    log = sqlite_site.conversations
    log.append("c1", [{"role": "user", "content": SECRET}, {"role": "assistant", "content": "fine"}])
    log.append("c2", [{"role": "user", "content": "other"}], title="t")
    messages = tables("").messages
    conversations = tables("").conversations
    with sqlite_site.engine.begin() as conn:
        first, second = conn.execute(
            sa.select(messages.c.id, messages.c.content).order_by(messages.c.id)
        ).all()[:2]
        conn.execute(sa.update(messages).where(messages.c.id == second.id).values(content=first.content))
        conn.execute(sa.update(conversations).where(conversations.c.id == "c2").values(title=first.content))
    with pytest.raises(Undecryptable) as raised:
        log.load("c1")
    assert f"messages row '{second.id}' column content" in str(raised.value) and SECRET not in str(
        raised.value
    )
    with pytest.raises(Undecryptable, match="conversations row 'c2' column title"):
        log.find("c2")
    page = log.messages("c1").items
    assert [m.content for m in page][0] == SECRET and "cannot be decrypted" in page[1].unreadable
    listed = {c.id: c for c in log.list().items}
    assert "title cannot be decrypted" in listed["c2"].unreadable


# -- failing closed ---------------------------------------------------------------------------


def _written(sqlite_site: Site, clock: FakeClock) -> str:
    claw = Claw.from_settings(sqlite_site.settings, EchoProvider(), clock=clock)
    claw.memory.set("fact", SECRET)
    return claw.send(f"hello {SECRET}", user_id="ada").conversation_id


def _flip_newest_message(engine: sa.engine.Engine) -> str:
    messages = tables("").messages
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(messages.c.id, messages.c.content).order_by(
                messages.c.created_at.desc(), messages.c.id.desc()
            )
        ).first()
        flipped = row.content[:-2] + ("A" if row.content[-2] != "A" else "B") + row.content[-1]
        conn.execute(sa.update(messages).where(messages.c.id == row.id).values(content=flipped))
    return row.id


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        (WRONG_ONE, "wrong key"),
        (KEY_TWO, "no configured key has this id"),
        ("", "encryption is off"),
    ],
    ids=["wrong-key", "other-key-id", "no-keys"],  # the keys are random: ids must not be them
)
def test_a_wrong_or_missing_key_is_a_clear_error_at_start_up(
    sqlite_site: Site, clock: FakeClock, keys: str, said: str
) -> None:
    conversation_id = _written(sqlite_site, clock)
    changed = sqlite_site.settings.replace(encryption_keys=keys)
    with pytest.raises(Undecryptable, match=said) as raised:
        Claw.from_settings(changed, EchoProvider(), clock=clock) if keys else check_keys(
            sqlite_site.engine, "", Cipher()
        )
    message = str(raised.value)
    assert "'k1'" in message and SECRET not in message and ("row '" in message or "namespace" in message)
    # One read raises; a list marks the row and goes on; nothing was deleted.
    log = Site(changed, clock).conversations
    with pytest.raises(Undecryptable):
        log.load(conversation_id)
    assert log.list().items[0].unreadable
    assert log.counts()["messages"] == 3


def test_a_flipped_byte_is_found_at_start_up_and_pop_deletes_nothing(
    sqlite_site: Site, clock: FakeClock
) -> None:
    conversation_id = _written(sqlite_site, clock)
    flipped = _flip_newest_message(sqlite_site.engine)
    with pytest.raises(Undecryptable, match=f"messages row '{flipped}' column content under key id 'k1'"):
        Claw.from_settings(sqlite_site.settings, EchoProvider(), clock=clock)
    log = sqlite_site.conversations
    before = log.counts()
    with pytest.raises(Undecryptable):
        log.pop_newest(conversation_id, ("assistant",))
    assert log.counts() == before
    assert log.messages_with_ids(conversation_id, [flipped])[flipped].unreadable


def test_the_start_up_check_passes_on_an_empty_database_and_on_good_keys(
    sqlite_site: Site, clock: FakeClock
) -> None:
    assert check_keys(sqlite_site.engine, "", sqlite_site.cipher) == 0
    _written(sqlite_site, clock)
    assert check_keys(sqlite_site.engine, "", sealed_cipher(f"{KEY_TWO},{KEY_ONE}")) > 0


def test_an_undecryptable_memory_value_raises_on_get_and_is_skipped_by_recall(
    sqlite_site: Site, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sqlite_site.memory.set("fact", "green tea lover")
    sqlite_site.memory.set("other", "green tea too")
    memory = sqlite_site.driver
    table = tables("").memory
    with sqlite_site.engine.begin() as conn:
        stored = conn.execute(sa.select(table.c.value).where(table.c.lookup_key == "fact")).scalar()
        conn.execute(sa.update(table).where(table.c.lookup_key == "other").values(value=stored))
    with pytest.raises(StorageError, match="key 'other'"):
        memory.get("other")
    with caplog.at_level(logging.WARNING):
        assert [hit.key for hit in memory.search("green tea")] == ["fact"]
        assert memory.all() == {"fact": "green tea lover"}
    assert "cannot be decrypted" in caplog.text and "green tea" not in caplog.text
    row = memory.entry("default", "other")
    assert "value cannot be decrypted" in row.unreadable
    memory.forget("other")
    assert memory.count() == 1


# -- turning it on, strict mode, phpClaw's tables ---------------------------------------------


def test_plaintext_rows_stay_readable_until_strict_mode_refuses_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    plain = Settings(instance_path=str(tmp_path))
    create_tables(engine_for(plain.database_url))
    before = Claw.from_settings(plain, EchoProvider(), clock=clock)
    before.memory.set("fact", "old plain fact")
    conversation_id = before.send("written before encryption").conversation_id

    turned_on = Site(settings_for(tmp_path), clock)
    assert turned_on.memory.get("fact") == "old plain fact"
    assert turned_on.conversations.load(conversation_id).title == "written before encryption"
    state = encryption_state(turned_on.engine, "", turned_on.cipher)
    assert state.plaintext_rows > 0 and state.problem is None

    strict = Site(settings_for(tmp_path, encryption_strict=True), clock)
    with pytest.raises(PlaintextRefused, match="CLAW_ENCRYPTION_STRICT"):
        strict.memory.get("fact")
    with pytest.raises(PlaintextRefused):
        strict.conversations.load(conversation_id)
    listed = strict.conversations.list().items[0]
    assert "plaintext" in listed.unreadable and strict.memory.all() == {}
    assert "plaintext" in strict.driver.entry("default", "fact").unreadable


def test_encryption_is_refused_on_phpclaws_tables_in_one_line(tmp_path: Path, clock: FakeClock) -> None:
    engine = engine_for(f"sqlite:///{tmp_path / 'clawmem.db'}")
    create_tables(engine, "wp_", shape="phpclaw-wordpress")
    settings = settings_for(tmp_path, table_prefix="wp_")
    for opened in (lambda: Site(settings, clock).memory, lambda: Site(settings, clock).conversations):
        with pytest.raises(ConfigError) as raised:
            opened()
        assert "CLAW_ENCRYPTION_KEYS" in str(raised.value) and "\n" not in str(raised.value)


def test_the_encryption_state_counts_rows_per_key_id(sqlite_site: Site, clock: FakeClock) -> None:
    _written(sqlite_site, clock)
    rotated = Site(sqlite_site.settings.replace(encryption_keys=f"{KEY_TWO},{KEY_ONE}"), clock)
    rotated.memory.set("new", "under the second key")
    state = encryption_state(rotated.engine, "", rotated.cipher)
    assert state.primary_id == "k2" and state.key_ids == ("k2", "k1")
    assert state.per_key["k2"] == 1 and state.per_key["k1"] >= 4 and state.plaintext_rows == 0
    assert key_id_of(rotated.driver.values.seal("default", "x", '"y"')) == "k2"
    shown = repr(state) + repr(rotated.settings)
    assert KEY_ONE.partition(":")[2] not in shown and KEY_TWO.partition(":")[2] not in shown


@pytest.mark.parametrize("driver", ["file", "redis"])
def test_the_configured_file_and_redis_drivers_seal_what_they_store(
    driver: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    more: dict[str, Any] = {"memory_driver": driver, "table_prefix": f"t{uuid.uuid4().hex[:8]}_"}
    if driver == "redis":
        client = request.getfixturevalue("redis_client")
        more["redis_url"] = backend_url("redis")
    settings = settings_for(tmp_path, **more)
    site = Site(settings, clock)
    try:
        site.memory.set("fact", f"{SECRET} drinks tea", namespace="user:ada")
        if driver == "file":
            stored = b"".join(p.read_bytes() for p in Path(settings.file_dir).rglob("*") if p.is_file())
        else:
            keys = list(client.scan_iter(match=f"{settings.table_prefix}phpclaw:*"))
            stored = b"".join([*keys, *(client.dump(key) or b"" for key in keys)])
        assert SECRET.encode() not in stored and b"cm1$k1$" in stored
        assert site.memory.get("fact", namespace="user:ada") == f"{SECRET} drinks tea"
        assert Site(settings.replace(encryption_keys=""), clock).driver.records("user:ada")[0].unreadable
    finally:
        if driver == "redis":
            for key in client.scan_iter(match=f"{settings.table_prefix}phpclaw:*"):
                client.delete(key)


def test_message_metadata_is_sealed_and_a_retried_job_still_stores_its_turn_once(
    sqlite_site: Site,
) -> None:
    log = sqlite_site.conversations
    turn = [
        {"role": "user", "content": "hi", "metadata": {"job_id": "job-1", "agents_item": {"text": SECRET}}},
        {"role": "assistant", "content": "hello", "metadata": {"job_id": "job-1"}},
    ]
    first = log.append("c1", turn, job_id="job-1")
    again = log.append("c1", turn, job_id="job-1")  # the job ran twice: nothing new is stored
    assert again == first and log.counts()["messages"] == 2
    assert SECRET not in raw_rows(sqlite_site.engine, "") and "job-1" not in raw_rows(sqlite_site.engine, "")
    assert [m.id for m in log.job_messages("c1", "job-1")] == first
    assert log.load("c1").messages[0].metadata["agents_item"] == {"text": SECRET}


def test_strict_mode_never_returns_a_plaintext_tool_input_or_metadata(
    tmp_path: Path, clock: FakeClock
) -> None:
    plain = Settings(instance_path=str(tmp_path))
    create_tables(engine_for(plain.database_url))
    Site(plain, clock).conversations.append(
        "c1",
        [
            {
                "role": "tool",
                "content": "",
                "tool_name": "t",
                "tool_input": {"q": SECRET},
                "metadata": {"k": 1},
            }
        ],
    )
    message = (
        Site(settings_for(tmp_path, encryption_strict=True), clock).conversations.messages("c1").items[0]
    )
    assert message.tool_input is None and message.metadata is None and message.content is None
    assert message.unreadable.count("plaintext") == 3


def test_a_history_opened_before_still_refuses_a_ciphertext_moved_since(sqlite_site: Site) -> None:
    log = sqlite_site.conversations
    log.append("c1", [{"role": "user", "content": SECRET}, {"role": "assistant", "content": "fine"}])
    assert [m.content for m in log.load("c1").messages] == [SECRET, "fine"]  # opened, and kept
    messages = tables("").messages
    with sqlite_site.engine.begin() as conn:
        first, second = conn.execute(
            sa.select(messages.c.id, messages.c.content).order_by(messages.c.id)
        ).all()
        conn.execute(sa.update(messages).where(messages.c.id == second.id).values(content=first.content))
    with pytest.raises(Undecryptable, match=f"messages row '{second.id}'"):
        log.load("c1")


@pytest.mark.parametrize("backend", ["sqlite", "mysql", "postgres"])
def test_a_sealed_entry_written_after_recall_first_read_is_recalled_at_the_next_turn(
    backend: str, tmp_path: Path, clock: FakeClock
) -> None:
    # The feed reads a changed row again with the driver's cipher, never as stored text: a
    # value sealed after the index was built is recalled, not skipped as undecodable.
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    engine, other_engine = (
        create_engine(sql_url(backend, tmp_path)),
        create_engine(sql_url(backend, tmp_path)),
    )
    create_tables(engine, prefix)
    try:
        memory, other = (
            SqlMemory(engine, prefix=prefix, clock=clock),
            SqlMemory(other_engine, prefix=prefix, clock=clock),
        )
        for driver in (memory, other):
            driver.use_cipher(sealed_cipher(), prefix)
        memory.set("first", "black coffee")
        assert memory.search("tea", 5) == []  # the index is built here
        memory.set("mine", "green tea")  # written by this process
        other.set("theirs", "mint tea")  # and by another
        assert [hit.key for hit in memory.search("tea", 5)] == ["mine", "theirs"]
        assert SECRET not in raw_rows(engine, prefix)
    finally:
        drop_tables(engine, prefix)
        engine.dispose()
        other_engine.dispose()
