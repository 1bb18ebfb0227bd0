"""A real chat-completions server on 127.0.0.1 for tests that must see what left the host."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class LoopbackCompletions:
    """Answers every ``POST …/chat/completions`` with ``reply`` and a usage block, and keeps the
    raw body of every request.

    The usage of the n-th call (from 1) is ``prompt_tokens`` 100 + n, ``completion_tokens`` 7 and
    ``total_tokens`` their sum, so each call's usage can be told apart.
    """

    def __init__(self, reply: str = "Noted.") -> None:
        self.reply = reply
        self.bodies: list[str] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode("utf-8")
                with server._lock:
                    server.bodies.append(raw)
                    number = len(server.bodies)
                payload = json.dumps(
                    {
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": server.reply}}],
                        "usage": server.usage(number),
                    }
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

    @property
    def requests(self) -> list[list[dict[str, str]]]:
        """Return the ``messages`` of every request received, in order."""
        return [json.loads(body)["messages"] for body in self.bodies]

    @property
    def received(self) -> str:
        """Return every request body received, joined: everything that left the host."""
        return "\n".join(self.bodies)

    def start(self) -> LoopbackCompletions:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def loopback() -> Iterator[LoopbackCompletions]:
    """A chat-completions server on a free loopback port, stopped after the test."""
    server = LoopbackCompletions().start()
    yield server
    server.stop()
