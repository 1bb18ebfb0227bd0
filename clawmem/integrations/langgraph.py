"""LangGraph's long-term memory store over clawmem: ``ClawStore(memory)``.

A ``langgraph.store.base.BaseStore``: ``get``, ``put``, ``delete``, ``search`` and
``list_namespaces`` and their async twins work on any clawmem memory, and what the graph stores
is ordinary clawmem entries, so the dashboard, recall, export, erase and retention cover it.
How tuples, keys and values are stored is in :mod:`clawmem.integrations.stored_items`.

Differences from LangGraph's ``InMemoryStore``, by design: ops of one batch run in the order
given (``InMemoryStore`` answers a batch's reads before its writes); ``search`` without a query
lists items by namespace then key (``InMemoryStore`` by insertion order, which no clawmem
driver keeps); ``list_namespaces`` lists only namespaces holding a live item (``InMemoryStore``
keeps a namespace once read or emptied); a ``$gt``-style filter on a field that is missing
or not a number does not match (``InMemoryStore`` raises); ``search(query=...)`` returns only
the items clawmem's recall scores above zero, best first; ``index`` on ``put`` is ignored,
because recall reads every item.

Memory the model writes: :meth:`ClawStore.memory_tools` returns a LangChain tool ``remember``
(a key and a text value) for a graph's ``ToolNode``, the one :meth:`clawmem.Claw.send` offers
with ``CLAW_MEMORY_WRITES=tool``. It writes the subject's own facts (plain keys of the subject
namespace, not LangGraph items), so a clawmem turn or an Agents SDK session of the same user
recalls them. A call is checked as a turn's is (:mod:`clawmem.turn.writes`) and written at once,
attributed to origin ``langgraph``, the graph's ``thread_id``, the run and the time; a refused
call writes nothing and is an error result (``ToolMessage`` status ``error``) telling the model
why. No tool deletes or expires anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from clawmem.integrations import require

require("langgraph.store.base", "langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool, ToolException  # noqa: E402
from langgraph.store.base import (  # noqa: E402
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from clawmem import events  # noqa: E402
from clawmem.clock import Clock  # noqa: E402
from clawmem.ids import new_id  # noqa: E402
from clawmem.integrations import aio  # noqa: E402
from clawmem.integrations import stored_items as stored  # noqa: E402
from clawmem.memory.base import MemoryInterface  # noqa: E402
from clawmem.memory.wrappers import namespaces_any, search_any  # noqa: E402
from clawmem.recall.sources import serving_driver  # noqa: E402
from clawmem.rules import (  # noqa: E402
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_SUBJECT_NAMESPACE,
    check_value,
    encode_value,
    subject_namespace,
    subject_of_namespace,
    validate_key,
    validate_template,
)
from clawmem.turn.guards import Guard, PiiGuard  # noqa: E402
from clawmem.turn.writes import REMEMBER_TOOL, RememberTool, attribution, remember_now  # noqa: E402

# Recall is asked for every hit of a namespace, so that a filter applied after it loses none.
_ALL_HITS = 2**31


class ClawStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items are entries of a clawmem ``memory``.

    ``subject_label`` names the first label of a user's tuples (``("users", user_id, ...)``),
    which live in that user's subject namespace made from ``subject_template``
    (``CLAW_SUBJECT_NAMESPACE``). ``ttl`` is LangGraph's ``TTLConfig`` (``default_ttl`` in
    minutes, ``refresh_on_read``); expired items are deleted by ``flask claw sweep``.
    """

    supports_ttl = True

    def __init__(
        self,
        memory: MemoryInterface,
        *,
        subject_label: str = "users",
        subject_template: str = DEFAULT_SUBJECT_NAMESPACE,
        namespace_prefix: str = "langgraph",
        ttl: TTLConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(subject_label, str) or not subject_label or "." in subject_label:
            raise ValueError(
                f"subject_label must be a LangGraph label (non-empty, no '.'), got {subject_label!r}"
            )
        if stored.encode_label(namespace_prefix) != namespace_prefix:
            raise ValueError(
                f"namespace_prefix must be ASCII letters, digits, _ or -, got {namespace_prefix!r}"
            )
        self.memory = memory
        self.prefix = namespace_prefix
        self.subject_label = subject_label
        self.subject_template = validate_template(subject_template)
        self.ttl_config = ttl
        driver, _ = serving_driver(memory, "default")
        self.clock = clock or getattr(driver, "clock", time.time)

    @classmethod
    def from_settings(cls, settings: Any, clock: Clock = time.time, **options: Any) -> ClawStore:
        """Return a store over the memory ``settings`` open (privacy switch included), with the
        settings' subject namespace."""
        from clawmem.memory.registry import open_memory
        from clawmem.memory.vector_writes import embed_writes

        return cls(
            embed_writes(open_memory(settings, clock), settings),
            subject_template=settings.subject_namespace,
            clock=clock,
            **options,
        )

    # -- memory the model writes -------------------------------------------------------------

    def memory_tools(
        self, user_id: str | None = None, guards: Iterable[Guard] | None = None
    ) -> list[BaseTool]:
        """Return the tools that let the model write memory: ``remember`` into the subject
        namespace of ``user_id``, or of the run's ``config["configurable"]["user_id"]`` when
        ``user_id`` is ``None`` (a run without one is refused, nothing written). An anonymous
        ``user_id`` (``""``) gets no tool. ``guards`` default to ``[PiiGuard()]``, as a turn's
        do. Raises ``TypeError`` for a ``user_id`` that is not a str."""
        if user_id is not None and not isinstance(user_id, str):
            raise TypeError(f"user_id must be a str or None, got {type(user_id).__name__}")
        if user_id == "":
            return []
        return [
            RememberOverStore(
                store=self, user_id=user_id, guards=[PiiGuard()] if guards is None else list(guards)
            )
        ]

    # -- where an item lives ------------------------------------------------------------------

    def _is_subject(self, labels: tuple[str, ...]) -> bool:
        return len(labels) >= 2 and labels[0] == self.subject_label

    def _address(self, labels: tuple[str, ...], key: str) -> tuple[str, str]:
        """Return the clawmem ``(namespace, key)`` of an item, or raise ``ValueError``."""
        if not isinstance(key, str):
            raise TypeError(f"a LangGraph key is a str, got {type(key).__name__}")
        if self._is_subject(labels):
            namespace = stored.user_namespace(labels[1], self.subject_template)
            return namespace, validate_key(stored.subject_key(labels[2:], key))
        return stored.encode_namespace(self.prefix, labels), validate_key(key)

    def _labels_of(self, namespace: str, stored_key: str) -> tuple[tuple[str, ...], str] | None:
        """Return the ``(tuple, key)`` a clawmem entry stands for, or ``None`` if it is not an item."""
        labels = stored.decode_namespace(self.prefix, namespace)
        if labels is not None:
            return labels, stored_key
        user_id = subject_of_namespace(namespace, self.subject_template)
        found = stored.read_subject_key(stored_key) if user_id else None
        if found is None:
            return None
        rest, key = found
        return (self.subject_label, user_id, *rest), key  # type: ignore[misc]

    def _namespaces_under(self, prefix: tuple[str, ...]) -> list[str]:
        """Return the clawmem namespaces that can hold items under the tuple ``prefix``."""
        if self._is_subject(prefix):
            return [stored.user_namespace(prefix[1], self.subject_template)]
        found = []
        for namespace in namespaces_any(self.memory):
            labels = stored.decode_namespace(self.prefix, namespace)
            if labels is not None:
                if labels[: len(prefix)] == prefix:
                    found.append(namespace)
            elif subject_of_namespace(namespace, self.subject_template) and prefix[:1] in (
                (),
                (self.subject_label,),
            ):
                found.append(namespace)
        return found

    def _items_in(self, namespace: str, entries: Mapping[str, Any]) -> Iterator[tuple[str, Item, int | None]]:
        """Yield ``(stored key, item, ttl seconds)`` for each LangGraph item among ``entries``."""
        for stored_key, value in entries.items():
            where = self._labels_of(namespace, stored_key)
            opened = stored.read_envelope(value)
            if where is None or opened is None:
                continue
            body, created, updated, ttl = opened
            item = Item(value=body, key=where[1], namespace=where[0], created_at=created, updated_at=updated)
            yield stored_key, item, ttl

    # -- the protocol -----------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order and return one result each. Every op is checked before any runs:
        LangGraph's label rules raise ``InvalidNamespaceError``, a value that is not a dict
        ``TypeError``, an unknown op, an over-long tuple or key, a bad ttl or a value over
        ``CLAW_MAX_VALUE_BYTES`` ``ValueError``; then nothing is written."""
        steps = [self._plan(op) for op in list(ops)]
        return [step() for step in steps]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run :meth:`batch` on the async path (:mod:`clawmem.integrations.aio`): on the event loop over
        asyncio drivers on PostgreSQL, MariaDB/MySQL and Redis, else in a worker thread, so the
        loop keeps serving other tasks either way."""
        return await aio.run(aio.every_driver_on_loop(self.memory), self.batch, list(ops))

    def _plan(self, op: Op) -> Callable[[], Result]:
        if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
            raise ValueError(f"unknown LangGraph store operation {type(op).__name__}")
        validate_op_namespace(op)
        if isinstance(op, GetOp):
            namespace, key = self._address(tuple(op.namespace), op.key)
            return lambda: self._get(namespace, key, op.refresh_ttl)
        if isinstance(op, PutOp):
            return self._plan_put(op)
        if isinstance(op, SearchOp):
            self._check_page(op.limit, op.offset)
            check_filter(op.filter)
            return lambda: self._search(op)
        self._check_page(op.limit, op.offset)
        return lambda: self._list_namespaces(op)

    def _plan_put(self, op: PutOp) -> Callable[[], None]:
        labels = tuple(op.namespace)
        if not labels:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if labels[0] == "langgraph":
            raise InvalidNamespaceError(f'Root label for namespace cannot be "langgraph". Got: {labels}')
        namespace, key = self._address(labels, op.key)
        if op.value is None:
            return lambda: self.memory.forget(key, namespace)
        if not isinstance(op.value, Mapping):
            raise TypeError(f"a LangGraph value is a dict, got {type(op.value).__name__} for key {op.key!r}")
        check_value(op.key, dict(op.value))  # so an error's path is the caller's, not the envelope's
        ttl = stored.ttl_seconds(op.ttl)
        now = stored.stamp(self._now())
        value = stored.envelope(op.value, now, now, ttl)
        driver, _ = serving_driver(self.memory, namespace)
        encode_value(key, value, getattr(driver, "max_value_bytes", DEFAULT_MAX_VALUE_BYTES))

        def put() -> None:
            before = stored.read_envelope(self.memory.get(key, namespace))
            if before is not None:
                value["c"] = stored.stamp(before[1])
            self.memory.set(key, value, namespace, ttl)

        return put

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    @staticmethod
    def _check_page(limit: object, offset: object) -> None:
        for name, number in (("limit", limit), ("offset", offset)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise ValueError(f"{name} must be a non-negative int, got {number!r}")

    def _refresh(self, namespace: str, stored_key: str, item: Item, ttl: int | None) -> None:
        """Renew an item's expiry: a write, so the privacy switch holds it back when off."""
        if ttl is not None:
            value = stored.envelope(
                item.value, stored.stamp(item.created_at), stored.stamp(item.updated_at), ttl
            )
            self.memory.set(stored_key, value, namespace, ttl)

    def _get(self, namespace: str, key: str, refresh: bool) -> Item | None:
        found = list(self._items_in(namespace, {key: self.memory.get(key, namespace)}))
        if not found:
            return None
        _, item, ttl = found[0]
        if refresh:
            self._refresh(namespace, key, item, ttl)
        return item

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        hits: list[tuple[float | None, str, str, Item, int | None]] = []
        for namespace in self._namespaces_under(prefix):
            if op.query:
                found = search_any(self.memory, op.query, _ALL_HITS, namespace)
                scores = {hit.key: hit.score for hit in found}
                entries = {hit.key: hit.value for hit in found}
            else:
                scores, entries = {}, self.memory.all(namespace)
            for stored_key, item, ttl in self._items_in(namespace, entries):
                if item.namespace[: len(prefix)] == prefix and matches_filter(item.value, op.filter):
                    hits.append((scores.get(stored_key), namespace, stored_key, item, ttl))
        hits.sort(key=lambda hit: (-(hit[0] or 0), hit[3].namespace, hit[3].key))
        page = hits[op.offset : op.offset + op.limit]
        if op.refresh_ttl:
            for _, namespace, stored_key, item, ttl in page:
                self._refresh(namespace, stored_key, item, ttl)
        return [
            SearchItem(
                item.namespace,
                item.key,
                item.value,
                item.created_at,
                item.updated_at,
                score=None if score is None else float(score),
            )
            for score, _, _, item, _ in page
        ]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found: set[tuple[str, ...]] = set()
        for namespace in self._namespaces_under(()):
            found.update(
                item.namespace for _, item, _ in self._items_in(namespace, self.memory.all(namespace))
            )
        conditions = op.match_conditions or ()
        matching = [labels for labels in found if all(matches_condition(c, labels) for c in conditions)]
        if op.max_depth is not None:
            matching = list({labels[: op.max_depth] for labels in matching})
        return sorted(matching)[op.offset : op.offset + op.limit]


class RememberOverStore(BaseTool):
    """The ``remember`` tool over a :class:`ClawStore` (see :meth:`ClawStore.memory_tools`)."""

    name: str = REMEMBER_TOOL.name
    description: str = REMEMBER_TOOL.description
    args_schema: dict[str, Any] = dict(REMEMBER_TOOL.parameters)  # checked by clawmem.turn.writes, not here
    handle_tool_error: bool = True  # a refusal is the model's error result, not the graph's failure
    store: Any
    user_id: str | None = None
    guards: list[Any] = []

    def _run(self, *args: Any, config: RunnableConfig, run_manager: Any = None, **arguments: Any) -> str:
        configurable = config.get("configurable") or {}
        user_id = self.user_id if self.user_id is not None else configurable.get("user_id")
        if not isinstance(user_id, str) or not user_id:
            raise ToolException(
                '{"stored": false, "error": "this run has no user id (configurable user_id), so there '
                'is no subject to remember for; nothing was written"}'
            )
        store: ClawStore = self.store
        namespace = subject_namespace(user_id, store.subject_template)
        tool = RememberTool.over(store.memory, namespace, self.guards)
        thread = configurable.get("thread_id")
        run_id = events.current_run_id() or new_id()
        origin = attribution("langgraph", store.clock, run_id=run_id)
        if isinstance(thread, str):
            origin["thread_id"] = thread[:200]  # the graph's conversation, not one clawmem keeps
        with events.run_context(run_id):
            done = remember_now(store.memory, tool, arguments if not args else args[0], new_id(), origin)
        if not done.stores:
            raise ToolException(done.result)
        return done.result


def matches_condition(condition: MatchCondition, labels: tuple[str, ...]) -> bool:
    """Return whether ``labels`` starts (``prefix``) or ends (``suffix``) with the condition's
    path, where ``*`` stands for any one label; raise ``ValueError`` for another match type."""
    path = tuple(condition.path)
    if condition.match_type not in ("prefix", "suffix"):
        raise ValueError(f"unknown namespace match type {condition.match_type!r}")
    if len(labels) < len(path):
        return False
    window = labels[: len(path)] if condition.match_type == "prefix" else labels[len(labels) - len(path) :]
    return all(wanted in ("*", label) for wanted, label in zip(path, window, strict=True))


_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def check_filter(wanted: object) -> None:
    """Raise ``TypeError`` for a filter that is not a dict, ``ValueError`` for an operator
    LangGraph does not define, anywhere in it."""
    if wanted is None:
        return
    if not isinstance(wanted, Mapping):
        raise TypeError(f"a search filter is a dict, got {type(wanted).__name__}")
    for name, want in wanted.items():
        if isinstance(name, str) and name.startswith("$") and name not in _OPERATORS:
            raise ValueError(f"unsupported filter operator {name!r}: use {', '.join(_OPERATORS)}")
        if isinstance(want, Mapping):
            check_filter(want)


def matches_filter(value: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """Return whether an item's ``value`` passes a LangGraph search filter: each field equals
    the wanted value (dicts and lists compared field by field) or passes its operators
    (``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``). Raises ``ValueError`` for another
    operator."""
    return not wanted or all(_matches(value.get(field), want) for field, want in wanted.items())


def _matches(found: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        if any(isinstance(name, str) and name.startswith("$") for name in want):
            return all(_operator(found, name, operand) for name, operand in want.items())
        return isinstance(found, Mapping) and all(_matches(found.get(k), v) for k, v in want.items())
    if isinstance(want, list | tuple):
        return (
            isinstance(found, list | tuple)
            and len(found) == len(want)
            and all(_matches(f, w) for f, w in zip(found, want, strict=True))
        )
    return found == want


def _operator(found: Any, name: str, operand: Any) -> bool:
    if name == "$eq":
        return found == operand
    if name == "$ne":
        return found != operand
    compare = _COMPARISONS.get(name)
    if compare is None:
        raise ValueError(f"unsupported filter operator {name!r}: use {', '.join(_OPERATORS)}")
    try:
        return compare(float(found), float(operand))
    except (TypeError, ValueError):
        return False  # a missing or non-numeric field is not greater or less than anything


__all__ = ["ClawStore", "RememberOverStore", "check_filter", "matches_condition", "matches_filter"]
