"""A random key kept in a private file of the instance folder, made on first use: the audit
log's key (``<instance>/audit_key``) and the dashboard's generated secret key."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

from clawmem.errors import KeyFileError

MIN_KEY_CHARS = 32


def kept_key(path: Path, what: str, remedy: str) -> str:
    """Return the key held in ``path``, making it first when there is none (32 random bytes as
    hex, mode 0600, its folder 0700). Concurrent first runs agree on one key: it is written to
    a private temporary file and linked into place, and a run that loses reads the winner's.

    Raises :class:`KeyFileError` when the file cannot be read or made, or holds fewer than
    :data:`MIN_KEY_CHARS` characters (``what`` names the key in the message, ``remedy`` says
    what to do)."""
    try:
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(descriptor, "w") as handle:
                    handle.write(secrets.token_hex(32))
                with contextlib.suppress(FileExistsError):
                    os.link(temp_name, path)
            finally:
                os.unlink(temp_name)
        key = path.read_text().strip()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise KeyFileError(f"{reason}: {exc.filename}" if exc.filename else reason) from exc
    if len(key) < MIN_KEY_CHARS:
        raise KeyFileError(f"{path} holds {what} shorter than {MIN_KEY_CHARS} characters; {remedy}")
    return key
