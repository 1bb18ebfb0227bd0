"""``eval FILE``: recall quality per scoring on a labelled JSONL file (:mod:`clawmem.recall.eval`)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import click

from clawmem.cli.audit import one_line_errors
from clawmem.errors import EmbedderUnavailable, EvalFileError
from clawmem.memory.array import ArrayMemory
from clawmem.memory.vector_writes import SEMANTIC_SCORINGS
from clawmem.recall.eval import EvalEntry, embed_entries, evaluate, parse, table
from clawmem.recall.phpclaw import ranker_for
from clawmem.records import MemoryRow
from clawmem.rules import decode_value
from clawmem.settings import RECALL_SCORINGS, RECALL_STEMMINGS


class EvalMemory(ArrayMemory):
    """The in-process memory of an eval file's entries, keeping each one's metadata (as SQL
    does), so that a scoring reads an entry's time (metadata ``at``) as it would on a site."""

    keeps_metadata = True

    def __init__(self) -> None:
        super().__init__()
        self._metadata: dict[tuple[str, str], str | None] = {}

    def _set(  # type: ignore[override]
        self, key: str, encoded: str, namespace: str, expires_at: int | None, now: int, described: str | None
    ) -> None:
        super()._set(key, encoded, namespace, expires_at, now)
        with self._lock:
            self._metadata[namespace, key] = described

    def _described(self, rows: list[MemoryRow]) -> list[MemoryRow]:
        with self._lock:
            held = [self._metadata.get((row.namespace, row.key)) for row in rows]
        return [
            row if text is None else dataclasses.replace(row, metadata=decode_value(text))
            for row, text in zip(rows, held, strict=True)
        ]

    def _records(self, namespace: str) -> list[MemoryRow]:
        return self._described(super()._records(namespace))

    def _fetch(self, namespace: str, keys: set[str]) -> list[MemoryRow]:
        return self._described(super()._fetch(namespace, keys))


def load_entries(entries: list[EvalEntry]) -> EvalMemory:
    """Return an :class:`EvalMemory` holding an eval file's entries (with their metadata)."""
    memory = EvalMemory()
    for entry in entries:
        memory.set(entry.key, entry.value, namespace=entry.namespace, metadata=entry.metadata)
    return memory


@click.command("eval")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--scoring",
    "scorings",
    multiple=True,
    type=click.Choice(RECALL_SCORINGS),
    help="A scoring to measure (repeatable); default: every one.",
)
@click.option(
    "--top-k", type=click.IntRange(1, 100), default=None, help="k of recall@k (default CLAW_RECALL_TOP_K)."
)
@click.option(
    "--stemming",
    type=click.Choice(RECALL_STEMMINGS),
    default=None,
    help="Words as written (off) or Snowball stems (english); default CLAW_RECALL_STEMMING.",
)
@click.option(
    "--by",
    "by",
    type=click.Choice(["category"]),
    default=None,
    help="Also print each scoring's figures per question category (the lines' 'category').",
)
@one_line_errors
def evaluate_command(
    file: Path, scorings: tuple[str, ...], top_k: int | None, stemming: str | None, by: str | None
) -> None:
    """Print recall@1, recall@3, recall@k and MRR per scoring for the questions of FILE.

    FILE holds JSON lines: questions {"message", "keys", "namespace"?, "subject"?, "category"?}
    and, to be self-contained, entries {"namespace", "key", "value", "metadata"?} (then an
    in-process memory holds just them and the site's memory is not read).
    """
    from clawmem.cli import current_site

    try:
        with file.open(encoding="utf-8") as lines:
            entries, questions = parse(lines)
    except (EvalFileError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{file}: {exc}") from None
    site = current_site()
    settings, chosen = site.settings, scorings or RECALL_SCORINGS
    embedder = settings.recall_embedder
    embeds = any(scoring in SEMANTIC_SCORINGS for scoring in chosen)
    if embeds and embedder.strip():
        from clawmem.recall.fusion import default_scorer

        default_scorer(embedder)  # a named embedder that cannot load stops here, before any reading
    if entries:
        memory = load_entries(entries)
        k, default_namespace = top_k or 3, "default"
        if embeds:
            # Without the extra, each semantic scoring says so below, skipped or refused.
            bar = click.progressbar(length=len(entries), label="embedding", file=sys.stderr)
            with bar, contextlib.suppress(EmbedderUnavailable):
                embed_entries(memory, entries, bar.update, embedder)
    else:
        memory = site.memory
        k, default_namespace = top_k or settings.recall_top_k, settings.recall_namespace
    if stemming is None:
        stemming = settings.recall_stemming
    results = []
    for scoring in chosen:
        with click.progressbar(length=len(questions), label=scoring, file=sys.stderr) as bar:
            try:
                results += evaluate(
                    memory,
                    questions,
                    scoring,
                    ranker_for(scoring, embedder, stemming),
                    k,
                    default_namespace,
                    bar.update,
                    by_category=by == "category",
                )
            except EmbedderUnavailable as exc:
                if scorings:
                    raise click.ClickException(str(exc)) from None
                click.echo(f"{scoring}: skipped, {exc}", err=True)
    click.echo(
        f"{len(questions)} questions, {len(entries) or 'the site memory'} entries, stemming {stemming}"
    )
    click.echo(table(results, k))


COMMANDS = [evaluate_command]
