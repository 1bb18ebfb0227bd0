"""The rules every driver applies identically: keys, namespaces, values and TTLs, and the
namespace that holds a subject's own facts."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import unicodedata
from datetime import timedelta
from typing import Any

from clawmem.errors import ConfigError, InvalidKey, InvalidNamespace, ValueTooLarge

MAX_KEY_CHARS = 191
MAX_NAMESPACE_CHARS = 100
# Lists and dicts inside one another, at most: deeper values are refused at set, so that every
# page, export and recall can walk what is stored without running out of stack.
MAX_NESTING = 64
DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024

_NAMESPACE = re.compile(r"[A-Za-z0-9_.:\-]+")
_PREFIX = re.compile(r"[A-Za-z0-9_]{0,20}")


def validate_prefix(prefix: object) -> str:
    """Return the table prefix if it is safe in a table name, else raise ``ConfigError``."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ConfigError(
            f"table prefix must be at most 20 ASCII letters, digits or underscores, got {prefix!r}"
        )
    return prefix


def validate_namespace(namespace: object) -> str:
    """Return ``namespace`` unchanged if it is valid, else raise :class:`InvalidNamespace`."""
    rule = (
        f"1-{MAX_NAMESPACE_CHARS} characters from ASCII letters, digits and _ - . : and never containing '..'"
    )
    if not isinstance(namespace, str):
        raise InvalidNamespace(f"namespace must be a str ({rule}), got {type(namespace).__name__}")
    if not namespace:
        raise InvalidNamespace(f"namespace must not be empty: {rule}")
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise InvalidNamespace(
            f"namespace must not exceed {MAX_NAMESPACE_CHARS} characters (got {len(namespace)}): {rule}"
        )
    if not _NAMESPACE.fullmatch(namespace):
        raise InvalidNamespace(f"namespace {namespace!r} has illegal characters: {rule}")
    if ".." in namespace:
        raise InvalidNamespace(f"namespace {namespace!r} contains '..': {rule}")
    return namespace


def validate_key(key: object) -> str:
    """Return ``key`` unchanged if it is valid, else raise :class:`InvalidKey`."""
    if not isinstance(key, str):
        raise InvalidKey(f"key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidKey("key must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise InvalidKey(f"key must not exceed {MAX_KEY_CHARS} characters (got {len(key)})")
    for char in key:
        category = unicodedata.category(char)
        if category == "Cc":
            raise InvalidKey(f"key {key!r} contains the control character U+{ord(char):04X}")
        if category == "Cs":
            raise InvalidKey(f"key {key!r} contains the lone surrogate U+{ord(char):04X}")
    return key


Ttl = int | timedelta | None
"""What ``set`` takes as ``ttl``: seconds, a ``timedelta`` of whole seconds, or ``None`` (never expires)."""


def validate_ttl(ttl: object) -> int | None:
    """Return ``ttl`` in whole seconds: ``None``, a positive int, or a positive ``timedelta`` of
    whole seconds (``timedelta(hours=1)`` is 3600). Anything else (a bool, a float, a fraction of
    a second, zero or less) raises ``ValueError``."""
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        seconds, fraction = divmod(ttl, _SECOND)
        if fraction:
            raise ValueError(f"ttl must be a whole number of seconds, got {ttl!r}")
        ttl = seconds
    elif isinstance(ttl, bool) or not isinstance(ttl, int):
        raise ValueError(
            f"ttl must be None, a positive int of seconds or a timedelta of whole seconds, got {ttl!r}"
        )
    if ttl <= 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl}")
    return ttl


_SECOND = timedelta(seconds=1)


def validate_count(name: str, value: object, hint: str = "") -> int:
    """Return ``value`` if it is a non-negative int (not a bool), else raise ``ValueError``.

    The message names the setting, appends ``hint`` (e.g. ``" (0 = off)"``) and quotes the value.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int{hint}, got {value!r}")
    return value


def _check_json(value: Any, key: str, path: str, active: set[int]) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if len(active) >= MAX_NESTING:
        raise ValueError(
            f"value for key {key!r} is nested more than {MAX_NESTING} levels deep; store it flatter"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"value for key {key!r} holds {value!r} at {path}; JSON allows only finite numbers"
            )
        return
    if isinstance(value, (list, tuple, dict)):
        if id(value) in active:
            raise ValueError(f"value for key {key!r} refers to itself at {path}")
        active.add(id(value))
        if isinstance(value, dict):
            for child_key, child in value.items():
                if not isinstance(child_key, str):
                    raise TypeError(f"value for key {key!r} has a non-str dict key {child_key!r} at {path}")
                _check_json(child, key, f"{path}[{child_key!r}]", active)
        else:
            for index, child in enumerate(value):
                _check_json(child, key, f"{path}[{index}]", active)
        active.discard(id(value))
        return
    raise TypeError(
        f"value for key {key!r} holds a {type(value).__name__} at {path}, which JSON cannot store"
    )


def check_value(key: str, value: Any) -> None:
    """Raise ``ValueError`` (NaN/infinity, cycles, too deep) or ``TypeError`` (anything JSON
    cannot hold), naming the key, unless ``value`` is one the memory contract stores."""
    _check_json(value, key, "value", set())


def encode_value(key: str, value: Any, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> str:
    """Return ``value`` as compact JSON text.

    Raises ``ValueError`` for NaN/infinity or cycles, ``TypeError`` for anything JSON cannot
    hold, and :class:`ValueTooLarge` past ``max_bytes``. Every message names the key.
    """
    check_value(key, value)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    check_size(f"value for key {key!r}", text, max_bytes)
    return text


def check_size(what: str, text: str, max_bytes: int) -> int:
    """Return the UTF-8 size of ``text``; raise :class:`ValueTooLarge` if it exceeds ``max_bytes``."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode text: {exc.reason}") from None
    if size > max_bytes:
        raise ValueTooLarge(f"{what} is {size} bytes, over the limit of {max_bytes} bytes")
    return size


def decode_value(text: str) -> Any:
    """Return the value stored as JSON ``text``."""
    return json.loads(text)


def is_expired(expires_at: int | None, now: int) -> bool:
    """Return whether an entry expiring at ``expires_at`` (``None``: never) is expired at ``now``."""
    return expires_at is not None and now >= expires_at


def ttl_state(expires_at: int | None, now: int) -> tuple[str, int | None]:
    """Return an entry's TTL state at ``now``.

    ``("permanent", None)`` never expires, ``("expiring", seconds_left)`` is live (not
    expired) until ``expires_at``, and ``("expired", seconds_since)`` is expired but may not be
    swept yet.
    """
    if expires_at is None:
        return ("permanent", None)
    if not is_expired(expires_at, now):
        return ("expiring", expires_at - now)
    return ("expired", now - expires_at)


def problem_in(value: Any, raw: str | None = None) -> str | None:
    """Return why a decoded value cannot be shown or exported safely (nested more than
    :data:`~clawmem.rules.MAX_NESTING` levels, a NaN or infinity, a lone surrogate), or
    ``None``. Walks the value without recursion, so any depth is safe to check; given the
    ``raw`` text it was decoded from, most values are cleared without a walk."""
    if raw is not None and not _suspect(raw):
        return None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return "holds a lone surrogate, which is not text"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "holds NaN or infinity"
        elif isinstance(item, (list, dict)):
            if depth >= MAX_NESTING:
                return f"is nested more than {MAX_NESTING} levels deep"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
            if isinstance(item, dict):
                stack.extend((key, depth + 1) for key in item)
    return None


def _suspect(raw: str) -> bool:
    # What the text of a value holds when its decoded value may hold a problem: a \\u escape (a
    # lone surrogate is one), NaN or infinity as JSON or PHP writes them, or more openings than
    # MAX_NESTING. Most values hold none, and are cleared without a walk.
    return (
        "\\u" in raw
        or "NaN" in raw
        or "Inf" in raw
        or "NAN" in raw
        or "INF" in raw
        or raw.count("[") + raw.count("{") > MAX_NESTING
    )


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# -- a subject's own namespace ---------------------------------------------------------------

DEFAULT_SUBJECT_NAMESPACE = "user:{user_id}"
PLACEHOLDER = "{user_id}"
_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]+")
# Encoded ids start with "." (a plain id never holds one): ".<base64url of the UTF-8 id>",
# or ".:<sha256 hex>" when that would not fit in a namespace (":" is outside base64url).
_ENCODED = "."
_HASHED = ".:"


def validate_template(template: str) -> str:
    """Return ``template`` if it holds ``{user_id}`` once and makes valid namespaces; else raise
    :class:`clawmem.errors.ConfigError` naming ``CLAW_SUBJECT_NAMESPACE``."""
    if not isinstance(template, str) or template.count(PLACEHOLDER) != 1:
        raise ConfigError(f"CLAW_SUBJECT_NAMESPACE must hold {PLACEHOLDER} exactly once, got {template!r}")
    try:
        validate_namespace(template.replace(PLACEHOLDER, "x"))
    except InvalidNamespace as exc:
        raise ConfigError(f"CLAW_SUBJECT_NAMESPACE {template!r} does not make a namespace: {exc}") from None
    return template


def encode_subject(user_id: str, room: int) -> str:
    """Return ``user_id`` in namespace characters, injectively, in at most ``room`` characters.

    An id of ASCII letters, digits, ``_`` and ``-`` stands for itself; any other id becomes
    ``.`` + its base64url, or ``.:`` + its SHA-256 when that does not fit.
    """
    if _PLAIN_ID.fullmatch(user_id) and len(user_id) <= room:
        return user_id
    encoded = _ENCODED + base64.urlsafe_b64encode(user_id.encode("utf-8")).decode("ascii").rstrip("=")
    if len(encoded) <= room:
        return encoded
    return _HASHED + hashlib.sha256(user_id.encode("utf-8")).hexdigest()


def subject_namespace(user_id: str, template: str = DEFAULT_SUBJECT_NAMESPACE) -> str:
    """Return the namespace that holds ``user_id``'s own facts (``user:cust-42`` by default).

    Raises ``ValueError`` for an empty or non-str id and ``ConfigError`` for a bad template.
    """
    if not isinstance(user_id, str) or not user_id:
        raise ValueError("a subject's user id must be a non-empty str")
    validate_template(template)
    room = 100 - (len(template) - len(PLACEHOLDER))
    return validate_namespace(template.replace(PLACEHOLDER, encode_subject(user_id, room)))


def subject_of_namespace(namespace: str, template: str = DEFAULT_SUBJECT_NAMESPACE) -> str | None:
    """Return the user id behind a subject namespace when it can be read back, else ``None``
    (not a subject namespace, or an id stored only as its hash)."""
    head, _, tail = template.partition(PLACEHOLDER)
    if not namespace.startswith(head) or not namespace.endswith(tail) or len(namespace) <= len(head + tail):
        return None
    encoded = namespace[len(head) : len(namespace) - len(tail)]
    if _PLAIN_ID.fullmatch(encoded):
        return encoded
    if encoded.startswith(_HASHED) or not encoded.startswith(_ENCODED):
        return None
    body = encoded[len(_ENCODED) :]
    try:
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
    except ValueError:
        return None
