"""The site switcher: which of ``CLAW_SITES`` a request shows, carried in every URL it makes.

The site is the ``site`` query parameter. Every ``url_for`` adds it, so links, htmx requests,
"load more" cursors and redirects keep it, and every GET form holds it as a hidden input
(``site_input()``, because a browser drops the query of a GET form's action). The first site of
``CLAW_SITES`` is the one shown without it, so with one site every address stays as it was.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, current_app, g, request, url_for

from dashboard import state

SITE_ARG = "site"
# Pages that name one thing (a conversation, a message, a key) which the other site most likely
# lacks: switching from them shows the list they belong to there, keeping these path values.
SWITCH_FALLBACK: dict[str, tuple[str, tuple[str, ...]]] = {
    "conversations.detail": ("conversations.index", ()),
    "conversations.turn": ("conversations.index", ()),
    "memory.entry": ("memory.namespace", ("namespace",)),
}
# Query values that only mean something on the site they came from.
SITE_BOUND_ARGS = frozenset({SITE_ARG, "cursor"})


def _sites() -> dict[str, Any]:
    return state.sites_of(current_app._get_current_object())  # type: ignore[attr-defined]


def _url_value(label: str | None) -> str | None:
    # The value of ?site= for the site ``label``: none for the first site, the one shown without it.
    return None if label is None or label == next(iter(_sites())) else label


def choose_site() -> None:
    """Set the request's site from ``?site=`` (the first of ``CLAW_SITES`` when absent); a label
    no site has is a 404 that names the sites there are."""
    if request.endpoint == "static":
        return
    sites = _sites()
    label = request.args.get(SITE_ARG, next(iter(sites)))
    if label not in sites:
        abort(404, description=f"No site is called {label[:40]!r}. This dashboard shows: {', '.join(sites)}.")
    g.clawmem_site = label


def add_site_to_url(endpoint: str, values: dict[str, Any]) -> None:
    """Make every URL built during a request keep its site (static files have none)."""
    label = _url_value(state.site_label())
    if endpoint != "static" and label is not None:
        values.setdefault(SITE_ARG, label)


def site_param() -> str | None:
    """Return the value of ``?site=`` that keeps the current site (``None`` on the first site)."""
    return _url_value(state.site_label())


def site_input() -> str:
    """Return the hidden input that keeps the site in a GET form, rendered (and autoescaped) by
    the macro of ``_site_input.html``, so every form template needs only ``{{ site_input() }}``."""
    return current_app.jinja_env.get_template("_site_input.html").module.site_input()


def switch_url(label: str) -> str:
    """Return this page on site ``label``: the same endpoint, path values and query, less a cursor
    (it points into this site's list); a page naming one record gives its list, unfiltered."""
    endpoint, view_args = request.endpoint or "overview.index", dict(request.view_args or {})
    query = {name: values for name, values in request.args.lists() if name not in SITE_BOUND_ARGS}
    if endpoint in SWITCH_FALLBACK:
        endpoint, kept = SWITCH_FALLBACK[endpoint]
        view_args = {name: value for name, value in view_args.items() if name in kept}
        query = {}
    return url_for(endpoint, **view_args, **query, **{SITE_ARG: _url_value(label)})


def _switcher() -> dict[str, Any]:
    label = state.site_label()
    if label is None:
        return {"site_nav": None}
    sites = _sites()
    others = (
        [
            {"label": other, "prefix": site.prefix, "url": switch_url(other)}
            for other, site in sites.items()
            if other != label
        ]
        if len(sites) > 1
        else []
    )
    # With CLAW_SITES unset the one site has no name of its own: its table prefix names it.
    named = bool(sites[label].settings.sites)
    return {"site_nav": {"label": label, "named": named, "prefix": sites[label].prefix, "others": others}}


def init_app(app: Flask) -> None:
    """Choose each request's site after the sign-in gate, and carry it in URLs and forms."""
    app.before_request(choose_site)
    app.url_defaults(add_site_to_url)
    app.context_processor(_switcher)
    app.jinja_env.globals.update(site_param=site_param, site_input=site_input)
