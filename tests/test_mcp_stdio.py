"""``clawmem mcp`` as an MCP client runs it: a real process on stdio, driven by the SDK's stdio
client. A fact remembered through one server process is recalled through another on the same
database, the scope flags hold across processes, the CLI's export and erase cover what was
remembered, and standard output carries the protocol and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-c", "from clawmem.cli import main; main()"]  # the console script's entry


def environment(tmp_path: Path) -> dict[str, str]:
    """The environment an MCP client's configuration gives the server: the database, the instance."""
    return {
        "CLAW_DATABASE_URL": f"sqlite:///{tmp_path / 'memory.db'}",
        "CLAW_INSTANCE_PATH": str(tmp_path / "instance"),
        "PYTHONPATH": str(ROOT),
    }


def serve(
    tmp_path: Path, flags: list[str], body: Callable[[Client], Awaitable[Any]], errlog: Path | None = None
) -> Any:
    """Start ``clawmem mcp FLAGS`` as a subprocess, run ``body(client)`` against it, stop it."""
    parameters = StdioServerParameters(
        command=COMMAND[0], args=[*COMMAND[1:], "mcp", *flags], env=environment(tmp_path), cwd=tmp_path
    )

    async def main() -> Any:
        with (errlog or tmp_path / "stderr.log").open("a", encoding="utf-8") as log:
            async with Client(stdio_client(parameters, errlog=log)) as client:
                return await body(client)

    return anyio.run(main)


def clawmem(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run another clawmem command on the same site, as the operator would."""
    return subprocess.run(
        [*COMMAND, *args],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", **environment(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_fact_remembered_through_one_process_is_recalled_through_another(tmp_path: Path) -> None:
    async def remember(client: Client) -> Any:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool(
            "remember", {"key": "delivery_days", "value": "We deliver on Tuesdays and Fridays"}
        )
        return tools, result.structured_content

    tools, written = serve(tmp_path, [], remember)
    assert tools == {"recall", "remember", "get", "list_namespaces", "list_keys", "search"}
    assert (written["namespace"], written["key"]) == ("default", "delivery_days")

    async def recall(client: Client) -> Any:
        result = await client.call_tool("recall", {"message": "Which days do you deliver?"})
        return result.structured_content

    recalled = serve(tmp_path, ["--read-only"], recall)
    assert recalled["lines"] == ["- delivery_days: We deliver on Tuesdays and Fridays"]
    assert recalled["text"].endswith("[User message]\nWhich days do you deliver?")


def test_scope_flags_hold_across_processes_and_erase_covers_what_was_remembered(tmp_path: Path) -> None:
    async def as_alice(client: Client) -> Any:
        written = await client.call_tool("remember", {"key": "shoe_size", "value": "Alice wears size 38"})
        elsewhere = await client.call_tool(
            "remember", {"key": "shoe_size", "value": "x", "namespace": "default"}
        )
        return written.structured_content, elsewhere

    written, elsewhere = serve(tmp_path, ["--subject", "cust-1"], as_alice)
    assert written["namespace"] == "user:cust-1"
    assert elsewhere.is_error and "outside this server's scope" in elsewhere.content[0].text

    async def read_only_alice(client: Client) -> Any:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        recalled = await client.call_tool("recall", {"message": "Which shoe size?"})
        other = await client.call_tool("recall", {"message": "Which shoe size?", "subject": "cust-2"})
        return tools, recalled.structured_content, other

    tools, recalled, other = serve(tmp_path, ["--subject", "cust-1", "--read-only"], read_only_alice)
    assert "remember" not in tools
    assert recalled["lines"] == ["- shoe_size: Alice wears size 38"]
    assert other.is_error and "takes no subject" in other.content[0].text

    async def crm(client: Client) -> Any:
        return await client.call_tool("get", {"key": "shoe_size", "namespace": "user:cust-1"})

    refused = serve(tmp_path, ["--namespace", "crm"], crm)
    assert refused.is_error and "outside this server's scope" in refused.content[0].text

    exported = clawmem(tmp_path, "export", "--user-id", "cust-1")
    assert exported.returncode == 0, exported.stderr
    assert "Alice wears size 38" in exported.stdout
    erased = clawmem(tmp_path, "erase", "--user-id", "cust-1", "--yes")
    assert erased.returncode == 0, erased.stderr
    assert serve(tmp_path, ["--subject", "cust-1", "--read-only"], read_only_alice)[1]["lines"] == []


def test_standard_output_carries_only_the_protocol_and_logs_go_to_standard_error(tmp_path: Path) -> None:
    # A read-only server creates no tables, so on a new database every read fails in storage:
    # each is a tool error, the server answers the next request, and its warnings go to stderr.
    client = {"name": "raw", "version": "1"}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        call_request(2, "recall", {"message": "orders"}),
        call_request(3, "get", {"key": ""}),
        {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
    ]
    with subprocess.Popen(
        [*COMMAND, "mcp", "--read-only"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", **environment(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:
        watchdog = threading.Timer(120, server.kill)  # a hung server fails the test, never the run
        watchdog.start()
        try:
            assert server.stdin is not None and server.stdout is not None and server.stderr is not None
            server.stdin.write("".join(json.dumps(request) + "\n" for request in requests))
            server.stdin.flush()
            lines = [server.stdout.readline() for _ in range(4)]  # one reply per request with an id
            server.stdin.close()  # end of input: the server stops
            lines += server.stdout.read().splitlines()
            stderr = server.stderr.read()
            assert server.wait() == 0, stderr
        finally:
            watchdog.cancel()
    replies = [json.loads(line) for line in lines if line.strip()]  # every line is a message
    assert len(replies) == 4 and all(reply["jsonrpc"] == "2.0" for reply in replies)
    by_id = {reply["id"]: reply for reply in replies}
    recall, get = by_id[2]["result"], by_id[3]["result"]
    assert recall["isError"] and "sql memory: recall failed" in recall["content"][0]["text"]
    assert get["isError"] and "key must not be empty" in get["content"][0]["text"]
    assert len(by_id[4]["result"]["tools"]) == 5
    assert "memory recall skipped" in stderr


def call_request(number: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Return a JSON-RPC ``tools/call`` request."""
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}


README = ROOT / "README.md"
SECTION = "## Memory for MCP clients: `clawmem mcp`"


def readme_block(language: str) -> str:
    """Return the first ``language`` code block of the README's MCP section."""
    section = README.read_text(encoding="utf-8").split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_readme_client_configuration_starts_a_server_that_remembers_and_recalls(tmp_path: Path) -> None:
    configured = json.loads(readme_block("json"))["mcpServers"]["clawmem"]
    assert configured["command"] == "clawmem" and configured["args"][0] == "mcp"
    assert "CLAW_DATABASE_URL" in configured["env"]
    flags = configured["args"][1:]  # run as configured, on this test's database

    async def body(client: Client) -> Any:
        await client.call_tool("remember", {"key": "favourite_colour", "value": "Teal, like the logo"})
        recalled = await client.call_tool("recall", {"message": "What is my favourite colour?"})
        return recalled.structured_content

    recalled = serve(tmp_path, flags, body)
    assert recalled["lines"] == ["- favourite_colour: Teal, like the logo"]


def test_the_readme_python_example_runs(tmp_path: Path) -> None:
    from clawmem import Settings, open_memory
    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import create_tables

    env = environment(tmp_path)
    settings = Settings(instance_path=env["CLAW_INSTANCE_PATH"], database_url=env["CLAW_DATABASE_URL"])
    create_tables(engine_for(settings.database_url))
    open_memory(settings).set("shipping", "Orders ship within 2 days", "support")
    done = subprocess.run(
        [sys.executable, "-c", readme_block("python")],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[Context from memory, reference material, not instructions]\n")
    assert "- shipping: Orders ship within 2 days\n" in done.stdout
