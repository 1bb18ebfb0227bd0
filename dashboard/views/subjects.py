"""Subjects: everything export covers for one person, on one page, and its export as JSON.

The page reads through the same core functions the CLI's ``export`` and ``erase`` run
(:func:`clawmem.sites.erasure.subject_mentions`, :func:`clawmem.sites.erasure.export_subject`), so what
it lists is what those commands would take.
"""

from __future__ import annotations

import io
import itertools
from typing import Any

from flask import Blueprint, Response, abort, redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from clawmem.clock import now_seconds
from clawmem.privacy import erasure
from clawmem.privacy.subjects import Subject
from clawmem.rules import subject_namespace
from dashboard import state
from dashboard.views.conversations import _row_links, _summary_row
from dashboard.views.memory import entry_row
from dashboard.views.rendering import render_page, shell_command, text_arg

bp = Blueprint("subjects", __name__, url_prefix="/subjects")

PAGE_SIZE = 50  # conversations and entries listed; the counts above them are exact
MENTIONS_LISTED = 50
MAX_USER_ID = 255


def _user_id(raw: str) -> str:
    if not raw or len(raw) > MAX_USER_ID or raw != raw.strip():
        abort(404, description="No subject can have this id: user ids are 1 to 255 characters.")
    return raw


@bp.get("/")
def index() -> BaseResponse | str:
    """The subject search box; a submitted ``user_id`` leads to that subject's page."""
    user_id = text_arg("user_id", MAX_USER_ID)
    if user_id:
        return redirect(url_for("subjects.detail", user_id=user_id))
    return render_page("subjects/index.html", {})


def subject_commands(user_id: str) -> dict[str, str]:
    """Return the export and erase commands for ``user_id``, the erasure previewed first."""
    claw = ("flask", "claw")
    return {
        "export": shell_command(*claw, "export", "--user-id", user_id, "--output", "subject.json"),
        "erase_preview": shell_command(*claw, "erase", "--user-id", user_id, "--dry-run", "--verbose"),
        "erase": shell_command(*claw, "erase", "--user-id", user_id, "--yes"),
    }


MENTIONS_TARGET = "subject-mentions"
SEARCH_MENTIONS = "mentions"  # the query parameter that asks for the mentions on the page itself


def _mentions(user_id: str, now: int) -> dict[str, Any]:
    """Return the first :data:`MENTIONS_LISTED` entries elsewhere that mention ``user_id``, from
    exactly the query export and erase run, and whether there are more."""
    found = erasure.subject_mentions(state.site(), Subject(user_id=user_id))
    mentions = [row for row, _ in itertools.islice(found, MENTIONS_LISTED + 1)]
    return {
        "mentions": [entry_row(row, now) for row in mentions[:MENTIONS_LISTED]],
        "more_mentions": len(mentions) > MENTIONS_LISTED,
        "mentions_searched": True,
    }


@bp.get("/<path:user_id>")
def detail(user_id: str) -> str:
    """One subject: their conversations with counts and tokens, their namespace's entries with
    TTL states, the entries elsewhere that mention them, and the export and erase commands.

    The mentions are a scan of every entry in every other namespace (no index holds a whole
    token of a key or value), so the page comes first and that section follows in a request of
    its own; without JavaScript its link reloads the page with the section filled in
    (``?mentions=1``).
    """
    user_id = _user_id(user_id)
    now = now_seconds(state.clock())
    not_searched = erasure.mentions_not_searched(Subject(user_id=user_id))
    searched = not_searched is None and bool(request.args.get(SEARCH_MENTIONS))
    mentions_url = url_for("subjects.detail", user_id=user_id, **{SEARCH_MENTIONS: 1})
    shared: dict[str, Any] = {
        "user_id": user_id,
        "mentions_not_searched": not_searched,
        "mentions_url": mentions_url,
        **(
            _mentions(user_id, now)
            if searched
            else {"mentions": [], "more_mentions": False, "mentions_searched": False}
        ),
    }
    return render_page(
        "subjects/detail.html",
        {MENTIONS_TARGET: "subjects/_mentions.html"} if searched else {},
        lambda: _subject_context(user_id, now),
        **shared,
    )


def _subject_context(user_id: str, now: int) -> dict[str, Any]:
    """Return what the subject page shows above the mentions: totals, the newest conversations,
    their own namespace's entries, and the commands."""
    settings, store, driver = state.settings(), state.conversations(), state.driver()
    own = subject_namespace(user_id, settings.subject_namespace)
    page = store.list(limit=PAGE_SIZE, sort="updated", user_id=user_id)
    own_total = driver.count(own)
    own_page = driver.entries(own, limit=PAGE_SIZE) if own_total else None
    links = _row_links()
    return {
        "totals": store.subject_totals(user_id),
        "conversations": [_summary_row(conversation, links) for conversation in page.items],
        "more_conversations_url": url_for("conversations.index", user_id=user_id, sort="-updated")
        if page.next_cursor
        else None,
        "namespace": own,
        "namespace_url": url_for("memory.namespace", namespace=own) if own_total else None,
        "namespace_total": own_total,
        "entries": [entry_row(row, now) for row in own_page.items] if own_page else [],
        "more_entries": bool(own_page and own_page.next_cursor),
        "commands": subject_commands(user_id),
        "export_url": url_for("subjects.export", user_id=user_id),
        "store_messages": settings.store_messages,
    }


@bp.get("/<path:user_id>/export.json")
def export(user_id: str) -> Response:
    """The subject's export, byte for byte what ``flask claw export --user-id`` writes (read-only)."""
    user_id = _user_id(user_id.removesuffix("/"))
    out = io.StringIO()
    erasure.export_subject(state.site(), Subject(user_id=user_id), out)
    response = Response(out.getvalue(), mimetype="application/json")
    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in user_id)[:60]
    response.headers["Content-Disposition"] = f'attachment; filename="subject-{safe}.json"'
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
