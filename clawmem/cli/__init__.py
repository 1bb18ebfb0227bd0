"""The command group of the operations: the only place anything is deleted.

It is mounted twice: as the ``clawmem`` console script (settings from ``CLAW_*`` variables,
instance folder ``CLAW_INSTANCE_PATH`` or ``./instance``) and as ``flask claw`` by the
dashboard, which adds its own commands. Every command acts on one site, the one of
``CLAW_TABLE_PREFIX``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click

from clawmem import __version__
from clawmem.settings import Settings
from clawmem.sites.site import Site

HELP = "Inspect, retain, export and delete clawmem data of one site (CLAW_TABLE_PREFIX)."
_SITE = "clawmem.sites.site"


class ClawGroup(click.Group):
    """A group of claw commands; ``open_site()`` builds the :class:`Site` they act on, once per run."""

    def __init__(self, name: str, open_site: Callable[[], Site], **options: object) -> None:
        super().__init__(name, **options)  # type: ignore[arg-type]
        self.open_site = open_site
        add_commands(self)


def current_site() -> Site:
    """Return the site of the running claw command (built on first use in this run)."""
    context = click.get_current_context()
    site = context.meta.get(_SITE)
    if site is None:
        group = context
        while group is not None and not isinstance(group.command, ClawGroup):
            group = group.parent
        if group is None:
            raise RuntimeError("a claw command runs only inside a ClawGroup")
        site = context.meta[_SITE] = group.command.open_site()
    return site


def add_commands(group: click.Group) -> None:
    """Add every core command to ``group``."""
    from clawmem.cli import data, embed, evaluate, keys, serve, subjects, tables, tokens, worker

    for module in (tables, data, subjects, keys, tokens, worker, serve, evaluate, embed):
        for command in module.COMMANDS:
            group.add_command(command)


def site_from_environment() -> Site:
    """Return the site named by the ``CLAW_*`` environment variables; the instance folder (audit
    log, default SQLite database and file directory) is ``CLAW_INSTANCE_PATH`` or ``./instance``.
    Nothing is created here: a command that writes makes the folder when it first needs it."""
    instance = Path(os.environ.get("CLAW_INSTANCE_PATH") or "instance")
    return Site(Settings.from_env(instance_path=instance))


main = ClawGroup(
    "clawmem",
    site_from_environment,
    help=HELP,
    epilog="Settings come from CLAW_* environment variables (CLAW_DATABASE_URL, CLAW_TABLE_PREFIX, "
    "CLAW_MEMORY_DRIVER, ...). The instance folder, which holds the audit log and the default SQLite "
    "database, is CLAW_INSTANCE_PATH or ./instance.",
)
click.version_option(__version__, "--version", prog_name="clawmem")(main)
