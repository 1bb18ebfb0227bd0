"""Sites stay apart on every key/value driver (SPEC 4.2).

Two sites share one SQL database, one Redis database or one ``CLAW_FILE_DIR``, and each store is
built from its site's settings by the registry, so the wiring from ``CLAW_TABLE_PREFIX`` is what
is tested. Whatever one site sets, forgets, flushes or sweeps, the other site's stored data stays
byte-identical: its table rows, its Redis keys (DUMP and absolute expiry), its directory's files.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from clawmem.clock import FakeClock
from clawmem.memory.array import ArrayMemory
from clawmem.memory.base import BaseMemory
from clawmem.memory.file import FileMemory
from clawmem.memory.redis import RedisMemory
from clawmem.memory.registry import registry
from clawmem.settings import Settings
from clawmem.sql.engine import create_engine
from clawmem.sql.schema import create_tables, drop_tables
from tests.conftest import backend_url, sql_url

TTL = 3600  # long enough that the real Redis never expires an entry while a test runs
NAMESPACES = ["crm", "crm:eu", "default"]

DRIVERS = ["file", "sql-sqlite", "sql-mysql", "sql-postgres", "redis"]


@dataclass
class Site:
    """One site's store, and a way to read everything it has stored, byte for byte."""

    prefix: str
    memory: BaseMemory
    stored: Callable[[], Any]


def _settings(driver: str, prefix: str, tmp_path: Path) -> Settings:
    """Return site ``prefix``'s settings for ``driver`` (``sql-<backend>`` names a SQL backend)."""
    chosen: dict[str, Any] = {}
    if driver.startswith("sql-"):
        chosen["database_url"] = sql_url(driver.removeprefix("sql-"), tmp_path)
    if driver == "redis":
        chosen["redis_url"] = backend_url("redis")
    return Settings(
        instance_path=str(tmp_path / "instance"),
        table_prefix=prefix,
        memory_driver=driver.split("-")[0],
        file_dir=str(tmp_path / "memory"),
        **chosen,
    )


def _build(driver: str, prefix: str, tmp_path: Path, clock: FakeClock) -> BaseMemory:
    settings = _settings(driver, prefix, tmp_path)
    memory = registry.build(settings.memory_driver, settings, clock)
    assert isinstance(memory, BaseMemory)
    return memory


def _file_bytes(memory: FileMemory) -> Callable[[], dict[str, tuple[bytes, int]]]:
    def stored() -> dict[str, tuple[bytes, int]]:
        return {
            str(path.relative_to(memory.root)): (path.read_bytes(), path.stat().st_mtime_ns)
            for path in sorted(memory.directory.rglob("*"))
        }

    return stored


def _redis_dump(memory: RedisMemory, pattern: str) -> Callable[[], dict[bytes, tuple[bytes, int]]]:
    # EXPIRETIME is absolute, so it stays put while the real clock runs, unlike TTL.
    def stored() -> dict[bytes, tuple[bytes, int]]:
        keys = sorted(memory.client.scan_iter(match=pattern, count=1000))
        return {key: (memory.client.dump(key), memory.client.expiretime(key)) for key in keys}

    return stored


def _sql_rows(engine: sa.engine.Engine, prefix: str) -> Callable[[], list[tuple[Any, ...]]]:
    def stored() -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT * FROM {prefix}phpclaw_memory ORDER BY id"))
            return [tuple(row) for row in rows]

    return stored


@pytest.fixture
def open_site(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[[str, str], Site]]:
    """Open site ``prefix`` on ``driver`` through the registry; everything it made is removed."""
    cleanups: list[Callable[[], None]] = []

    def open_one(driver: str, prefix: str) -> Site:
        memory = _build(driver, prefix, tmp_path, clock)
        if isinstance(memory, FileMemory):
            return Site(prefix, memory, _file_bytes(memory))
        if isinstance(memory, RedisMemory):
            redis_prefix = f"{prefix}phpclaw:"
            assert memory.prefix == redis_prefix
            # The prefix holds this test's unique table prefix, so these keys are all its own.
            cleanups.append(
                lambda: [memory.client.delete(key) for key in memory.client.scan_iter(f"{redis_prefix}*")]
            )
            return Site(prefix, memory, _redis_dump(memory, f"{redis_prefix}*"))
        engine = create_engine(memory.engine.url.render_as_string(hide_password=False))
        create_tables(engine, prefix)

        def drop() -> None:
            drop_tables(engine, prefix)
            engine.dispose()

        cleanups.append(drop)
        return Site(prefix, memory, _sql_rows(engine, prefix))

    yield open_one
    for cleanup in cleanups:
        cleanup()


def _stock(site: Site) -> None:
    """Give a site the same keys as its neighbour, each value naming the site it belongs to."""
    for namespace in NAMESPACES:
        site.memory.set("shared", f"{site.prefix}:{namespace}", namespace)
        site.memory.set("keep", [site.prefix, 1.0], namespace)
        site.memory.set("soon", {"site": site.prefix}, namespace, ttl=TTL)


def _set(memory: BaseMemory, clock: FakeClock) -> None:
    memory.set("shared", "changed", "crm", ttl=TTL)
    memory.set("new", "only here", "crm:eu")
    assert memory.get("shared", "crm") == "changed"


def _forget(memory: BaseMemory, clock: FakeClock) -> None:
    memory.forget("shared", "crm")
    memory.forget("keep", "default")
    assert not memory.has("shared", "crm")


def _flush(memory: BaseMemory, clock: FakeClock) -> None:
    memory.flush("crm")
    assert memory.all("crm") == {}


def _sweep(memory: BaseMemory, clock: FakeClock) -> None:
    clock.advance(2 * TTL)
    assert memory.sweep(dry_run=True) == dict.fromkeys(NAMESPACES, 1)
    assert memory.sweep() == dict.fromkeys(NAMESPACES, 1)
    assert memory.sweep() == {}


OPERATIONS = {"set": _set, "forget": _forget, "flush": _flush, "sweep": _sweep}


@pytest.mark.parametrize("acting", ["shorter", "longer"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.slow
def test_what_one_site_does_leaves_the_other_sites_data_byte_identical(
    open_site: Callable[[str, str], Site],
    prefix: str,
    clock: FakeClock,
    driver: str,
    operation: str,
    acting: str,
) -> None:
    # Like wp_ and wp_2_: one prefix is a string prefix of the other.
    shorter, longer = open_site(driver, prefix), open_site(driver, f"{prefix}2_")
    one, other = (shorter, longer) if acting == "shorter" else (longer, shorter)
    _stock(one)
    _stock(other)
    before = other.stored()
    assert before

    OPERATIONS[operation](one.memory, clock)

    assert other.stored() == before
    assert other.memory.namespaces() == sorted(NAMESPACES)
    for namespace in NAMESPACES:
        assert other.memory.get("shared", namespace) == f"{other.prefix}:{namespace}"
        assert other.memory.get("keep", namespace) == [other.prefix, 1.0]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_site_reads_only_its_own_entries(
    open_site: Callable[[str, str], Site], prefix: str, driver: str
) -> None:
    shorter, longer = open_site(driver, prefix), open_site(driver, f"{prefix}2_")
    _stock(shorter)
    assert longer.memory.namespaces() == []
    for namespace in NAMESPACES:
        assert longer.memory.all(namespace) == {}
        assert longer.memory.search(prefix, namespace=namespace) == []
        assert not longer.memory.has("keep", namespace)
    _stock(longer)
    for site in (shorter, longer):
        assert site.memory.all("crm") == {
            "keep": [site.prefix, 1.0],
            "shared": f"{site.prefix}:crm",
            "soon": {"site": site.prefix},
        }


def test_array_stores_built_for_two_sites_are_separate(tmp_path: Path, clock: FakeClock) -> None:
    # The array driver keeps nothing outside its own process and instance.
    one, other = (_build("array", site, tmp_path, clock) for site in ("wp_", "wp_2_"))
    assert isinstance(one, ArrayMemory) and one is not other
    one.set("k", "wp_")
    other.set("k", "wp_2_")
    one.flush()
    assert other.all() == {"k": "wp_2_"}


# -- site names that look alike ----------------------------------------------------------------

# "" and "x" are the brief's pair: "phpclaw:" vs "xphpclaw:"; the others are the file names'.
LOOKALIKES = [("", "x"), ("x", "X"), ("", "default"), ("site", "")]


@pytest.fixture
def namespaces() -> list[str]:
    """Namespaces no other test uses, since the prefix "" is shared by every default setting."""
    tag = uuid.uuid4().hex[:8]
    return [f"n{tag}", f"n{tag}:sub"]


def _lookalike_redis_dump(memory: RedisMemory, namespaces: list[str]) -> Callable[[], Any]:
    # Only this test's namespaces: other users of the shared prefix may change theirs meanwhile.
    dumps = [_redis_dump(memory, f"{memory.prefix}{{{namespace}}}*") for namespace in namespaces]

    def stored() -> Any:
        members = [memory.client.sismember(memory.namespaces_key, namespace) for namespace in namespaces]
        return [dump() for dump in dumps], members

    return stored


@pytest.mark.parametrize(("site", "other_site"), LOOKALIKES)
@pytest.mark.parametrize("driver", ["file", "redis"])
def test_site_names_that_look_alike_never_collide(
    tmp_path: Path, driver: str, site: str, other_site: str, namespaces: list[str]
) -> None:
    # An early fake time: a sweep of the shared prefix "" must not reach other tests' entries.
    clock = FakeClock(1_000.25)
    stores: list[Any] = [_build(driver, prefix, tmp_path, clock) for prefix in (site, other_site)]
    if driver == "file":
        snapshots = [_file_bytes(store) for store in stores]
        assert stores[0].directory != stores[1].directory
    else:
        snapshots = [_lookalike_redis_dump(store, namespaces) for store in stores]
    try:
        for store, prefix in zip(stores, (site, other_site), strict=True):
            for namespace in namespaces:
                store.set("k", prefix, namespace)
                store.set("gone", prefix, namespace, ttl=TTL)
        for acting, watched in ((0, 1), (1, 0)):
            assert stores[watched].all(namespaces[0])
            before = snapshots[watched]()
            store = stores[acting]
            store.set("k", "changed", namespaces[0])
            store.forget("gone", namespaces[0])
            clock.advance(2 * TTL)
            assert store.sweep().get(namespaces[1]) == 1
            store.flush(namespaces[1])
            assert snapshots[watched]() == before
    finally:
        for store in stores:
            for namespace in namespaces:
                store.flush(namespace)


# -- CLAW_SITES: the sites one dashboard offers ---------------------------------------------------


def test_claw_sites_gives_label_prefix_pairs_in_the_order_written(tmp_path: Path) -> None:
    environment = {"CLAW_SITES": " shop = wp_ , blog=wp_2_,, bare= ", "CLAW_TABLE_PREFIX": "wp_"}
    settings = Settings.from_env(environment, tmp_path)
    assert settings.site_prefixes == (("shop", "wp_"), ("blog", "wp_2_"), ("bare", ""))
    assert settings.table_prefix == "wp_"  # what every command acts on stays CLAW_TABLE_PREFIX


@pytest.mark.parametrize("sites", ["", " , "])
def test_without_claw_sites_the_one_site_is_the_table_prefix(sites: str, tmp_path: Path) -> None:
    settings = Settings.from_env({"CLAW_SITES": sites, "CLAW_TABLE_PREFIX": "wp_3_"}, tmp_path)
    assert settings.site_prefixes == (("default", "wp_3_"),)
