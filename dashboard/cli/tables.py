"""``flask claw stats | uninstall``: the three tables of the configured prefix as a whole.

``stats`` is the inspection query for the current dialect; ``uninstall`` drops the prefix's
tables (and, with ``--files``, the file driver's directory), with the same dry run, confirmation
and audit line as every deleting command.
"""

from __future__ import annotations

import json

import click

from clawmem.errors import redact
from clawmem.sql.retention import drop_prefix_tables, existing_tables, sqlite_file_bytes, table_stats
from dashboard import state
from dashboard.cli import claw
from dashboard.cli.audit import AuditEntry, audited, one_line_errors
from dashboard.cli.common import confirm_deletion, deleting_options, plural
from dashboard.cli.files import remove_store_files, store_files

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


@claw.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@one_line_errors
def stats(as_json: bool) -> None:
    """Show rows and size of the three tables.

    The inspection query, for the tables of the configured prefix only.

    Rows are exact counts. Sizes come from information_schema (data + index length) on
    MariaDB/MySQL, pg_total_relation_size on PostgreSQL and the dbstat table on SQLite. InnoDB
    and PostgreSQL keep freed space until OPTIMIZE TABLE / VACUUM FULL.
    """
    settings = state.settings()
    engine = state.engine()
    found = table_stats(engine, settings.table_prefix)
    database = redact(settings.database_url)
    if as_json:
        document = {
            "database": database,
            "dialect": engine.dialect.name,
            "table_prefix": settings.table_prefix,
            "tables": [
                {"table": t.name, "exists": t.exists, "rows": t.rows, "bytes": t.bytes} for t in found
            ],
        }
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(f"database: {database} ({engine.dialect.name}), table prefix {settings.table_prefix!r}")
    width = max(len(t.name) for t in found)
    click.echo(f"{'table':<{width}}  {'rows':>12}  {'size':>10}")
    for table in found:
        if not table.exists:
            click.echo(f"{table.name:<{width}}  missing: run `flask claw init-db`")
            continue
        click.echo(f"{table.name:<{width}}  {table.rows:>12,}  {human_bytes(table.bytes):>10}")
    file_bytes = sqlite_file_bytes(engine)
    if file_bytes is not None:
        click.echo(f"database file: {human_bytes(file_bytes)} (page_count x page_size, all tables)")


# -- uninstall --------------------------------------------------------------------------------


@claw.command("uninstall")
@click.option("--files", is_flag=True, help="Also remove the file driver's directory (CLAW_FILE_DIR).")
@deleting_options(listing="Also list the files that go.")
@audited("uninstall")
def uninstall(entry: AuditEntry, files: bool, dry_run: bool, yes: bool, verbose: bool) -> None:
    """Drop the three tables of the configured prefix.

    Every row in them goes.

    Other prefixes' tables are never touched. With --files, also remove the namespace files of
    the file driver and then its directory; a directory holding anything clawmem did not
    write is refused before anything is deleted.
    """
    settings = state.settings()
    engine = state.engine()
    present = existing_tables(engine, settings.table_prefix)
    rows = sum(table.rows or 0 for table in present)
    directory_files = store_files(settings.file_dir) if files else []
    entry.counts = {"tables": 0, "rows": 0, "files": 0}
    for table in present:
        click.echo(f"table {table.name}: {plural(table.rows or 0, 'row')}")
    if files:
        click.echo(f"directory {settings.file_dir}: {plural(len(directory_files), 'file')}")
        if verbose:
            for path in directory_files:
                click.echo(f"  {path}")
    nothing = not present and not directory_files
    summary = f"{plural(len(present), 'table')} holding {plural(rows, 'row')}"
    if files:
        summary += f" and remove {plural(len(directory_files), 'file')}"
    if dry_run:
        entry.counts = {"tables": len(present), "rows": rows, "files": len(directory_files)}
        click.echo(f"would drop {summary} (dry run: nothing deleted)")
        return
    confirm_deletion(f"Drop {summary}? This cannot be undone.", yes, nothing_to_delete=nothing)
    dropped = drop_prefix_tables(engine, settings.table_prefix)
    entry.counts.update(tables=len(dropped), rows=rows)
    click.echo(f"dropped {plural(len(dropped), 'table')}: {', '.join(dropped) or 'none existed'}")
    if files:
        removed = remove_store_files(settings.file_dir)
        entry.counts["files"] = removed
        click.echo(f"removed {plural(removed, 'file')} and the directory {settings.file_dir}")
