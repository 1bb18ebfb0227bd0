"""The README's framework examples run as written in an empty directory, as a newcomer would
run them, and print what their comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_first_run import README, clean_environment

SECTION = "Using clawmem from your framework"


def framework_example(framework: str) -> str:
    """Return the python block under ``### framework`` in the README's framework section."""
    section = README.read_text(encoding="utf-8").split(f"\n## {SECTION}\n", 1)[1].split("\n## ", 1)[0]
    part = section.split(f"\n### {framework}\n", 1)[1].split("\n### ", 1)[0]
    found = re.search(r"^```python\n(.*?)^```", part, re.S | re.M)
    assert found, f"the README's {framework} example has no python block"
    return found.group(1)


@pytest.mark.parametrize(
    ("framework", "printed"),
    [
        ("LangGraph", ["['contact me by e-mail']"]),
        (
            "LangChain",
            ["[b'\\x00\\x01 vector bytes', None]", "['Where is my order?', 'It shipped yesterday.']"],
        ),
    ],
)
@pytest.mark.slow
def test_a_framework_example_runs_in_an_empty_directory(
    tmp_path: Path, framework: str, printed: list[str]
) -> None:
    example = framework_example(framework)
    (tmp_path / "agent.py").write_text(example, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "agent.py"],
        cwd=tmp_path,
        env=clean_environment(),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == printed
