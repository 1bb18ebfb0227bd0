"""Response headers, the session cookie, the secret key and CSRF tokens of the dashboard."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from flask import Flask, Request, Response, abort, request, session
from flask.sessions import SecureCookieSessionInterface
from werkzeug.middleware.proxy_fix import ProxyFix

from clawmem.crypto.keyfile import MIN_KEY_CHARS, kept_key
from clawmem.errors import ConfigError

SECRET_KEY_FILE = "secret_key"
MIN_SECRET_KEY_CHARS = MIN_KEY_CHARS
# The largest request body read: only the sign-in and sign-out forms have one, and they are tiny.
MAX_BODY_BYTES = 64 * 1024
# The longest query string and query value any page takes (the preview's message is the longest
# text); anything longer, or holding a NUL, is refused before a view or the database sees it.
MAX_QUERY_BYTES = 128 * 1024
MAX_PARAMETER_CHARS = 20_000
CSRF_SESSION_KEY = "csrf"
CSRF_FIELD = "csrf_token"

CONTENT_SECURITY_POLICY = "default-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def load_or_create_secret_key(instance_path: str | os.PathLike[str]) -> str:
    """Return the secret key stored in ``<instance>/secret_key``, creating it (mode 0600) on
    first use; several workers starting at once all read the one key that won. Raises
    :class:`~clawmem.errors.KeyFileError` when it cannot be read or made, or is too short."""
    return kept_key(Path(instance_path) / SECRET_KEY_FILE, "a secret key", "delete it to regenerate")


def check_secret_key(key: object) -> str:
    """Return a configured ``SECRET_KEY`` (``CLAW_SECRET_KEY``); raise :class:`ConfigError` in one
    line when it is too short to sign sessions safely."""
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    if len(text) < MIN_SECRET_KEY_CHARS:
        raise ConfigError(
            f"CLAW_SECRET_KEY must be at least {MIN_SECRET_KEY_CHARS} characters (got {len(text)}); "
            "unset it to use a generated key kept in the instance folder"
        )
    return text


def refuse_unusable_input() -> None:
    """Answer 400 before any view runs when the path or a query parameter holds a NUL character
    or a query is longer than any page takes. Bad input is the client's mistake: it must not
    reach the database (PostgreSQL refuses NUL) and look like an outage."""
    if len(request.query_string) > MAX_QUERY_BYTES:
        abort(400, description="The query string is longer than any page of this dashboard takes.")
    if "\x00" in request.path:
        abort(400, description="The address holds a NUL character.")
    for name, value in request.args.items(multi=True):
        if "\x00" in name or "\x00" in value:
            abort(400, description="A query parameter holds a NUL character.")
        if len(value) > MAX_PARAMETER_CHARS:
            abort(
                400,
                description=f"The query parameter {name[:40]!r} is longer than {MAX_PARAMETER_CHARS} "
                "characters.",
            )


class DashboardSessionInterface(SecureCookieSessionInterface):
    """The signed cookie session, marked Secure whenever the request itself came over HTTPS."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or bool(request and request.is_secure)


def csrf_token() -> str:
    """Return this session's CSRF token, creating one on first use."""
    token = session.get(CSRF_SESSION_KEY)
    if not token:
        token = session[CSRF_SESSION_KEY] = secrets.token_urlsafe(32)
    return token


def check_csrf(form_request: Request) -> None:
    """Abort with 400 unless the form carries this session's CSRF token."""
    expected = session.get(CSRF_SESSION_KEY)
    given = form_request.form.get(CSRF_FIELD, "")
    if not expected or not hmac.compare_digest(str(expected).encode(), given.encode()):
        abort(400, description="The form expired or did not come from this dashboard; reload it and retry.")


def _add_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    # The same URL serves a full page or a fragment depending on these request headers.
    response.vary.update(("HX-Request", "HX-Target"))
    if request.endpoint != "static":
        response.headers["Cache-Control"] = "no-store"
    return response


def trust_proxies(app: Flask, hops: object) -> None:
    """Believe ``hops`` reverse proxies' X-Forwarded-For/-Proto/-Host (config ``TRUSTED_PROXIES``).

    Off by default: without a proxy in front, a client could forge its address and dodge the
    sign-in rate limit. Behind one, every client would otherwise share the proxy's address.
    """
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise ValueError(f"TRUSTED_PROXIES must be a whole number of proxies (0 = none), got {hops!r}")
    if hops:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)  # type: ignore[method-assign]


def init_app(app: Flask) -> None:
    """Configure the secret key, session cookie and trusted proxies, and add the security headers
    to every response."""
    trust_proxies(app, app.config.get("TRUSTED_PROXIES", 0))
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = load_or_create_secret_key(app.instance_path)
    else:
        check_secret_key(app.config["SECRET_KEY"])
    if app.config.get("MAX_CONTENT_LENGTH") is None:  # Flask's default reads any body whole
        app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    app.session_interface = DashboardSessionInterface()
    app.jinja_env.globals["csrf_token"] = csrf_token
    app.jinja_env.globals["CSRF_FIELD"] = CSRF_FIELD
    app.after_request(_add_headers)
    app.before_request(refuse_unusable_input)  # registered before the sign-in gate, so it runs first
