"""Providers against a real local HTTP server: success, HTTP errors, timeouts, bad bodies, no key leaks."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from clawmem.errors import ProviderError
from clawmem.providers import (
    EchoProvider,
    OpenAICompatibleProvider,
    Provider,
    ProviderReply,
    ToolCall,
    ToolSpec,
)
from clawmem.providers.openai import to_wire

API_KEY = "sk-test-7f3a9c1e5b2d4f60a8e1"

OK_BODY = {
    "id": "cmpl-1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3},
}


class FakeCompletionsServer:
    """A chat-completions endpoint whose answer the test chooses with ``mode``."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.body: Any = OK_BODY
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                server.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                if server.mode == "slow":
                    server.release.wait(10)
                    return
                if server.mode == "500":
                    # Echo the credentials back, as a careless proxy might.
                    self._send(500, f"upstream exploded; auth was {self.headers['Authorization']}".encode())
                elif server.mode == "text":
                    self._send(200, b"<html>not json</html>")
                else:
                    self._send(200, json.dumps(server.body).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeCompletionsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[FakeCompletionsServer]:
    with FakeCompletionsServer() as running:
        yield running


@pytest.fixture
def provider(server: FakeCompletionsServer) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(server.url, "local-model", api_key=API_KEY, timeout=2)


def assert_no_key(error: BaseException, provider: OpenAICompatibleProvider, logs: str) -> None:
    for text in (str(error), repr(error), repr(provider), logs):
        assert API_KEY not in text


def test_success_posts_model_and_messages(
    server: FakeCompletionsServer, provider: OpenAICompatibleProvider
) -> None:
    reply = provider.complete([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert reply == ProviderReply("Hello there.", (), {"prompt_tokens": 12, "completion_tokens": 3})
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"] == {
        "model": "local-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    assert request["headers"]["Authorization"] == f"Bearer {API_KEY}"
    assert isinstance(provider, Provider)


def test_no_key_means_no_authorization_header(server: FakeCompletionsServer) -> None:
    OpenAICompatibleProvider(server.url + "/", "m").complete([{"role": "user", "content": "Hi"}])
    assert "Authorization" not in server.requests[0]["headers"]
    assert server.requests[0]["path"] == "/v1/chat/completions"


def test_tool_calls_are_parsed(server: FakeCompletionsServer, provider: OpenAICompatibleProvider) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"order": 7}'}}
    server.body = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    reply = provider.complete([{"role": "user", "content": "where is order 7"}])
    assert reply == ProviderReply("", (ToolCall("lookup", {"order": 7}, "call_1"),), None)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [("{oops", "the arguments are not valid JSON"), ("[1, 2]", "the arguments are not a JSON object")],
)
def test_unreadable_arguments_keep_the_call_with_the_reason(
    server: FakeCompletionsServer, provider: OpenAICompatibleProvider, arguments: str, problem: str
) -> None:
    # The model's mistake, not a broken reply: the tool tells the model, and the turn goes on.
    call = {"id": "call_1", "type": "function", "function": {"name": "remember", "arguments": arguments}}
    server.body = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    reply = provider.complete([{"role": "user", "content": "remember this"}])
    assert reply.tool_calls == (ToolCall("remember", {}, "call_1", problem),)


def test_tools_and_tool_rounds_go_on_the_wire(
    server: FakeCompletionsServer, provider: OpenAICompatibleProvider
) -> None:
    spec = ToolSpec("remember", "Store a fact.", {"type": "object", "properties": {}})
    call = ToolCall("remember", {"key": "colour", "value": "teal"}, "call_1")
    provider.complete(
        [
            {"role": "user", "content": "my colour is teal"},
            {"role": "assistant", "content": "", "tool_calls": (call,)},
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "tool_name": "remember",
                "content": '{"stored": true}',
            },
        ],
        tools=[spec],
    )
    body = server.requests[0]["body"]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "remember", "description": "Store a fact.", "parameters": spec.parameters},
        }
    ]
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "remember", "arguments": '{"key": "colour", "value": "teal"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"stored": true}'},
    ]


def test_http_500_is_a_clear_error_without_the_key(
    server: FakeCompletionsServer, provider: OpenAICompatibleProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.mode = "500"
    with pytest.raises(ProviderError, match=r"HTTP 500 .*upstream exploded") as failure:
        provider.complete([{"role": "user", "content": "Hi"}])
    assert "local-model" in str(failure.value)
    assert "Bearer ***" in str(failure.value)
    assert_no_key(failure.value, provider, caplog.text)


def test_timeout_is_a_clear_error_without_the_key(
    server: FakeCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.mode = "slow"
    provider = OpenAICompatibleProvider(server.url, "local-model", api_key=API_KEY, timeout=0.2)
    with pytest.raises(ProviderError, match=r"no response within 0\.2 s \(timeout\)") as failure:
        provider.complete([{"role": "user", "content": "Hi"}])
    assert_no_key(failure.value, provider, caplog.text)


@pytest.mark.parametrize(
    ("mode", "body", "expected"),
    [
        ("text", None, r"response body is not JSON: <html>not json</html>"),
        ("ok", {"choices": []}, r"malformed reply: the response has no choices\[0\]\.message"),
        ("ok", {"choices": [{"message": {"content": 5}}]}, r"content is not a string"),
        ("ok", {"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}, r"has no function name"),
    ],
)
def test_bad_bodies_are_clear_errors_without_the_key(
    server: FakeCompletionsServer,
    provider: OpenAICompatibleProvider,
    caplog: pytest.LogCaptureFixture,
    mode: str,
    body: Any,
    expected: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    server.mode, server.body = mode, body
    with pytest.raises(ProviderError, match=expected) as failure:
        provider.complete([{"role": "user", "content": "Hi"}])
    assert_no_key(failure.value, provider, caplog.text)


def test_connection_refused_is_a_clear_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = OpenAICompatibleProvider(f"http://127.0.0.1:{port}", "m", api_key=API_KEY)
    with pytest.raises(ProviderError, match="connection failed") as failure:
        provider.complete([{"role": "user", "content": "Hi"}])
    assert_no_key(failure.value, provider, "")


def test_repr_masks_the_key_and_url_password() -> None:
    provider = OpenAICompatibleProvider("https://user:hunter2@llm.example/v1", "m", api_key=API_KEY)
    assert repr(provider) == (
        "OpenAICompatibleProvider(base_url='https://user:***@llm.example/v1', model='m', "
        "api_key='***', timeout=30.0)"
    )
    assert "hunter2" not in provider.endpoint


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAICompatibleProvider("localhost:8080", "m")
    with pytest.raises(ValueError, match="model"):
        OpenAICompatibleProvider("http://x", "")
    with pytest.raises(ValueError, match="timeout"):
        OpenAICompatibleProvider("http://x", "m", timeout=0)


def test_tool_rows_go_on_the_wire_as_assistant_notes() -> None:
    wire = to_wire(
        [
            {"role": "user", "content": "where is 7"},
            {"role": "tool", "content": "shipped", "tool_name": "lookup", "tool_input": {"order": 7}},
            {"role": "tool", "content": "", "tool_name": "ping", "tool_input": None},
        ]
    )
    assert wire == [
        {"role": "user", "content": "where is 7"},
        {"role": "assistant", "content": '[tool lookup called with {"order": 7}]\nshipped'},
        {"role": "assistant", "content": "[tool ping called with {}]"},
    ]
    with pytest.raises(ValueError, match="role 'robot'"):
        to_wire([{"role": "robot", "content": "x"}])


def test_echo_provider_is_deterministic_and_counts_calls() -> None:
    echo = EchoProvider(tool_calls=[ToolCall("lookup", {"q": 1})])
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"}]
    first = echo.complete([*messages, {"role": "user", "content": "second"}])
    assert first.text == "echo: second"
    assert first.tool_calls == (ToolCall("lookup", {"q": 1}),)
    assert echo.complete([]).text == "echo: "
    assert echo.calls == 2
    assert echo.requests[0][-1] == {"role": "user", "content": "second"}
