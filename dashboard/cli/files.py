"""The file driver's directory as ``flask claw uninstall --files`` removes it."""

from __future__ import annotations

import os
from pathlib import Path

from clawmem.memory.file import LOCK_SUFFIX, STORE_SUFFIX, namespace_of_stem

# FileMemory writes through temporary files named like this; a crash can leave one behind.
_TEMP_PREFIX = ".tmp-"


def _is_store_file(name: str) -> bool:
    stem, suffix = os.path.splitext(name)
    if suffix == STORE_SUFFIX and stem.startswith(_TEMP_PREFIX):
        return True
    return suffix in (STORE_SUFFIX, LOCK_SUFFIX) and namespace_of_stem(stem) is not None


def store_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Return the file driver's files in ``directory`` (none if it does not exist), sorted.

    Raises ``ValueError`` naming the first entry the file driver did not write, so that a
    mistyped ``CLAW_FILE_DIR`` (``/``, a home directory) is never emptied.
    """
    root = Path(directory)
    if not root.exists():
        return []
    if not root.is_dir():
        raise ValueError(f"CLAW_FILE_DIR {root} is not a directory; refusing to remove it")
    found = []
    for item in sorted(root.iterdir()):
        if not item.is_file() or item.is_symlink() or not _is_store_file(item.name):
            raise ValueError(
                f"{root} holds {item.name!r}, which the file driver did not write; "
                "nothing was removed (move it away, or remove the directory yourself)"
            )
        found.append(item)
    return found


def remove_store_files(directory: str | os.PathLike[str]) -> int:
    """Remove the file driver's files and then ``directory``; return how many files went.

    Raises ``ValueError`` (before removing anything) if the directory holds anything else.
    """
    found = store_files(directory)
    for path in found:
        path.unlink(missing_ok=True)
    root = Path(directory)
    if root.exists():
        root.rmdir()
    return len(found)
