"""Signing in and out, and the gate that keeps every other page behind a login."""

from __future__ import annotations

import math
import re
from urllib.parse import quote, urlsplit

from flask import Blueprint, Flask, Response, g, redirect, render_template, request, session, url_for
from werkzeug.wrappers import Response as BaseResponse

from dashboard import accounts, state
from dashboard.security import check_csrf

bp = Blueprint("auth", __name__)

# Endpoints reachable without signing in. Everything else, including routes added later, is gated.
PUBLIC_ENDPOINTS = frozenset({"auth.login", "health.healthz", "health.readyz", "static"})
SESSION_TOKEN = "sid"
LOGIN_ERROR = "Unknown username or wrong password."
# C0 and C1 controls, DEL, any whitespace, and the backslash: never in an address we issue.
_UNSAFE_IN_NEXT = re.compile(r"[\x00-\x20\x7f-\x9f\s\\]")


def _safe_next(target: str | None) -> str:
    """Return ``target`` when it is a path on this site, else the overview's address."""
    # Browsers drop tabs and newlines inside a URL and treat a backslash as a slash, so
    # "/\t//evil.example" would leave the site: any control, space or backslash is refused
    # outright (a newline would also fail the Location header), and the host part is judged
    # only after that.
    if target and not _UNSAFE_IN_NEXT.search(target):
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc and target.startswith("/") and not target.startswith("//"):
            return target
    return url_for("overview.index")


def _now() -> float:
    return state.clock()()


def _client_address() -> str:
    return (request.remote_addr or "unknown")[:64]


@bp.route("/login", methods=["GET", "POST"])
def login() -> str | BaseResponse | tuple[str, int]:
    """Show the sign-in form, or check it: same error for an unknown name and a wrong password."""
    next_url = _safe_next(request.values.get("next"))
    if request.method != "POST":  # GET, and HEAD, which must never sign anyone in
        if accounts.session_admin(session.get(SESSION_TOKEN), _now()) is not None:
            return redirect(next_url)
        return render_template("auth/login.html", next_url=next_url, error=None, username="")
    check_csrf(request)
    username = request.form.get("username", "")[:200]
    password = request.form.get("password", "")[:1000]
    address, now = _client_address(), _now()
    # Counted as a failure before the password is checked, in one step with the limit check,
    # so concurrent guesses cannot all slip through; a success clears it below.
    if not accounts.begin_attempt(address, username, now):
        wait = accounts.login_blocked_for(address, username, now)
        minutes = max(1, math.ceil(wait / 60))
        error = f"Too many failed sign-ins. Try again in {minutes} minute{'s' if minutes != 1 else ''}."
        return render_template("auth/login.html", next_url=next_url, error=error, username=username), 429
    admin = accounts.authenticate(username, password)
    if admin is None:
        return render_template("auth/login.html", next_url=next_url, error=LOGIN_ERROR, username=username)
    accounts.clear_failures(address, username)
    # A fresh session (and CSRF token) on sign-in, so a token planted before it is worthless.
    session.clear()
    session[SESSION_TOKEN] = accounts.start_session(admin, now)
    return redirect(next_url)


@bp.post("/logout")
def logout() -> BaseResponse:
    """End the session on the server, so a copy of the old cookie no longer signs anyone in."""
    check_csrf(request)
    accounts.end_session(session.get(SESSION_TOKEN))
    session.clear()
    return redirect(url_for("auth.login"))


def _asked_for() -> str:
    # The path percent-encoded, so a subject id with a space or a backslash comes back intact
    # through the sign-in form instead of being refused by _safe_next.
    query = request.query_string.decode("latin-1")
    return quote(request.path, safe="/") + (f"?{query}" if query else "")


def require_login() -> BaseResponse | None:
    """Send an anonymous request to the sign-in page; let a signed-in one through with ``g.admin`` set."""
    if request.endpoint is None or request.endpoint in PUBLIC_ENDPOINTS:
        return None  # unknown URL or method: the 404/405 follows and shows nothing
    admin = accounts.session_admin(session.get(SESSION_TOKEN), _now())
    if admin is None:
        session.pop(SESSION_TOKEN, None)
        login_url = url_for("auth.login", next=_asked_for())
        if request.headers.get("HX-Request") == "true":
            # htmx would swap a redirected login form into a fragment; make it load the page instead.
            response = Response("sign in required", status=401, mimetype="text/plain")
            response.headers["HX-Redirect"] = login_url
            return response
        return redirect(login_url)
    g.admin = admin
    return None


def init_app(app: Flask) -> None:
    """Register the sign-in pages and put every other endpoint behind the login gate."""
    app.register_blueprint(bp)
    app.before_request(require_login)
