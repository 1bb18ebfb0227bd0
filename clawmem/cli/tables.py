"""``init-db | stats | uninstall``: the three tables of the configured prefix as a whole.

``init-db`` creates them, ``stats`` is the inspection query for the current dialect, and
``uninstall`` drops them (and, with ``--files``, this site's directory of the file driver), with
the same dry run, confirmation and audit line as every deleting command.
"""

from __future__ import annotations

import json

import click

from clawmem.cli import current_site
from clawmem.cli.audit import AuditEntry, audited, one_line_errors
from clawmem.cli.common import confirm_deletion, deleting_options, plural
from clawmem.errors import redact
from clawmem.settings import Settings
from clawmem.sites import operations
from clawmem.sql.sizes import sqlite_file_bytes


@click.command("init-db")
@click.option(
    "--change-log",
    is_flag=True,
    help="On phpClaw's tables, also add the change log and its triggers (printed first), so that "
    "recall reads only what changed instead of counting each turn. Our own tables always get it.",
)
@one_line_errors
def init_db(change_log: bool) -> None:
    """Create the three tables of the configured prefix, or bring existing ones up to date
    (added columns and indexes, each printed); safe to run again.

    Beside them: the vectors table, and on clawmem's shape the change log, whose triggers on the
    memory table let recall see what any program wrote without counting the namespace each
    turn. Without the TRIGGER privilege the log is left out (said in one line) and recall counts.
    """
    site = current_site()
    if change_log:
        click.echo("init-db --change-log adds to the database (dropped again by uninstall):")
        for line in operations.change_log_plan(site):
            click.echo(f"  {line}")
    names, changes = operations.init_db(site, change_log=change_log)
    for change in changes:
        click.echo(change)
    click.echo(f"tables ready: {', '.join(names)}")


# -- stats ------------------------------------------------------------------------------------


def human_bytes(size: int | None) -> str:
    """Return ``size`` as ``512 B``, ``1.5 KiB``, ``12.0 MiB``...; ``n/a`` for ``None``."""
    if size is None:
        return "n/a"
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    value, unit = float(size), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {units[unit]}"


@click.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@one_line_errors
def stats(as_json: bool) -> None:
    """Show rows and size of the three tables, and how recall scores.

    The inspection query, for the tables of the configured prefix only. The recall line names
    the scoring (CLAW_RECALL_SCORING) and the stemming its words are taken with
    (CLAW_RECALL_STEMMING; phpclaw never stems).

    Rows are exact counts. Sizes come from information_schema (data + index length) on
    MariaDB/MySQL, pg_total_relation_size on PostgreSQL and the dbstat table on SQLite. InnoDB
    and PostgreSQL keep freed space until OPTIMIZE TABLE / VACUUM FULL. Only reads: a SQLite
    database file that does not exist is an error, never created.
    """
    site = current_site()
    missing = site.missing_database(tables=False)
    if missing is not None:
        raise click.ClickException(missing)
    settings, engine = site.settings, site.engine
    found = operations.table_stats(site)
    roles = operations.message_roles(site)
    log = operations.change_log_state(site)
    database = redact(settings.database_url)
    if as_json:
        document = {
            "database": database,
            "dialect": engine.dialect.name,
            "table_prefix": settings.table_prefix,
            "tables": [
                {"table": t.name, "exists": t.exists, "rows": t.rows, "bytes": t.bytes} for t in found
            ],
            "messages_by_role": roles,
            "change_log": None if log is None else {"on": log.on, "recall": log.line},
            "recall": {"scoring": settings.recall_scoring, "stemming": recall_stemming(settings)},
        }
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(f"database: {database} ({engine.dialect.name}), table prefix {settings.table_prefix!r}")
    width = max(len(t.name) for t in found)
    click.echo(f"{'table':<{width}}  {'rows':>12}  {'size':>10}")
    for table in found:
        if not table.exists:
            click.echo(f"{table.name:<{width}}  missing: run the init-db command")
            continue
        click.echo(f"{table.name:<{width}}  {table.rows:>12,}  {human_bytes(table.bytes):>10}")
    if roles:
        click.echo("messages by role: " + ", ".join(f"{role} {count:,}" for role, count in roles.items()))
    if log is not None:
        click.echo(f"change log: {'on' if log.on else 'off'}: {log.line}")
    file_bytes = sqlite_file_bytes(engine)
    if file_bytes is not None:
        click.echo(f"database file: {human_bytes(file_bytes)} (page_count x page_size, all tables)")
    stemming = recall_stemming(settings)
    unused = "" if stemming == settings.recall_stemming else " (phpclaw never stems)"
    click.echo(f"recall: scoring {settings.recall_scoring}, stemming {stemming}{unused}")


def recall_stemming(settings: Settings) -> str:
    """Return the stemming recall's words are taken with: ``CLAW_RECALL_STEMMING``, or ``off``
    under the ``phpclaw`` scoring, which never stems."""
    return "off" if settings.recall_scoring == "phpclaw" else settings.recall_stemming


# -- uninstall --------------------------------------------------------------------------------


@click.command("uninstall")
@click.option("--files", is_flag=True, help="Also remove the file driver's directory (CLAW_FILE_DIR).")
@deleting_options(listing="Also list the files that go.")
@audited("uninstall")
def uninstall(entry: AuditEntry, files: bool, dry_run: bool, yes: bool, verbose: bool) -> None:
    """Drop the three tables of the configured prefix.

    Every row in them goes.

    Other prefixes' tables and files are never touched. With --files, also remove this site's
    namespace files of the file driver and then their directory; a directory holding anything
    clawmem did not write is refused before anything is deleted.
    """
    site = current_site()
    preview = operations.uninstall(site, files=files, dry_run=True)
    directory = operations.site_directory(site)
    entry.counts = {"tables": 0, "rows": 0, "files": 0}
    for table in preview.tables:
        click.echo(f"table {table.name}: {plural(table.rows or 0, 'row')}")
    if files:
        click.echo(f"directory {directory}: {plural(len(preview.files), 'file')}")
        if verbose:
            for path in preview.files:
                click.echo(f"  {path}")
    nothing = not preview.tables and not preview.files
    summary = f"{plural(len(preview.tables), 'table')} holding {plural(preview.rows, 'row')}"
    if files:
        summary += f" and remove {plural(len(preview.files), 'file')}"
    if dry_run:
        entry.counts = preview.counts()
        click.echo(f"would drop {summary} (dry run: nothing deleted)")
        return
    confirm_deletion(f"Drop {summary}? This cannot be undone.", yes, nothing_to_delete=nothing)
    entry.start(preview.counts())
    done = operations.uninstall(site, files=files)
    entry.counts = done.counts()
    dropped = [table.name for table in done.tables]
    click.echo(f"dropped {plural(len(dropped), 'table')}: {', '.join(dropped) or 'none existed'}")
    if files:
        click.echo(f"removed {plural(len(done.files), 'file')} and the directory {directory}")


COMMANDS = [init_db, stats, uninstall]
