"""One index per host: a worker forked from a process that built the index (gunicorn's preload)
starts from it, catches up from its cursor, and stays exactly as fresh as its parent."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from clawmem.clock import FakeClock
from clawmem.recall import MessageAugmenter
from clawmem.recall.feeds import fresh_index, warm
from clawmem.recall.index import WordIndex

SHARED_BACKENDS = ["sql-sqlite", "sql-mysql", "sql-postgres", "redis"]


def another_process(driver: Any, clock: FakeClock) -> Any:
    """Return a second driver on the same tables or keys, with connections of its own."""
    if hasattr(driver, "engine"):
        from clawmem.memory.sql import SqlMemory
        from clawmem.sql.engine import create_engine

        url = driver.engine.url.render_as_string(hide_password=False)
        return SqlMemory(create_engine(url), prefix=driver.prefix, clock=clock)
    import redis

    from clawmem.memory.redis import RedisMemory

    pool = driver.client.connection_pool.connection_kwargs
    client = redis.Redis(host=pool.get("host"), port=pool.get("port"), db=pool.get("db", 0))
    return RedisMemory(client=client, prefix=driver.prefix, clock=clock)


def recalled(driver: Any, message: str) -> set[str]:
    result = MessageAugmenter(driver, top_k=10, namespace="notes", announce=False).augment(message)
    assert result.error is None, result.error
    return {decision.key for decision in result.decisions if decision.status == "injected"}


def in_a_forked_worker(check: Any) -> Any:
    """Run ``check()`` in a forked child and return what it returned (JSON), or fail with its error."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(reader)
        try:
            answer = {"value": check()}
        except BaseException as exc:  # the parent reports it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(writer, json.dumps(answer).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        answer = json.loads(pipe.read() or '{"error": "the worker died"}')
    os.waitpid(child, 0)
    assert "error" not in answer, answer["error"]
    return answer["value"]


@pytest.mark.parametrize("name", SHARED_BACKENDS)
def test_a_forked_worker_starts_from_its_parents_index_and_sees_every_later_commit(
    name: str, make_driver: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = make_driver(name)
    for number in range(50):
        driver.set(f"tea{number:02d}", f"green tea note {number}", "notes")
    assert warm(driver) == 50
    other = another_process(driver, clock)
    other.set("fresh", "green tea written after the build", "notes")
    other.forget("tea07", "notes")
    other.engine.dispose() if hasattr(other, "engine") else other.client.close()

    def worker() -> list[str]:
        loads: list[int] = []
        original = WordIndex.load
        counted = lambda self, entries: loads.append(1) or original(self, entries)  # noqa: E731
        monkeypatch.setattr(WordIndex, "load", counted)
        seen = recalled(driver, "written after build")
        keys = fresh_index(driver, "notes").live_sizes(int(clock()))
        assert not loads, "the worker built its own index instead of sharing its parent's"
        driver.set("from-worker", "written after build by the worker", "notes")
        return sorted(seen | ({"tea07"} & set(keys)))

    assert in_a_forked_worker(worker) == ["fresh"]
    # The parent's connections survived the worker: it sees the worker's write and the others.
    assert recalled(driver, "written after build") == {"fresh", "from-worker"}
    assert "tea07" not in fresh_index(driver, "notes").live_sizes(int(clock()))


def test_warm_skips_namespaces_a_driver_cannot_feed(tmp_path: Any, clock: FakeClock) -> None:
    from clawmem.memory.array import ArrayMemory
    from clawmem.memory.wrappers import RouterMemory

    class Unfed:
        """A memory without a change feed: recall scans it."""

        def all(self, namespace: str = "default") -> dict[str, Any]:
            return {"k": "green tea"}

    fed = ArrayMemory(clock=clock)
    fed.set("a", "green tea", "notes")
    fed.set("b", "black tea", "notes")
    router = RouterMemory(fed, {"scanned": Unfed()})  # type: ignore[dict-item]
    assert warm(router, ["notes", "scanned"]) == 2


def test_an_erasure_reaches_the_index_a_worker_shares_with_its_parent(
    tmp_path: Any, clock: FakeClock
) -> None:
    from clawmem.privacy.erasure import erase_subject
    from clawmem.privacy.subjects import Subject
    from clawmem.settings import Settings
    from clawmem.sites.site import Site
    from clawmem.sql.engine import create_engine
    from clawmem.sql.schema import create_tables, drop_tables

    url = f"sqlite:///{tmp_path / 'site.db'}"
    engine = create_engine(url)
    create_tables(engine, "")
    site = Site(Settings(instance_path=str(tmp_path / "instance"), database_url=url), clock)
    try:
        site.memory.set("ticket-9", "customer cust-100042 wants a refund of marmalade", "support")
        site.memory.set("tea", "cust-100042 likes marmalade", "user:cust-100042")
        site.memory.set("jam", "marmalade is in aisle three", "support")
        assert warm(site.memory) == 3

        def injected(namespace: str) -> list[str]:
            augmenter = MessageAugmenter(site.memory, namespace=namespace, announce=False)
            result = augmenter.augment("marmalade cust-100042", subject_namespace="user:cust-100042")
            return sorted(decision.key for decision in result.decisions if decision.status == "injected")

        assert injected("support") == ["jam", "tea", "ticket-9"]

        def worker() -> list[str]:
            erase_subject(site, Subject(user_id="cust-100042"), mentions=True)
            return injected("support")

        assert in_a_forked_worker(worker) == ["jam"]  # the worker erased, and its index followed
        assert injected("support") == ["jam"]  # so did its parent's, through the feed
    finally:
        drop_tables(engine, "")
        engine.dispose()
