"""``keys generate | status | rotate``: the encryption keys of a site (SPEC 13).

No command here prints, logs or audits a key except ``generate``, whose one line of output is the
new key: key ids, counts and places only.
"""

from __future__ import annotations

import json
import secrets
import sys
from typing import Any

import click

from clawmem.cli import current_site
from clawmem.cli.audit import AuditEntry, audited, one_line_errors
from clawmem.cli.common import plural, shown, stdout_is_terminal
from clawmem.crypto import generate_key
from clawmem.encryption.ciphers import cipher_for, keystore_of
from clawmem.errors import ConfigError
from clawmem.sites import rotation
from clawmem.sql.keys import column_keys
from clawmem.sql.schema import tables
from clawmem.sql.sizes import present_tables


@click.group("keys")
def keys() -> None:
    """Encryption keys: make one, count rows per key id, rotate to the first key.

    Keys come from CLAW_ENCRYPTION_KEYS (or the 0600 file CLAW_ENCRYPTION_KEY_FILE) as
    id:base64key items: the first encrypts, every one listed decrypts. No command shows a key
    except generate.
    """


@keys.command("generate")
@click.option("--id", "key_id", help="The new key's id (1-32 of A-Z a-z 0-9 _ -); default: a random one.")
def generate(key_id: str | None) -> None:
    """Print a new key as one id:base64 line.

    Put it first in CLAW_ENCRYPTION_KEYS (keeping the old keys after it), restart every process
    of the site, then run keys rotate. The key is printed once and kept nowhere.
    """
    try:
        line = generate_key(key_id if key_id is not None else "k" + secrets.token_hex(4))
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--id") from None
    click.echo(line)


def _status(site: Any) -> dict[str, Any]:
    cipher = cipher_for(site.settings)
    document: dict[str, Any] = {
        "encryption": "on" if cipher.enabled else "off",
        "encrypts_with": cipher.primary_id,
        "key_ids": list(cipher.keyring.key_ids) if cipher.keyring else [],
        "strict": cipher.strict,
        "tables": [],
    }
    if present_tables(site.engine, site.prefix):
        with site.engine.connect() as conn:
            columns = column_keys(conn, site.prefix)
        for column in columns:
            if column.table == "memory" and site.settings.memory_driver != "sql":
                continue
            document["tables"].append(
                {
                    "table": getattr(tables(site.prefix), column.table).name,
                    "column": column.column,
                    "rows_per_key_id": dict(sorted(column.per_key.items())),
                    "plaintext_rows": column.plaintext,
                }
            )
    vectors = rotation.vector_key_counts(site)
    if vectors is not None and (vectors[1] or vectors[2]):  # derived from the values, sealed like them
        where, per_key, plaintext = vectors
        document["tables"].append(
            {
                "table": where,
                "column": "vector",
                "rows_per_key_id": dict(sorted(per_key.items())),
                "plaintext_rows": plaintext,
            }
        )
    scanned = rotation.memory_key_counts(site)
    if scanned is not None:  # Redis or files: a scan of every namespace, expired entries included
        per_key, plaintext = scanned
        document["tables"].append(
            {
                "table": f"{site.settings.memory_driver} memory",
                "column": "value",
                "rows_per_key_id": dict(sorted(per_key.items())),
                "plaintext_rows": plaintext,
            }
        )
    keystore = keystore_of(cipher)
    if keystore is not None:
        document["key_store"] = {"where": keystore.where, "subject_keys_per_master_key_id": keystore.counts()}
    return document


def _data_key_rows(per_key: dict[str, int]) -> tuple[dict[str, int], int]:
    # Subjects' data keys are many and say nothing to an operator one by one: summed.
    masters = {key_id: rows for key_id, rows in per_key.items() if not key_id.startswith("s-")}
    return masters, sum(rows for key_id, rows in per_key.items() if key_id.startswith("s-"))


@keys.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@one_line_errors
def status(as_json: bool) -> None:
    """Count rows per key id and plaintext rows left, per table and encrypted column.

    A key can be dropped from CLAW_ENCRYPTION_KEYS once no row is under it and the key store
    (CLAW_KEYSTORE_URL) holds no subject key wrapped by it. Only reads: decrypts nothing, and
    creates no database, table or key store.
    """
    site = current_site()
    missing = site.missing_database(tables=False)
    if missing is not None:
        raise click.ClickException(missing)
    document = _status(site)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    if document["encryption"] == "on":
        listed = ", ".join(document["key_ids"])
        strict = "; strict: plaintext rows are refused" if document["strict"] else ""
        click.echo(
            f"encryption on: new values are sealed under {document['encrypts_with']} "
            f"(listed: {listed}){strict}"
        )
    else:
        click.echo("encryption off: CLAW_ENCRYPTION_KEYS is not set, and values are written as plaintext")
    for row in document["tables"]:
        masters, subject_rows = _data_key_rows(row["rows_per_key_id"])
        parts = [f"{plural(rows, 'row')} under {key_id}" for key_id, rows in masters.items()]
        if subject_rows:
            parts.append(f"{plural(subject_rows, 'row')} under subjects' data keys")
        parts.append(f"{plural(row['plaintext_rows'], 'plaintext row')}")
        if " " not in row["table"]:
            place = f"{row['table']}.{row['column']}"
        else:  # a driver's store beyond the tables: its values, or its vectors as it names them
            place = f"{row['table']} values" if row["column"] == "value" else row["table"]
        click.echo(f"{place}: " + ", ".join(parts))
    if not document["tables"]:
        click.echo(f"no tables with prefix {site.prefix!r} yet")
    if "key_store" in document:
        store = document["key_store"]
        counts = store["subject_keys_per_master_key_id"]
        listed = ", ".join(
            f"{plural(count, 'subject key')} wrapped by {key_id}" for key_id, count in counts.items()
        )
        click.echo(f"key store {shown(store['where'])}: {listed or 'no subject keys yet'}")
    unknown = sorted(
        {
            key_id
            for row in document["tables"]
            for key_id in row["rows_per_key_id"]
            if not key_id.startswith("s-") and key_id not in document["key_ids"]
        }
    )
    if unknown:
        click.echo(
            f"rows are sealed under key ids no listed key has: {', '.join(unknown)} (they cannot be read)"
        )


@keys.command("rotate")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Rows per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be re-encrypted and change nothing.")
@audited("keys rotate")
def rotate(entry: AuditEntry, batch_size: int, dry_run: bool) -> None:
    """Re-encrypt every value under the first key of CLAW_ENCRYPTION_KEYS.

    Values under another listed key, and plaintext left from before encryption was on, are
    sealed under the first key; with a key store, every subject's data key is re-wrapped by it
    (rows under a subject's data key need no rewriting). Batches commit one by one and each is in
    the audit log: a killed run is carried on by the next, which says what the killed one had
    committed. The agent keeps running meanwhile: a row it writes during a batch is left as it
    wrote it. A value that cannot be decrypted is never rewritten nor deleted: it is named and
    the run ends with exit code 1.
    """
    site = current_site()
    cipher = rotation.rotation_cipher(site.settings)
    plan = rotation.rotation_plan(site, cipher)
    total = sum(plan.values())
    summary = ", ".join(
        plural(count, "subject key") if name == rotation.SUBJECT_KEYS else f"{plural(count, 'row')} of {name}"
        for name, count in plan.items()
    )
    if dry_run:
        entry.counts = plan
        click.echo(f"would re-encrypt under {cipher.primary_id}: {summary} (dry run: nothing changed)")
        return
    entry.counts = {}  # filled batch by batch, so a failed run records what it committed
    previous = entry.start(plan)
    if previous is not None:
        click.echo(previous.sentence())
    bar = (
        click.progressbar(length=total, label="re-encrypting", file=sys.stdout)
        if stdout_is_terminal()
        else None
    )
    done = 0

    def report(batch: rotation.RotationBatch) -> None:
        nonlocal done
        done += batch.rows + batch.skipped
        entry.committed({batch.table: batch.rows})
        if bar is not None:
            bar.update(batch.rows + batch.skipped)
        else:
            what = (
                plural(batch.rows, "subject key")
                if batch.table == rotation.SUBJECT_KEYS
                else f"{plural(batch.rows, 'row')} of {batch.table}"
            )
            click.echo(f"batch {entry.batches}: re-encrypted {what} ({done} of {total})")
        if batch.skipped:
            click.echo(f"  {plural(batch.skipped, 'row')} written meanwhile by the agent: left as written")

    try:
        result = rotation.rotate(site, batch_size, on_batch=report, cipher=cipher)
    finally:
        if bar is not None:
            bar.render_finish()
    entry.counts = {name: result.counts.get(name, 0) for name in plan}
    moved = ", ".join(f"{count} {name}" for name, count in entry.counts.items())
    click.echo(f"re-encrypted under {cipher.primary_id} in {plural(result.batches, 'batch')}: {moved}")
    if result.vectors_dropped:
        entry.add("vectors_dropped", result.vectors_dropped)
        click.echo(
            f"  {plural(result.vectors_dropped, 'vector')} could not be decrypted: deleted, to be "
            "embedded again (clawmem embed)"
        )
    if result.undecryptable:
        entry.add("undecryptable", len(result.undecryptable))
        for line in result.undecryptable:
            click.echo(f"  not rotated: {shown(line)}", err=True)
        raise click.ClickException(
            f"{plural(len(result.undecryptable), 'value')} could not be decrypted and stay as they are "
            "(nothing was deleted): restore the key they name to CLAW_ENCRYPTION_KEYS and run keys "
            "rotate again"
        )


COMMANDS = [keys]
