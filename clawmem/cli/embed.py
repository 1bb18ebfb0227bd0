"""``embed``: give every live entry its vector where the driver keeps vectors (the sql driver's
vectors table, a Redis hash per namespace, a file per namespace), so that no turn waits for it.

Each batch is written in its own transaction: a run that is killed keeps what it wrote, and the
next run embeds only what is still missing. Vectors of entries gone or changed are deleted first.
"""

from __future__ import annotations

import sys

import click

from clawmem.cli.audit import one_line_errors
from clawmem.errors import ConfigError, InvalidNamespace
from clawmem.recall.embeddings import load_embedder
from clawmem.recall.persisted import PersistedVectors, VectorKeeping
from clawmem.recall.words import text_of
from clawmem.rules import validate_namespace


@click.command("embed")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="A namespace to embed (repeatable); default: every namespace holding entries.",
)
@click.option("--dry-run", is_flag=True, help="Only count the entries that have no vector yet.")
@click.option(
    "--replace",
    is_flag=True,
    help=(
        "Delete the vectors of any other model first (after changing the embedder), and rewrite "
        "those of the float32 format as int8 codes."
    ),
)
@click.option("--batch", type=click.IntRange(1, 4096), default=64, show_default=True, help="Texts per batch.")
@click.option(
    "--embedder",
    "embedder_spec",
    default="",
    metavar="MODULE:CALLABLE",
    help="A local model to embed with; default: CLAW_RECALL_EMBEDDER, else the bundled encoder.",
)
@one_line_errors
def embed(namespaces: tuple[str, ...], dry_run: bool, replace: bool, batch: int, embedder_spec: str) -> None:
    """Embed the entries that have no vector of their current text, with a progress bar.

    The vectors are kept beside the entries (the sql driver's vectors table, created by
    init-db; a Redis hash or a file per namespace), where every worker's semantic and hybrid
    turns read them. Safe to stop and run again: it resumes where it stopped.
    """
    from clawmem.cli import current_site

    site = current_site()
    driver = site.driver
    if not isinstance(driver, VectorKeeping):
        raise ConfigError(
            f"vectors are kept beside the entries of the sql, redis and file memory drivers; "
            f"CLAW_MEMORY_DRIVER is {site.settings.memory_driver}, whose vectors stay in each "
            "worker's process"
        )
    backing = driver.vector_backing()
    if backing is None:
        raise ConfigError("the vectors table does not exist yet: run init-db to create it")
    embedder = load_embedder(embedder_spec or site.settings.recall_embedder)
    if replace and not dry_run:
        dropped = backing.delete_other_models(embedder.model_id, int(embedder.dimension))
        if dropped:
            click.echo(f"deleted {dropped:,} vectors of other models")
    store = PersistedVectors(embedder, backing)
    if replace and not dry_run:
        if backing.make_binary():
            click.echo(f"made {backing.name} hold vectors as bytes")
        converted = sum(store.convert(namespace) for namespace in backing.namespaces())
        if converted:
            click.echo(f"rewrote {converted:,} vectors of an older format as int8 codes")
    now = int(site.clock())
    plan: list[tuple[str, list[tuple[str, str]]]] = []
    entries_total = 0
    for namespace in namespaces or [name for name in driver.namespaces() if _recallable(name)]:
        store.follow(driver.changes, namespace, now)  # drops the vectors of what is gone
        entries = [(key, text_of(value)) for key, value in driver.all(namespace).items()]
        entries_total += len(entries)
        plan.append((namespace, store.missing(namespace, entries)))
    missing_total = sum(len(missing) for _, missing in plan)
    done = entries_total - missing_total
    if dry_run:
        for namespace, missing in plan:
            click.echo(f"{namespace}: {len(missing):,} to embed")
        click.echo(f"{done:,} of {entries_total:,} entries embedded; {missing_total:,} to embed (dry run)")
        return
    with click.progressbar(length=missing_total, label="embedding", file=sys.stderr) as bar:
        for namespace, missing in plan:
            store.embed_missing(namespace, missing, batch=batch, on_batch=bar.update)
    click.echo(f"embedded {missing_total:,} entries; {entries_total:,} of {entries_total:,} entries embedded")


def _recallable(namespace: str) -> bool:
    """Return whether recall reads ``namespace`` (not a name another program wrote that today's
    rule refuses)."""
    try:
        validate_namespace(namespace)
    except InvalidNamespace:
        return False
    return True


COMMANDS = [embed]
