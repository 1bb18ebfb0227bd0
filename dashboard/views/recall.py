"""What memory reaches the model: the injection preview and the cold-memory report.

Both run the real :class:`clawmem.MessageAugmenter`; nothing here scores or ranks on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, request, url_for

from clawmem.clock import now_seconds
from clawmem.errors import GuardBlocked
from clawmem.guards import PiiGuard
from clawmem.memory.rules import validate_namespace
from clawmem.prompt import CUT_BYTE_CAP, CUT_TOP_K, INJECTED, TRUNCATED, ZERO_OVERLAP
from clawmem.ranking import ranker_for
from clawmem.recall import DEFAULT_MAX_RECALL_BYTES, AugmentResult, MessageAugmenter, injection_counts
from dashboard import state
from dashboard.views.rendering import (
    format_bytes,
    int_arg,
    offset_cursor,
    offset_from_cursor,
    render_page,
    text_arg,
)

bp = Blueprint("recall", __name__)

DECISION_PAGE_SIZE = 50
COLD_PAGE_SIZE = 50
MAX_MESSAGE_CHARS = 20_000
# What the preview says about the scoring it shows (CLAW_RECALL_SCORING).
SCORING_WORDS = {
    "clawmem": "clawmem's scoring: words of the key and the value (Unicode letters and digits), ties by "
    "key, from the recall namespace and the subject's",
    "phpclaw": "phpClaw's own scoring, byte for byte: words of the value only (ASCII letters, as PHP's "
    "str_word_count), arrays as PHP's json_encode writes them, ties by PHP's comparison of the values "
    "and then by insertion order, from the recall namespace only",
}
STATUS_WORDS = {
    INJECTED: "injected",
    TRUNCATED: "injected, cut to fit",
    ZERO_OVERLAP: "dropped: no shared word",
    CUT_TOP_K: "cut: top-k",
    CUT_BYTE_CAP: "cut: byte budget",
}


def _namespace_arg() -> str:
    # Read past the 100-character limit so that a longer name is refused, not cut to another one.
    return validate_namespace(text_arg("namespace", 1000) or state.settings().recall_namespace)


def _namespace_page(selected: str) -> Callable[[], dict[str, Any]]:
    # The namespace picker is on the full page only, so htmx keystrokes never list namespaces.
    # Names only (no per-state counts): the drivers answer this from an index.
    def page() -> dict[str, Any]:
        recall_namespace = state.settings().recall_namespace
        return {"namespaces": sorted({*state.driver().namespaces(), recall_namespace, selected})}

    return page


def _guard_outcome(result: AugmentResult) -> dict[str, Any]:
    """Return what the configured PII guard (``CLAW_PII_GUARD``, ``CLAW_PII_ALLOW_KEYS``) would do
    to ``result``: ``outcome`` is ``blocked``, ``redacted``, ``warned``, ``clean`` or ``off``;
    ``text`` is what would be sent; ``ignored`` lists the findings of allowed keys."""
    settings = state.settings()
    guard = PiiGuard(settings.pii_guard, settings.allowed_pii_keys)
    findings = guard.find(result)
    every = PiiGuard("warn").find(result) if guard.mode != "off" else []
    shown = {
        "mode": guard.mode,
        "findings": [{"pattern": f.pattern, "source": f.source} for f in findings],
        "ignored": [{"pattern": f.pattern, "source": f.source} for f in every if f not in findings],
        "text": result.text,
    }
    if guard.mode == "off":
        return {**shown, "outcome": "off"}
    if guard.mode == "block" and findings:
        # Not apply(): it would announce guard.blocked for a turn that never ran.
        return {**shown, "outcome": "blocked"}
    try:
        guarded = guard.apply(result)
    except GuardBlocked:  # only block mode raises, and it was handled above
        return {**shown, "outcome": "blocked"}
    outcome = "clean" if not findings else "redacted" if guard.mode == "redact" else "warned"
    return {**shown, "outcome": outcome, "text": guarded.text}


@bp.get("/preview")
def preview() -> str:
    """Show exactly what ``augment`` would send for a message: the text, every entry's score and
    fate, the bytes of the budget used, and whether the PII guard would block the turn."""
    message = request.args.get("message", "")[:MAX_MESSAGE_CHARS]
    namespace = _namespace_arg()
    settings = state.settings()
    offset = offset_from_cursor(text_arg("cursor", 200))
    report: dict[str, Any] | None = None
    decisions: list[dict[str, Any]] = []
    more_url = None
    if message.strip():
        augmenter = MessageAugmenter(
            state.memory(),
            top_k=settings.recall_top_k,
            namespace=namespace,
            announce=False,
            ranker=ranker_for(settings.recall_scoring),
        )
        result = augmenter.augment(message)
        guard = _guard_outcome(result)
        shown = result.decisions[offset:offset + DECISION_PAGE_SIZE]
        decisions = [
            {"key": d.key, "score": d.score, "bytes": d.bytes, "status": d.status,
             "status_words": STATUS_WORDS.get(d.status, d.status), "reason": d.reason, "injected": d.injected,
             "matched": ", ".join(d.matched),
             "url": url_for("memory.entry", namespace=d.namespace or namespace, key=d.key)}
            for d in shown
        ]
        if offset + DECISION_PAGE_SIZE < len(result.decisions):
            more_url = url_for("recall.preview", message=message, namespace=namespace,
                               cursor=offset_cursor(offset + DECISION_PAGE_SIZE))
        report = {
            "text": guard["text"],
            "changed": result.changed,
            "bytes_used": result.bytes_used,
            "budget": result.max_recall_bytes,
            "injected": len(result.injected_keys),
            "entries": len(result.decisions) + result.zero_overlap,
            "hits": len(result.decisions),
            "zero_overlap": result.zero_overlap,
            "error": result.error,
            "guard": guard,
            "scoring": {"name": settings.recall_scoring, "words": SCORING_WORDS[settings.recall_scoring]},
        }
    return render_page(
        "recall/preview.html",
        {"preview-result": "recall/_preview_result.html", "decisions-more": "recall/_decisions.html"},
        message=message,
        namespace=namespace,
        page_context=_namespace_page(namespace),
        top_k=settings.recall_top_k,
        budget=DEFAULT_MAX_RECALL_BYTES,
        report=report,
        decisions=decisions,
        more_url=more_url,
    )


@bp.get("/cold")
def cold() -> str:
    """Entries that none of the last ``n`` user messages would have injected, and their share of
    the namespace: stored memory that never reaches the model."""
    count = int_arg("n", 50, 1, 1000)
    namespace = _namespace_arg()
    settings = state.settings()
    offset = offset_from_cursor(text_arg("cursor", 200))
    messages = state.conversations().recent_user_messages(count)
    now = now_seconds(state.clock())
    memory = state.memory()
    injections = injection_counts(
        memory,
        (m.content or "" for m in messages),
        namespace,
        settings.recall_top_k,
        now,
        ranker=ranker_for(settings.recall_scoring),
    )
    # Sizes are those of the entries' injection lines: what each would cost in a prompt.
    sizes = state.driver().word_index(namespace).live_sizes(now)
    cold_keys = [key for key in sizes if key not in injections]
    cold_bytes = sum(sizes[key] for key in cold_keys)
    total_bytes = sum(sizes.values())
    rows = [
        {"key": key, "bytes": format_bytes(sizes[key]),
         "url": url_for("memory.entry", namespace=namespace, key=key)}
        for key in cold_keys[offset:offset + COLD_PAGE_SIZE]
    ]
    more_url = None
    if offset + COLD_PAGE_SIZE < len(cold_keys):
        more_url = url_for("recall.cold", n=count, namespace=namespace,
                           cursor=offset_cursor(offset + COLD_PAGE_SIZE))
    summary = {
        "messages": len(messages),
        "entries": len(sizes),
        "cold": len(cold_keys),
        "cold_percent": round(100 * len(cold_keys) / len(sizes), 1) if sizes else 0.0,
        "cold_bytes": format_bytes(cold_bytes),
        "total_bytes": format_bytes(total_bytes),
        "cold_bytes_percent": round(100 * cold_bytes / total_bytes, 1) if total_bytes else 0.0,
    }
    hot = [{"key": key, "times": times, "url": url_for("memory.entry", namespace=namespace, key=key)}
           for key, times in sorted(injections.items(), key=lambda item: (-item[1], item[0]))[:10]]
    return render_page(
        "recall/cold.html",
        {"cold-more": "recall/_cold_rows.html"},
        n=count,
        namespace=namespace,
        page_context=_namespace_page(namespace),
        top_k=settings.recall_top_k,
        summary=summary,
        rows=rows,
        hot=hot,
        more_url=more_url,
    )
