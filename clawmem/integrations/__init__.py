"""Adapters that let agents built with other frameworks keep their memory in clawmem.

One module per framework, each importing its framework only when it is imported itself, so
``import clawmem`` never pulls one in. Each framework comes with an extra:
``pip install 'clawmem[langgraph]'``, ``'clawmem[langchain]'``, ``'clawmem[openai-agents]'``.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Return the imported ``module``, or raise ``ModuleNotFoundError`` in one line naming the
    extra that installs it (``name`` is the module that is missing)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"clawmem's {extra} adapter needs the {module} module, which is not installed: "
            f"pip install 'clawmem[{extra}]'",
            name=exc.name,
        ) from exc
