"""The one place that makes ids: monotonic ULIDs, 26 characters, sortable by creation time."""

from __future__ import annotations

import threading

from ulid import ULID

_lock = threading.Lock()
_last = 0


def new_id() -> str:
    """Return a new ULID string, strictly greater than every id made before in this process.

    ULIDs made in the same millisecond increment the previous one, so rows inserted in one
    batch sort in insertion order by id.
    """
    global _last
    with _lock:
        candidate = int(ULID())
        if candidate <= _last:
            candidate = _last + 1
        _last = candidate
    return str(ULID.from_int(candidate))
