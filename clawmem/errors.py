"""Every exception clawmem raises on purpose, in one place."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]*@")
# A secret passed as a query parameter: ?password=..., &passwd=..., &token=... and the like.
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pwd|pass|secret|token|api_?key|access_?key|auth)=)[^&;#\s]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """Return ``text`` with every password in it replaced by ``***``: the ``user:pass@`` of a
    URL and a secret passed as a query parameter (``?password=...``)."""
    return _QUERY_SECRET.sub(r"\g<head>***", _URL_PASSWORD.sub(r"\g<head>***@", text))


class StorageError(RuntimeError):
    """A storage backend failed. Carries the driver name and the operation; never a password."""

    def __init__(self, driver: str, operation: str, detail: str) -> None:
        self.driver = driver
        self.operation = operation
        self.detail = redact(detail)
        super().__init__(f"{driver} memory: {operation} failed: {self.detail}")


class CorruptStoreError(Exception):
    """A file-driver namespace file exists but holds no valid store. It is left exactly as it was.

    Drivers raise it internally; callers see it as a :class:`StorageError` naming the file.
    """


class CorruptEntryError(Exception):
    """A Redis key in clawmem's layout holds something other than ``[expires_at, value]``.

    Drivers raise it internally; callers see it as a :class:`StorageError` naming the key.
    """


class KeyStoreError(StorageError):
    """The key store of per-subject data keys (``CLAW_KEYSTORE_URL``) failed or holds a key that
    cannot be unwrapped. The message names the data key's id and its master key's id, never a key."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__("key store", operation, detail)


class InvalidCursor(ValueError):
    """A pagination cursor was not one this API issued."""


class InvalidNamespace(ValueError):
    """A namespace broke the naming rule (1-100 of ``A-Z a-z 0-9 _ - . :``, no ``..``)."""


class InvalidKey(ValueError):
    """A key broke the key rule (non-empty str, at most 191 characters, no control characters)."""


class ValueTooLarge(ValueError):
    """A value or message exceeds the configured byte limit; nothing was written."""


class ConfigError(ValueError):
    """A setting could not be parsed; the message names the variable and the accepted form."""


class KeyFileError(ConfigError):
    """A private key file (the audit key, the dashboard's generated secret key) could not be
    read or made, or holds too short a key; the message names the file, never the key."""


class GuardBlocked(RuntimeError):
    """A guard refused the turn. The message names each pattern and where it matched, never the text."""

    def __init__(self, message: str, findings: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


class ProviderError(RuntimeError):
    """An LLM provider call failed: HTTP status, timeout, connection or malformed reply.

    The message says which and never contains the API key.
    """


class EmbeddingMismatch(ValueError):
    """Vectors recorded by one embedding model (id and dimension) were offered to another."""


class EmbedderUnavailable(RuntimeError):
    """The semantic scorings need the ``clawmem[semantic]`` extra, which is not installed."""


class EvalFileError(ValueError):
    """A ``clawmem eval`` file line that is not a valid entry or question (its line number is said)."""


class JobRefused(ValueError):
    """A background turn could not be queued (message storage off, a bad message or id); the
    message says why, and nothing was queued."""


class TurnsStillRunning(RuntimeError):
    """A subject's background turns were still running, each worker still renewing its lease,
    when an erasure had waited as long as it may. ``jobs`` holds each job id and when its lease
    runs out (Unix seconds); the message names the jobs, never the subject."""

    def __init__(self, jobs: list[tuple[str, float | None]], waited: float) -> None:
        self.jobs = jobs
        self.waited = waited
        named = ", ".join(job_id for job_id, _ in jobs)
        super().__init__(f"{len(jobs)} turn(s) of the subject still running after {waited:g} s: job {named}")


class Undecryptable(StorageError):
    """A sealed value could not be opened: its key is missing, the key is wrong, or the text was
    altered or moved to another row or column. The message names where the value lives (table and
    row id, or namespace and key, and column) and the key id, never the value."""

    def __init__(self, where: str, key_id: str | None, reason: str) -> None:
        self.where = where
        self.key_id = key_id
        self.reason = reason
        self.driver = "encryption"
        self.operation = "decrypt"
        self.detail = redact(reason)
        named = f" under key id {key_id!r}" if key_id else ""
        RuntimeError.__init__(self, f"cannot decrypt {where}{named}: {self.detail}")


class PlaintextRefused(Undecryptable):
    """``CLAW_ENCRYPTION_STRICT`` is on and a value is stored as plaintext: it is never returned."""


class EncryptionUnavailable(ConfigError):
    """Encryption keys are set but the ``cryptography`` package (extra ``clawmem[encrypt]``) is missing."""


class UndecodableValue(ValueError):
    """A stored value is not text its shape's codec reads. Drivers raise it internally; callers
    see a :class:`clawmem.StorageError` that names the key (never the value)."""

    def __init__(self, namespace: str, key: str, codec: str, reason: str) -> None:
        self.namespace = namespace
        self.key = key
        super().__init__(f"the value of key {key!r} in namespace {namespace!r} is not {codec}: {reason}")


class PhpFormatError(ValueError):
    """Text that is not a ``serialize()`` string of a value clawmem can hold."""


class StaleIndex(Exception):
    """An indexed candidate no longer matched the backend; the index has been corrected."""
