"""Conversations: the keyset-paginated list, and one conversation with its compaction analysis."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from typing import Any

from flask import Blueprint, abort, request, url_for

from clawmem.compaction import analyse, as_history, configured_thresholds, estimate_tokens
from clawmem.conversations import ConversationLog
from clawmem.sql.conversations import ConversationSummary, StoredMessage
from dashboard import state
from dashboard.views.rendering import format_time, int_arg, pretty_json, preview_text, render_page, text_arg

bp = Blueprint("conversations", __name__, url_prefix="/conversations")

PAGE_SIZE = 50
MESSAGE_PAGE_SIZE = 200
ANALYSIS_LIMIT = 5000  # messages read for the compaction analysis of one conversation
FILTERS = ("q", "user_id", "namespace", "since", "until")


def _day(name: str) -> date | None:
    raw = text_arg(name, 10)
    if not raw:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        abort(400, description=f"{name} must be a date written YYYY-MM-DD, got {raw!r}")


def _filters() -> dict[str, str]:
    given = {name: text_arg(name) for name in FILTERS}
    return {name: value for name, value in given.items() if value}


def _summary_row(conversation: ConversationSummary) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "url": url_for("conversations.detail", conversation_id=conversation.id),
        "title": conversation.title or "(untitled)",
        "user_id": conversation.user_id or "anonymous",
        "namespace": conversation.namespace,
        "created_at": format_time(conversation.created_at),
        "updated_at": format_time(conversation.updated_at),
        "message_count": conversation.message_count,
    }


@bp.get("/")
def index() -> str:
    """The newest conversations first, filtered by search text, subject, namespace and date."""
    filters = _filters()
    since, until = _day("since"), _day("until")
    cursor = text_arg("cursor", 500) or None
    store = state.conversations()
    page = store.list(
        limit=PAGE_SIZE,
        cursor=cursor,
        user_id=filters.get("user_id"),
        namespace=filters.get("namespace"),
        since=datetime.combine(since, datetime.min.time()) if since else None,
        until=datetime.combine(until + timedelta(days=1), datetime.min.time()) if until else None,
        query=filters.get("q"),
    )
    more_url = url_for("conversations.index", **filters, cursor=page.next_cursor) \
        if page.next_cursor else None
    return render_page(
        "conversations/index.html",
        {
            "conversation-results": "conversations/_results.html",
            "conversations-more": "conversations/_rows.html",
        },
        filters=filters,
        page_context=lambda: {"namespaces": store.namespaces()},
        rows=[_summary_row(conversation) for conversation in page.items],
        more_url=more_url,
    )


def _message_row(message: StoredMessage, analysis: dict[str, Any] | None) -> dict[str, Any]:
    summarised = analysis is not None and message.id in analysis["summarised_ids"]
    return {
        "id": message.id,
        "role": message.role,
        "created_at": format_time(message.created_at),
        "content": message.content or "",
        "tool_name": message.tool_name or "",
        "tool_input": "" if message.tool_input is None else pretty_json(message.tool_input),
        "tokens": estimate_tokens(as_history([message])),
        "fate": ("summarised" if summarised else "kept") if analysis and analysis["reason"] else "",
        "first_fire": analysis is not None and analysis["first_fire_id"] == message.id,
    }


def _full_history(store: ConversationLog, conversation_id: str, count: int) -> list[StoredMessage] | None:
    if count > ANALYSIS_LIMIT:
        return None
    return list(state.every_item(lambda cursor: store.messages(conversation_id, limit=1000, cursor=cursor)))


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
    page = store.messages(conversation_id, limit=MESSAGE_PAGE_SIZE, cursor=cursor)
    if cursor is None and page.next_cursor is None:
        history: list[StoredMessage] | None = page.items  # the first page is the whole history
    else:
        history = _full_history(store, conversation_id, conversation.message_count)
    analysis = analyse(history, max_messages, max_tokens) if history is not None else None
    what_if = {
        name: request.args[name] for name in ("max_messages", "max_tokens") if request.args.get(name)
    }
    more_url = (
        url_for("conversations.detail", conversation_id=conversation_id, cursor=page.next_cursor, **what_if)
        if page.next_cursor else None
    )
    return render_page(
        "conversations/detail.html",
        {"messages-more": "conversations/_messages.html"},
        conversation=_summary_row(conversation),
        metadata=preview_text(json.dumps(conversation.metadata, ensure_ascii=False), 400)
        if conversation.metadata else "",
        messages=[_message_row(message, analysis) for message in page.items],
        more_url=more_url,
        analysis=analysis,
        analysis_limit=ANALYSIS_LIMIT,
        configured=configured_thresholds(settings),
        what_if=bool(what_if),
    )
