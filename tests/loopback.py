"""A real chat-completions server on 127.0.0.1 for tests that must see what left the host."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


def tool_call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    """Return one chat-completions ``tool_calls`` item; ``arguments`` that are not a str are
    sent as their JSON text, as a model sends them."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def calls(*items: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """Return a scripted assistant message that asks for the tool calls ``items``."""
    return {"role": "assistant", "content": content, "tool_calls": list(items)}


HANG = {"hang": True}


def failing(status: int) -> dict[str, Any]:
    """Return a scripted answer that is the HTTP error ``status`` instead of a reply."""
    return {"status": status}


class LoopbackCompletions:
    """Answers every ``POST …/chat/completions`` and keeps the raw body of every request.

    Each answer is the next scripted one (:meth:`script`: a reply text, or an assistant message
    such as :func:`calls` makes), and once the script is spent ``reply``. The usage of the n-th
    call (from 1) is ``prompt_tokens`` 100 + n, ``completion_tokens`` 7 and ``total_tokens``
    their sum, so each call's usage can be told apart. Two scripted answers are not replies:
    :data:`HANG` answers nothing until the server stops (the client times out), and
    ``failing(status)`` answers with that HTTP error status.
    """

    def __init__(self, reply: str = "Noted.") -> None:
        self.reply = reply
        self.bodies: list[str] = []
        self.scripted: list[str | dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode("utf-8")
                with server._lock:
                    server.bodies.append(raw)
                    number = len(server.bodies)
                    answer = server.scripted.pop(0) if server.scripted else server.reply
                if answer == HANG:
                    server._stopping.wait()
                    return
                if isinstance(answer, dict) and "status" in answer:
                    self.send_error(answer["status"])
                    return
                if isinstance(answer, str):
                    answer = {"role": "assistant", "content": answer}
                payload = json.dumps(
                    {"choices": [{"index": 0, "message": answer}], "usage": server.usage(number)}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    @staticmethod
    def usage(number: int) -> dict[str, int]:
        """Return the usage block the server reports for its ``number``-th call (from 1)."""
        return {"prompt_tokens": 100 + number, "completion_tokens": 7, "total_tokens": 107 + number}

    def script(self, *answers: str | dict[str, Any]) -> LoopbackCompletions:
        """Queue ``answers`` for the next calls, in order; return the server."""
        with self._lock:
            self.scripted.extend(answers)
        return self

    @property
    def requests(self) -> list[list[dict[str, Any]]]:
        """Return the ``messages`` of every request received, in order."""
        return [json.loads(body)["messages"] for body in self.bodies]

    @property
    def offered(self) -> list[list[str]]:
        """Return the names of the tools each request offered, in order ([] when none)."""
        return [
            [tool["function"]["name"] for tool in json.loads(body).get("tools", [])] for body in self.bodies
        ]

    @property
    def received(self) -> str:
        """Return every request body received, joined: everything that left the host."""
        return "\n".join(self.bodies)

    def start(self) -> LoopbackCompletions:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def loopback() -> Iterator[LoopbackCompletions]:
    """A chat-completions server on a free loopback port, stopped after the test."""
    server = LoopbackCompletions().start()
    yield server
    server.stop()
