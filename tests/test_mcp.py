"""The MCP memory server in process, driven by the SDK's own client (``mcp.Client(server)``): its
tools and their annotations, what each returns, recall equal to ``MessageAugmenter``'s, the scope
flags, run ids on events, and every bad input as a one-line tool error that writes nothing."""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, Tool

from clawmem import InvalidNamespace, MessageAugmenter, Settings, events, open_memory, subject_namespace
from clawmem.clock import FakeClock
from clawmem.integrations.mcp import server
from clawmem.sql.engine import engine_for
from clawmem.sql.schema import create_tables, drop_tables
from tests.conftest import SQL_BACKENDS, sql_url

ROOT = Path(__file__).resolve().parent.parent
TOOLS = {"recall", "remember", "get", "list_namespaces", "list_keys", "search"}
READS = TOOLS - {"remember"}
ALICE = "user:cust-1"

FACTS: dict[str, dict[str, Any]] = {
    "default": {
        "shipping_policy": "Orders ship within 2 business days",
        "returns": "Returns are accepted within 30 days of delivery",
        "store_hours": "Open 9 to 5 on business days",
        "big_catalogue": "orders " + "catalogue " * 600,
        "gift": {"wrap": True, "note": "gift orders ship free"},
        "tie_b": "express delivery orders",
        "tie_a": "express delivery orders",
    },
    ALICE: {"shipping_policy": "Alice's orders ship by express", "name": "Alice"},
    "crm": {"note": "orders of the crm"},
}


# -- helpers ----------------------------------------------------------------------------------------


def in_session(app: MCPServer, body: Callable[[Client], Awaitable[Any]]) -> Any:
    """Run ``body(client)`` in one session of the SDK's in-process client."""

    async def main() -> Any:
        async with Client(app) as client:
            return await body(client)

    return anyio.run(main)


def calls(app: MCPServer, *requests: tuple[str, dict[str, Any]]) -> list[CallToolResult]:
    """Make ``requests`` (tool name, arguments) in order in one session."""

    async def body(client: Client) -> list[CallToolResult]:
        return [await client.call_tool(name, arguments) for name, arguments in requests]

    return in_session(app, body)


def call(app: MCPServer, name: str, **arguments: Any) -> dict[str, Any]:
    """Return the structured result of one successful call."""
    (result,) = calls(app, (name, arguments))
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def error_of(result: CallToolResult) -> str:
    """Return the text of a tool error, which must be one line."""
    assert result.is_error and result.structured_content is None
    (content,) = result.content
    text = content.text  # type: ignore[union-attr]
    assert "\n" not in text and text.strip() == text, text
    return text


def tools_of(app: MCPServer) -> dict[str, Tool]:
    async def body(client: Client) -> dict[str, Tool]:
        return {tool.name: tool for tool in (await client.list_tools()).tools}

    return in_session(app, body)


def instructions_of(app: MCPServer) -> str:
    async def body(client: Client) -> str:
        return client.instructions or ""

    return in_session(app, body)


def stored(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every live entry of every namespace, read directly from the site's memory."""
    memory = open_memory(settings)
    return {namespace: memory.all(namespace) for namespace in memory.namespaces()}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000.25)


def site_settings(url: str, prefix: str, tmp_path: Path, **changes: Any) -> Settings:
    return Settings(instance_path=str(tmp_path), database_url=url, table_prefix=prefix, **changes)


@pytest.fixture
def settings(tmp_path: Path, prefix: str) -> Iterator[Settings]:
    """A SQLite site with its tables and the FACTS in it."""
    settings = site_settings(sql_url("sqlite", tmp_path), prefix, tmp_path)
    create_tables(engine_for(settings.database_url), prefix)
    fill(settings)
    yield settings


def fill(settings: Settings, clock: Callable[[], float] | None = None) -> None:
    memory = open_memory(settings, clock) if clock else open_memory(settings)
    for namespace, facts in FACTS.items():
        for key, value in facts.items():
            memory.set(key, value, namespace)


# -- the tools --------------------------------------------------------------------------------------


def test_the_tools_their_annotations_and_typed_outputs(settings: Settings) -> None:
    tools = tools_of(server(settings))
    assert set(tools) == TOOLS
    for name in READS:
        assert tools[name].annotations.read_only_hint is True, name
        assert tools[name].annotations.destructive_hint is False, name
    assert tools["remember"].annotations.read_only_hint is False
    for tool in tools.values():
        assert tool.description and tool.title
        assert tool.output_schema is not None and "run_id" in tool.output_schema["properties"], tool.name
    assert set(tools["recall"].output_schema["properties"]) >= {
        "text",
        "lines",
        "candidates",
        "zero_overlap",
        "injected",
    }
    ttl = tools["remember"].input_schema["properties"]["ttl_seconds"]
    assert {"exclusiveMinimum": 0, "type": "integer"} in ttl["anyOf"]
    assert tools["list_keys"].input_schema["required"] == ["namespace"]


def test_no_tool_deletes_and_the_instructions_say_deletion_stays_in_the_cli(settings: Settings) -> None:
    app = server(settings)
    deleting = {"forget", "flush", "erase", "delete", "clear", "remove", "prune", "sweep", "purge"}
    assert not any(word in name for name in tools_of(app) for word in deleting)
    instructions = instructions_of(app)
    assert "Nothing can be deleted through this server" in instructions
    assert "clawmem forget" in instructions and "clawmem erase" in instructions
    before = stored(settings)
    results = calls(
        app,
        ("recall", {"message": "orders ship express"}),
        ("get", {"key": "returns"}),
        ("list_namespaces", {}),
        ("list_keys", {"namespace": "default"}),
        ("search", {"query": "orders"}),
        ("remember", {"key": "shipping_policy", "value": "Orders ship the same day"}),
    )
    assert not any(result.is_error for result in results)
    after = stored(settings)
    # Every tool ran; the only change is the value remember replaced.
    assert {ns: set(facts) for ns, facts in after.items()} == {ns: set(facts) for ns, facts in before.items()}
    assert after["default"]["shipping_policy"] == "Orders ship the same day"


MESSAGES = [
    "ship by express",
    "When do my orders ship?",
    "returns within 30 days",
    "express delivery orders",
    "orders",
    "nothing in common zzz",
    "",
]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_recall_gives_the_text_and_decisions_of_message_augmenter(
    backend: str, tmp_path: Path, prefix: str
) -> None:
    settings = site_settings(sql_url(backend, tmp_path), prefix, tmp_path, recall_top_k=2)
    engine = engine_for(settings.database_url)
    create_tables(engine, prefix)
    try:
        fill(settings)
        app = server(settings)
        augmenter = MessageAugmenter(open_memory(settings), top_k=2, namespace="default")
        requests = [("recall", {"message": message}) for message in MESSAGES]
        requests += [("recall", {"message": message, "subject": "cust-1"}) for message in MESSAGES]
        results = calls(app, *requests)
        expected = [augmenter.augment(message) for message in MESSAGES]
        expected += [augmenter.augment(message, subject_namespace("cust-1")) for message in MESSAGES]
        for result, report in zip(results, expected, strict=True):
            got = result.structured_content
            assert got["text"] == report.text
            assert got["injected"] == report.injected_keys
            assert got["candidates"] == [
                {
                    "namespace": d.namespace,
                    "key": d.key,
                    "score": d.score,
                    "matched": list(d.matched),
                    "status": d.status,
                    "reason": d.reason,
                    "bytes": d.bytes,
                }
                for d in report.decisions
            ]
            assert got["candidates_total"] == len(report.decisions)
            assert got["zero_overlap"] == report.zero_overlap
            assert got["bytes_used"] == report.bytes_used and got["top_k"] == 2
            assert "".join(f"{line}\n" for line in got["lines"]) in report.text
        with_subject = results[len(MESSAGES)].structured_content
        assert with_subject["namespaces"] == [ALICE, "default"]
        assert with_subject["lines"][0] == "- shipping_policy: Alice's orders ship by express"
        nothing = results[MESSAGES.index("nothing in common zzz")].structured_content
        assert nothing["text"] == "nothing in common zzz" and nothing["lines"] == []  # byte-identical
        statuses = {c["status"] for result in results for c in result.structured_content["candidates"]}
        assert statuses == {"injected", "truncated", "cut_byte_cap", "cut_top_k"}  # every decision
    finally:
        drop_tables(engine, prefix)


def test_remember_then_recall_get_and_list_see_the_write_and_its_ttl(
    settings: Settings, clock: FakeClock
) -> None:
    app = server(settings, clock=clock)
    fact = "Parcels wait 3 days in the locker"
    written = call(app, "remember", key="parcel_locker", value=fact, ttl_seconds=60)
    assert written["namespace"] == "default" and written["key"] == "parcel_locker"
    assert written["expires_at"] == 1_700_000_000 + 60  # floor(now) + ttl
    assert written["bytes"] == len(f'"{fact}"')
    recalled = call(app, "recall", message="How long does my parcel wait in the locker?")
    assert recalled["lines"] == ["- parcel_locker: Parcels wait 3 days in the locker"]
    got = call(app, "get", key="parcel_locker")
    assert (got["found"], got["value"], got["expires_at"]) == (True, fact, 1_700_000_060)
    keys = {k["key"]: k for k in call(app, "list_keys", namespace="default")["keys"]}
    assert keys["parcel_locker"]["expires_at"] == 1_700_000_060 and keys["returns"]["expires_at"] is None
    clock.advance(59.75)  # now >= expires_at: expired for every tool at once
    got = call(app, "get", key="parcel_locker")
    assert (got["found"], got["value"]) == (False, None)
    assert call(app, "recall", message="How long does my parcel wait in the locker?")["lines"] == []
    assert "parcel_locker" not in [k["key"] for k in call(app, "list_keys", namespace="default")["keys"]]


def test_remember_says_where_the_entry_came_from_as_a_turns_tool_does(
    settings: Settings, clock: FakeClock
) -> None:
    app = server(settings, clock=clock)
    written = call(app, "remember", key="parcel_locker", value="Parcels wait 3 days")
    row = open_memory(settings).inner.entry("default", "parcel_locker")  # type: ignore[attr-defined]
    assert row.metadata == {
        "origin": "mcp",
        "conversation_id": None,
        "message_id": None,
        "run_id": written["run_id"],
        "written_at": "2023-11-14T22:13:20.250000+00:00",
    }


def test_get_list_and_search_answer_as_the_memory_does(settings: Settings) -> None:
    app = server(settings)
    assert call(app, "get", key="gift")["value"] == {"wrap": True, "note": "gift orders ship free"}
    assert call(app, "get", key="missing")["found"] is False
    assert call(app, "get", key="name", namespace=ALICE)["value"] == "Alice"
    listed = call(app, "list_namespaces")
    assert listed["namespaces"] == sorted(FACTS) and listed["home"] == "default"
    hits = call(app, "search", query="express orders", limit=3)["hits"]
    assert [(h["key"], h["score"]) for h in hits] == [("tie_a", 2), ("tie_b", 2), ("big_catalogue", 1)]
    memory = open_memory(settings)
    for number in range(230):
        memory.set(f"k{number:03d}", number, "paged")
    pages, cursor = [], None
    while True:
        page = call(app, "list_keys", namespace="paged", **({"cursor": cursor} if cursor else {}))
        pages.append([k["key"] for k in page["keys"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(page) for page in pages] == [100, 100, 30]
    assert sum(pages, []) == [f"k{number:03d}" for number in range(230)]


def test_each_call_runs_in_a_run_context_of_its_own(settings: Settings) -> None:
    seen: list[dict[str, Any]] = []
    events.on("*", seen.append)
    try:
        results = calls(
            server(settings),
            ("remember", {"key": "k1", "value": "orders"}),
            ("recall", {"message": "orders"}),
            ("get", {"key": "k1"}),
        )
    finally:
        events.off("*", seen.append)
    run_ids = [result.structured_content["run_id"] for result in results]
    assert len(set(run_ids)) == 3
    assert [e["run_id"] for e in seen if e["event"] == "memory.write"] == [run_ids[0]]
    assert {e["run_id"] for e in seen if e["event"] in ("memory.search", "memory.recalled")} == {run_ids[1]}
    assert all(e["run_id"] in run_ids for e in seen)


# -- bad input and faults ---------------------------------------------------------------------------


def deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


BAD_INPUT = [
    ("remember", {"key": "", "value": 1}, "key must not be empty"),
    ("remember", {"key": "a\x1bb", "value": 1}, "control character U+001B"),
    ("remember", {"key": "k" * 192, "value": 1}, "must not exceed 191 characters"),
    ("remember", {"key": "k", "value": 1, "namespace": "bad ns"}, "illegal characters"),
    ("remember", {"key": "k", "value": 1, "namespace": "a..b"}, "contains '..'"),
    ("remember", {"key": "k", "value": "x" * 300}, "302 bytes, over the limit of 100 bytes"),
    ("remember", {"key": "k", "value": deep(80)}, "nested"),
    ("remember", {"key": "k", "value": 1, "ttl_seconds": 0}, "greater than 0"),
    ("remember", {"key": "k", "value": 1, "ttl_seconds": -5}, "greater than 0"),
    ("remember", {"key": "k", "value": 1, "ttl_seconds": 1.5}, "valid integer"),
    ("remember", {"key": "k", "value": 1, "ttl_seconds": True}, "valid integer"),
    ("remember", {"key": "k", "value": 1, "ttl_seconds": "60"}, "valid integer"),
    ("remember", {"value": 1}, "key: Field required"),
    ("remember", {"key": 5, "value": 1}, "key: Input should be a valid string"),
    ("get", {"key": "k", "namespace": ""}, "namespace must not be empty"),
    ("list_keys", {"namespace": "n" * 101}, "must not exceed 100 characters"),
    ("list_keys", {"namespace": "default", "cursor": "not-a-cursor"}, "invalid cursor"),
    ("search", {"query": "orders", "limit": 0}, "greater than or equal to 1"),
    ("recall", {"message": "orders", "subject": ""}, "non-empty"),
    ("forget", {"key": "shipping_policy"}, "Unknown tool: forget"),
]


@pytest.mark.parametrize(("tool", "arguments", "says"), BAD_INPUT, ids=[f"{t}-{s}" for t, _, s in BAD_INPUT])
def test_bad_input_is_a_one_line_tool_error_that_writes_nothing(
    settings: Settings, tool: str, arguments: dict[str, Any], says: str
) -> None:
    settings = settings.replace(max_value_bytes=100)
    before = stored(settings)
    bad, good = calls(server(settings), (tool, arguments), ("get", {"key": "returns"}))
    assert says in error_of(bad)
    assert stored(settings) == before
    assert good.structured_content["found"] is True  # the server goes on serving


def test_with_storage_off_remember_is_refused_with_the_reason_and_old_facts_still_recall(
    settings: Settings,
) -> None:
    settings = settings.replace(store_messages=False)
    before = stored(settings)
    refused, recalled = calls(
        server(settings),
        ("remember", {"key": "new_fact", "value": "orders ship on Sundays"}),
        ("recall", {"message": "When do orders ship?"}),
    )
    assert "CLAW_STORE_MESSAGES=false" in error_of(refused) and "nothing was written" in error_of(refused)
    assert stored(settings) == before
    assert "- shipping_policy: Orders ship within 2 business days" in recalled.structured_content["lines"]


def test_a_storage_failure_is_a_tool_error_and_the_server_keeps_serving(settings: Settings) -> None:
    engine = engine_for(settings.database_url)
    app = server(settings)

    async def body(client: Client) -> list[CallToolResult]:
        results = [await client.call_tool("get", {"key": "returns"})]
        drop_tables(engine, settings.table_prefix)  # the database loses its tables mid-session
        for name, arguments in [
            ("recall", {"message": "orders"}),
            ("remember", {"key": "k", "value": 1}),
            ("get", {"key": "returns"}),
            ("list_keys", {"namespace": "default"}),
            ("list_namespaces", {}),
            ("search", {"query": "orders"}),
        ]:
            results.append(await client.call_tool(name, arguments))
        create_tables(engine, settings.table_prefix)
        results.append(await client.call_tool("remember", {"key": "k", "value": "orders again"}))
        results.append(await client.call_tool("recall", {"message": "orders again"}))
        return results

    first, *failed, wrote, recalled = in_session(app, body)
    assert first.structured_content["found"] is True
    for result in failed:
        assert "sql memory:" in error_of(result) and "failed" in error_of(result)
    assert not wrote.is_error
    assert recalled.structured_content["lines"] == ["- k: orders again"]


# -- scope ----------------------------------------------------------------------------------------------


def test_namespace_limits_reads_and_writes_to_that_namespace(settings: Settings) -> None:
    app = server(settings, namespace="crm")
    outside = "is outside this server's scope"
    results = calls(
        app,
        ("get", {"key": "returns", "namespace": "default"}),
        ("list_keys", {"namespace": ALICE}),
        ("search", {"query": "orders", "namespace": "default"}),
        ("remember", {"key": "k", "value": 1, "namespace": "default"}),
        ("recall", {"message": "orders", "subject": "cust-1"}),
    )
    for result in results:
        assert outside in error_of(result)
    assert call(app, "list_namespaces")["namespaces"] == ["crm"]
    assert call(app, "remember", key="lead", value="orders in bulk")["namespace"] == "crm"
    recalled = call(app, "recall", message="orders")
    assert recalled["namespaces"] == ["crm"] and {c["namespace"] for c in recalled["candidates"]} == {"crm"}
    assert call(app, "search", query="orders")["namespace"] == "crm"
    assert stored(settings)["crm"] == {"note": "orders of the crm", "lead": "orders in bulk"}
    assert "default" not in [k for k in stored(settings) if stored(settings)[k].get("lead")]


def test_subject_binds_recall_and_remember_to_the_subjects_namespace(settings: Settings) -> None:
    app = server(settings, subject="cust-1")
    refused = calls(
        app,
        ("recall", {"message": "orders", "subject": "cust-2"}),
        ("remember", {"key": "k", "value": 1, "namespace": "default"}),
        ("get", {"key": "name", "namespace": "user:cust-2"}),
        ("list_keys", {"namespace": "crm"}),
    )
    assert "recall takes no subject" in error_of(refused[0])
    for result in refused[1:]:
        assert "outside this server's scope" in error_of(result)
    recalled = call(app, "recall", message="ship by express")
    assert recalled["namespaces"] == [ALICE, "default"]
    assert recalled["lines"][0] == "- shipping_policy: Alice's orders ship by express"
    assert call(app, "remember", key="size", value="shoe size 38")["namespace"] == ALICE
    assert call(app, "get", key="size")["value"] == "shoe size 38"
    assert call(app, "list_namespaces")["namespaces"] == ["default", ALICE]
    assert "size" not in stored(settings)["default"]


def test_read_only_offers_no_remember_and_writes_nothing(settings: Settings) -> None:
    app = server(settings, read_only=True)
    assert set(tools_of(app)) == READS
    before = stored(settings)
    (result,) = calls(app, ("remember", {"key": "k", "value": 1}))
    assert error_of(result) == "Unknown tool: remember"
    assert stored(settings) == before
    instructions = instructions_of(app)
    assert "read-only" in instructions


def test_a_bad_scope_is_refused_before_serving(settings: Settings) -> None:
    with pytest.raises(InvalidNamespace):
        server(settings, namespace="bad ns")
    with pytest.raises(ValueError, match="non-empty"):
        server(settings, subject="")


# -- the command ----------------------------------------------------------------------------------


def test_the_command_is_in_both_groups_with_its_flags(settings: Settings) -> None:
    from click.testing import CliRunner

    from clawmem.cli import main

    shown = CliRunner().invoke(main, ["--help"]).output
    assert "  mcp " in shown
    usage = CliRunner().invoke(main, ["mcp", "--help"]).output
    for flag in ("--namespace NS", "--subject USER_ID", "--read-only"):
        assert flag in usage
    bad = CliRunner().invoke(main, ["mcp", "--namespace", "bad ns"])
    assert bad.exit_code == 2 and "illegal characters" in bad.output


def test_without_the_sdk_the_command_says_which_extra_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from clawmem.cli import main

    for name in [name for name in sys.modules if name.startswith("clawmem.integrations.mcp")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)  # what an install without the extra sees
    monkeypatch.setenv("CLAW_INSTANCE_PATH", str(tmp_path))
    result = CliRunner().invoke(main, ["mcp"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: the mcp integration needs the mcp package, which is not installed: "
        "pip install 'clawmem[mcp]'\n"
    )


def test_importing_clawmem_and_its_cli_never_imports_the_sdk() -> None:
    probe = "import sys, clawmem, clawmem.cli; print(any(n.split('.')[0] == 'mcp' for n in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout == "False\n", done.stderr


def test_flask_claw_mounts_the_command(tmp_path: Path) -> None:
    from dashboard import create_app

    config = {"TESTING": True, "DATABASE_URL": f"sqlite:///{tmp_path / 'clawmem.db'}"}
    app = create_app(config, instance_path=str(tmp_path))
    result = app.test_cli_runner().invoke(args=["claw", "mcp", "--help"])
    assert result.exit_code == 0 and "--read-only" in result.output


# -- against a plain model ----------------------------------------------------------------------------

NAMESPACES = ["default", "crm", ALICE]
KEYS = st.text(alphabet="abé A", min_size=0, max_size=3)  # "" is a bad key; "a", "A", "a " differ
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(alphabet="xy z", max_size=4),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text("ab", max_size=2), inner, max_size=2),
    max_leaves=4,
)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("remember"), KEYS, JSON, st.sampled_from(NAMESPACES), st.none() | st.integers(-1, 3)
        ),
        st.tuples(st.just("get"), KEYS, st.sampled_from(NAMESPACES)),
        st.tuples(st.just("advance"), st.integers(1, 3)),
    ),
    max_size=12,
)


@hypothesis_settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=OPERATIONS)
@pytest.mark.slow
def test_remember_and_get_agree_with_a_dict_with_expiry(
    tmp_path: Path, operations: list[tuple[Any, ...]]
) -> None:
    prefix = f"h{uuid.uuid4().hex[:8]}_"
    settings = site_settings(sql_url("sqlite", tmp_path), prefix, tmp_path)
    engine = engine_for(settings.database_url)
    create_tables(engine, prefix)
    clock = FakeClock(1_700_000_000.5)
    model: dict[tuple[str, str], tuple[Any, float | None]] = {}  # (namespace, key): (value, expires_at)
    app = server(settings, clock=clock)

    async def body(client: Client) -> None:
        for operation in operations:
            if operation[0] == "advance":
                clock.advance(operation[1])
                continue
            if operation[0] == "remember":
                _, key, value, namespace, ttl = operation
                arguments = {"key": key, "value": value, "namespace": namespace}
                if ttl is not None:
                    arguments["ttl_seconds"] = ttl
                result = await client.call_tool("remember", arguments)
                if key == "" or (ttl is not None and ttl <= 0):
                    error_of(result)  # refused in one line, nothing written
                    continue
                assert not result.is_error, result.content
                expires = math.floor(clock()) + ttl if ttl is not None else None
                model[(namespace, key)] = (value, expires)
                assert result.structured_content["expires_at"] == expires
                continue
            _, key, namespace = operation
            result = await client.call_tool("get", {"key": key, "namespace": namespace})
            if key == "":
                error_of(result)
                continue
            value, expires = model.get((namespace, key), (None, None))
            live = (namespace, key) in model and (expires is None or clock() < expires)
            assert result.structured_content["found"] is live
            assert result.structured_content["value"] == (value if live else None)

    try:
        in_session(app, body)
    finally:
        drop_tables(engine, prefix)
