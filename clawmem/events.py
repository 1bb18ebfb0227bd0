"""Lifecycle events: ``on``/``off`` listeners, ``emit``, and the ``run_context`` that tags them.

Payloads name keys, namespaces, drivers, counts and sizes. They never carry a value or message
text. A listener that raises is logged and never breaks the operation that emitted the event.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

EVENTS = frozenset(
    {
        "memory.read",
        "memory.write",
        "memory.forget",
        "memory.flush",
        "memory.search",
        "memory.recalled",
        "compaction.before",
        "compaction.after",
        "context.overflow",
        "conversation.saved",
        "guard.blocked",
    }
)
ANY = "*"

Listener = Callable[[dict[str, Any]], None]

_listeners: dict[str, list[Listener]] = {}
_lock = threading.Lock()
_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("clawmem_run_id", default=None)


def _check_name(name: str) -> None:
    if name != ANY and name not in EVENTS:
        raise ValueError(f"unknown event {name!r}; known events: {', '.join(sorted(EVENTS))} or '*'")


def on(name: str, callback: Listener) -> Listener:
    """Call ``callback(payload)`` for every event ``name`` (``"*"`` for all). Returns the callback."""
    _check_name(name)
    with _lock:
        _listeners.setdefault(name, []).append(callback)
    return callback


def off(name: str, callback: Listener | None = None) -> None:
    """Remove ``callback`` from ``name``, or every listener of ``name`` when no callback is given."""
    _check_name(name)
    with _lock:
        if callback is None:
            _listeners.pop(name, None)
        elif callback in _listeners.get(name, []):
            _listeners[name].remove(callback)


@contextlib.contextmanager
def run_context(run_id: str) -> Iterator[str]:
    """Tag every event emitted inside the block with ``run_id``."""
    token = _run_id.set(run_id)
    try:
        yield run_id
    finally:
        _run_id.reset(token)


def current_run_id() -> str | None:
    """Return the run id of the enclosing :func:`run_context`, or ``None`` outside one."""
    return _run_id.get()


def emit(name: str, **fields: Any) -> None:
    """Deliver event ``name`` to its listeners with ``event`` and ``run_id`` added to ``fields``."""
    with _lock:
        listeners = [*_listeners.get(name, ()), *_listeners.get(ANY, ())]
    if not listeners:
        return
    payload = {"event": name, "run_id": _run_id.get(), **fields}
    for listener in listeners:
        try:
            listener(dict(payload))
        except Exception:  # a listener is the caller's code: log its traceback, never stop the operation
            log.exception("listener %r for event %s raised; the operation goes on", listener, name)
