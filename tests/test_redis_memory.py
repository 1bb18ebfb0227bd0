"""RedisMemory beyond the shared contract: key layout, cost per namespace, Redis TTLs, the clock
boundary, sweeping, and failures that must not leak the URL's password."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import assume, given
from hypothesis import strategies as st

import clawmem
from clawmem.clock import FakeClock
from clawmem.memory.redis import RedisMemory
from tests.conftest import backend_url

BIG = 5000


def _prefix() -> str:
    return f"clawtest:{uuid.uuid4().hex[:8]}:"


def _cleanup(client: Any, prefix: str) -> None:
    for redis_key in client.scan_iter(match=f"{prefix}*"):
        client.delete(redis_key)


@pytest.fixture
def memory(make_driver: Callable[[str], Any]) -> RedisMemory:
    return make_driver("redis")


@pytest.fixture
def recorded(clock: FakeClock) -> Iterator[tuple[RedisMemory, list[str]]]:
    """A RedisMemory whose connections record the name of every command they send."""
    sent: list[str] = []

    def name(args: tuple[Any, ...]) -> str:
        first = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        return first.split()[0].upper()

    class RecordingConnection(redis.Connection):
        def send_command(self, *args: Any, **kwargs: Any) -> None:
            sent.append(name(args))
            super().send_command(*args, **kwargs)

        def pack_commands(self, commands: Any) -> Any:
            sent.extend(name(command) for command in commands)
            return super().pack_commands(commands)

    client = redis.Redis.from_url(backend_url("redis"), connection_class=RecordingConnection)
    prefix = _prefix()
    yield RedisMemory(client=client, prefix=prefix, clock=clock), sent
    _cleanup(client, prefix)
    client.close()


def _commands(sent: list[str], call: Callable[[], Any]) -> list[str]:
    sent.clear()
    call()
    return list(sent)


# -- layout and cost ---------------------------------------------------------------------------


def test_all_and_flush_cost_does_not_grow_with_other_namespaces(
    recorded: tuple[RedisMemory, list[str]],
) -> None:
    memory, sent = recorded
    memory.client.ping()  # the connection handshake is not part of what is measured
    for key in ["x", "y", "z"]:
        memory.set(key, key, namespace="small")
        memory.set(key, key, namespace="tiny")
    all_alone = _commands(sent, lambda: memory.all("small"))
    flush_alone = _commands(sent, lambda: memory.flush("tiny"))

    neighbour = memory.client.pipeline(transaction=False)
    for number in range(BIG):
        neighbour.set(memory.entry_key(f"k{number}", "small:big"), f"[null,{number}]")
        neighbour.zadd(memory.index_key("small:big"), {f"k{number}": "+inf"})
    neighbour.execute()
    for key in ["x", "y", "z"]:
        memory.set(key, key, namespace="tiny")

    assert _commands(sent, lambda: memory.all("small")) == all_alone
    assert _commands(sent, lambda: memory.flush("tiny")) == flush_alone
    assert not {"KEYS", "SCAN"} & {*all_alone, *flush_alone}
    assert len(all_alone) <= 3 and len(flush_alone) <= 8
    assert memory.all("small") == {"x": "x", "y": "y", "z": "z"}
    assert memory.all("tiny") == {}


def test_large_namespace_reads_and_flushes_in_batches(memory: RedisMemory) -> None:
    pipe = memory.client.pipeline(transaction=False)
    for number in range(BIG):
        pipe.set(memory.entry_key(f"k{number:04d}", "big"), f"[null,{number}]")
        pipe.zadd(memory.index_key("big"), {f"k{number:04d}": "+inf"})
    pipe.execute()
    memory.set("other", 1, namespace="big:neighbour")
    assert memory.all("big") == {f"k{number:04d}": number for number in range(BIG)}
    flushed: list[dict[str, Any]] = []
    clawmem.events.on("memory.flush", flushed.append)
    try:
        memory.flush("big")
    finally:
        clawmem.events.off("memory.flush", flushed.append)
    assert flushed[0]["count"] == BIG
    assert memory.client.exists(memory.index_key("big"), memory.entry_key("k0000", "big")) == 0
    assert memory.all("big:neighbour") == {"other": 1}


TRICKY_NAMESPACES = ["a", "a:b", "a:k", "a:i", "a:k:b", "A"]
TRICKY_KEYS = ["x", "b:x", "k:x", "i", "}:k:x", "{a}:k:x", "namespaces"]


def test_namespace_a_never_sees_a_colon_b(memory: RedisMemory) -> None:
    for namespace in TRICKY_NAMESPACES:
        for key in TRICKY_KEYS:
            memory.set(key, namespace, namespace=namespace)
    for namespace in TRICKY_NAMESPACES:
        assert memory.all(namespace) == dict.fromkeys(sorted(TRICKY_KEYS), namespace)
    memory.flush("a")
    memory.forget("x", "a:k")
    assert memory.all("a") == {}
    assert memory.get("x", "a:b") == "a:b"
    assert memory.get("x", "a:k") is None
    assert memory.namespaces() == sorted(set(TRICKY_NAMESPACES) - {"a"})


LAYOUT = RedisMemory(url="redis://127.0.0.1:1/0", prefix="p:")  # never connects
NAMESPACE_PARTS = st.text(alphabet="ak:i_", min_size=1, max_size=5).filter(lambda n: ".." not in n)
KEY_PARTS = st.text(alphabet="ak:i{}", min_size=1, max_size=7)


@given(NAMESPACE_PARTS, KEY_PARTS, NAMESPACE_PARTS, KEY_PARTS)
def test_redis_keys_are_injective(namespace: str, key: str, other_namespace: str, other_key: str) -> None:
    same_entry = LAYOUT.entry_key(key, namespace) == LAYOUT.entry_key(other_key, other_namespace)
    assert same_entry == ((namespace, key) == (other_namespace, other_key))
    assert LAYOUT.entry_key(key, namespace) not in {LAYOUT.index_key(other_namespace), LAYOUT.namespaces_key}


SITE_PREFIXES = ["", "x", "phpclaw:", "xphpclaw:", "wp_phpclaw:", "wp_2_phpclaw:", "p", "pnamespaces"]
PREFIXES = st.one_of(st.sampled_from(SITE_PREFIXES), st.text(alphabet="pak:i_nmesc", max_size=12))


def _layout_keys(prefix: str, namespace: str, key: str) -> set[str]:
    layout = RedisMemory(url="redis://127.0.0.1:1/0", prefix=prefix)  # never connects
    return {layout.entry_key(key, namespace), layout.index_key(namespace), layout.namespaces_key}


@given(PREFIXES, NAMESPACE_PARTS, KEY_PARTS, PREFIXES, NAMESPACE_PARTS, KEY_PARTS)
def test_two_prefixes_never_share_a_redis_key(
    prefix: str, namespace: str, key: str, other_prefix: str, other_namespace: str, other_key: str
) -> None:
    # Even when one prefix starts with the other, as "phpclaw:" (site "") and "pnamespaces" do.
    assume(prefix != other_prefix)
    assert not _layout_keys(prefix, namespace, key) & _layout_keys(other_prefix, other_namespace, other_key)


@pytest.mark.parametrize("prefix", ["p{a}:k:", "{", "site}"])
def test_prefix_with_a_brace_is_refused(prefix: str) -> None:
    # "p{a}:k:namespaces" would be both that prefix's namespace set and key "namespaces" of "p".
    with pytest.raises(ValueError, match="must not contain"):
        RedisMemory(url="redis://127.0.0.1:1/0", prefix=prefix)


# -- TTL and the clock -------------------------------------------------------------------------


def test_ttl_none_sets_no_redis_ttl_and_a_ttl_sets_one(memory: RedisMemory, clock: FakeClock) -> None:
    redis_key = memory.entry_key("k", "default")
    memory.set("k", 1)
    assert memory.client.ttl(redis_key) == -1
    memory.set("k", 2, ttl=60)
    assert 58 <= memory.client.ttl(redis_key) <= 60
    memory.set("k", 3)
    assert memory.client.ttl(redis_key) == -1
    clock.advance(10**9)
    assert memory.get("k") == 3


def test_clock_boundary_holds_before_redis_expires_the_key(memory: RedisMemory, clock: FakeClock) -> None:
    redis_key = memory.entry_key("k", "default")
    clock.now = 1000.75
    memory.set("k", "v", ttl=10)
    clock.now = 1009.999
    assert memory.get("k") == "v"
    clock.now = 1010.0
    assert memory.client.exists(redis_key) == 1
    assert memory.client.ttl(redis_key) > 0
    assert memory.get("k") is None
    assert memory.has("k") is False
    assert memory.all() == {}
    assert memory.search("v k") == []


# -- sweeping and entries Redis dropped --------------------------------------------------------


def test_sweep_deletes_exactly_the_clock_expired_entries(memory: RedisMemory, clock: FakeClock) -> None:
    memory.set("old", 1, ttl=5)
    memory.set("fresh", 2, ttl=500)
    memory.set("forever", 3)
    memory.set("old", 1, namespace="other", ttl=5)
    memory.set("dropped", 4, namespace="other", ttl=5)
    memory.client.delete(memory.entry_key("dropped", "other"))  # as if Redis expired it first
    clock.advance(10)

    def index_sizes() -> list[int]:
        return [memory.client.zcard(memory.index_key(namespace)) for namespace in ["default", "other"]]

    before = index_sizes()
    assert memory.sweep(dry_run=True) == {"default": 1, "other": 1}
    assert index_sizes() == before == [3, 2]
    assert memory.client.exists(memory.entry_key("old", "default")) == 1
    assert memory.sweep() == {"default": 1, "other": 1}
    assert memory.client.exists(memory.entry_key("old", "default"), memory.entry_key("old", "other")) == 0
    assert memory.client.zrange(memory.index_key("default"), 0, -1) == [b"fresh", b"forever"]
    assert memory.client.exists(memory.index_key("other")) == 0
    assert memory.namespaces() == ["default"]
    assert memory.client.smembers(memory.namespaces_key) == {b"default"}
    assert memory.sweep() == {}
    assert memory.all() == {"forever": 3, "fresh": 2}


def test_entry_that_redis_dropped_is_skipped_and_unindexed(memory: RedisMemory) -> None:
    memory.set("evicted", 1)
    memory.set("kept", 2)
    memory.client.delete(memory.entry_key("evicted", "default"))
    assert memory.all() == {"kept": 2}
    assert memory.client.zscore(memory.index_key("default"), "evicted") is None
    assert memory.get("evicted") is None


def test_several_dropped_entries_are_unindexed_together(memory: RedisMemory) -> None:
    for number in range(6):
        memory.set(f"k{number}", number)
    memory.client.delete(*(memory.entry_key(f"k{number}", "default") for number in (0, 2, 3, 5)))
    assert memory.all() == {"k1": 1, "k4": 4}
    assert memory.client.zrange(memory.index_key("default"), 0, -1) == [b"k1", b"k4"]
    assert memory.namespaces() == ["default"]


@pytest.mark.parametrize("stored", ["garbage", '{"value": 1}', "[1, 2, 3]", '["soon", 1]', "[null, NaN]"])
def test_corrupt_entry_raises_on_get_and_is_skipped_by_all(
    memory: RedisMemory, stored: str, caplog: Any
) -> None:
    memory.set("k", "good")
    memory.set("other", "kept")
    redis_key = memory.entry_key("k", "default")
    memory.client.set(redis_key, stored)
    for operation, call in {"get": lambda: memory.get("k"), "has": lambda: memory.has("k")}.items():
        with pytest.raises(clawmem.StorageError) as raised:
            call()
        assert (raised.value.driver, raised.value.operation) == ("redis", operation)
        assert redis_key in str(raised.value)
    with caplog.at_level(logging.WARNING, logger="clawmem.recall"):
        assert memory.all() == {"other": "kept"}
    assert "recall skips key 'k' in namespace 'default'" in caplog.text
    (row,) = [row for row in memory.records() if row.key == "k"]
    assert (row.value, row.unreadable, row.raw_value) == (stored, "value cannot be decoded", True)
    assert memory.client.get(redis_key) == stored.encode()


def test_wrong_redis_type_under_an_entry_key_raises(memory: RedisMemory) -> None:
    memory.client.hset(memory.entry_key("k", "default"), "field", "value")
    with pytest.raises(clawmem.StorageError, match="WRONGTYPE"):
        memory.get("k")


def test_concurrent_sets_and_flushes_keep_the_index_consistent(memory: RedisMemory) -> None:
    def write(worker: int) -> None:
        for number in range(150):
            memory.set(f"w{worker}-{number}", number, namespace="busy")

    def flush() -> None:
        for _ in range(30):
            memory.flush("busy")

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(3)]
    threads.append(threading.Thread(target=flush))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entry_prefix = memory.entry_key("", "busy")
    stored = {
        redis_key.decode()[len(entry_prefix) :]
        for redis_key in memory.client.scan_iter(match=f"{entry_prefix}*")
    }
    indexed = {member.decode() for member in memory.client.zrange(memory.index_key("busy"), 0, -1)}
    assert stored == indexed
    assert set(memory.all("busy")) == stored
    assert ("busy" in memory.namespaces()) == bool(stored)


def test_client_that_decodes_responses_works_too(clock: FakeClock) -> None:
    client = redis.Redis.from_url(backend_url("redis"), decode_responses=True)
    prefix = _prefix()
    try:
        memory = RedisMemory(client=client, prefix=prefix, clock=clock)
        memory.set("é", {"v": 1.0}, ttl=5)
        memory.set("gone", 1)
        client.delete(memory.entry_key("gone", "default"))
        assert memory.all() == {"é": {"v": 1.0}}
        assert memory.namespaces() == ["default"]
        clock.advance(5)
        assert memory.sweep() == {"default": 1}
        memory.set("k", 1)
        memory.flush()
        assert memory.all() == {}
    finally:
        _cleanup(client, prefix)
        client.close()


# -- configuration and failures ----------------------------------------------------------------


def test_unreachable_redis_raises_memory_error_without_the_password() -> None:
    memory = RedisMemory(url="redis://:secretpw@127.0.0.1:1/0")
    for operation, call in {
        "get": lambda: memory.get("k"),
        "set": lambda: memory.set("k", 1, ttl=5),
        "all": lambda: memory.all(),
        "flush": lambda: memory.flush(),
        "sweep": lambda: memory.sweep(),
    }.items():
        with pytest.raises(clawmem.StorageError) as raised:
            call()
        error = raised.value
        assert (error.driver, error.operation) == ("redis", operation)
        assert "ConnectionError" in str(error)
        for text in (str(error), repr(error), error.detail, str(error.__cause__)):
            assert "secretpw" not in text


def test_bad_url_raises_config_error_without_the_password() -> None:
    with pytest.raises(clawmem.ConfigError) as raised:
        RedisMemory(url="http://user:secretpw@example.invalid/0")
    assert "secretpw" not in str(raised.value)
    assert "redis://" in str(raised.value)


def test_url_defaults_and_url_or_client_not_both() -> None:
    kwargs = RedisMemory().client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs.get("db", 0)) == ("127.0.0.1", 6379, 0)
    with pytest.raises(ValueError, match="not both"):
        RedisMemory(url="redis://127.0.0.1:6379/0", client=redis.Redis())


def test_importing_clawmem_does_not_import_redis() -> None:
    script = (
        "import sys, clawmem\n"
        "clawmem.MemoryRegistry, clawmem.FileMemory, clawmem.ArrayMemory\n"
        "assert 'redis' not in sys.modules, sorted(m for m in sys.modules if 'redis' in m)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
