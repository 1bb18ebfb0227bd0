"""Adapters to the frameworks agents are built with, one module per framework.

Each module imports its framework only when used, so ``import clawmem`` never needs one; without
it, :func:`require` raises one line naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Return the imported framework ``module``; raise ``ImportError`` naming the ``extra`` that
    installs it when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"clawmem.integrations needs the {extra} extra for {module}: pip install 'clawmem[{extra}]'"
        ) from exc
