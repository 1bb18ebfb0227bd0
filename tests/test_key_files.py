"""The instance folder's private key files, the audit key and the dashboard's generated secret
key: made once, and a damaged or unusable one refused in one line naming the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from clawmem.cli.audit import AUDIT_KEY_FILE
from clawmem.crypto.keyfile import kept_key
from clawmem.errors import ConfigError, KeyFileError
from dashboard.security import SECRET_KEY_FILE

pytest_plugins = ["tests.dashboard_fixtures"]


def test_a_key_is_made_once_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "new-folder" / "key"
    first = kept_key(path, "a key", "fix it")
    assert kept_key(path, "a key", "fix it") == first == path.read_text()
    assert len(first) == 64 and (path.stat().st_mode & 0o777) == 0o600
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["key"]  # no temporary file left behind


def test_a_folder_that_cannot_be_made_is_one_key_file_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the folder should be")
    with pytest.raises(KeyFileError) as refused:
        kept_key(tmp_path / "taken" / "key", "a key", "fix it")
    assert str(refused.value) == f"File exists: {tmp_path / 'taken'}"
    assert isinstance(refused.value, ConfigError)


def test_a_damaged_audit_key_stops_a_deleting_command_in_one_line(app: Flask) -> None:
    key_file = Path(app.instance_path) / AUDIT_KEY_FILE
    key_file.write_text("short\n")
    result = app.test_cli_runner().invoke(args=["claw", "forget", "nothing-here", "--yes"])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: cannot read the audit key: {key_file} holds an audit key shorter than 32 characters; "
        "restore it from a backup\n"
    )
    hashed = app.test_cli_runner().invoke(args=["claw", "audit-hash", "cust-1001"])
    assert hashed.exit_code == 1 and "holds an audit key shorter than 32 characters" in hashed.output


def test_a_damaged_secret_key_file_stops_the_dashboard_in_one_line(
    make_app: Callable[..., Flask], tmp_path: Path
) -> None:
    key_file = tmp_path / "instance" / SECRET_KEY_FILE
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text("short")
    with pytest.raises(KeyFileError) as refused:
        make_app()
    assert str(refused.value) == (
        f"{key_file} holds a secret key shorter than 32 characters; delete it to regenerate"
    )
