"""One site's directory of the file driver, as ``flask claw uninstall --files`` removes it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from clawmem.memory.file import LOCK_SUFFIX, STORE_SUFFIX, namespace_of_stem, site_directory

# FileMemory writes through temporary files named like this; a crash can leave one behind.
_TEMP_PREFIX = ".tmp-"


def _is_store_file(name: str) -> bool:
    stem, suffix = os.path.splitext(name)
    if suffix == STORE_SUFFIX and stem.startswith(_TEMP_PREFIX):
        return True
    return suffix in (STORE_SUFFIX, LOCK_SUFFIX) and namespace_of_stem(stem) is not None


def store_files(file_dir: str | os.PathLike[str], site: str) -> list[Path]:
    """Return the file driver's files of site ``site`` (a table prefix) under ``file_dir``
    (``CLAW_FILE_DIR``), sorted; none if the site has no directory there.

    Only the site's own directory is looked at, never another site's. Raises ``ValueError``
    naming the first entry in it that the file driver did not write, so that a mistyped
    ``CLAW_FILE_DIR`` (``/``, a home directory) is never emptied.
    """
    root = Path(file_dir)
    if root.exists() and not root.is_dir():
        raise ValueError(f"CLAW_FILE_DIR {root} is not a directory; refusing to remove it")
    directory = site_directory(root, site)
    if not directory.exists():
        return []
    if not directory.is_dir() or directory.is_symlink():
        raise ValueError(f"{directory} is not a directory the file driver made; refusing to remove it")
    found = []
    for item in sorted(directory.iterdir()):
        if not item.is_file() or item.is_symlink() or not _is_store_file(item.name):
            raise ValueError(
                f"{directory} holds {item.name!r}, which the file driver did not write; "
                "nothing was removed (move it away, or remove the directory yourself)"
            )
        found.append(item)
    return found


def remove_store_files(file_dir: str | os.PathLike[str], site: str) -> int:
    """Remove site ``site``'s files and directory under ``file_dir``; return how many files went.

    ``file_dir`` itself goes too once no other site's directory (or anything else) is left in
    it. Raises ``ValueError`` (before removing anything) if the site's directory holds
    anything the file driver did not write.
    """
    found = store_files(file_dir, site)
    for path in found:
        path.unlink(missing_ok=True)
    directory = site_directory(file_dir, site)
    if directory.exists():
        directory.rmdir()
    try:
        Path(file_dir).rmdir()
    except OSError as exc:
        # rmdir removes only an empty directory: another site's files keep CLAW_FILE_DIR.
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise
    return len(found)
