"""Dependency audit that works without the internet: the pinned versions of requirements*.txt
against what is installed and what the package index offers, reported and never failing.

No vulnerability database can be had here (the advisory services are out of reach; only the
package index answers, through pip), so this is the fallback: ``pip list --outdated`` run only
over the pinned packages, in a few pip processes at once so it stays under half a minute, with
a one-line notice instead of a report when the index cannot be reached in time.

Run ``python tools/audit_dependencies.py`` (``make audit``). It always exits 0: a newer version
is something to read about and plan, not a reason to stop a build.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENT_FILES = ("requirements.txt", "requirements-test.txt", "requirements-models.txt")
# The whole audit's budget; each pip process gets it, and they run side by side.
TIME_LIMIT_SECONDS = 25.0
PROCESSES = 4  # besides the one that tells whether the index answered
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def canonical_name(name: str) -> str:
    """Return a distribution name as PEP 503 compares them (``Flask_SQLAlchemy`` -> ``flask-sqlalchemy``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(lines: Iterable[str]) -> dict[str, str]:
    """Return ``{canonical name: version}`` for every ``name==version`` line; comments, ``-r``
    includes and unpinned lines are left out."""
    pins = {}
    for line in lines:
        found = _PIN.match(line)
        if found:
            pins[canonical_name(found.group(1))] = found.group(2)
    return pins


def pinned_versions(root: Path = ROOT) -> dict[str, str]:
    """Return the pins of every requirements file of the project at ``root``."""
    pins: dict[str, str] = {}
    for name in REQUIREMENT_FILES:
        path = root / name
        if path.is_file():
            pins.update(read_pins(path.read_text(encoding="utf-8").splitlines()))
    return pins


def installed_versions() -> dict[str, str]:
    """Return ``{canonical name: version}`` of this interpreter's installed distributions."""
    return {canonical_name(dist.metadata["Name"]): dist.version for dist in distributions()}


@dataclass(frozen=True)
class Finding:
    """One pinned package whose pin, installed copy or index differ."""

    name: str
    pinned: str
    installed: str | None
    latest: str | None

    def line(self) -> str:
        """Return the report line of this package."""
        words = [f"{self.name}=={self.pinned}"]
        if self.installed is None:
            words.append("not installed")
        elif self.installed != self.pinned:
            words.append(f"installed {self.installed}")
        if self.latest is not None:
            words.append(f"newer on the index: {self.latest}")
        return "  " + ", ".join(words)


def findings(
    pins: Mapping[str, str], installed: Mapping[str, str], latest: Mapping[str, str]
) -> list[Finding]:
    """Return, sorted by name, every pinned package that is missing, installed at another
    version, or has a newer version on the index (``latest``: name -> newest version)."""
    found = []
    for name, pinned in sorted(pins.items()):
        have = installed.get(name)
        newer = latest.get(name)
        if have != pinned or newer is not None:
            found.append(Finding(name, pinned, have, newer))
    return found


@dataclass
class IndexAnswer:
    """What the index said about a group of packages: the newer versions, and how many project
    pages were fetched from a remote index and how many could not be."""

    latest: dict[str, str]
    fetched: int = 0
    failed: int = 0

    def add(self, other: IndexAnswer) -> None:
        """Fold ``other`` into this answer."""
        self.latest.update(other.latest)
        self.fetched += other.fetched
        self.failed += other.failed


def read_pip_list(output: str) -> IndexAnswer:
    """Read the output of ``pip list -vv --outdated --format=json``: its debug lines (pip says
    an unreachable index only there, and still exits 0 with ``[]``) and the JSON line at the end."""
    answer = IndexAnswer({})
    rows: list[dict[str, str]] = []
    for line in output.splitlines():
        if re.match(r"Fetched page https?://", line):
            answer.fetched += 1
        elif re.match(r"Could not fetch URL https?://", line):
            answer.failed += 1
        elif line.startswith("[") and line.endswith("]"):
            rows = json.loads(line)
    answer.latest = {canonical_name(row["name"]): row["latest_version"] for row in rows}
    return answer


def _outdated_among(
    names: Sequence[str], everything: Iterable[str], timeout: float, verbose: bool
) -> IndexAnswer:
    # pip list looks every installed package up on the index; --exclude keeps it to ``names``.
    excluded = sorted(set(everything) - set(names))
    command = [sys.executable, "-m", "pip", "list", *(["-vv"] if verbose else []), "--outdated"]
    command += ["--format=json", "--disable-pip-version-check", "--timeout", "10", "--retries", "0"]
    for name in excluded:
        command += ["--exclude", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["pip list failed"]
        raise OSError(last[0])
    return read_pip_list(done.stdout)


def ask_index(
    names: Sequence[str], everything: Iterable[str], timeout: float = TIME_LIMIT_SECONDS
) -> IndexAnswer:
    """Return what the index says about ``names``, asked by a few pip processes side by side.
    The first name is asked alone with pip's debug output, which alone tells whether the index
    answered (pip exits 0 with ``[]`` when it did not); the rest are asked quietly, as debug
    output of large project pages costs seconds. Raises ``OSError``, or
    ``subprocess.TimeoutExpired`` when pip does not finish in ``timeout`` seconds."""
    everything = list(everything)
    rest = names[1:]
    groups = [(list(names[:1]), True)]
    groups += [(list(rest[start::PROCESSES]), False) for start in range(PROCESSES) if rest[start::PROCESSES]]
    answer = IndexAnswer({})
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        parts = pool.map(lambda group: _outdated_among(group[0], everything, timeout, group[1]), groups)
        for part in parts:
            answer.add(part)
    return answer


def main() -> int:
    """Print the audit and return 0, whatever it found or could not find."""
    pins = pinned_versions()
    installed = installed_versions()
    # Only what is installed can be compared with the index; the rest is reported as missing.
    present = [name for name in sorted(pins) if name in installed]
    try:
        answer = ask_index(present, installed)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        reason = (
            f"no answer in {TIME_LIMIT_SECONDS:.0f} s" if isinstance(exc, subprocess.TimeoutExpired) else exc
        )
        print(f"dependency audit skipped: the package index is unreachable ({reason})")
        return 0
    if present and answer.fetched == 0:
        print("dependency audit skipped: the package index is unreachable (pip could fetch no project page)")
        return 0
    report = findings(pins, installed, answer.latest)
    print(
        f"dependency audit: {len(pins)} pinned packages, {len(report)} to look at "
        "(no vulnerability database is reachable offline; this compares versions only)"
    )
    for finding in report:
        print(finding.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
