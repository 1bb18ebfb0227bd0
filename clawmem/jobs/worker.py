"""The worker: the provider and Claw it builds from settings, its periodic tasks, Huey's consumer.

The provider is ``CLAW_PROVIDER_FACTORY=module:callable`` (called with the settings, returning
a provider), or an OpenAI-compatible endpoint from ``CLAW_PROVIDER_URL`` and
``CLAW_PROVIDER_MODEL``, with ``CLAW_PROVIDER_API_KEY`` read from the environment only, so it is
never a setting that a page or a log could show.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from clawmem.clock import Clock
from clawmem.errors import ConfigError, redact
from clawmem.jobs.schedule import RetentionRunner, RetentionSchedule, run_retention_tick
from clawmem.jobs.turns import REAPER_TASK, TurnQueue
from clawmem.providers.base import Provider
from clawmem.settings import ENV_PREFIX, Settings

API_KEY_VARIABLE = f"{ENV_PREFIX}PROVIDER_API_KEY"
RETENTION_TASK = "clawmem_retention"
SHUTDOWN_SECONDS = 60
log = logging.getLogger("clawmem.worker")


def provider_from_settings(settings: Settings, environ: Mapping[str, str] | None = None) -> Provider:
    """Return the provider a worker runs turns with. Raises :class:`ConfigError` in one line for
    a factory that cannot be imported or called or returns no provider, a URL without a model,
    or no provider configured at all."""
    environ = os.environ if environ is None else environ
    if settings.provider_factory:
        return _from_factory(settings)
    if settings.provider_url:
        if not settings.provider_model:
            raise ConfigError(f"{ENV_PREFIX}PROVIDER_URL is set but {ENV_PREFIX}PROVIDER_MODEL is not")
        from clawmem.providers.openai import OpenAICompatibleProvider

        try:
            return OpenAICompatibleProvider(
                settings.provider_url, settings.provider_model, environ.get(API_KEY_VARIABLE) or None
            )
        except ValueError as exc:
            raise ConfigError(f"{ENV_PREFIX}PROVIDER_URL: {exc}") from None
    raise ConfigError(
        f"a worker needs a provider: set {ENV_PREFIX}PROVIDER_URL and {ENV_PREFIX}PROVIDER_MODEL (and "
        f"{API_KEY_VARIABLE} in the environment), or {ENV_PREFIX}PROVIDER_FACTORY=module:callable"
    )


def _from_factory(settings: Settings) -> Provider:
    spec = settings.provider_factory.strip()
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(f"{ENV_PREFIX}PROVIDER_FACTORY must be module:callable, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{ENV_PREFIX}PROVIDER_FACTORY {spec!r}: cannot import {module_name!r} ({exc})"
        ) from None
    factory = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(f"{ENV_PREFIX}PROVIDER_FACTORY {spec!r}: {module_name} has no {attribute!r}")
    if not callable(factory):
        raise ConfigError(f"{ENV_PREFIX}PROVIDER_FACTORY {spec!r} is not callable")
    try:
        provider = factory(settings)
    except Exception as exc:  # the operator's own factory: whatever it raises is named, not hidden
        raise ConfigError(
            f"{ENV_PREFIX}PROVIDER_FACTORY {spec!r} failed: {type(exc).__name__}: {redact(str(exc))}"
        ) from None
    if not isinstance(provider, Provider):
        raise ConfigError(
            f"{ENV_PREFIX}PROVIDER_FACTORY {spec!r} returned {type(provider).__name__}, not a provider "
            "(an object with name, model and complete(messages))"
        )
    return provider


def claw_factory(settings: Settings, clock: Clock = time.time) -> Callable[[], Any]:
    """Return a builder of the worker's Claw on the settings' site; each call builds a new one
    (one per worker thread), with a provider from :func:`provider_from_settings`."""
    from clawmem.turn.pipeline import Claw

    def build() -> Any:
        return Claw.from_settings(settings, provider_from_settings(settings), clock=clock)

    return build


def add_periodic_tasks(
    queue: TurnQueue, schedule: RetentionSchedule | None, runner: RetentionRunner | None
) -> None:
    """Register the worker's periodic tasks on the queue's Huey: the reaper, and with a schedule
    the retention check. Huey wakes both every minute on every worker; the cron schedule and the
    site-wide locks decide what runs."""
    from huey import crontab

    def reaper() -> None:
        counts = queue.reap()
        if any(counts.values()):
            log.warning(
                "reaper: %d job(s) requeued, %d failed (their workers stopped)",
                counts["requeued"],
                counts["failed"],
            )

    queue.huey.periodic_task(crontab(), name=REAPER_TASK)(reaper)
    if schedule is None or runner is None:
        return

    def retention() -> None:
        outcome = run_retention_tick(queue, schedule, runner, queue.clock)
        if outcome["ran"]:
            log.info("retention: %s, deleted %s", outcome.get("outcome"), outcome.get("counts"))

    queue.huey.periodic_task(crontab(), name=RETENTION_TASK)(retention)


def run_consumer(queue: TurnQueue, workers: int = 1) -> None:
    """Run Huey's consumer on the queue with ``workers`` threads until it is stopped: SIGTERM lets
    running turns finish (for up to a minute), SIGINT stops at once (the reaper requeues what
    was running). Polls a SQLite queue 0.25 ms after its last task, then each time 10 % later, at
    most every 0.1 s when idle (a Redis queue is waited on, not polled)."""
    consumer = queue.huey.create_consumer(
        workers=workers,
        worker_type="thread",
        periodic=True,
        # The next turn often comes a few milliseconds after the last one ended (its caller read
        # the result and sent the next): looking again soon finds it without waiting for a poll.
        initial_delay=0.00025,
        backoff=1.1,
        max_delay=0.1,
        scheduler_interval=1,
        check_worker_health=True,
        graceful_signal="TERM",  # what a service manager sends: let running turns finish
        shutdown_timeout=SHUTDOWN_SECONDS,
    )
    consumer.run()
