"""How a LangGraph item sits in clawmem: its namespace tuple, its key and its envelope.

Pure functions, no framework import, so the encoding can be read and tested on its own.

**Namespaces.** A tuple ``(l1, l2, ...)`` is stored in the clawmem namespace
``"langgraph:" + ":".join(label(l) for l in tuple)``, where a label made only of ASCII letters,
digits, ``_`` and ``-`` stands for itself and any other becomes ``"."`` + the base64url of its
UTF-8 bytes (no padding). A plain label never holds ``.`` or ``:``, base64url never does, and
LangGraph forbids empty labels, so the encoding is injective and never makes ``..``. The
result must fit in clawmem's 100 characters: a plain label costs its length plus one, any
other about 4/3 of its UTF-8 bytes plus two; a longer tuple is refused with
:class:`clawmem.InvalidNamespace`.

**Subjects.** ``(subject_label, user_id, *rest)`` (``("users", "cust-42", "memories")``) is
stored in that user's subject namespace (:func:`clawmem.subject_namespace`), with the key
``json.dumps([*rest, key])``, so ``export`` and ``erase --user-id`` take it with the rest of the
subject. Other keys of a subject namespace (the subject's own facts) are not LangGraph items.

**Envelope.** A stored value is ``{"v": value, "c": created, "u": updated, "t": ttl}``, with
the times as ISO 8601 UTC to the second and the TTL (kept so a read can renew it) as an ISO 8601
duration (``"PT3600S"``) or ``null``. The field names and the formats are chosen so that
no query word of clawmem's recall (three characters or more) matches them: an item's recall score
is that of its key and value alone. The envelope works on every driver and every wrapper,
because it needs nothing but the six-method contract.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from clawmem.errors import InvalidNamespace
from clawmem.rules import MAX_NAMESPACE_CHARS, subject_namespace, subject_of_namespace

_PLAIN_LABEL = re.compile(r"[A-Za-z0-9_-]+")
_ENCODED = "."
_SEPARATOR = ":"
_ENVELOPE_FIELDS = frozenset({"v", "c", "u", "t"})
_DURATION = re.compile(r"PT([1-9][0-9]*)S")


def encode_label(label: str) -> str:
    """Return ``label`` in clawmem namespace characters (see the module's docstring)."""
    if _PLAIN_LABEL.fullmatch(label):
        return label
    return _ENCODED + base64.urlsafe_b64encode(label.encode("utf-8")).decode("ascii").rstrip("=")


def decode_label(text: str) -> str | None:
    """Return the label ``text`` encodes, or ``None`` when it is not one :func:`encode_label` makes."""
    if _PLAIN_LABEL.fullmatch(text):
        return text
    if not text.startswith(_ENCODED):
        return None
    body = text[len(_ENCODED) :]
    try:
        label = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return label if label and encode_label(label) == text else None


def encode_namespace(prefix: str, labels: tuple[str, ...]) -> str:
    """Return the clawmem namespace of the tuple ``labels`` under ``prefix``; raise
    :class:`clawmem.InvalidNamespace` when it would pass clawmem's 100 characters."""
    namespace = _SEPARATOR.join([prefix, *(encode_label(label) for label in labels)])
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise InvalidNamespace(
            f"namespace {labels!r} takes {len(namespace)} characters as the clawmem namespace "
            f"{namespace[:40]}..., over the {MAX_NAMESPACE_CHARS} allowed: plain labels (ASCII letters, "
            "digits, _ and -) cost their length plus one, others about 4/3 of their UTF-8 bytes plus two"
        )
    return namespace


def decode_namespace(prefix: str, namespace: str) -> tuple[str, ...] | None:
    """Return the tuple that ``namespace`` stores under ``prefix``, or ``None`` if it is not one."""
    head, separator, rest = namespace.partition(_SEPARATOR)
    if head != prefix or not separator:
        return None
    labels = tuple(decode_label(part) for part in rest.split(_SEPARATOR))
    if any(label is None for label in labels):
        return None
    return labels  # type: ignore[return-value]


def subject_key(rest: tuple[str, ...], key: str) -> str:
    """Return the clawmem key of ``key`` under ``(subject_label, user_id, *rest)``."""
    return json.dumps([*rest, key], ensure_ascii=False, separators=(",", ":"))


def read_subject_key(stored: str) -> tuple[tuple[str, ...], str] | None:
    """Return ``(rest, key)`` from a key :func:`subject_key` made, or ``None``."""
    if not stored.startswith("["):
        return None
    try:
        parts = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(parts, list) or not parts or not all(isinstance(part, str) for part in parts):
        return None
    if subject_key(tuple(parts[:-1]), parts[-1]) != stored:
        return None
    return tuple(parts[:-1]), parts[-1]


def user_namespace(user_id: str, template: str) -> str:
    """Return ``user_id``'s subject namespace, refusing with ``ValueError`` an id that it holds
    only as a hash (so the tuple could not be read back)."""
    namespace = subject_namespace(user_id, template)
    if subject_of_namespace(namespace, template) != user_id:
        raise ValueError(
            f"user id {user_id[:40]!r}... is too long to keep readable in a subject namespace "
            f"({namespace!r}); use a shorter id"
        )
    return namespace


def ttl_seconds(minutes: object) -> int | None:
    """Return LangGraph's ``ttl`` (minutes, fractions allowed) in whole seconds, rounded up; raise
    ``ValueError`` for a bool, a non-number, NaN, infinity, zero or less."""
    if minutes is None:
        return None
    if isinstance(minutes, bool) or not isinstance(minutes, int | float):
        raise ValueError(f"ttl is a positive number of minutes or None, got {minutes!r}")
    if not math.isfinite(minutes) or minutes <= 0:
        raise ValueError(f"ttl is a positive number of minutes or None, got {minutes!r}")
    return max(1, math.ceil(minutes * 60))


def stamp(moment: datetime) -> str:
    """Return ``moment`` as the envelope keeps it: ISO 8601 UTC to the second."""
    return moment.astimezone(UTC).replace(microsecond=0).isoformat()


def envelope(value: Mapping[str, Any], created: str, updated: str, ttl: int | None) -> dict[str, Any]:
    """Return the stored form of an item (see the module's docstring)."""
    return {"v": dict(value), "c": created, "u": updated, "t": None if ttl is None else f"PT{ttl}S"}


def read_envelope(stored: Any) -> tuple[dict[str, Any], datetime, datetime, int | None] | None:
    """Return ``(value, created_at, updated_at, ttl seconds)`` of a stored envelope, or ``None``
    when ``stored`` is not one (an entry something else wrote)."""
    if not isinstance(stored, dict) or stored.keys() != _ENVELOPE_FIELDS or not isinstance(stored["v"], dict):
        return None
    ttl = stored["t"]
    if ttl is not None:
        found = _DURATION.fullmatch(ttl) if isinstance(ttl, str) else None
        if found is None:
            return None
        ttl = int(found.group(1))
    try:
        created = datetime.fromisoformat(stored["c"])
        updated = datetime.fromisoformat(stored["u"])
    except (TypeError, ValueError):
        return None
    return stored["v"], created, updated, ttl
