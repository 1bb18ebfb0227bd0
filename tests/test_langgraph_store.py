"""ClawStore as a LangGraph agent uses it: inside a compiled graph, under a user's subject (export
and erase cover it), with TTLs, behind the privacy switch, and refusing bad input whole."""

from __future__ import annotations

import asyncio
import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import sqlalchemy as sa
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, GetOp, InvalidNamespaceError, PutOp

from clawmem.clock import FakeClock
from clawmem.errors import InvalidNamespace, ValueTooLarge
from clawmem.integrations.langgraph import ClawStore
from clawmem.memory.array import ArrayMemory
from clawmem.memory.sql import SqlMemory
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.rules import subject_namespace
from tests.held_memory import HeldMemory
from tests.test_cli_basics import build_app, claw, url_of

# LangGraph forbids "." in a label, so an e-mail address cannot name a user there.
ALICE, BOB = "Ålice Smith", "bob"


@pytest.fixture
def memory(clock: FakeClock) -> ArrayMemory:
    return ArrayMemory(clock=clock)


# -- in a graph ------------------------------------------------------------------------------


class Turn(TypedDict):
    user: str
    said: str
    recalled: Annotated[list[str], operator.add]


def build_graph(store: BaseStore) -> Any:
    """Two two-node graphs (sync nodes, async nodes): one node stores what the user said, the
    next searches for it."""

    def remember(state: Turn, *, store: BaseStore) -> dict[str, Any]:
        store.put(("users", state["user"], "facts"), "latest", {"text": state["said"]})
        return {}

    def recall(state: Turn, *, store: BaseStore) -> dict[str, Any]:
        hits = store.search(("users", state["user"]), query=state["said"], limit=3)
        return {"recalled": [hit.value["text"] for hit in hits]}

    async def aremember(state: Turn, *, store: BaseStore) -> dict[str, Any]:
        await store.aput(("users", state["user"], "facts"), "latest", {"text": state["said"]})
        return {}

    async def arecall(state: Turn, *, store: BaseStore) -> dict[str, Any]:
        hits = await store.asearch(("users", state["user"]), query=state["said"], limit=3)
        return {"recalled": [hit.value["text"] for hit in hits]}

    graphs = []
    for first, second in ((remember, recall), (aremember, arecall)):
        builder = StateGraph(Turn)
        builder.add_node("remember", first)
        builder.add_node("recall", second)
        builder.add_edge(START, "remember")
        builder.add_edge("remember", "recall")
        builder.add_edge("recall", END)
        graphs.append(builder.compile(store=store))
    return graphs


def test_a_compiled_graph_keeps_its_memory_in_clawmem_under_invoke_and_ainvoke(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock
) -> None:
    memory = SqlMemory(engine, prefix, clock=clock)
    graph, async_graph = build_graph(ClawStore(memory))

    first = graph.invoke({"user": BOB, "said": "my favourite tea is oolong", "recalled": []})
    second = asyncio.run(async_graph.ainvoke({"user": ALICE, "said": "I drink rooibos", "recalled": []}))

    assert first["recalled"] == ["my favourite tea is oolong"]
    assert second["recalled"] == ["I drink rooibos"]
    # Ordinary entries of each user's subject namespace: what the dashboard and export read.
    assert memory.all("user:bob")['["facts","latest"]']["v"] == {"text": "my favourite tea is oolong"}
    assert list(memory.all(subject_namespace(ALICE))) == ['["facts","latest"]']


def test_export_and_erase_by_user_id_cover_a_users_items(
    engine: sa.engine.Engine, prefix: str, clock: FakeClock, tmp_path: Path
) -> None:
    store = ClawStore(SqlMemory(engine, prefix, clock=clock))
    store.put(("users", ALICE, "memories"), "m1", {"text": "allergic to peanuts"})
    store.put(("users", ALICE), "m2", {"text": "lives in Leeds"})
    store.put(("users", BOB, "memories"), "m1", {"text": "likes jazz"})
    app = build_app(url_of(engine), prefix, clock, tmp_path / "instance")

    exported = claw(app, "export", "--user-id", ALICE)
    assert exported.exit_code == 0, exported.output
    values = [entry["value"]["v"] for entry in json.loads(exported.stdout)["memory"]]
    assert sorted(value["text"] for value in values) == ["allergic to peanuts", "lives in Leeds"]

    erased = claw(app, "erase", "--user-id", ALICE, "--yes")
    assert erased.exit_code == 0, erased.output
    assert store.search(("users", ALICE)) == []
    assert [item.value for item in store.search(("users",))] == [{"text": "likes jazz"}]


def test_items_carry_the_stores_times_and_a_rewrite_keeps_created_at(
    memory: ArrayMemory, clock: FakeClock
) -> None:
    store = ClawStore(memory)
    store.put(("docs",), "k", {"v": 1})
    clock.advance(90)
    store.put(("docs",), "k", {"v": 2})
    item = store.get(("docs",), "k")
    assert item is not None and item.value == {"v": 2}
    assert (item.updated_at - item.created_at).total_seconds() == 90
    assert item.created_at.timestamp() == 1_700_000_000


# -- TTL -----------------------------------------------------------------------------------


def test_a_fractional_ttl_rounds_up_to_whole_seconds(memory: ArrayMemory, clock: FakeClock) -> None:
    store = ClawStore(memory)
    store.put(("docs",), "k", {"v": 1}, ttl=0.505)  # 30.3 seconds: expires after 31
    clock.advance(30)
    assert store.get(("docs",), "k", refresh_ttl=False) is not None
    clock.advance(1)
    assert store.get(("docs",), "k") is None


@pytest.mark.parametrize("read", ["get", "search"])
def test_a_read_renews_the_original_ttl_unless_told_not_to(
    memory: ArrayMemory, clock: FakeClock, read: str
) -> None:
    store = ClawStore(memory)
    store.put(("docs",), "renewed", {"v": 1}, ttl=1)
    store.put(("docs",), "kept", {"v": 2}, ttl=1)
    clock.advance(50)
    if read == "get":
        store.get(("docs",), "renewed")
        store.get(("docs",), "kept", refresh_ttl=False)
    else:
        store.search(("docs",), filter={"v": 1})
        store.search(("docs",), filter={"v": 2}, refresh_ttl=False)
    clock.advance(50)  # 100 s after the put, 50 s after the read
    assert store.get(("docs",), "kept") is None
    renewed = store.get(("docs",), "renewed")
    assert renewed is not None and renewed.updated_at.timestamp() == 1_700_000_000  # a renewal is no update
    clock.advance(60)
    assert store.get(("docs",), "renewed") is None


def test_a_ttl_config_sets_the_default_and_whether_reads_renew(memory: ArrayMemory, clock: FakeClock) -> None:
    store = ClawStore(memory, ttl={"default_ttl": 1, "refresh_on_read": False})
    store.put(("docs",), "k", {"v": 1})
    clock.advance(50)
    assert store.get(("docs",), "k") is not None
    clock.advance(10)
    assert store.get(("docs",), "k") is None


def test_with_the_privacy_switch_off_nothing_is_stored_and_no_read_renews(
    memory: ArrayMemory, clock: FakeClock
) -> None:
    ClawStore(memory).put(("docs",), "old", {"v": 1}, ttl=1)
    store = ClawStore(PrivacyAwareMemory(memory, store_messages=False))
    store.put(("docs",), "new", {"v": 2})
    clock.advance(50)
    assert store.get(("docs",), "old") is not None  # written before the switch: still readable
    clock.advance(10)
    assert store.get(("docs",), "old") is None  # the read renewed nothing
    assert store.get(("docs",), "new") is None and memory.namespaces() == ["langgraph:docs"]


# -- bad input: the framework's error or a clear ValueError/TypeError, nothing written -------


def put(namespace: tuple[Any, ...], value: Any, key: str = "k", ttl: Any = None) -> PutOp:
    return PutOp(namespace, key, value, ttl=ttl)


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        (put(("docs", "a.b"), {"v": 1}), InvalidNamespaceError, "periods"),
        (put(("docs", ""), {"v": 1}), InvalidNamespaceError, "empty"),
        (put(("langgraph", "x"), {"v": 1}), InvalidNamespaceError, "langgraph"),
        (put((), {"v": 1}), InvalidNamespaceError, "empty"),
        (put(("docs", 7), {"v": 1}), InvalidNamespaceError, "strings"),
        (put(("docs",), ["not", "a", "dict"]), TypeError, "dict"),
        (put(("docs",), "text"), TypeError, "dict"),
        (put(("docs",), {"v": float("nan")}), ValueError, "finite"),
        (put(("docs",), {"v": object()}), TypeError, "object"),
        (put(("docs",), {"v": 1}, ttl=0), ValueError, "ttl"),
        (put(("docs",), {"v": 1}, ttl=True), ValueError, "ttl"),
        (put(("docs",), {"v": 1}, key=""), ValueError, "empty"),
        (put(("docs",), {"v": 1}, key="x" * 192), ValueError, "191"),
        (put(("a" * 60, "b" * 40), {"v": 1}), InvalidNamespace, "100"),
        (put(("users", "u" * 120), {"v": 1}), ValueError, "too long"),
        (put(("docs",), {"v": "x" * 2000}), ValueTooLarge, "bytes"),
        ("not an op", ValueError, "unknown"),
    ],
)
def test_bad_input_is_refused_and_nothing_of_the_batch_is_written(
    clock: FakeClock, bad: Any, error: type[Exception], words: str
) -> None:
    memory = ArrayMemory(clock=clock, max_value_bytes=1000)
    store = ClawStore(memory)
    with pytest.raises(error, match=words):
        store.batch([put(("docs",), {"fine": True}, key="first"), bad])
    assert memory.namespaces() == []


@pytest.mark.parametrize(
    ("search", "error"),
    [
        ({"filter": {"n": {"$regex": "x"}}}, ValueError),
        ({"filter": ["n"]}, TypeError),
        ({"limit": -1}, ValueError),
        ({"offset": 1.5}, ValueError),
    ],
)
def test_a_bad_search_is_refused(memory: ArrayMemory, search: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        ClawStore(memory).search(("docs",), **search)


def test_a_get_of_a_forbidden_label_raises_langgraphs_own_error(memory: ArrayMemory) -> None:
    with pytest.raises(InvalidNamespaceError):
        ClawStore(memory).batch([GetOp(("a.b",), "k")])


def test_entries_written_by_something_else_are_not_items(memory: ArrayMemory) -> None:
    memory.set("tea", "green", "user:bob")  # the subject's own fact, not a LangGraph item
    memory.set("k", {"v": 1}, "langgraph:docs")  # not an envelope
    store = ClawStore(memory)
    assert store.get(("docs",), "k") is None
    assert store.search(()) == [] and store.list_namespaces() == []


# -- async -----------------------------------------------------------------------------------


def test_async_methods_leave_the_event_loop_free_while_storage_is_slow(clock: FakeClock) -> None:
    memory = HeldMemory(clock)
    store = ClawStore(memory)

    async def main() -> list[str]:
        served: list[str] = []
        reading = asyncio.create_task(store.aget(("docs",), "k"))
        while not memory.entered.is_set():
            await asyncio.sleep(0)
        served.append("another coroutine ran while the read was held")
        memory.release.set()
        assert await reading is None
        return served

    assert asyncio.run(main()) == ["another coroutine ran while the read was held"]
