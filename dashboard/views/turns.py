"""What each turn of a conversation was given, and what the same message would be given now.

A turn's ``recall`` record names the entries it was given (namespace, key, score, line bytes,
status; never values). Each is shown beside the entry as it is now: unchanged, changed since,
expired, or gone. The per-turn preview runs recall for the turn's user message again, through
the index, and says which entries it would gain and lose.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from flask import abort, url_for

from clawmem.clock import now_seconds
from clawmem.errors import InvalidKey
from clawmem.recall import AugmentResult, MessageAugmenter
from clawmem.recall.injection import line_bytes
from clawmem.recall.words import text_of
from clawmem.rules import is_expired, subject_namespace, validate_namespace
from clawmem.sql.conversations import StoredMessage
from clawmem.turn.messages import validate_conversation_id
from dashboard import state
from dashboard.views.rendering import render_page

NOW_WORDS = {
    "unchanged": "unchanged since",
    "rewritten": "written again since, same size",
    "changed": "changed since",
    "expired": "expired since",
    "gone": "deleted since",
}


def given(record: StoredMessage) -> list[dict[str, Any]]:
    """Return the entries a ``recall`` row names, or ``[]`` when it cannot be read."""
    try:
        entries = json.loads(record.content or "[]")
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("key"), str)]


def _now_state(entry: dict[str, Any], row: Any, recorded_at: datetime, now: int) -> str:
    if row is None:
        return "gone"
    if is_expired(row.expires_at, now):
        return "expired"
    # The record holds no value, only the size of the line it injected: a different size is a
    # change; a later write of the same size may or may not have changed the value.
    if line_bytes(row.key, text_of(row.value)) != entry.get("bytes"):
        return "changed"
    if row.updated_at is not None and row.updated_at > recorded_at:
        return "rewritten"
    return "unchanged"


def _accepted(namespace: str) -> bool:
    try:
        validate_namespace(namespace)
    except ValueError:
        return False
    return True


def recall_rows(records: Sequence[StoredMessage]) -> dict[str, list[dict[str, Any]]]:
    """Return, per ``recall`` message id, its entries each with its state now and a link to the
    entry as it is now (one read for the whole page)."""
    entries = {record.id: given(record) for record in records}
    wanted: dict[str, set[str]] = {}
    for listed in entries.values():
        for entry in listed:
            wanted.setdefault(str(entry.get("namespace") or ""), set()).add(entry["key"])
    driver, now = state.driver(), now_seconds(state.clock())
    # A namespace the rules no longer accept: nothing can be read there.
    readable = {namespace: keys for namespace, keys in wanted.items() if _accepted(namespace)}
    rows = driver.fetch_across(readable)
    shown: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        shown[record.id] = []
        for entry in entries[record.id]:
            namespace = str(entry.get("namespace") or "")
            now_state = _now_state(entry, rows.get((namespace, entry["key"])), record.created_at, now)
            shown[record.id].append(
                {
                    "namespace": namespace,
                    "key": entry["key"],
                    "score": entry.get("score"),
                    "status": entry.get("status"),
                    "now": now_state,
                    "now_words": NOW_WORDS[now_state],
                    "url": None
                    if now_state == "gone"
                    else url_for("memory.entry", namespace=namespace, key=entry["key"]),
                }
            )
    return shown


def preview_now(message: str, user_id: str) -> AugmentResult:
    """Return what ``message`` would be given now, as a turn of this subject would run it."""
    settings = state.settings()
    augmenter = MessageAugmenter.from_settings(state.memory(), settings, announce=False)
    subject = subject_namespace(user_id, settings.subject_namespace) if user_id else None
    return augmenter.augment(message, subject)


def turn_preview(conversation_id: str, message_id: str) -> str:
    """Render the per-turn preview of one user message: what it was given, what it would be
    given now, and the difference."""
    try:
        validate_conversation_id(conversation_id)
    except InvalidKey:
        abort(404, description="No conversation has this id.")
    store = state.conversations()
    conversation = store.get(conversation_id)
    if conversation is None:
        abort(404, description="No conversation has this id; it may have been deleted or pruned.")
    turn = store.turn(conversation_id, message_id)
    if turn is None:
        abort(404, description="This conversation has no user message with this id.")
    record, message = turn
    given_then = recall_rows([record])[record.id] if record is not None else []
    then = [(entry["namespace"], entry["key"]) for entry in given_then]
    result = preview_now(message.content or "", conversation.user_id)
    now = [(d.namespace, d.key) for d in result.decisions[: result.top_k] if d.injected]
    return render_page(
        "conversations/turn.html",
        {f"turn-{message_id}": "conversations/_turn_preview.html"},
        conversation=conversation,
        message=message,
        recorded=record is not None,
        given_then=given_then,
        given_now=[
            {"namespace": namespace, "key": key, "url": url_for("memory.entry", namespace=namespace, key=key)}
            for namespace, key in now
        ],
        gained=[pair for pair in now if pair not in then],
        lost=[pair for pair in then if pair not in now],
        text=result.text,
    )
