"""The one settings object. Built from ``CLAW_*`` environment variables or a Flask config."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from clawmem.errors import ConfigError
from clawmem.rules import (
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_SUBJECT_NAMESPACE,
    validate_prefix,
    validate_template,
)

ENV_PREFIX = "CLAW_"
NO_STEMMING = "off"
# CLAW_RECALL_STEMMING's values: words as written, or Snowball's English stems.
RECALL_STEMMINGS = (NO_STEMMING, "english")
# The modes of clawmem.turn.guards.PiiGuard (named here so that settings stand below the guards).
PII_GUARD_MODES = ("block", "redact", "warn", "off")
# Who writes memory entries besides the operator's code (SPEC 1): nobody (phpClaw), the model
# through a `remember` tool offered in each turn (clawmem.turn.writes), or one extraction call after
# each turn (clawmem.turn.extraction).
MEMORY_WRITES_MODES = ("off", "tool", "extract")
# The shapes of the three tables (SPEC 4.8): ours, and the one phpClaw's WordPress plugin writes.
CLAWMEM_SCHEMA = "clawmem"
PHPCLAW_SCHEMA = "phpclaw-wordpress"
SCHEMAS = (CLAWMEM_SCHEMA, PHPCLAW_SCHEMA)
# How recall scores (SPEC 5): ours, or phpClaw's own byte for byte (clawmem.recall.phpclaw.ranker_for).
RECALL_SCORINGS = ("clawmem", "phpclaw", "weighted", "semantic", "hybrid")
# A site's label in CLAW_SITES: it is shown in the header and carried in every dashboard URL.
SITE_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
# The label of the one site of CLAW_TABLE_PREFIX when CLAW_SITES is unset.
DEFAULT_SITE_LABEL = "default"
# Background work (SPEC 14): Huey's own storage in the instance folder, and how long a queued
# turn's record stays in phpclaw_jobs (phpClaw's RunAgentJob keeps its state for an hour).
QUEUE_FILE = "queue.db"
DEFAULT_JOB_TTL = 3600
# Every connection to a server (SQL and Redis) has these timeouts, so a server that stops
# answering fails the request in bounded time instead of hanging it until TCP gives up. They
# are tuned in the URL itself, whose own parameters win: MariaDB's connect_timeout=,
# read_timeout=, write_timeout=; PostgreSQL's connect_timeout=, tcp_user_timeout= (ms);
# Redis's socket_connect_timeout=, socket_timeout=.
CONNECT_TIMEOUT_SECONDS = 10
SQL_READ_TIMEOUT_SECONDS = 60  # one statement's answer: a sweep or an export may run long
REDIS_READ_TIMEOUT_SECONDS = 10  # one command's answer (above the queue's 1 s blocking pop)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{ENV_PREFIX}{name} must be true or false, got {raw!r}")


def _parse_float(name: str, raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name} must be a number, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{ENV_PREFIX}{name} must be a finite number, got {raw!r}")
    return value


def _parse_int(name: str, raw: Any, minimum: int = 0) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{ENV_PREFIX}{name} must be a whole number, got {raw!r}")
    try:
        number = int(str(raw).strip()) if not isinstance(raw, int) else raw
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name} must be a whole number, got {raw!r}") from None
    if number < minimum:
        raise ConfigError(f"{ENV_PREFIX}{name} must be at least {minimum}, got {number}")
    return number


def check_url(name: str, url: str) -> str:
    """Return a connection URL unless it holds more than one ``@`` before its path, which is a
    password with an unencoded ``@``: the part after it would silently become the host name.
    Raises :class:`ConfigError` in one line naming ``CLAW_<name>``, without the password."""
    _, separator, rest = url.partition("://")
    if separator and not rest.startswith("/") and rest.split("?", 1)[0].count("@") > 1:
        raise ConfigError(
            f"{ENV_PREFIX}{name} holds more than one '@' before its host: write an '@' inside the user "
            "name or password as %40"
        )
    return url


def parse_sites(raw: str) -> tuple[tuple[str, str], ...]:
    """Return the ``(label, table prefix)`` pairs of a ``CLAW_SITES`` value such as
    ``shop=wp_,blog=wp_2_`` (blank items skipped), in the order given.

    Raises :class:`ConfigError` in one line naming the bad pair: not ``label=prefix``, a label
    that is not 1-40 ASCII letters, digits, ``_ . -``, a prefix ``CLAW_TABLE_PREFIX`` would refuse,
    or a label or prefix named twice.
    """
    pairs: dict[str, str] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        label, equals, prefix = (part.strip() for part in item.partition("="))
        if not equals:
            raise ConfigError(f"{ENV_PREFIX}SITES item {item!r} must be label=prefix, such as shop=wp_")
        if not SITE_LABEL.fullmatch(label):
            raise ConfigError(
                f"{ENV_PREFIX}SITES item {item!r}: a label is 1-40 ASCII letters, digits, _ . or -, "
                "starting with a letter or digit"
            )
        try:
            validate_prefix(prefix)
        except ConfigError as exc:
            raise ConfigError(f"{ENV_PREFIX}SITES item {item!r}: {exc}") from None
        if label in pairs:
            raise ConfigError(f"{ENV_PREFIX}SITES names the site {label!r} twice")
        if prefix in pairs.values():
            raise ConfigError(f"{ENV_PREFIX}SITES item {item!r}: the prefix {prefix!r} already has a label")
        pairs[label] = prefix
    return tuple(pairs.items())


def refuse_phpclaw_encryption() -> str:
    """Return the one line that refuses encryption on phpClaw's own tables (SPEC 13)."""
    return (
        f"{ENV_PREFIX}ENCRYPTION_KEYS is refused on the {PHPCLAW_SCHEMA} shape: phpClaw could no longer "
        f"read its own rows; unset {ENV_PREFIX}ENCRYPTION_KEYS and {ENV_PREFIX}ENCRYPTION_KEY_FILE"
    )


def display_zone(name: str) -> ZoneInfo:
    """Return the time zone ``CLAW_DISPLAY_TZ`` names (an IANA name such as ``Europe/Berlin``).

    Raises :class:`ConfigError` in one line when no such zone is known.
    """
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(
            f"{ENV_PREFIX}DISPLAY_TZ must be a time zone name such as UTC or Europe/Berlin, got {name!r}"
        ) from None


def check_memory_writes(mode: str) -> str:
    """Return ``mode`` if ``CLAW_MEMORY_WRITES`` may take it (``off``, ``tool`` or ``extract``).

    Raises :class:`ConfigError` in one line listing the allowed values.
    """
    if mode in MEMORY_WRITES_MODES:
        return mode
    allowed = ", ".join(MEMORY_WRITES_MODES)
    raise ConfigError(f"{ENV_PREFIX}MEMORY_WRITES must be one of {allowed}, got {mode!r}")


@dataclass(frozen=True)
class Settings:
    """Every clawmem setting. Field ``x`` is read from ``CLAW_X`` (config key ``X``).

    ``database_url`` and ``file_dir`` default to paths inside ``instance_path``.
    """

    instance_path: str = "instance"
    database_url: str = ""
    table_prefix: str = ""
    memory_driver: str = "sql"
    redis_url: str = "redis://127.0.0.1:6379/0"
    file_dir: str = ""
    store_messages: bool = True
    recall_top_k: int = 3
    recall_namespace: str = "default"
    compact_max_messages: int = 0
    compact_max_tokens: int = 0
    retention_days: int | None = None
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    subject_namespace: str = DEFAULT_SUBJECT_NAMESPACE
    compact_persist: bool = True
    record_recall: bool = True
    pii_guard: str = "block"
    pii_allow_keys: str = ""
    schema: str = ""  # unset: the existing tables' shape, or clawmem for a new database
    recall_scoring: str = "clawmem"
    recall_stemming: str = "off"  # "english": Snowball stems in every scoring but phpclaw
    recall_min_score: float | None = None  # off: every candidate may be injected
    recall_embedder: str = ""  # module:callable of a local Embedder; "": the bundled encoder
    sites: str = ""
    queue_url: str = ""
    job_ttl: int = DEFAULT_JOB_TTL
    retention_schedule: str = ""
    provider_url: str = ""
    provider_model: str = ""
    provider_factory: str = ""
    display_tz: str = "UTC"
    memory_writes: str = "off"
    # Encryption at rest (SPEC 13). The key list is never shown: not in repr, not on any page.
    encryption_keys: str = field(default="", repr=False)
    encryption_key_file: str = ""
    encryption_strict: bool = False
    keystore_url: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        validate_prefix(self.table_prefix)
        parse_sites(self.sites)
        validate_template(self.subject_namespace)
        if self.pii_guard not in PII_GUARD_MODES:
            raise ConfigError(
                f"{ENV_PREFIX}PII_GUARD must be one of {', '.join(PII_GUARD_MODES)}, got {self.pii_guard!r}"
            )
        if self.schema and self.schema not in SCHEMAS:
            raise ConfigError(f"{ENV_PREFIX}SCHEMA must be one of {', '.join(SCHEMAS)}, got {self.schema!r}")
        if self.recall_scoring not in RECALL_SCORINGS:
            raise ConfigError(
                f"{ENV_PREFIX}RECALL_SCORING must be one of {', '.join(RECALL_SCORINGS)}, "
                f"got {self.recall_scoring!r}"
            )
        if self.recall_stemming not in RECALL_STEMMINGS:
            raise ConfigError(
                f"{ENV_PREFIX}RECALL_STEMMING must be one of {', '.join(RECALL_STEMMINGS)}, "
                f"got {self.recall_stemming!r}"
            )
        display_zone(self.display_tz)
        check_memory_writes(self.memory_writes)
        check_url("DATABASE_URL", self.database_url)
        check_url("REDIS_URL", self.redis_url)
        check_url("QUEUE_URL", self.queue_url)
        check_url("PROVIDER_URL", self.provider_url)
        check_url("KEYSTORE_URL", self.keystore_url)
        if self.schema == PHPCLAW_SCHEMA and self.encrypts:
            raise ConfigError(refuse_phpclaw_encryption())
        instance = Path(self.instance_path)
        if not self.queue_url:
            object.__setattr__(self, "queue_url", f"sqlite:///{instance.resolve() / QUEUE_FILE}")
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{instance.resolve() / 'clawmem.db'}")
        if not self.file_dir:
            object.__setattr__(self, "file_dir", str(instance / "memory"))

    @property
    def encrypts(self) -> bool:
        """Return whether encryption keys are configured (``CLAW_ENCRYPTION_KEYS`` or ``_KEY_FILE``)."""
        return bool(self.encryption_keys.strip() or self.encryption_key_file.strip())

    @property
    def display_zone(self) -> ZoneInfo:
        """Return the time zone the dashboard prints absolute times in (``CLAW_DISPLAY_TZ``)."""
        return display_zone(self.display_tz)

    @property
    def allowed_pii_keys(self) -> tuple[str, ...]:
        """Return the memory keys of ``CLAW_PII_ALLOW_KEYS`` (comma-separated, blanks dropped)."""
        return tuple(key.strip() for key in self.pii_allow_keys.split(",") if key.strip())

    @property
    def site_prefixes(self) -> tuple[tuple[str, str], ...]:
        """Return the dashboard's sites as ``(label, table prefix)`` pairs: those of ``CLAW_SITES``,
        or when it names none the one site of ``CLAW_TABLE_PREFIX``, labelled ``default``."""
        return parse_sites(self.sites) or ((DEFAULT_SITE_LABEL, self.table_prefix),)

    @classmethod
    def setting_names(cls) -> list[str]:
        """Return the config key of every setting (``DATABASE_URL``, ...), in field order."""
        return [field.name.upper() for field in fields(cls) if field.name != "instance_path"]

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], instance_path: str | os.PathLike[str] = "instance"
    ) -> Settings:
        """Build settings from config keys such as ``DATABASE_URL``; unknown keys are ignored.

        Raises :class:`clawmem.errors.ConfigError` naming the variable when a value is malformed.
        """
        parsed: dict[str, Any] = {"instance_path": os.fspath(instance_path)}
        for name in cls.setting_names():
            if name not in values or values[name] in (None, ""):
                continue
            raw = values[name]
            attribute = name.lower()
            if attribute in {"store_messages", "compact_persist", "record_recall", "encryption_strict"}:
                parsed[attribute] = _parse_bool(name, raw)
            elif attribute in {"recall_top_k", "compact_max_messages", "compact_max_tokens"}:
                parsed[attribute] = _parse_int(name, raw)
            elif attribute == "recall_min_score":
                parsed[attribute] = _parse_float(name, raw)
            elif attribute in {"retention_days", "max_value_bytes", "job_ttl"}:
                parsed[attribute] = _parse_int(name, raw, minimum=1)
            else:
                parsed[attribute] = str(raw)
        for attribute in (
            "memory_driver",
            "pii_guard",
            "schema",
            "recall_scoring",
            "recall_stemming",
            "memory_writes",
        ):
            if attribute in parsed:
                parsed[attribute] = parsed[attribute].strip().lower()
        return cls(**parsed)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, instance_path: str | os.PathLike[str] = "instance"
    ) -> Settings:
        """Build settings from ``CLAW_*`` variables of ``environ`` (default ``os.environ``)."""
        environ = os.environ if environ is None else environ
        values = {
            name[len(ENV_PREFIX) :]: value for name, value in environ.items() if name.startswith(ENV_PREFIX)
        }
        return cls.from_mapping(values, instance_path)

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)
