"""The operations an operator runs on one site: forgetting, flushing, sweeping, retention, sizes
and uninstall. A subject's export and erasure are in :mod:`clawmem.privacy.erasure`.

Each is a function of a :class:`~clawmem.sites.site.Site` returning a typed result. With
``dry_run=True`` it deletes nothing and returns the same result it would have returned, so a
preview and a run can be compared line by line. The CLI (``clawmem`` and ``flask claw``) makes
its changes through these. Entries are reached through the operator API every driver has
(:class:`~clawmem.memory.base.BaseMemory`), so nothing here asks which driver is set.
Conversations, retention, init-db, activity and the table sizes work on the site's SQL tables;
uninstall drops them and, asked to, the file driver's directory of the site, whichever driver
is set.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from clawmem.clock import utc_datetime
from clawmem.memory.file import remove_store_files, store_files
from clawmem.memory.file import site_directory as file_site_directory
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sites.deletion import Deleted, OnBatch, delete_conversations
from clawmem.sites.site import Site
from clawmem.sql import activity as sql_activity
from clawmem.sql import changes as change_logs
from clawmem.sql import sizes
from clawmem.sql.activity import Activity
from clawmem.sql.engine import connect
from clawmem.sql.retention import iter_conversation_ids
from clawmem.sql.retention import older_than as older_than_condition
from clawmem.sql.schema import check_shape, create_tables
from clawmem.sql.vectors import create_vector_table, vector_table
from clawmem.turn.pipeline import billed_tokens

__all__ = [
    "activity",
    "conversations_to_prune",
    "Deleted",
    "flush_namespace",
    "forget_conversation",
    "forget_key",
    "init_db",
    "change_log_plan",
    "change_log_state",
    "message_roles",
    "OnBatch",
    "prune",
    "retention_cutoff",
    "site_directory",
    "site_files",
    "sweep",
    "table_stats",
    "uninstall",
    "Uninstalled",
]


# -- one key, one conversation, one namespace ---------------------------------------------------


def forget_key(site: Site, key: str, namespace: str = "default", dry_run: bool = False) -> Deleted:
    """Delete one key/value entry, expired or not. A missing key deletes nothing."""
    exists = site.driver.entry(namespace, key) is not None
    if exists and not dry_run:
        site.memory.forget(key, namespace)
    return Deleted(dry_run, entries=((namespace, key),) if exists else ())


def forget_conversation(site: Site, conversation_id: str, dry_run: bool = False) -> Deleted:
    """Delete one conversation with its messages, in one transaction. A missing id deletes nothing."""
    found = site.conversations.get(conversation_id)
    if found is None:
        return Deleted(dry_run)
    if dry_run:
        return Deleted(True, conversations=1, messages=found.row_count)
    conversations, messages = site.conversations.delete(conversation_id)
    return Deleted(False, conversations=conversations, messages=messages)


def flush_namespace(site: Site, namespace: str, dry_run: bool = False) -> Deleted:
    """Delete every entry of one key/value namespace, expired ones included, exactly as stored:
    a namespace another program wrote under a name today's rule refuses is reached too."""
    keys = tuple((namespace, row.key) for row in site.driver.stored_records(namespace))
    if dry_run or not keys:
        return Deleted(dry_run, entries=keys)
    site.driver.delete_stored(namespace)
    return Deleted(False, entries=keys)


def sweep(site: Site, dry_run: bool = False) -> dict[str, int]:
    """Delete expired key/value entries in every namespace; return the count per namespace."""
    return site.driver.sweep(dry_run=dry_run)


# -- retention -----------------------------------------------------------------------------------


def retention_cutoff(site: Site, window: timedelta) -> datetime:
    """Return the naive UTC moment before which a conversation is outside ``window``."""
    return utc_datetime(site.clock) - window


def prune(
    site: Site,
    window: timedelta,
    by: str = "created_at",
    batch_size: int = 1000,
    dry_run: bool = False,
    on_batch: OnBatch | None = None,
) -> Deleted:
    """Delete conversations whose ``by`` column is older than ``window``, with their messages.

    Oldest first, ``batch_size`` conversations per transaction, messages first: a run killed at
    any moment leaves no orphans, and the next run finishes the job. ``on_batch`` sees each
    committed batch. Raises ``ValueError`` for a bad ``by`` or ``batch_size``.
    """
    where = older_than_condition(site.prefix, by, retention_cutoff(site, window))
    return delete_conversations(site, where, by, batch_size, dry_run, on_batch)


def conversations_to_prune(
    site: Site, window: timedelta, by: str = "created_at"
) -> Iterator[tuple[str, datetime]]:
    """Yield ``(id, moment)`` of every conversation :func:`prune` would delete, oldest first."""
    where = older_than_condition(site.prefix, by, retention_cutoff(site, window))
    with connect(site.engine) as conn:
        yield from iter_conversation_ids(conn, site.prefix, where, by)


# -- the tables as a whole -------------------------------------------------------------------


def init_db(site: Site, change_log: bool = False) -> tuple[list[str], list[str]]:
    """Create the site's three tables in the shape of ``CLAW_SCHEMA`` (unset: the existing
    tables' shape, ours for a new database) if they do not exist, and bring existing ones of our
    shape up to date, and create the vectors table beside them (in either shape: the three
    tables gain nothing); return their names and what was added. Our shape also gets the change
    log and its triggers (:mod:`clawmem.sql.changes`); phpClaw's only with ``change_log``.
    Raises :class:`clawmem.ConfigError` when tables of the other shape exist, and
    :class:`sqlalchemy.exc.SQLAlchemyError` when the asked-for change log cannot be added."""
    shape = check_shape(site.engine, site.prefix, site.settings.schema)
    existed = bool(sizes.present_tables(site.engine, site.prefix))
    changes = create_tables(site.engine, site.prefix, shape)
    if create_vector_table(site.engine, site.prefix) and existed:
        changes.append(f"added table {vector_table(site.prefix).name}")
    names = [*sizes.table_names(site.prefix), vector_table(site.prefix).name]
    if change_log and shape != CLAWMEM_SCHEMA and change_logs.install(site.engine, site.prefix):
        changes.append(change_logs.added(site.prefix))
    if shape == CLAWMEM_SCHEMA or change_log:
        names.append(change_logs.change_table(site.prefix).name)
    return names, changes


def change_log_plan(site: Site) -> list[str]:
    """Return what ``init-db --change-log`` adds to the site's database, one line each."""
    return change_logs.describe(site.engine, site.prefix)


def change_log_state(site: Site) -> change_logs.LogState | None:
    """Return how recall follows the site's memory table, or ``None`` when memory is not in
    SQL or the tables do not exist."""
    if site.settings.memory_driver != "sql" or not sizes.present_tables(site.engine, site.prefix):
        return None
    return change_logs.state(site.engine, site.prefix, site.conversations.shape)


def activity(site: Site, days: int = 30) -> Activity:
    """Return the messages written, conversations begun and tokens billed on each of the last
    ``days`` UTC days, today (on the site's clock) last, with the conversations stored now and
    their tokens. Raises ``ValueError`` for days outside 1..366."""
    with connect(site.engine) as conn:
        return sql_activity.activity(
            conn,
            site.prefix,
            utc_datetime(site.clock),
            days,
            site.conversations.shape,
            billed_tokens,
            site.conversations.cipher,
        )


def table_stats(site: Site) -> list[sizes.TableStats]:
    """Return rows and bytes of the site's three tables (the inspection query of its dialect)."""
    return sizes.table_stats(site.engine, site.prefix)


def message_roles(site: Site, stats: Sequence[sizes.TableStats] | None = None) -> dict[str, int]:
    """Return how many stored messages each role has, when the messages table exists (as
    ``stats``, the :func:`table_stats` just taken, says, else as the database says)."""
    name = sizes.table_names(site.prefix)[1]
    present = [table.name for table in stats if table.exists] if stats is not None else None
    if name not in (present if present is not None else sizes.present_tables(site.engine, site.prefix)):
        return {}
    return site.conversations.role_counts()


@dataclass(frozen=True)
class Uninstalled:
    """What an uninstall dropped or, with ``dry_run``, would drop."""

    dry_run: bool
    tables: tuple[sizes.TableStats, ...]
    files: tuple[str, ...] = field(default=())

    @property
    def rows(self) -> int:
        """Return the rows the dropped tables held."""
        return sum(table.rows or 0 for table in self.tables)

    def counts(self) -> dict[str, int]:
        """Return the counts for an audit line."""
        return {"tables": len(self.tables), "rows": self.rows, "files": len(self.files)}


def uninstall(site: Site, files: bool = False, dry_run: bool = False) -> Uninstalled:
    """Drop the site's three tables and, with ``files``, the file driver's directory of this
    site. Other sites' tables and files are never touched. Raises ``ValueError`` (before
    anything is deleted) when the site's directory holds files the driver did not write."""
    present = tuple(sizes.existing_tables(site.engine, site.prefix))
    store_files = site_files(site) if files else []
    result = Uninstalled(dry_run, present, tuple(str(path) for path in store_files))
    if dry_run:
        return result
    sizes.drop_prefix_tables(site.engine, site.prefix)
    if files:
        remove_store_files(site.settings.file_dir, site.prefix)
    return result


def site_files(site: Site) -> list[Path]:
    """Return the file driver's files of this site (none when it has no directory)."""
    return store_files(site.settings.file_dir, site.prefix)


def site_directory(site: Site) -> Path:
    """Return the file driver's directory for this site."""
    return file_site_directory(site.settings.file_dir, site.prefix)
