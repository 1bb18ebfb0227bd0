"""Every command the dashboard offers to copy runs as shown, pasted into a plain shell in another
directory: the previews first, then the deleting ones, against this test's scratch database."""

from __future__ import annotations

import html
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from dashboard import accounts, state
from tests.dashboard_helpers import ADMIN, PASSWORD, claw_words, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]

COMMAND = re.compile(r'<code(?: class="command")?>([^<]*\bclaw(?:mem)? [^<]*)</code>')


def _shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A shell without any CLAW_* setting: what the command needs, it carries.
    environment = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    environment.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=environment,
        text=True,
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_every_offered_command_runs_as_shown_from_a_plain_shell(
    make_app: Callable[..., Flask], tmp_path: Path
) -> None:
    app = make_app(STORE_MESSAGES=False, RETENTION_DAYS=1)
    assert app.test_cli_runner().invoke(args=["claw", "demo"]).exit_code != 0  # storage is off
    on = make_app()
    assert on.test_cli_runner().invoke(args=["claw", "demo"]).exit_code == 0
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
        conversation = state.conversations().list(limit=1).items[0].id
    client = app.test_client()
    sign_in(client)
    pages = ["/", "/settings", "/subjects/cust-1001", "/memory/user:cust-2002/entry?key=profile"]
    shown = []
    for page in pages:
        shown += [html.unescape(found) for found in COMMAND.findall(page_text(client.get(page)))]
    fill = {
        "KEY": "profile",
        "NAMESPACE": "user:cust-2002",
        "SUBJECT_ID": "cust-1001",
        "CONVERSATION_ID": conversation,
        "TEXT": "cust-1001",
    }
    commands = list(
        dict.fromkeys(" ".join(fill.get(word, word) for word in command.split(" ")) for command in shown)
    )
    kinds = {claw_words(command)[1][0] for command in commands}
    assert {"prune", "erase", "export", "forget", "sweep", "flush", "audit-hash", "uninstall"} <= kinds, kinds
    # Previews and read-only commands first, then what deletes.
    deleting = [
        c
        for c in commands
        if "--yes" in c.split()
        or (claw_words(c)[1][0] in ("erase", "forget", "flush") and "--dry-run" not in c.split())
    ]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # audit-hash reads the audit key, which only a deleting command makes: it runs last.
    hashing = [c for c in commands if claw_words(c)[1][0] == "audit-hash"]
    reading = [c for c in commands if c not in deleting and c not in hashing]
    for command in reading + deleting + hashing:
        done = _shell(command, elsewhere)
        assert done.returncode == 0, (command, done.stdout[-500:], done.stderr[-1500:])
    assert (elsewhere / "subject.json").is_file(), "the export wrote where it was run"
    with app.app_context():
        assert state.conversations().count(user_id="cust-1001") == 0, "the erase shown erased"
        assert state.driver().entry("user:cust-2002", "profile") is None, "the forget shown forgot"
    assert (Path(app.instance_path) / "audit.log").exists() or any(Path(app.instance_path).iterdir())
