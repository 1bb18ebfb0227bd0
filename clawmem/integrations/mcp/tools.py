"""The MCP server's tools over one site's memory: its scope, and what each tool does.

Recall is the one a turn of :class:`clawmem.Claw` makes, so the server returns exactly what a
turn would inject. Writes go through the privacy switch. Nothing here deletes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clawmem import BaseMemory, Claw, events, subject_namespace
from clawmem.errors import ConfigError, StorageError
from clawmem.integrations.mcp.results import (
    Candidate,
    Found,
    KeyInfo,
    KeysPage,
    Namespaces,
    Recalled,
    Remembered,
    Searched,
    SearchHit,
)
from clawmem.memory.wrappers import set_any
from clawmem.turn.writes import attribution

KEYS_PER_PAGE = 100
MAX_CANDIDATES = 25  # candidates a recall lists in full; the rest are counted


@dataclass(frozen=True)
class Scope:
    """What one server may read and write.

    ``namespace`` is the namespace recall reads (``--namespace`` or ``CLAW_RECALL_NAMESPACE``),
    ``subject`` the namespace of the bound subject (``--subject``). A server with neither flag
    (``limited`` false) reads and writes any namespace; a limited one reads only ``namespace``
    and the subject's, and writes only the subject's when one is bound, else only ``namespace``.
    """

    namespace: str
    subject: str | None = None
    limited: bool = False
    read_only: bool = False

    @property
    def home(self) -> str:
        """Return where ``remember``, ``get`` and ``search`` go without a namespace."""
        return self.subject or self.namespace

    @property
    def readable(self) -> tuple[str, ...] | None:
        """Return the namespaces a limited server reads (the subject's first), or ``None``: any."""
        if not self.limited:
            return None
        return tuple(dict.fromkeys(n for n in (self.subject, self.namespace) if n is not None))

    def check_read(self, namespace: str) -> str:
        """Return ``namespace`` if this server may read it, else raise ``ValueError``."""
        readable = self.readable
        if readable is not None and namespace not in readable:
            raise ValueError(
                f"namespace {namespace!r} is outside this server's scope: it reads {_listed(readable)} only"
            )
        return namespace

    def check_write(self, namespace: str) -> str:
        """Return ``namespace`` if this server may write it, else raise ``ValueError``."""
        if not self.limited:
            return namespace
        writable = self.subject or self.namespace
        if namespace != writable:
            raise ValueError(
                f"namespace {namespace!r} is outside this server's scope: it writes {writable!r} only"
            )
        return namespace

    def describe(self) -> str:
        """Return the sentence of the server's instructions that states its scope."""
        if not self.limited:
            text = f"This server reads and writes any namespace; recall reads {self.namespace!r}."
        elif self.subject is not None:
            text = (
                f"This server is bound to one subject: recall reads {_listed(self.readable or ())}, "
                f"and remember writes {self.subject!r} only."
            )
        else:
            text = f"This server reads and writes namespace {self.namespace!r} only."
        if self.read_only:
            text += " It is read-only: it offers no remember."
        return text


def _utc_text(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def _listed(namespaces: tuple[str, ...]) -> str:
    return " and ".join(repr(namespace) for namespace in namespaces)


class MemoryTools:
    """The tools' logic over the memory of ``claw``, recalling exactly as its turns do.

    Each method takes the run id of its call and returns a result model. It raises ``ValueError``
    (bad input, a namespace outside ``scope``, storage switched off), ``TypeError`` (a value JSON
    cannot hold) or :class:`clawmem.StorageError`, which the server makes one-line tool errors.
    """

    def __init__(self, claw: Claw, scope: Scope) -> None:
        self.claw = claw
        self.memory = claw.memory
        self.augmenter = claw.augmenter
        self.scope = scope

    @property
    def driver(self) -> BaseMemory:
        """Return the storage driver behind the privacy switch (for listings and expiry times)."""
        driver = getattr(self.memory, "inner", self.memory)
        if not isinstance(driver, BaseMemory):
            raise ConfigError(f"the {type(driver).__name__} driver cannot list keys or report expiry times")
        return driver

    def _expiry(self, namespace: str, key: str) -> tuple[int | None, int | None]:
        try:
            row = self.driver.entry(namespace, key)
        except ConfigError:
            return None, None
        return (row.expires_at, row.bytes) if row is not None else (None, None)

    def recall(self, run_id: str, message: str, subject: str | None) -> Recalled:
        """Return what a turn for ``message`` (and ``subject``) would be given, and why."""
        if subject is not None and self.scope.subject is not None:
            raise ValueError("this server is bound to one subject (--subject): recall takes no subject")
        namespace = self.scope.subject
        if subject is not None:
            namespace = self.scope.check_read(subject_namespace(subject, self.claw.subject_template))
        report = self.augmenter.augment(message, namespace)
        if report.error is not None:
            driver = str(getattr(getattr(self.memory, "inner", self.memory), "name", "the"))
            detail = f"the backend raised {report.error}, so nothing was recalled"
            raise StorageError(driver, "recall", detail)
        lines = [
            report.text[span.start : span.end].removesuffix("\n")
            for span in report.spans
            if span.source.startswith("memory key ")
        ]
        shown = report.decisions[:MAX_CANDIDATES]
        return Recalled(
            text=report.text,
            lines=lines,
            injected=report.injected_keys,
            namespaces=[n for n in (report.subject_namespace, report.namespace) if n is not None],
            candidates=[
                Candidate(
                    namespace=d.namespace,
                    key=d.key,
                    score=d.score,
                    matched=list(d.matched),
                    status=d.status,
                    reason=d.reason,
                    bytes=d.bytes,
                )
                for d in shown
            ],
            candidates_total=len(report.decisions),
            zero_overlap=report.zero_overlap,
            bytes_used=report.bytes_used,
            max_recall_bytes=report.max_recall_bytes,
            top_k=report.top_k,
            run_id=run_id,
        )

    def remember(
        self, run_id: str, key: str, value: Any, namespace: str | None, ttl_seconds: int | None
    ) -> Remembered:
        """Store ``value`` under ``key``, attributed to this server (origin ``mcp``) and the
        call's run; refused when the privacy switch holds writes back, or when the scope is
        read-only."""
        if self.scope.read_only:
            raise ValueError("this token is read-only: remember is refused, and nothing was written")
        namespace = self.scope.check_write(self.scope.home if namespace is None else namespace)
        gated: list[dict[str, Any]] = []

        def watch(payload: dict[str, Any]) -> None:
            if payload.get("run_id") == run_id and payload.get("gated"):
                gated.append(payload)

        # Where the entry came from, in the shape a turn's remember tool writes (clawmem.turn.writes):
        # a call of this server is part of no conversation clawmem keeps.
        origin = attribution("mcp", self.claw.clock, run_id=run_id)
        events.on("memory.write", watch)
        try:
            set_any(self.memory, key, value, namespace, ttl_seconds, origin)
        finally:
            events.off("memory.write", watch)
        if gated:
            raise ValueError(
                "not stored: message storage is off (CLAW_STORE_MESSAGES=false), so the privacy "
                "switch writes nothing; nothing was written"
            )
        expires_at, size = self._expiry(namespace, key)
        return Remembered(namespace=namespace, key=key, expires_at=expires_at, bytes=size, run_id=run_id)

    def get(self, run_id: str, key: str, namespace: str | None) -> Found:
        """Return the live value of ``key``, or ``found`` false."""
        namespace = self.scope.check_read(self.scope.home if namespace is None else namespace)
        if not self.memory.has(key, namespace):
            return Found(found=False, namespace=namespace, key=key, run_id=run_id)
        value = self.memory.get(key, namespace)
        expires_at, _ = self._expiry(namespace, key)
        return Found(
            found=True, namespace=namespace, key=key, value=value, expires_at=expires_at, run_id=run_id
        )

    def list_namespaces(self, run_id: str) -> Namespaces:
        """Return the namespaces holding entries, within the scope."""
        stored = list(self.memory.namespaces())
        readable = self.scope.readable
        if readable is not None:
            stored = [namespace for namespace in stored if namespace in readable]
        return Namespaces(
            namespaces=stored,
            recall_namespace=self.scope.namespace,
            subject_namespace=self.scope.subject,
            home=self.scope.home,
            run_id=run_id,
        )

    def list_keys(self, run_id: str, namespace: str, cursor: str | None) -> KeysPage:
        """Return one page of ``namespace``'s live keys after ``cursor``."""
        self.scope.check_read(namespace)
        page = self.driver.entries(namespace, state="live", limit=KEYS_PER_PAGE, cursor=cursor)
        return KeysPage(
            namespace=namespace,
            keys=[
                KeyInfo(
                    key=row.key,
                    expires_at=row.expires_at,
                    bytes=row.bytes,
                    updated_at=_utc_text(row.updated_at),
                )
                for row in page.items
            ],
            next_cursor=page.next_cursor,
            run_id=run_id,
        )

    def search(self, run_id: str, query: str, namespace: str | None, limit: int) -> Searched:
        """Return the ``limit`` entries sharing the most words with ``query``."""
        namespace = self.scope.check_read(self.scope.home if namespace is None else namespace)
        hits = self.memory.search(query, limit, namespace)
        return Searched(
            query=query,
            namespace=namespace,
            hits=[SearchHit(namespace=h.namespace, key=h.key, value=h.value, score=h.score) for h in hits],
            run_id=run_id,
        )
