"""The current request's clawmem site, and what views and commands read through it.

Views and commands call the core's stores and operations on the current :class:`~clawmem.sites.site.Site`
and never ask which driver serves them. A command acts on the site of ``CLAW_TABLE_PREFIX``; a page
on the site its request chose among ``CLAW_SITES`` (see :mod:`dashboard.sites`).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from flask import Flask, current_app, g, has_request_context
from sqlalchemy.engine import Engine

from clawmem.clock import Clock
from clawmem.errors import redact
from clawmem.memory.base import BaseMemory
from clawmem.memory.wrappers import PrivacyAwareMemory
from clawmem.paging import Page
from clawmem.settings import Settings
from clawmem.sites.site import Site
from clawmem.sql.engine import held_connections
from clawmem.turn.conversations import ConversationLog

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def _open_site(app: Flask, settings: Settings) -> Site:
    # The clock is read at every call, so a test that replaces the clock moves every store with it.
    return Site(settings, lambda: app.extensions.get("clawmem.clock", time.time)())


def _hold_connections() -> None:
    held = held_connections()
    held.__enter__()
    g.clawmem_held_connections = held


def _release_connections(_error: BaseException | None) -> None:
    held = g.pop("clawmem_held_connections", None)
    if held is not None:
        held.__exit__(None, None, None)


def init_app(app: Flask) -> None:
    """Give each request one database connection per engine for all its reads, checked out at
    the first read and returned when the request ends (see :func:`clawmem.sql.engine.held_connections`)."""
    # First of the before-request functions, so the sign-in gate and site choice read on it too.
    app.before_request_funcs.setdefault(None, []).insert(0, _hold_connections)
    app.teardown_request(_release_connections)


def site_of(app: Flask) -> Site:
    """Return the site of ``CLAW_TABLE_PREFIX``, the one every command acts on, built once."""
    if "clawmem.sites.site" not in app.extensions:
        app.extensions["clawmem.sites.site"] = _open_site(app, app.extensions["clawmem.settings"])
    return app.extensions["clawmem.sites.site"]


def sites_of(app: Flask) -> dict[str, Site]:
    """Return the dashboard's sites by label (``CLAW_SITES``, in its order), built once; their
    stores open on first use. A site on ``CLAW_TABLE_PREFIX`` is the commands' site itself, and
    sites on one database share its engine."""
    if "clawmem.sites" not in app.extensions:
        command_site = site_of(app)
        app.extensions["clawmem.sites"] = {
            label: command_site
            if prefix == command_site.prefix
            else _open_site(app, command_site.settings.replace(table_prefix=prefix))
            for label, prefix in command_site.settings.site_prefixes
        }
    return app.extensions["clawmem.sites"]


def site_label() -> str | None:
    """Return the label of the site the current request chose, or ``None`` outside a request
    (a command) and before the choice is made."""
    return g.get("clawmem_site") if has_request_context() else None


def site() -> Site:
    """Return the current site: the one the request chose, else the commands' site."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    label = site_label()
    return sites_of(app)[label] if label is not None else site_of(app)


def settings() -> Settings:
    """Return the effective clawmem settings of the current site."""
    return site().settings


def setting_sources() -> dict[str, str]:
    """Return where each setting came from: default, environment, instance config file, test
    config; a table prefix chosen from ``CLAW_SITES`` says so."""
    sources = current_app.extensions["clawmem.sources"]
    if site_label() is not None and settings().sites:
        return {**sources, "TABLE_PREFIX": f"CLAW_SITES ({site_label()})"}
    return sources


# Settings only the dashboard reads: a command needs none of them.
DASHBOARD_ONLY = {"SITES", "DISPLAY_TZ"}


# Named like a secret but only a path: a command needs it to read the encrypted rows.
NOT_SECRET = {"ENCRYPTION_KEY_FILE"}


def _secret(name: str, value: str) -> bool:
    # Never printed on a page: the operator's shell must hold these already.
    if name in NOT_SECRET:
        return redact(value) != value
    return any(word in name for word in ("KEY", "PASSWORD", "SECRET", "TOKEN")) or redact(value) != value


def _config_word(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def command_program() -> tuple[str, ...]:
    """Return how this installation runs a claw command from a plain shell: ``clawmem`` when the
    console script of this very environment is on ``PATH``, else this environment's own
    ``flask`` on the checkout's ``wsgi.py`` (absolute paths, so it runs from any directory)."""
    bin_dir = Path(sys.executable).parent
    found = shutil.which("clawmem")
    if found is not None and Path(found).resolve().parent == bin_dir.resolve():
        return ("clawmem",)
    return (str(bin_dir / "flask"), "--app", str(ROOT / "wsgi.py"), "claw")


def command_environment(program: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Return the ``CLAW_*`` variables a claw command needs to act on the site the page shows:
    the instance folder when it is not the checkout's own, every setting that came from the
    environment or the app's own config (and, for the ``clawmem`` script, which reads no
    instance config file, from that file too), and the page's table prefix. A setting holding
    a secret is left out: the shell must hold it already."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    program = program if program is not None else command_program()
    sources = app.extensions["clawmem.sources"]
    passed = {"environment", "test config"} | ({"instance config file"} if program == ("clawmem",) else set())
    words = []
    if program == ("clawmem",) or Path(app.instance_path).resolve() != (ROOT / "instance").resolve():
        words.append(f"CLAW_INSTANCE_PATH={Path(app.instance_path).resolve()}")
    for name, source in sources.items():
        if source not in passed or name in DASHBOARD_ONLY or name == "TABLE_PREFIX":
            continue
        value = _config_word(app.config.get(name, ""))
        if not _secret(name, value):
            words.append(f"CLAW_{name}={value}")
    prefix = site().prefix
    if prefix != site_of(app).prefix or sources.get("TABLE_PREFIX") in passed:
        words.append(f"CLAW_TABLE_PREFIX={prefix}")
    return tuple(words)


def key_problem() -> str | None:
    """Return what the start-up check of the encryption keys found wrong on the current site (a
    row the configured keys cannot open, named by table, row and key id), or ``None``."""
    return current_app.extensions.get("clawmem.key_problems", {}).get(site().prefix)


def clock() -> Clock:
    """Return the app's clock (``time.time`` unless a test replaced ``app.extensions["clawmem.clock"]``)."""
    return current_app.extensions.get("clawmem.clock", time.time)


def engine() -> Engine:
    """Return the shared engine of the configured database."""
    return site().engine


def memory() -> PrivacyAwareMemory:
    """Return the site's key/value memory, behind the privacy switch."""
    return site().memory


def driver() -> BaseMemory:
    """Return the storage driver behind the switch: the operator's read API, expired entries included."""
    return site().driver


def conversations() -> ConversationLog:
    """Return the site's conversation log."""
    return site().conversations


COUNTS_MAX_AGE = 60  # seconds the pages show the same whole-table counts (see recent)


def recent(name: str, take: Callable[[], T], keep: Callable[[T], bool] = lambda _: True) -> tuple[T, float]:
    """Return what ``take()`` gave for the current site within the last :data:`COUNTS_MAX_AGE`
    seconds of the app's clock, and when (clock seconds), taking it again when it is older.
    For counts that cost a pass over a whole table: one request a minute pays for them, the
    others in this process show the same numbers and say when they were taken. What ``keep``
    refuses is shown once and never reused."""
    cache: dict[tuple[str, str], Any] = current_app.extensions.setdefault(f"dashboard.{name}", {})
    current, now = site(), clock()()
    key = (current.settings.database_url, current.prefix)
    found = cache.get(key)
    if found is None or not 0 <= now - found[1] < COUNTS_MAX_AGE:
        found = (take(), now)
        if keep(found[0]):
            cache[key] = found
    return found


def every_item(fetch: Callable[[str | None], Page[T]]) -> Iterator[T]:
    """Yield the items of every page ``fetch(cursor)`` returns, from the first (``None``) to the last."""
    cursor = None
    while True:
        page = fetch(cursor)
        yield from page.items
        cursor = page.next_cursor
        if cursor is None:
            return
