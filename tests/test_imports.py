"""Imports in the core run downward: no module of ``clawmem/`` reaches itself through its imports,
and no package (``memory/``, ``sql/``, ``recall/``, …) reaches itself through another.

The graph is read from the source with ``ast``, so imports under ``TYPE_CHECKING`` and imports
inside functions count too: a cycle hidden from the interpreter is still a cycle for a reader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "clawmem"
DASHBOARD = CORE.parent / "dashboard"


def module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, package: str, known: set[str]) -> set[str]:
    """Return the modules of ``known`` that ``source``, a module of ``package``, imports
    (``from pkg import mod`` names the module too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def import_graph(root: Path = CORE) -> dict[str, set[str]]:
    """Return, for each module under ``root`` (a package of the project), the modules of that
    package it imports."""
    paths = sorted(root.rglob("*.py"))
    known = {module_name(path) for path in paths}
    graph = {}
    for path in paths:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imported_modules(path.read_text(encoding="utf-8"), package, known) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]], roots: set[str]) -> list[str] | None:
    """Return one cycle as a path of module names, or ``None``. ``roots`` (package __init__
    modules) are skipped as nodes: importing a package to reach its submodule is not a cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target in roots:
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and node not in roots:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_core_has_no_import_cycle() -> None:
    graph = import_graph()
    roots = {name for name in graph if (CORE.parent / name.replace(".", "/") / "__init__.py").exists()}
    cycle = find_cycle(graph, roots)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_dashboard_has_no_import_cycle() -> None:
    graph = import_graph(DASHBOARD)
    roots = {name for name in graph if (CORE.parent / name.replace(".", "/") / "__init__.py").exists()}
    cycle = find_cycle(graph, roots)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def package_of(module: str) -> str:
    """Return the node a module counts as between packages: its package below ``clawmem``
    (``clawmem.memory.sql`` is ``clawmem.memory``), or itself for a top-level module."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package_of(module)
        found = packages.setdefault(source, set())
        found.update(package_of(target) for target in targets if target != "clawmem")
        found.discard(source)
    return packages


def test_no_package_reaches_itself_through_another() -> None:
    cycle = find_cycle(package_graph(import_graph()), {"clawmem"})
    assert cycle is None, "import loop between packages: " + " -> ".join(cycle or [])


# The house from the ground up (docs/ARCHITECTURE.md): a package may import the ground floor and
# the packages of the floors below its own, never one beside or above it.
HOUSE = (
    ("crypto",),
    ("sql",),
    ("recall", "providers"),
    ("encryption",),
    ("memory",),
    ("turn",),
    ("sites",),
    ("privacy",),
    ("jobs", "integrations"),
    ("cli",),
)
FLOOR = {f"clawmem.{package}": level for level, floor in enumerate(HOUSE, start=1) for package in floor}
# Past this many lines a module has, in practice, two jobs: split it by job. The largest modules
# of one job (the file driver, the memory table's statements) are near 650.
MAX_MODULE_LINES = 700


def floor_of(node: str) -> int:
    """Return the floor of a package node (0 for a top-level module, the ground floor)."""
    if node in FLOOR:
        return FLOOR[node]
    if (CORE.parent / node.replace(".", "/")).is_dir():
        raise AssertionError(f"{node} is not placed in HOUSE (tests/test_imports.py): give it a floor")
    return 0


def upward_imports(packages: dict[str, set[str]]) -> list[str]:
    """Return each import that does not run downward, as ``"source -> target"``."""
    found = []
    for source, targets in sorted(packages.items()):
        if source == "clawmem":
            continue
        for target in sorted(targets):
            if (
                target != "clawmem"
                and floor_of(target) >= floor_of(source)
                and not floor_of(target) == floor_of(source) == 0
            ):
                found.append(f"{source} -> {target}")
    return found


def test_every_import_runs_down_the_house() -> None:
    assert upward_imports(package_graph(import_graph())) == []


def test_a_ground_floor_module_importing_a_package_is_found() -> None:
    graph = {"clawmem.codecs": {"clawmem.crypto.cipher"}, "clawmem.sql.kv": {"clawmem.codecs"}}
    assert upward_imports(package_graph(graph)) == ["clawmem.codecs -> clawmem.crypto"]


def test_an_import_beside_or_above_is_found() -> None:
    graph = {"clawmem.recall.fusion": {"clawmem.providers.base", "clawmem.memory.base", "clawmem.rules"}}
    assert upward_imports(package_graph(graph)) == [
        "clawmem.recall -> clawmem.memory",
        "clawmem.recall -> clawmem.providers",
    ]


def test_the_top_floor_holds_only_packages_and_the_ground_floor() -> None:
    ground = sorted(path.stem for path in CORE.glob("*.py") if path.stem != "__init__")
    assert ground == [
        "clock", "codecs", "errors", "events", "ids", "loop", "paging", "php", "prompt", "records",
        "rules", "settings", "text",
    ]  # fmt: skip
    packages = sorted(path.name for path in CORE.iterdir() if (path / "__init__.py").exists())
    assert packages == sorted(package for floor in HOUSE for package in floor)


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda path: str(path.relative_to(CORE)))
def test_every_package_and_module_says_what_it_holds(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert docstring, f"{path.relative_to(CORE.parent)} opens with no docstring"


def test_no_module_is_past_the_size_of_one_job() -> None:
    long = {
        str(path.relative_to(CORE.parent)): lines
        for path in sorted(CORE.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by job (more than {MAX_MODULE_LINES} lines): {long}"


def test_a_loop_between_packages_is_found() -> None:
    graph = {"clawmem.memory.base": {"clawmem.sql.kv"}, "clawmem.sql.kv": {"clawmem.memory.rules"}}
    assert find_cycle(package_graph(graph), set()) == ["clawmem.memory", "clawmem.sql", "clawmem.memory"]


def test_the_cycle_finder_sees_a_type_only_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(graph, set()) == ["a", "b", "c", "a"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clawmem.words import rank\n",
            {"clawmem.words"},
        ),
        ("def later():\n    import clawmem.prompt\n", {"clawmem.prompt"}),
        ("from . import words\n", {"clawmem.words"}),
        ("from .memory import rules\n", {"clawmem.memory", "clawmem.memory.rules"}),
    ],
)
def test_every_kind_of_import_is_an_edge(source: str, expected: set[str]) -> None:
    known = {"clawmem.words", "clawmem.prompt", "clawmem.memory", "clawmem.memory.rules"}
    assert imported_modules(source, "clawmem", known) == expected


FRAMEWORKS = ("langgraph", "langchain_core", "langchain_tests", "agents")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=CORE.parent, capture_output=True, text=True, check=False
    )


def test_import_clawmem_imports_no_framework() -> None:
    code = (
        "import sys, clawmem\n"
        "for name in clawmem.__all__: getattr(clawmem, name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("adapter", "blocked", "extra"),
    [
        ("clawmem.integrations.langgraph", "langgraph.store.base", "langgraph"),
        ("clawmem.integrations.langchain", "langchain_core.stores", "langchain"),
    ],
)
def test_an_adapter_without_its_framework_names_the_extra_in_one_line(
    adapter: str, blocked: str, extra: str
) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"  # what Python does for a package that is not installed
        f"try:\n    import {adapter}\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    package = blocked.split(".")[0]
    expected = f"the {extra} integration needs the {package} package, which is not installed: "
    expected += f"pip install 'clawmem[{extra}]'"
    assert result.stdout == expected + "\n"
