"""gunicorn settings that build recall's word indexes once per host, before the workers fork:

    gunicorn -c python:dashboard.preload wsgi:app

The app is loaded in gunicorn's master (``preload_app``), which brings the index of every
namespace of every site up to date, then freezes the objects it holds so that the garbage
collector never writes to their pages. Each worker is forked with those indexes and their
cursors: it shares their memory with every other worker (copy-on-write: the arrays are only ever
replaced, never written where a query reads them) and catches up from the cursors on its first
turn, so it recalls exactly what its parent would. A worker gunicorn starts again later
(``max_requests``, a crash) catches up from the same boot-time cursors.

Nothing is written to disk: the indexes live in memory only, so encryption at rest has nothing
more to cover, and an erasure reaches every worker through the change feed it follows.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from clawmem.recall.feeds import warm

preload_app = True
log = logging.getLogger("gunicorn.error")


def when_ready(server: Any) -> None:
    """Build the indexes in the master, once the app is loaded and before any worker forks."""
    from dashboard.state import sites_of

    app = server.app.wsgi()
    started = time.perf_counter()
    held = sum(warm(site.memory, stemming=site.settings.recall_stemming) for site in sites_of(app).values())
    gc.freeze()  # what the master holds now is shared: keep the collector off its pages
    log.info("recall indexes built before forking: %d entries in %.1f s", held, time.perf_counter() - started)
