"""Adapters that let agents built with other frameworks keep their memory in clawmem.

One module per framework, each importing its framework only when it is imported itself, so
``import clawmem`` never pulls one in. Each framework comes with an extra:
``pip install 'clawmem[langgraph]'``, ``'clawmem[langchain]'``, ``'clawmem[openai-agents]'``.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Return the imported ``module``, or raise ``ImportError`` in one line naming the extra
    that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"clawmem's {extra} adapter needs {module}, which is not installed: "
            f"pip install 'clawmem[{extra}]'"
        ) from exc
