"""Every path the README and docs/ARCHITECTURE.md name still leads somewhere: each dotted
``clawmem.…`` name resolves, each ``from clawmem… import …`` of their examples imports, and each
``clawmem/…`` file or folder exists. Moving a module breaks this test, not a reader's copy."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "ARCHITECTURE.md"]
TEXT = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)
NOT_PATHS = {"clawmem.db"}  # SQLite's default file name, not a module

DOTTED = sorted({name.rstrip(".") for name in re.findall(r"\bclawmem(?:\.[A-Za-z_]\w*)+", TEXT)} - NOT_PATHS)
IMPORT_LINE = r"(?m)^\s*(from clawmem[\w.]* import [\w, ]+|import clawmem[\w.]*)\s*$"
IMPORTS = sorted(set(re.findall(IMPORT_LINE, TEXT)))
FILE = r"(?<![\w/])(?:clawmem/[\w/]+(?:\.py)?|dashboard/[\w/]+\.py)"
FILES = sorted(set(re.findall(FILE, TEXT)))


def resolve(dotted: str) -> Any:
    """Return what ``dotted`` names: the longest importable module, then attributes from it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_the_docs_name_paths() -> None:
    assert len(DOTTED) > 20 and len(IMPORTS) > 5 and len(FILES) > 20


@pytest.mark.parametrize("dotted", DOTTED)
def test_each_dotted_name_resolves(dotted: str) -> None:
    resolve(dotted)


@pytest.mark.parametrize("statement", IMPORTS)
def test_each_import_of_the_examples_runs(statement: str) -> None:
    exec(statement, {})  # noqa: S102 - the docs' own import lines


@pytest.mark.parametrize("path", FILES)
def test_each_named_file_exists(path: str) -> None:
    assert (ROOT / path).exists(), f"{path} is named in the docs and does not exist"
