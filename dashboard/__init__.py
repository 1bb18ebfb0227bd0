"""The operator dashboard: a read-only Flask app over clawmem's tables, plus the ``flask claw`` CLI."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from flask import Flask

from clawmem.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parent.parent


def _setting_sources(from_file: set[str], from_test: set[str]) -> dict[str, str]:
    # The reverse of the order create_app applies them in: the last one applied wins.
    sources = {}
    for name in Settings.setting_names():
        if name in from_test:
            sources[name] = "test config"
        elif f"{ENV_PREFIX}{name}" in os.environ:
            sources[name] = "environment"
        elif name in from_file:
            sources[name] = "instance config file"
        else:
            sources[name] = "default"
    return sources


def _check_schema(settings: Settings) -> None:
    """Refuse to start on tables of the other shape than ``CLAW_SCHEMA`` (one line, SPEC 4.8), on
    the commands' site and every site of ``CLAW_SITES``. A database that cannot be reached now is
    checked when a page first opens the site."""
    import sqlalchemy as sa

    from clawmem.settings import PHPCLAW_SCHEMA, refuse_phpclaw_encryption
    from clawmem.sql.engine import engine_for
    from clawmem.sql.schema import check_shape

    prefixes = dict.fromkeys([settings.table_prefix, *(prefix for _, prefix in settings.site_prefixes)])
    try:
        for prefix in prefixes:
            shape = check_shape(engine_for(settings.database_url), prefix, settings.schema)
            if shape == PHPCLAW_SCHEMA and settings.encrypts:
                from clawmem.errors import ConfigError

                raise ConfigError(refuse_phpclaw_encryption())
    except sa.exc.SQLAlchemyError as exc:
        log = logging.getLogger(__name__)
        # Said once a page or command reaches the database; a warning here would add a line
        # to every command's one-line error.
        log.info("could not check the tables' shape at start: %s", type(exc).__name__)


def _check_keys(settings: Settings) -> dict[str, str]:
    """Decrypt the newest rows under each key id on every site at start-up (SPEC 13); return the
    error of each site whose rows a configured key cannot open, by table prefix. A malformed key
    setting refuses to start (``ConfigError``); a wrong or missing key is logged and shown on
    the pages, which still render and mark what they cannot read."""
    import sqlalchemy as sa

    from clawmem.crypto import Cipher
    from clawmem.encryption.state import check_keys
    from clawmem.errors import Undecryptable
    from clawmem.sql.engine import engine_for

    cipher = Cipher.from_settings(settings)
    problems: dict[str, str] = {}
    prefixes = dict.fromkeys([settings.table_prefix, *(prefix for _, prefix in settings.site_prefixes)])
    for prefix in prefixes:
        try:
            check_keys(engine_for(settings.database_url), prefix, cipher)
        except Undecryptable as exc:
            logging.getLogger(__name__).error("encryption keys do not open this site's rows: %s", exc)
            problems[prefix] = str(exc)
        except sa.exc.SQLAlchemyError:
            continue  # said once a page reaches the database
    return problems


def create_app(test_config: dict[str, Any] | None = None, instance_path: str | None = None) -> Flask:
    """Build the dashboard app, its instance folder defaulting to ``CLAW_INSTANCE_PATH`` (as for
    the ``clawmem`` script), else ``<repository>/instance``.

    Configuration comes from ``<instance>/config.py``, then ``CLAW_*`` environment variables,
    then ``test_config``. Raises :class:`clawmem.ConfigError` for a malformed setting, or
    when the site's tables have the other shape than ``CLAW_SCHEMA``.
    """
    instance_path = instance_path or os.environ.get(f"{ENV_PREFIX}INSTANCE_PATH") or None
    app = Flask(
        __name__,
        instance_path=instance_path,
        instance_relative_config=True,
        template_folder=str(ROOT / "templates"),
        static_folder=None,
    )
    before = set(app.config)
    app.config.from_pyfile("config.py", silent=True)
    from_file = set(app.config) - before
    app.config.from_prefixed_env(ENV_PREFIX.rstrip("_"))
    if test_config:
        app.config.from_mapping(test_config)
    os.makedirs(app.instance_path, mode=0o700, exist_ok=True)  # conversations, logins, the audit log

    settings = Settings.from_mapping(app.config, app.instance_path)
    _check_schema(settings)
    app.extensions["clawmem.key_problems"] = _check_keys(settings)
    app.extensions["clawmem.settings"] = settings
    app.extensions["clawmem.sources"] = _setting_sources(from_file, set(test_config or {}))

    # Importing accounts registers the account models whose tables extensions.init_app makes.
    from dashboard import accounts, auth, commands, extensions, security, sites, state, views  # noqa: F401

    # Any other method gets 405 instead of an automatic OPTIONS answer: GET, HEAD and the two
    # sign-in POSTs are all this app accepts. The static route is added here, after that
    # switch, so it refuses OPTIONS too.
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.static_folder = str(ROOT / "static")
    app.add_url_rule(
        f"{app.static_url_path}/<path:filename>", endpoint="static", view_func=app.send_static_file
    )
    state.init_app(app)
    security.init_app(app)
    extensions.init_app(app)
    auth.init_app(app)
    sites.init_app(app)  # after the sign-in gate: a stranger learns no site names
    commands.init_app(app)
    views.init_app(app)
    return app
