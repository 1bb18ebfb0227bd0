"""Fetch htmx from the npm registry into ``static/vendor/``: a pinned version, checksum-verified.

Run as ``python -m dashboard.vendor`` (``make run`` does). Without npm, or when the fetch or the
checksum fails, it prints a warning and exits 0: every page also works without JavaScript.
``--strict`` exits 1 instead, for set-ups that need htmx (the browser tests).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HTMX_VERSION = "2.0.11"
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
PACKAGE_MEMBER = "package/dist/htmx.min.js"
DESTINATION = Path(__file__).resolve().parent.parent / "static" / "vendor" / "htmx.min.js"


class FetchError(RuntimeError):
    """htmx could not be fetched or did not match the pinned checksum; the message says which."""


def sha256_of(data: bytes) -> str:
    """Return the hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def is_current(path: Path | None = None) -> bool:
    """Return whether ``path`` (default: ``static/vendor/htmx.min.js``) holds the pinned htmx build."""
    path = path or DESTINATION
    return path.is_file() and sha256_of(path.read_bytes()) == HTMX_SHA256


def _pack(npm: str, directory: str) -> Path:
    try:
        completed = subprocess.run(
            [npm, "pack", f"htmx.org@{HTMX_VERSION}", "--silent"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"npm pack htmx.org@{HTMX_VERSION} did not run: {exc}") from None
    if completed.returncode != 0:
        detail = (completed.stderr.strip().splitlines() or ["no error output"])[-1]
        raise FetchError(f"npm pack htmx.org@{HTMX_VERSION} failed: {detail}")
    tarballs = sorted(Path(directory).glob("*.tgz"))
    if not tarballs:
        raise FetchError(f"npm pack htmx.org@{HTMX_VERSION} produced no tarball")
    return tarballs[0]


def fetch_htmx(destination: Path | None = None, npm: str = "npm") -> Path:
    """Put the pinned htmx at ``destination`` (default: ``static/vendor/htmx.min.js``; a no-op
    when it is already there) and return it.

    Raises :class:`FetchError` when npm is missing, the fetch fails or the checksum differs;
    nothing is written then.
    """
    destination = destination or DESTINATION
    if is_current(destination):
        return destination
    executable = shutil.which(npm)
    if executable is None:
        raise FetchError("npm is not installed, so htmx cannot be fetched from the npm registry")
    with tempfile.TemporaryDirectory() as directory:
        tarball = _pack(executable, directory)
        try:
            with tarfile.open(tarball) as archive:
                member = archive.extractfile(PACKAGE_MEMBER)
                if member is None:
                    raise FetchError(f"{PACKAGE_MEMBER} in the htmx package is not a file")
                data = member.read()
        except (tarfile.TarError, KeyError) as exc:
            raise FetchError(f"the htmx package has no readable {PACKAGE_MEMBER}: {exc}") from None
    digest = sha256_of(data)
    if digest != HTMX_SHA256:
        raise FetchError(
            f"htmx.org@{HTMX_VERSION} has SHA-256 {digest}, expected {HTMX_SHA256}; not installed"
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    temporary = destination.with_suffix(".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, destination)
    return destination


def main(argv: list[str] | None = None) -> int:
    """Fetch htmx; return 0, or 1 on failure when ``--strict`` is given."""
    strict = "--strict" in (sys.argv[1:] if argv is None else argv)
    try:
        path = fetch_htmx()
    except FetchError as exc:
        print(
            f"warning: {exc}. The dashboard works without JavaScript; pages will not update live.",
            file=sys.stderr,
        )
        return 1 if strict else 0
    print(f"htmx {HTMX_VERSION} ready at {path} (sha256 verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
