"""What memory reaches the model: the injection preview (with another scoring beside it, when
asked), its unmatched entries and the cold-memory report.

Each page shows what :mod:`clawmem.recall` answers (a :class:`clawmem.MessageAugmenter` turn,
or :mod:`clawmem.recall.survey`); nothing here scores or ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, request, url_for

from clawmem.clock import now_seconds
from clawmem.errors import GuardBlocked
from clawmem.paging import decode_cursor, encode_cursor
from clawmem.prompt import BELOW_MIN_SCORE, CUT_BYTE_CAP, CUT_TOP_K, INJECTED, TRUNCATED, ZERO_OVERLAP
from clawmem.recall import DEFAULT_MAX_RECALL_BYTES, AugmentResult, EntryDecision, MessageAugmenter
from clawmem.recall.compare import Side, compare
from clawmem.recall.phpclaw import ranker_for
from clawmem.recall.survey import InjectionSurvey, survey, unmatched_entries
from clawmem.rules import subject_namespace, validate_namespace
from clawmem.turn.guards import PiiGuard
from dashboard import state
from dashboard.views.memory import ttl_label
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
UNMATCHED_PAGE_SIZE = 50
COLD_MESSAGES = 50  # user messages the cold-memory report reads unless asked for more
MAX_MESSAGE_CHARS = 20_000
# What the preview says about the scoring it shows (CLAW_RECALL_SCORING).
SCORING_WORDS = {
    "clawmem": "clawmem's scoring: words of the key and the value (Unicode letters and digits), ties by "
    "key, from the recall namespace and the subject's",
    "phpclaw": "phpClaw's own scoring, byte for byte: words of the value only (ASCII letters, as PHP's "
    "str_word_count), arrays as PHP's json_encode writes them, ties by PHP's comparison of the values "
    "and then by insertion order, from the recall namespace only",
    "weighted": "weighted: rarer words weigh more (BM25 over the namespaces read together), words of the "
    "key and the value",
    "semantic": "semantic: the cosine of local sentence embeddings of the message and each entry",
    "hybrid": "hybrid: weighted and semantic fused by z-scores over both candidate lists, and lifted "
    "when the entry's time falls in one the message names",
}
STATUS_WORDS = {
    INJECTED: "injected",
    TRUNCATED: "injected, cut to fit",
    ZERO_OVERLAP: "dropped: no shared word",
    CUT_TOP_K: "cut: top-k",
    CUT_BYTE_CAP: "cut: byte budget",
    BELOW_MIN_SCORE: "dropped: below the floor",
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
    # A subject's turn reads their own namespace beside the recall namespace, as Claw.send does.
    user_id = text_arg("user_id", 255)
    subject = subject_namespace(user_id, settings.subject_namespace) if user_id else None
    offset = offset_from_cursor(text_arg("cursor", 200))
    report: dict[str, Any] | None = None
    decisions: list[dict[str, Any]] = []
    more_url = None
    if message.strip():
        augmenter = MessageAugmenter.from_settings(
            state.memory(), settings, announce=False, namespace=namespace
        )
        result = augmenter.augment(message, subject)
        guard = _guard_outcome(result)
        shown = result.decisions[offset : offset + DECISION_PAGE_SIZE]
        decisions = [
            {
                "key": d.key,
                "namespace": d.namespace or namespace,
                "score": round(d.score, 4) if isinstance(d.score, float) else d.score,
                "signals": "; ".join(f"{name}: {value}" for name, value in d.signals),
                "bytes": d.bytes,
                "status": d.status,
                "status_words": STATUS_WORDS.get(d.status, d.status),
                "reason": d.reason,
                "injected": d.injected,
                "matched": ", ".join(result.matched_words(d)),
                "url": url_for("memory.entry", namespace=d.namespace or namespace, key=d.key),
            }
            for d in shown
        ]
        if offset + DECISION_PAGE_SIZE < len(result.decisions):
            more_url = url_for(
                "recall.preview",
                message=message,
                namespace=namespace,
                **({"user_id": user_id} if user_id else {}),
                cursor=offset_cursor(offset + DECISION_PAGE_SIZE),
            )
        report = {
            "text": guard["text"],
            "changed": result.changed,
            "bytes_used": result.bytes_used,
            "budget": result.max_recall_bytes,
            "injected": len(result.injected_keys),
            "entries": len(result.decisions) + result.zero_overlap,
            "hits": len(result.decisions),
            "zero_overlap": result.zero_overlap,
            "unmatched_url": url_for("recall.unmatched", message=message, namespace=namespace),
            "error": result.error,
            "semantic": result.semantic_coverage,
            "guard": guard,
            "scoring": {"name": settings.recall_scoring, "words": SCORING_WORDS[settings.recall_scoring]},
            "stemming": result.stemming,
        }
    comparison, compare_error = _comparison(message, namespace, subject)
    return render_page(
        "recall/preview.html",
        {"preview-result": "recall/_preview_result.html", "decisions-more": "recall/_decisions.html"},
        message=message,
        namespace=namespace,
        user_id=user_id,
        subject_namespace=subject,
        page_context=_namespace_page(namespace),
        top_k=settings.recall_top_k,
        budget=DEFAULT_MAX_RECALL_BYTES,
        report=report,
        decisions=decisions,
        more_url=more_url,
        scorings=[name for name in SCORING_WORDS if name != settings.recall_scoring],
        scoring=settings.recall_scoring,
        compare_with=request.args.get("compare", "")[:40],
        comparison=comparison,
        compare_error=compare_error,
    )


def _decision_row(decision: EntryDecision, namespace: str, result: AugmentResult) -> dict[str, Any]:
    return {
        "key": decision.key,
        "namespace": decision.namespace or namespace,
        "score": round(decision.score, 4) if isinstance(decision.score, float) else decision.score,
        "signals": "; ".join(f"{name}: {value}" for name, value in decision.signals),
        "matched": ", ".join(result.matched_words(decision)),
        "url": url_for("memory.entry", namespace=decision.namespace or namespace, key=decision.key),
    }


def _comparison(
    message: str, namespace: str, subject: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    """Return what recall's comparison of the configured scoring and ``?compare=`` says about
    ``message`` (or ``None``), and the error to show for a scoring that does not exist."""
    other = request.args.get("compare", "")[:40]
    if not other or not message.strip():
        return None, None
    settings = state.settings()
    if other not in SCORING_WORDS:
        return None, f"There is no scoring {other!r}: choose one of {', '.join(SCORING_WORDS)}."
    found = compare(state.memory(), settings, message, [settings.recall_scoring, other], namespace, subject)

    def side(shown: Side) -> dict[str, Any]:
        return {
            "scoring": shown.scoring,
            "words": SCORING_WORDS[shown.scoring],
            "injected": [_decision_row(d, namespace, shown.result) for d in shown.injected],
            "bytes_used": shown.result.bytes_used,
            "error": shown.result.error,
        }

    return {
        "first": side(found.first),
        "second": side(found.second),
        "gained": [_decision_row(d, namespace, found.second.result) for d in found.gained],
        "lost": [_decision_row(d, namespace, found.first.result) for d in found.lost],
        "kept": [_decision_row(d, namespace, found.second.result) for d in found.kept],
        "same": found.same,
    }, None


def injection_survey(count: int, namespace: str) -> InjectionSurvey:
    """Return recall's survey of the last ``count`` user messages over ``namespace``, under the
    configured top-k and scoring."""
    settings = state.settings()
    messages = state.conversations().recent_user_messages(count)
    return survey(
        state.memory(),
        [m.content or "" for m in messages],
        namespace,
        settings.recall_top_k,
        now_seconds(state.clock()),
        ranker_for(settings.recall_scoring, settings.recall_embedder, settings.recall_stemming),
    )


@bp.get("/cold")
def cold() -> str:
    """Entries that none of the last ``n`` user messages would have injected, and their share of
    the namespace: stored memory that never reaches the model."""
    count = int_arg("n", COLD_MESSAGES, 1, 1000)
    namespace = _namespace_arg()
    settings = state.settings()
    offset = offset_from_cursor(text_arg("cursor", 200))
    found = injection_survey(count, namespace)
    read, injections, sizes = found.messages, found.injections, found.sizes
    cold_keys, cold_bytes, total_bytes = found.cold, found.cold_bytes, found.total_bytes
    rows = [
        {
            "key": key,
            "bytes": format_bytes(sizes[key]),
            "url": url_for("memory.entry", namespace=namespace, key=key),
        }
        for key in cold_keys[offset : offset + COLD_PAGE_SIZE]
    ]
    more_url = None
    if offset + COLD_PAGE_SIZE < len(cold_keys):
        more_url = url_for(
            "recall.cold", n=count, namespace=namespace, cursor=offset_cursor(offset + COLD_PAGE_SIZE)
        )
    summary = {
        "messages": read,
        "entries": len(sizes),
        "cold": len(cold_keys),
        "cold_percent": round(100 * len(cold_keys) / len(sizes), 1) if sizes else 0.0,
        "cold_bytes": format_bytes(cold_bytes),
        "total_bytes": format_bytes(total_bytes),
        "cold_bytes_percent": round(100 * cold_bytes / total_bytes, 1) if total_bytes else 0.0,
    }
    hot = [
        {"key": key, "times": times, "url": url_for("memory.entry", namespace=namespace, key=key)}
        for key, times in sorted(injections.items(), key=lambda item: (-item[1], item[0]))[:10]
    ]
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


@bp.get("/preview/unmatched")
def unmatched() -> str:
    """The live entries of the preview's namespace that share no word with the message (score 0,
    so never injected), by key, a page at a time: each key's line size and TTL, never its value."""
    message = request.args.get("message", "")[:MAX_MESSAGE_CHARS]
    namespace = _namespace_arg()
    cursor = text_arg("cursor", 500)
    after = decode_cursor(cursor, 1)[0] if cursor else None
    now = now_seconds(state.clock())
    settings = state.settings()
    ranker = ranker_for(settings.recall_scoring, settings.recall_embedder, settings.recall_stemming)
    count, found = unmatched_entries(
        state.memory(), message, namespace, now, after, UNMATCHED_PAGE_SIZE + 1, ranker
    )
    rows = [
        {
            "key": key,
            "bytes": format_bytes(size),
            "ttl": ttl_label(expires_at, now)[1],
            "url": url_for("memory.entry", namespace=namespace, key=key),
        }
        for key, size, expires_at in found[:UNMATCHED_PAGE_SIZE]
    ]
    more_url = None
    if len(found) > UNMATCHED_PAGE_SIZE:
        more_url = url_for(
            "recall.unmatched",
            message=message,
            namespace=namespace,
            cursor=encode_cursor([found[UNMATCHED_PAGE_SIZE - 1][0]]),
        )
    return render_page(
        "recall/unmatched.html",
        {"unmatched": "recall/_unmatched.html", "unmatched-more": "recall/_unmatched_rows.html"},
        message=message,
        namespace=namespace,
        count=count,
        rows=rows,
        more_url=more_url,
        preview_url=url_for("recall.preview", message=message, namespace=namespace),
    )
