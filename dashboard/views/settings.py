"""Settings: every effective setting with its source, and the CLI commands that delete data."""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from sqlalchemy.exc import SQLAlchemyError

from clawmem.encryption.state import encryption_state
from clawmem.errors import ConfigError, redact
from clawmem.settings import CLAWMEM_SCHEMA, ENV_PREFIX, Settings
from clawmem.sites import operations
from clawmem.turn.compaction import configured_thresholds
from dashboard import state
from dashboard.views.rendering import render_page, shell_command

bp = Blueprint("settings", __name__)

MEANINGS = {
    "DATABASE_URL": "where the three tables live",
    "TABLE_PREFIX": "table name prefix of this site",
    "MEMORY_DRIVER": "storage of key/value memory",
    "REDIS_URL": "used by the redis driver",
    "FILE_DIR": "used by the file driver",
    "STORE_MESSAGES": "privacy switch: false stops new writes, keeps old ones",
    "RECALL_TOP_K": "memory entries injected per turn (0 = recall off)",
    "RECALL_NAMESPACE": "the namespace recall reads",
    "COMPACT_MAX_MESSAGES": "compact when a history has more messages (0 = off)",
    "COMPACT_MAX_TOKENS": "compact when a history has more estimated tokens (0 = off)",
    "RETENTION_DAYS": "window that flask claw prune uses by default",
    "MAX_VALUE_BYTES": "largest value or message accepted",
    "SUBJECT_NAMESPACE": "where a subject's own facts live; recall reads it, export and erase take it whole",
    "COMPACT_PERSIST": "keep each compaction summary as a checkpoint, so no message is summarised twice",
    "PII_GUARD": "what personal data in a turn does: block, redact, warn or off",
    "MEMORY_WRITES": "who writes memory besides code: off, tool (the model's remember) or extract",
    "PII_ALLOW_KEYS": "memory keys whose contact details never block or redact (comma-separated)",
    "SCHEMA": "shape of the three tables: clawmem, or phpclaw-wordpress (phpClaw's own tables)",
    "RECALL_SCORING": "how recall scores: clawmem, or phpclaw (phpClaw's own scoring, byte for byte)",
    "RECALL_STEMMING": "off, or english: recall matches words by their Snowball stems (never under phpclaw)",
    "RECALL_EMBEDDER": "module:callable of the local model semantic and hybrid embed with (unset: bundled)",
    "SITES": "dashboard only: label=prefix pairs offered by the site switcher (unset: the TABLE_PREFIX site)",
    "QUEUE_URL": "the background queue (Huey): a SQLite file on one machine, or redis:// for many hosts",
    "JOB_TTL": "seconds a background job's record stays in phpclaw_jobs after its last change",
    "RETENTION_SCHEDULE": "cron expression (UTC) on which clawmem worker runs prune and sweep",
    "PROVIDER_URL": "the OpenAI-compatible endpoint of a worker (its key: CLAW_PROVIDER_API_KEY, env only)",
    "PROVIDER_MODEL": "the model a worker asks the provider for",
    "PROVIDER_FACTORY": "module:callable that builds a worker's provider instead of PROVIDER_URL",
    "DISPLAY_TZ": "dashboard only: the time zone absolute times are printed in (an IANA name; default UTC)",
    "ENCRYPTION_KEYS": "id:base64key list: the first encrypts text at rest, every one decrypts (never shown)",
    "ENCRYPTION_KEY_FILE": "the same list in a file only its owner may read (mode 0600)",
    "ENCRYPTION_STRICT": "true: plaintext rows are refused (unreadable), once every row is encrypted",
    "KEYSTORE_URL": "where each subject's own data key lives, apart from this database (erasure deletes it)",
}
# Settings whose value is never printed: the page says whether they are set, and for keys, their ids.
HIDDEN = {"ENCRYPTION_KEYS"}


def shown_value(value: Any) -> str:
    """Return a setting as text, with any password in a URL replaced by ``***``."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return redact(str(value))


def deletion_commands(settings: Settings) -> list[dict[str, str]]:
    """Return the claw commands for each deletion task, with what each one does, every deleting
    one as its dry run (run it again without ``--dry-run`` to delete); every word is quoted for
    the shell (the capitalised words are for the operator to fill in)."""
    window = f"{settings.retention_days}d" if settings.retention_days else "90d"
    claw = ("flask", "claw")
    return [
        {
            "task": "Delete one memory key",
            "command": shell_command(*claw, "forget", "KEY", "--namespace", "NAMESPACE", "--dry-run"),
        },
        {
            "task": "Delete one conversation and its messages",
            "command": shell_command(*claw, "forget", "--conversation", "CONVERSATION_ID", "--dry-run"),
        },
        {
            "task": "Delete every key of a namespace",
            "command": shell_command(*claw, "flush", "--namespace", "NAMESPACE", "--dry-run"),
        },
        {
            "task": "Delete every conversation written until an hour ago, with its messages",
            "command": shell_command(*claw, "prune", "--older-than", "1h", "--dry-run"),
        },
        {
            "task": "Delete expired keys (see first what would go)",
            "command": shell_command(*claw, "sweep", "--dry-run"),
        },
        {
            "task": "Apply the retention window to conversations",
            "command": shell_command(*claw, "prune", "--older-than", window, "--dry-run"),
        },
        {
            "task": "Export everything about a subject",
            "command": shell_command(*claw, "export", "--user-id", "SUBJECT_ID", "--output", "subject.json"),
        },
        {
            "task": "Erase a subject (conversations, messages, matching memory)",
            "command": shell_command(*claw, "erase", "--user-id", "SUBJECT_ID", "--dry-run"),
        },
        {
            "task": "Erase every mention of a text, such as an email address",
            "command": shell_command(*claw, "erase", "--match", "TEXT", "--dry-run"),
        },
        {
            "task": "Find a subject's lines in the audit log (it holds only keyed hashes)",
            "command": shell_command(*claw, "audit-hash", "SUBJECT_ID"),
        },
        {
            "task": "Remove clawmem's tables and data from this site",
            "command": shell_command(*claw, "uninstall", "--dry-run"),
        },
    ]


@bp.get("/settings")
def index() -> str:
    """Every effective setting, where it came from, the compaction thresholds and deletion commands."""
    settings = state.settings()
    sources = state.setting_sources()
    site = state.site()
    try:
        cipher = site.cipher
    except ConfigError as exc:  # a malformed key list: said here, the keys never shown
        cipher, key_error = None, str(exc)
    else:
        key_error = None
    rows = [
        {
            "variable": f"{ENV_PREFIX}{name}",
            "value": _hidden_value(name, settings, cipher)
            if name in HIDDEN
            else shown_value(getattr(settings, name.lower())),
            "source": sources.get(name, "default"),
            "meaning": MEANINGS.get(name, ""),
        }
        for name in Settings.setting_names()
    ]
    encryption = None
    if cipher is not None and site.conversations.shape == CLAWMEM_SCHEMA:
        # Two grouped counts per encrypted column: this page's, never the Overview's. phpClaw's
        # tables are never encrypted (SPEC 13), and lack some of the columns counted.
        in_sql = settings.memory_driver == "sql"
        encryption = encryption_state(site.engine, site.prefix, cipher, sql_memory=in_sql)
    try:
        change_log = operations.change_log_state(site)
    except SQLAlchemyError:  # the database is down: the rest of the page still shows
        change_log = None
    return render_page(
        "settings/index.html",
        {},
        rows=rows,
        change_log=change_log,
        compaction=configured_thresholds(settings),
        commands=deletion_commands(settings),
        encryption=encryption,
        key_error=key_error,
    )


def _hidden_value(name: str, settings: Settings, cipher: Any) -> str:
    if not getattr(settings, name.lower()):
        return "(unset)"
    if cipher is None or cipher.keyring is None:
        return "(set, not readable: see below)"
    return f"(set: key ids {', '.join(cipher.keyring.key_ids)}; the keys are never shown)"
