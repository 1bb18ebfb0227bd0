"""``flask claw``: the core's command group, mounted on the app, plus the dashboard's own
commands ``demo``, ``create-admin`` and ``set-password``."""

from __future__ import annotations

import re
from pathlib import Path

import click
from flask import Flask, current_app
from flask.cli import ScriptInfo, with_appcontext

from clawmem.cli import HELP, ClawGroup
from clawmem.cli.audit import AuditEntry, audited
from clawmem.cli.common import confirm_deletion
from clawmem.clock import FakeClock
from clawmem.memory.registry import open_memory
from clawmem.settings import CLAWMEM_SCHEMA
from clawmem.sites.site import Site
from clawmem.sql.schema import check_shape, create_tables
from clawmem.sql.sizes import present_tables
from clawmem.turn.conversations import ConversationLog
from dashboard import accounts, state
from dashboard.demo import DEMO_ALLOWED_KEY, demo_loaded, load_demo, remove_demo


def _open_site() -> Site:
    # The app that flask (or a test's CLI runner) loaded for this command.
    app = click.get_current_context().ensure_object(ScriptInfo).load_app()
    return state.site_of(app)


claw = ClawGroup("claw", _open_site, help=HELP)


def _tables_exist() -> bool:
    return bool(present_tables(state.engine(), state.settings().table_prefix))


@claw.command("demo")
@with_appcontext
@click.option("--reset", is_flag=True, help="Delete earlier demo data (and only that) before loading.")
@click.option("--yes", "-y", is_flag=True, help="With --reset: do not ask for confirmation.")
@click.option("--if-new", is_flag=True, help="Load only when the tables do not exist yet, as make run does.")
@audited("demo")
def demo(entry: AuditEntry, reset: bool, yes: bool, if_new: bool) -> None:
    """Load realistic demo data: namespaces with live, expiring and expired keys, and conversations
    of two identifiable subjects (cust-1001, cust-2002) with tool calls.

    With --reset, the keys the demo writes and the conversations it marked are deleted first
    (after confirmation, and with a line in the audit log); other data is never touched.
    """
    settings = state.settings()
    if if_new and _tables_exist():
        click.echo("The database already has clawmem tables; demo data not loaded.")
        return
    if not settings.store_messages:
        raise click.ClickException(
            "CLAW_STORE_MESSAGES is false, so the privacy switch would drop every demo write; "
            "turn it on to load demo data."
        )
    shape = check_shape(state.engine(), settings.table_prefix, settings.schema)
    if shape != CLAWMEM_SCHEMA:
        raise click.ClickException(
            f"the tables are of the {shape} shape: the demo writes clawmem's own conversations (recall "
            "records and checkpoints, which phpClaw cannot read); load it on a clawmem database."
        )
    create_tables(state.engine(), settings.table_prefix)
    now = state.clock()()
    # The stores read this clock; the loader moves it so that entries expire and times spread.
    clock = FakeClock(now)
    memory = open_memory(settings, clock)
    conversations = ConversationLog.from_settings(settings, clock)
    if not reset and demo_loaded(conversations):
        # A second load would add thirty more conversations beside the first thirty.
        click.echo("Demo data is already loaded; nothing added (to load it afresh: flask claw demo --reset).")
        return
    if reset:
        confirm_deletion("Delete the demo's keys and every conversation marked as demo data?", yes)
        removed = remove_demo(memory, conversations, settings.subject_namespace)
        entry.counts = {
            "conversations": removed.conversations,
            "messages": removed.messages,
            "keys": removed.entries,
        }
        click.echo(
            f"removed demo data: {removed.conversations} conversations with "
            f"{removed.messages} messages, {removed.entries} demo keys"
        )
    report = load_demo(memory, conversations, clock, now, settings.subject_namespace)
    click.echo(
        f"loaded demo data: {report.entries} keys in {len(report.namespaces)} namespaces "
        f"({', '.join(sorted(report.namespaces))}), {report.conversations} conversations with "
        f"{report.messages} messages"
    )
    _allow_demo_contact()


def _allow_demo_contact() -> None:
    # The demo shop's escalation_contact is its own business address, which every support turn
    # may be given; a customer's address in any other key must still be caught. The instance
    # config file gets the allowance only when no source sets CLAW_PII_ALLOW_KEYS, and it is said.
    settings = state.settings()
    source = state.setting_sources()["PII_ALLOW_KEYS"]
    if source != "default":
        if DEMO_ALLOWED_KEY not in settings.allowed_pii_keys:
            click.echo(
                f"CLAW_PII_ALLOW_KEYS is set ({source}) without {DEMO_ALLOWED_KEY}, so the PII guard "
                f"({settings.pii_guard}) acts on the demo's escalation address too"
            )
        return
    path = Path(current_app.instance_path) / "config.py"
    if path.exists() and re.search(r"^PII_ALLOW_KEYS\s*=", path.read_text(encoding="utf-8"), re.M):
        return  # written by an earlier demo run of this process
    with path.open("a", encoding="utf-8") as config:
        config.write(
            f"\n# Written by flask claw demo: the demo shop's own escalation address is not a "
            f"customer's.\nPII_ALLOW_KEYS = {DEMO_ALLOWED_KEY!r}\n"
        )
    click.echo(
        f"wrote PII_ALLOW_KEYS = {DEMO_ALLOWED_KEY!r} to {path}: the PII guard lets the demo "
        "shop's own escalation address through and still catches customers' addresses in "
        "every other key (takes effect when the dashboard next starts)"
    )


def _new_password(generate: bool) -> str:
    if generate:
        return accounts.generate_password()
    return click.prompt("Password", hide_input=True, confirmation_prompt=True)


@claw.command("create-admin")
@with_appcontext
@click.argument("username", default="admin")
@click.option("--generate", is_flag=True, help="Generate a random password and print it once.")
@click.option("--if-none", is_flag=True, help="Do nothing when an admin account already exists.")
def create_admin(username: str, generate: bool, if_none: bool) -> None:
    """Create a dashboard admin (default name: admin). Only the Argon2id hash of the password is kept."""
    if if_none and accounts.admin_count() > 0:
        click.echo(
            "An admin account exists; sign in with it (to reset a password: flask claw set-password NAME)."
        )
        return
    try:
        accounts.check_new_username(username)  # before asking for a password it would not use
        password = _new_password(generate)
        accounts.create_admin(username, password, state.clock()())
    except accounts.AccountError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"created dashboard admin {username!r}")
    if generate:
        click.echo(f"password: {password}")
        click.echo("This password is shown only now; store it somewhere safe.")


@claw.command("set-password")
@with_appcontext
@click.argument("username")
@click.option("--generate", is_flag=True, help="Generate a random password and print it once.")
def set_password(username: str, generate: bool) -> None:
    """Change a dashboard admin's password and sign that admin out everywhere."""
    password = _new_password(generate)
    try:
        accounts.set_password(username, password)
    except accounts.AccountError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"password changed for {username!r}; every session of that admin has ended")
    if generate:
        click.echo(f"password: {password}")
        click.echo("This password is shown only now; store it somewhere safe.")


def init_app(app: Flask) -> None:
    """Mount the ``claw`` command group on the app's ``flask`` command."""
    app.cli.add_command(claw)
