"""Sites: which table prefixes the database holds, which of them this dashboard shows, how
each memory driver keeps sites apart, and a live check that this site sees nothing of another's."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app

from clawmem.errors import ConfigError
from clawmem.privacy.isolation import (
    DRIVER_RULES,
    SAMPLE_CONVERSATIONS,
    SAMPLE_KEYS,
    SAMPLE_NAMESPACES,
    check_separation,
    memory_location,
)
from clawmem.sql.schema import detect_shape
from clawmem.sql.sizes import TABLE_SUFFIXES, prefixes_found
from dashboard import state
from dashboard.views.rendering import render_page, shell_command

bp = Blueprint("sites", __name__, url_prefix="/sites")

SEEN_LISTED = 10


def _shape(prefix: str) -> str:
    try:
        return detect_shape(state.engine(), prefix) or "no memory table"
    except ConfigError:
        return "neither clawmem's nor phpClaw's shape"


def _prefix_rows(labels: dict[str, str], current: str, command_prefix: str) -> list[dict[str, Any]]:
    found = prefixes_found(state.engine())
    rows = []
    for prefix in sorted(set(found) | set(labels)):
        tables = found.get(prefix, [])
        rows.append(
            {
                "prefix": prefix,
                "shown": prefix or "(no prefix)",
                "tables": [name[len(prefix) :] for name in tables],
                "missing": len(tables) < len(TABLE_SUFFIXES),
                "shape": _shape(prefix) if tables else None,
                "label": labels.get(prefix),
                "current": prefix == current,
                "commands": prefix == command_prefix,
            }
        )
    return rows


def _separation_row(label: str, this: Any, other: Any) -> dict[str, Any]:
    found = check_separation(this, other)
    return {
        "label": label,
        "prefix": other.prefix or "(no prefix)",
        "place": found.other_place,
        "shared_place": found.shared_place,
        "apart": found.apart,
        "entries": found.entries_checked,
        "conversations": found.conversations_checked,
        "seen_entries": [
            {"namespace": namespace, "key": key} for namespace, key in found.seen_entries[:SEEN_LISTED]
        ],
        "seen_entry_count": len(found.seen_entries),
        "seen_conversations": found.seen_conversations[:SEEN_LISTED],
        "seen_conversation_count": len(found.seen_conversations),
        "alike_count": len(found.alike_entries),
    }


@bp.get("/")
def index() -> str:
    """The prefixes found and configured, each driver's rule, and the live separation check."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    sites = state.sites_of(app)
    label, this = state.site_label() or next(iter(sites)), state.site()
    labels = {site.prefix: name for name, site in sites.items()}
    driver = this.settings.memory_driver
    checks = [
        _separation_row(other_label, this, other)
        for other_label, other in sites.items()
        if other_label != label
    ]
    return render_page(
        "sites/index.html",
        {},
        site={
            "label": label,
            "prefix": this.prefix,
            "place": memory_location(this),
            "driver": driver,
            "named": bool(this.settings.sites),
        },
        prefixes=_prefix_rows(labels, this.prefix, state.site_of(app).prefix),
        rules=[
            {"driver": name, "rule": rule, "in_use": name == driver} for name, rule in DRIVER_RULES.items()
        ],
        other_driver=None if driver in DRIVER_RULES else driver,
        checks=checks,
        all_apart=all(check["apart"] for check in checks),
        sample={
            "namespaces": SAMPLE_NAMESPACES,
            "per_namespace": SAMPLE_KEYS,
            "conversations": SAMPLE_CONVERSATIONS,
        },
        init_db=shell_command("flask", "claw", "init-db"),
    )
