"""The development server ``make run`` starts: Werkzeug's, with a request log that leaves out
query strings, because filters and previews carry customer text (SPEC 9, Deployment).

``python -m dashboard.devserver [--host 127.0.0.1] [--port 5000]``; production runs gunicorn
with the access-log format of the ``Procfile``, which leaves them out too.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from werkzeug.serving import WSGIRequestHandler, run_simple


class PathOnlyRequestHandler(WSGIRequestHandler):
    """Logs each request as method, path and status: never the query string."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        path = getattr(self, "path", None)
        if path is None:
            super().log_request(code, size)
            return
        self.path = path.split("?", 1)[0]
        try:
            super().log_request(code, size)
        finally:
            self.path = path


class ClosingBody:
    """A response body closed as soon as it is sent whole, dropped half-way, or closed.

    Werkzeug's server closes a body only after reading what is left of the request; when the
    browser resets the connection that read raises first, and the body (an open static file)
    is left to the garbage collector unclosed. Here closing does not depend on that read.
    """

    def __init__(self, body: Iterable[bytes]) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self.body
        finally:
            self.close()

    def close(self) -> None:
        close = getattr(self.body, "close", None)
        self.body = ()
        if close is not None:
            close()


def closing_bodies(app: Any) -> Any:
    """``app`` (a WSGI application) with every response body a :class:`ClosingBody`."""
    return lambda environ, start_response: ClosingBody(app(environ, start_response))


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the dashboard (``create_app()``) on ``--host``/``--port`` until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    options = parser.parse_args(argv)
    from dashboard import create_app

    app = closing_bodies(create_app())
    run_simple(options.host, options.port, app, threaded=True, request_handler=PathOnlyRequestHandler)


if __name__ == "__main__":
    main()
