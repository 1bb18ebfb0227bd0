"""Adapters that put clawmem behind other frameworks' protocols, one module per framework.

Each adapter imports its framework lazily, behind an extra of the package: ``import clawmem``
never imports one, and using an adapter whose framework is missing raises one line that names
the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Return the imported ``module``; raise ``ModuleNotFoundError`` in one line naming
    ``pip install 'clawmem[extra]'`` when it (or its top-level package) is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or module.split(".")[0] != exc.name.split(".")[0]:
            raise  # something the framework itself needs is missing: its own message says what
        raise ModuleNotFoundError(
            f"the {extra} integration needs the {module.split('.')[0]} package, which is not installed: "
            f"pip install 'clawmem[{extra}]'",
            name=exc.name,
        ) from None
