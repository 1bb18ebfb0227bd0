"""Conversations: the keyset-paginated list, and one conversation with its compaction analysis."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from typing import Any, NamedTuple

from flask import Blueprint, Response, abort, request, url_for

from clawmem.clock import utc_datetime
from clawmem.integrations.openai_agents import session_id_of
from clawmem.sql.conversation_list import SORTS
from clawmem.sql.conversations import ConversationSummary, MessageSize, StoredMessage
from clawmem.turn.compaction import analyse_sizes, configured_thresholds, estimate_tokens
from clawmem.turn.conversations import ConversationLog
from clawmem.turn.messages import sizes_of
from clawmem.turn.pipeline import billed_tokens, provider_history
from clawmem.turn.search import SCAN_LIMIT as CONVERSATIONS_SCAN_LIMIT
from dashboard import state
from dashboard.views.downloads import DOWNLOAD_FORMATS, DOWNLOAD_LIMIT, moment_text
from dashboard.views.downloads import download as download_response
from dashboard.views.rendering import (
    UNREADABLE_TIME,
    TimeFrame,
    format_duration,
    format_time,
    int_arg,
    marked,
    pretty_json,
    preview_text,
    render_page,
    snippet,
    sort_arg,
    sort_links,
    sort_word,
    text_arg,
    time_frame,
    url_maker,
    wants_fragment,
    when,
)
from dashboard.views.turns import recall_rows, turn_preview

bp = Blueprint("conversations", __name__, url_prefix="/conversations")

PAGE_SIZE = 50
DOWNLOAD_PAGE = 500  # rows read per query while a download streams
MESSAGE_PAGE_SIZE = 100
ANALYSIS_LIMIT = 5000  # messages read for the compaction analysis of one conversation
NOT_SAID = ("summary", "recall")  # rows the analysis leaves out: not part of what the model said
THRESHOLD_NAMES = {"messages": "message count", "tokens": "token estimate"}
FILTERS = ("q", "user_id", "namespace", "since", "until")
DEFAULT_SORT = "-updated"  # the conversations an operator is most likely looking for
SORT_DIRECTIONS = {name: descending for name, (_, descending) in SORTS.items()}
MESSAGE_SORTS = {"created": False}  # a conversation's messages: oldest first, or newest (-created)
MORE_TARGET = "conversations-more"
SEARCH_COUNT_LIMIT = 1000
SCAN_LIMIT = CONVERSATIONS_SCAN_LIMIT
# The form labels the date filters "From" and "To", so those names are understood too.
DATE_ALIASES = {"since": "from", "until": "to"}
DATE_LABELS = {"since": "From", "until": "To"}


def _day(name: str, raw: str) -> tuple[datetime | None, str | None]:
    """Return the start of day ``raw`` (for ``until``, of the day after it, so the whole day is
    in), or ``None``, with what is wrong with it to say on the page."""
    if not raw:
        return None, None
    label = DATE_LABELS[name]
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        return None, f"{label}: {raw!r} is not a date; write it YYYY-MM-DD, for example 2024-05-01."
    try:
        return datetime.combine(day + timedelta(days=1 if name == "until" else 0), datetime.min.time()), None
    except OverflowError:
        return None, f"{label}: {raw} is past the last day a list can be filtered to."


def _filters() -> dict[str, str]:
    given = {name: text_arg(name) for name in FILTERS}
    for name, alias in DATE_ALIASES.items():
        given[name] = given[name] or text_arg(alias)
    return {name: value for name, value in given.items() if value}


def _summary_row(
    conversation: ConversationSummary, links: tuple[Callable[[str], str], Callable[[str], str]] | None = None
) -> dict[str, Any]:
    """Return the row a list shows of ``conversation``; ``links`` (of :func:`_row_links`) build
    its links when there are many rows."""
    to_conversation, to_subject = links or _row_links()
    return {
        "id": conversation.id,
        "url": to_conversation(conversation.id),
        "title": conversation.title or "(untitled)",
        "user_id": conversation.user_id or "anonymous",
        # The subject's page; the anonymous ones share no subject.
        "subject_url": to_subject(conversation.user_id) if conversation.user_id else None,
        "namespace": conversation.namespace,
        # Both columns are NOT NULL: no time means one the row's writer left unreadable.
        "created_at": conversation.created_at or UNREADABLE_TIME,
        "updated_at": conversation.updated_at or UNREADABLE_TIME,
        "message_count": conversation.message_count,
        "total_tokens": conversation.total_tokens,  # None: not reported
        "recall_count": conversation.recall_count,
        "checkpoint_count": conversation.checkpoint_count,
        "unreadable": conversation.unreadable,
    }


class ListRow(NamedTuple):
    """One row of the conversation list, each field ready to print (the template unpacks it in
    this order): built in one pass, as a page holds fifty rows and a template's tests and
    lookups per cell cost more than the rest of a row."""

    url: str
    title: str  # markup: escaped, the search's matches marked
    unreadable: str | None
    snippet: str | None  # markup: the first matching message, around its match
    subject_url: str | None  # the subject's page; the anonymous ones share no subject
    user_id: str
    namespace: str
    messages: int  # said
    apart: str  # the recall records and checkpoints, counted apart ('' for none)
    tokens: int | None  # None: not reported
    started: str  # markup of rendering.when
    updated: str


def _list_row(
    conversation: ConversationSummary,
    links: tuple[Callable[[str], str], Callable[[str], str]],
    query: str | None,
    match: str | None,
    frame: TimeFrame,
) -> ListRow:
    to_conversation, to_subject = links
    recalls, checkpoints = conversation.recall_count, conversation.checkpoint_count
    apart = f"+{recalls} recall" if recalls else ""
    if checkpoints:
        apart += f" +{checkpoints} checkpoint{'' if checkpoints == 1 else 's'}"
    return ListRow(
        url=to_conversation(conversation.id),
        title=marked(conversation.title or "(untitled)", query),
        unreadable=conversation.unreadable,
        snippet=None if match is None else snippet(match, query),
        subject_url=to_subject(conversation.user_id) if conversation.user_id else None,
        user_id=conversation.user_id or "anonymous",
        namespace=conversation.namespace,
        messages=conversation.message_count,
        apart=apart,
        tokens=conversation.total_tokens,
        # Both times are NOT NULL: no time means one the row's writer left unreadable.
        started=when(conversation.created_at or UNREADABLE_TIME, frame),
        updated=when(conversation.updated_at or UNREADABLE_TIME, frame),
    )


def _chosen(filters: dict[str, str], since: datetime | None, until: datetime | None) -> dict[str, Any]:
    return {
        "user_id": filters.get("user_id"),
        "namespace": filters.get("namespace"),
        "since": since,
        "until": until,
        "query": filters.get("q"),
    }


def _row_links() -> tuple[Callable[[str], str], Callable[[str], str]]:
    return url_maker("conversations.detail", "conversation_id"), url_maker("subjects.detail", "user_id")


def _list_page(
    filters: dict[str, str], sort: str, since: datetime | None, until: datetime | None, descending: bool
) -> dict[str, Any]:
    """Return the page of the list the request asks for, its rows, and (unless only more rows
    are asked for) how many conversations match in all."""
    store = state.conversations()
    chosen = _chosen(filters, since, until)
    # A search reads message text, which no index serves: its count stops at a bound. The count
    # is read with the page (a request for more rows shows none).
    bound = SEARCH_COUNT_LIMIT if filters.get("q") else None
    # Every conversation, unfiltered: a count of the whole table, which costs a pass over it on
    # every backend (7 ms at 50,000 conversations on MariaDB), taken once a minute as the
    # Overview's are, unless the first page holds them all. Filtered counts are exact on every
    # request.
    counting, cursor = not wants_fragment(MORE_TARGET), text_arg("cursor", 500) or None
    page = store.list(
        limit=PAGE_SIZE,
        cursor=cursor,
        sort=sort,
        descending=descending,
        counted=counting and bool(filters),
        count_at_most=bound,
        **chosen,
    )
    total, counted_at = page.total, None
    if counting and not filters:
        if cursor is None and page.next_cursor is None:
            total = len(page.items)
        else:
            total, counted_at = state.recent("conversation_total", store.count)
    order = sort_word(sort, descending)
    scanned = None
    if filters.get("q") and store.encrypted:
        # The same scan the list made (kept for the page): how far the search looked.
        scan = store.scan(filters["q"], **{name: value for name, value in chosen.items() if name != "query"})
        scanned = {
            "conversations": scan.conversations_read,
            "messages": scan.messages_read,
            "complete": scan.complete,
            "limit": SCAN_LIMIT,
        }
    found = store.first_matches([c.id for c in page.items], filters["q"]) if filters.get("q") else {}
    links, frame = _row_links(), time_frame()
    return {
        "rows": [_list_row(c, links, filters.get("q"), found.get(c.id), frame) for c in page.items],
        "total": total,
        "counted_at": None if counted_at is None else format_time(utc_datetime(lambda: counted_at)),
        "count_max_age": format_duration(state.COUNTS_MAX_AGE),
        "bound": bound,
        "scanned": scanned,
        "more_url": url_for("conversations.index", **filters, sort=order, cursor=page.next_cursor)
        if page.next_cursor
        else None,
        "downloads": {
            format: url_for("conversations.download", format=format, **filters, sort=order)
            for format in DOWNLOAD_FORMATS
        },
        "download_limit": DOWNLOAD_LIMIT,
    }


TITLES_SEALED = "Titles are encrypted, so the database cannot sort by them: sorted by last activity instead."


def _titles_unsortable(sort: str) -> bool:
    # The database holds sealed titles: an order by them would be an order by ciphertext.
    return sort == "title" and state.conversations().encrypted


def _list_arguments() -> tuple[dict[str, str], str, bool, datetime | None, datetime | None, list[str]]:
    filters = _filters()
    sort, descending = sort_arg(SORT_DIRECTIONS, DEFAULT_SORT)
    if sort == "tokens" and not state.conversations().stores_metadata:
        abort(400, description="phpClaw's tables hold no token counts to sort by.")
    if _titles_unsortable(sort):
        sort, descending = DEFAULT_SORT.removeprefix("-"), True
    (since, since_error), (until, until_error) = (_day(name, filters.get(name, "")) for name in DATE_LABELS)
    errors = [error for error in (since_error, until_error) if error]
    return filters, sort, descending, since, until, errors


DOWNLOAD_COLUMNS = (
    "id",
    "title",
    "user_id",
    "namespace",
    "created_at",
    "updated_at",
    "messages",
    "recall_records",
    "checkpoints",
    "total_tokens",
)


def _download_row(conversation: ConversationSummary) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "title": conversation.title,
        "user_id": conversation.user_id,
        "namespace": conversation.namespace,
        "created_at": moment_text(conversation.created_at),
        "updated_at": moment_text(conversation.updated_at),
        "messages": conversation.message_count,
        "recall_records": conversation.recall_count,
        "checkpoints": conversation.checkpoint_count,
        "total_tokens": conversation.total_tokens,  # None: not reported (an empty CSV cell)
    }


@bp.get("/export.<any(csv, json):format>")
def download(format: str) -> Response:
    """The filtered list in its order as CSV or JSON, streamed, at most ``DOWNLOAD_LIMIT`` rows
    (times in UTC; no tokens reported is an empty cell or ``null``, never 0)."""
    filters, sort, descending, since, until, errors = _list_arguments()
    if errors:
        abort(400, description=" ".join(errors))
    store, chosen = state.conversations(), _chosen(filters, since, until)

    def rows() -> Iterator[dict[str, Any]]:
        fetch = functools.partial(store.list, limit=DOWNLOAD_PAGE, sort=sort, descending=descending, **chosen)
        for conversation in state.every_item(lambda cursor: fetch(cursor=cursor)):
            yield _download_row(conversation)

    about = {"filters": filters, "sort": sort_word(sort, descending), "times": "UTC"}
    return download_response(format, "conversations", DOWNLOAD_COLUMNS, rows, about)


@bp.get("/")
def index() -> str | tuple[str, int]:
    """Conversations, the most recently active first unless another ``sort`` is asked for,
    filtered by search text, subject, namespace and date, with how many match."""
    filters, sort, descending, since, until, errors = _list_arguments()
    # Said on the page beside the filters, instead of silently listing everything.
    nothing = {"rows": [], "total": 0, "counted_at": None, "bound": None, "scanned": None, "more_url": None}
    listed = nothing if errors else _list_page(filters, sort, since, until, descending)
    body = render_page(
        "conversations/index.html",
        {"conversation-results": "conversations/_results.html", MORE_TARGET: "conversations/_rows.html"},
        filters=filters,
        errors=errors,
        page_context=lambda: {"namespaces": state.conversations().namespaces()},
        sort=sort_word(sort, descending),
        sorts=sort_links(SORT_DIRECTIONS, sort, descending, "conversations.index", **filters),
        notice=TITLES_SEALED if _titles_unsortable(sort_arg(SORT_DIRECTIONS, DEFAULT_SORT)[0]) else None,
        **listed,
    )
    return (body, 400) if errors else body


def _checkpoint(message: StoredMessage | MessageSize, positions: dict[str, int]) -> dict[str, Any] | None:
    """Return what a ``summary`` row covers (1-based positions when the whole history is known,
    else message ids) and what it cost; ``None`` for any other row."""
    if message.role != "summary":
        return None
    record = message.tool_input if isinstance(message.tool_input, dict) else {}
    covers = record.get("covers") if isinstance(record.get("covers"), dict) else {}
    # Another program may have written anything here: only ids and whole numbers are used.
    ends = (covers.get("from"), covers.get("to"))
    first, last = (value if isinstance(value, str) else None for value in ends)
    if first in positions and last in positions:
        span = f"messages {positions[first]}–{positions[last]}"
    else:
        span = f"messages {first or '?'} to {last or '?'}"
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    counted = {name: value for name, value in usage.items() if type(value) is int}
    parts = counted.get("prompt_tokens", 0) + counted.get("completion_tokens", 0)
    tokens = counted.get("total_tokens") or parts
    return {
        "position": positions.get(message.id),
        "covers": span,
        "count": covers.get("messages"),
        "provider_calls": record.get("provider_calls") or 0,
        "tokens": tokens or None,
        "usage": ", ".join(f"{name} {value}" for name, value in usage.items()),
    }


class Billed(NamedTuple):
    """What an assistant row's provider call was billed: ``tokens`` (``None``: not reported)
    and the usage's parts, as the page says them; with an extraction after the turn, what it
    cost (``memory_writing``, ``None``: not reported) and the entries it wrote, each with its
    key and the link to it."""

    tokens: int | None
    usage: str
    extracted: bool = False
    memory_writing: int | None = None
    wrote: tuple[dict[str, str], ...] = ()


class MessageRow(NamedTuple):
    """One message as its page shows it. A tuple with names, not a dict: the template reads
    some fifteen fields of each, and a name it looks up on a dict is first tried (and missed)
    as an attribute."""

    id: str
    position: int | None  # in the whole conversation, when its every message's size is known
    role: str
    created_at: str  # markup of rendering.when
    content: str
    unreadable: str | None  # e.g. a column the configured keys cannot decrypt
    tool_name: str
    tool_input: str
    checkpoint: dict[str, Any] | None  # what a summary row covers and cost (_checkpoint)
    tokens: int | None  # what a turn would send of it (a recall record is never sent)
    billed: Billed | None  # an assistant row's provider call
    fate: str  # "summarised" or "kept" by the analysis ('' when it does not say)
    first_fire: bool
    given: list[dict[str, Any]] | None  # a recall record's entries
    preview_url: str | None  # a user message's turn preview
    wrote: dict[str, str] | None = None  # the entry a remember tool row wrote: key and link


def _message_row(
    message: StoredMessage,
    analysis: dict[str, Any] | None,
    positions: dict[str, int],
    given: dict[str, list[dict[str, Any]]],
    turn_url: Callable[[str], str],
    frame: TimeFrame,
) -> MessageRow:
    summarised = analysis is not None and message.id in analysis["summarised_ids"]
    analysed = analysis is not None and analysis["reason"] and message.role not in NOT_SAID
    checkpoint = _checkpoint(message, positions)
    return MessageRow(
        id=message.id,
        position=positions.get(message.id),
        role=message.role,
        created_at=when(message.created_at or UNREADABLE_TIME, frame),  # NOT NULL: none means unreadable
        content=message.content or "",
        unreadable=message.unreadable,
        tool_name=message.tool_name or "",
        tool_input="" if message.tool_input is None or checkpoint else pretty_json(message.tool_input),
        checkpoint=checkpoint,
        tokens=None if message.role == "recall" else estimate_tokens(provider_history([message])),
        billed=_billed(message),
        fate=("summarised" if summarised else "kept") if analysed else "",
        first_fire=analysis is not None and analysis["first_fire_id"] == message.id,
        given=given.get(message.id) if message.role == "recall" else None,
        preview_url=turn_url(message.id) if message.role == "user" else None,
        wrote=_wrote(message),
    )


def _wrote(message: StoredMessage) -> dict[str, str] | None:
    """Return the entry a ``remember`` tool row says it wrote (its metadata's ``wrote``: the
    namespace and key), with the link to it; ``None`` for other rows and for a refused call."""
    if message.role != "tool" or not isinstance(message.metadata, dict):
        return None
    wrote = message.metadata.get("wrote")
    if not isinstance(wrote, dict):
        return None
    namespace, key = wrote.get("namespace"), wrote.get("key")
    if not isinstance(namespace, str) or not isinstance(key, str):
        return None  # another program may have written anything here
    return {"key": key, "namespace": namespace, "url": url_for("memory.entry", namespace=namespace, key=key)}


def _billed(message: StoredMessage) -> Billed | None:
    """Return what an assistant row's provider call was billed, from its metadata's usage;
    ``None`` for other rows."""
    if message.role != "assistant":
        return None
    metadata = message.metadata if isinstance(message.metadata, dict) else {}
    usage = metadata.get("usage") if isinstance(metadata.get("usage"), dict) else None
    parts = {name: value for name, value in (usage or {}).items() if type(value) is int}
    # Another program may have written anything here: only a whole count and text keys are used.
    writing = metadata.get("memory_writing")
    record = writing if isinstance(writing, dict) else {}
    namespace = record.get("namespace")
    keys = record.get("wrote") if isinstance(record.get("wrote"), list) else []
    wrote = tuple(
        {"key": key, "url": url_for("memory.entry", namespace=namespace, key=key)}
        for key in keys
        if isinstance(key, str) and isinstance(namespace, str)
    )
    tokens = metadata.get("memory_writing_tokens")
    return Billed(
        billed_tokens(usage),
        ", ".join(f"{name.removesuffix('_tokens')} {value}" for name, value in parts.items()),
        bool(record),
        tokens if type(tokens) is int and tokens >= 0 else None,
        wrote,
    )


Reader = Callable[[list[str]], list[StoredMessage]]


def _analysis(sizes: list[MessageSize], read: Reader, max_messages: int, max_tokens: int) -> dict[str, Any]:
    """Return :func:`analyse_sizes` of what was said (summary and recall rows left out), its
    message numbers given as positions in the whole conversation, and the other threshold's
    first crossing when both are exceeded."""
    said = [message for message in sizes if message.role not in NOT_SAID]
    found = analyse_sizes(said, max_messages, max_tokens, read)
    position = {message.id: index for index, message in enumerate(sizes, start=1)}
    at = {name: position[said[crossing - 1].id] for name, crossing in found["crossings"].items()}
    other = next((name for name in at if name != found["reason"]), None)
    return {
        **found,
        "first_fire": at.get(found["reason"]) if found["reason"] else None,
        "threshold": THRESHOLD_NAMES.get(found["reason"] or ""),
        "other": {"threshold": THRESHOLD_NAMES[other], "at": at[other]} if other else None,
        "left_out": len(sizes) - len(said),
    }


def _sizes(store: ConversationLog, conversation_id: str, count: int) -> list[MessageSize] | None:
    """Return every message's size for the analysis, or ``None`` when there are too many."""
    if count > ANALYSIS_LIMIT:
        return None
    sizes = store.message_sizes(conversation_id, limit=ANALYSIS_LIMIT + 1)
    return None if len(sizes) > ANALYSIS_LIMIT else sizes


def _reader(store: ConversationLog, conversation_id: str, read_already: list[StoredMessage]) -> Reader:
    """Return what reads the analysed messages' text, in the order of the ids asked for (from
    ``read_already`` when it holds them all)."""
    known = {message.id: message for message in read_already}

    def read(message_ids: list[str]) -> list[StoredMessage]:
        found = (
            known
            if all(message_id in known for message_id in message_ids)
            else (store.messages_with_ids(conversation_id, message_ids))
        )
        return [found[message_id] for message_id in message_ids if message_id in found]

    return read


@bp.get("/<conversation_id>")
def detail(conversation_id: str) -> str:
    """One conversation's messages in order, each with its token estimate, and what compaction
    would do under the configured thresholds (or the ``max_messages``/``max_tokens`` tried here)."""
    store = state.conversations()
    conversation = store.get(conversation_id)
    if conversation is None:
        abort(404, description="No conversation has this id; it may have been deleted or pruned.")
    settings = state.settings()
    max_messages = int_arg("max_messages", settings.compact_max_messages, 0, 1_000_000)
    max_tokens = int_arg("max_tokens", settings.compact_max_tokens, 0, 1_000_000_000)
    cursor = text_arg("cursor", 500) or None
    _, newest_first = sort_arg(MESSAGE_SORTS, "created")
    page = store.messages(conversation_id, limit=MESSAGE_PAGE_SIZE, cursor=cursor, descending=newest_first)
    # The analysis reads every message's size, not its text; only this page is read in full,
    # and when it holds the whole conversation the sizes are measured from it.
    whole = cursor is None and page.next_cursor is None
    in_order = page.items[::-1] if newest_first else page.items
    sizes = sizes_of(in_order) if whole else _sizes(store, conversation_id, conversation.row_count)
    reader = _reader(store, conversation_id, page.items if whole else [])
    analysis = _analysis(sizes, reader, max_messages, max_tokens) if sizes is not None else None
    positions = {message.id: index for index, message in enumerate(sizes or [], start=1)}
    # What the agent did: every checkpoint stored, what it covers and cost (from its sizes row,
    # which carries the checkpoint's record).
    done = [_checkpoint(message, positions) for message in sizes or [] if message.role == "summary"]
    given = recall_rows([message for message in page.items if message.role == "recall"])
    what_if = {name: request.args[name] for name in ("max_messages", "max_tokens") if request.args.get(name)}
    order = {"sort": "-created"} if newest_first else {}
    turn_url = url_maker("conversations.turn", "message_id", conversation_id=conversation_id)
    frame = time_frame()
    more_url = (
        url_for(
            "conversations.detail",
            conversation_id=conversation_id,
            cursor=page.next_cursor,
            **what_if,
            **order,
        )
        if page.next_cursor
        else None
    )
    return render_page(
        "conversations/detail.html",
        {"messages-more": "conversations/_messages.html"},
        conversation=_summary_row(conversation),
        metadata=preview_text(json.dumps(conversation.metadata, ensure_ascii=False), 400)
        if conversation.metadata
        else "",
        session_id=session_id_of(conversation.metadata),
        messages=[
            _message_row(message, analysis, positions, given, turn_url, frame) for message in page.items
        ],
        more_url=more_url,
        analysis=analysis,
        done=done,
        analysis_limit=ANALYSIS_LIMIT,
        configured=configured_thresholds(settings),
        checkpoints=settings.compact_persist,
        what_if=bool(what_if),
        newest_first=newest_first,
        orders={
            "oldest": url_for("conversations.detail", conversation_id=conversation_id, **what_if),
            "newest": url_for(
                "conversations.detail", conversation_id=conversation_id, **what_if, sort="-created"
            ),
        },
    )


@bp.get("/<conversation_id>/turns/<message_id>")
def turn(conversation_id: str, message_id: str) -> str:
    """One user turn: the memory it was given then, what the same message would be given now,
    and what changed (an htmx fragment in the conversation page, or a page of its own)."""
    return turn_preview(conversation_id, message_id)
