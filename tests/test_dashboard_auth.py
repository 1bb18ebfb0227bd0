"""Signing in and out: one error for every failure, rate limiting on the fake clock, CSRF,
sessions that really end, safe cookies, and admin accounts kept only as Argon2id hashes."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from clawmem.clock import FakeClock
from dashboard import accounts, state
from dashboard.auth import LOGIN_ERROR
from tests.dashboard_helpers import ADMIN, PASSWORD, csrf_from, page_text, sign_in

pytest_plugins = ["tests.dashboard_fixtures"]


def _without_username(body: str, username: str) -> str:
    return body.replace(f'value="{username}"', 'value=""')


def test_wrong_password_and_unknown_user_get_the_same_answer(app: Flask, admin: tuple[str, str]) -> None:
    wrong = sign_in(app.test_client(), ADMIN, "not the password at all")
    unknown = sign_in(app.test_client(), "nobody", PASSWORD)
    assert wrong.status_code == unknown.status_code == 200
    assert LOGIN_ERROR in page_text(wrong) and LOGIN_ERROR in page_text(unknown)

    def normalise(response: object, username: str) -> str:
        text = _without_username(page_text(response), username)  # type: ignore[arg-type]
        return text.replace(csrf_from(response), "TOKEN")  # type: ignore[arg-type]

    assert normalise(wrong, ADMIN) == normalise(unknown, "nobody")


def test_there_are_no_default_credentials(app: Flask, client: FlaskClient) -> None:
    for username, password in [("admin", "admin"), ("admin", ""), ("admin", "password"), ("root", "root")]:
        response = sign_in(client, username, password)
        assert response.status_code == 200 and LOGIN_ERROR in page_text(response)
    assert client.get("/").status_code == 302


def test_a_correct_sign_in_opens_the_page_asked_for(client: FlaskClient, admin: tuple[str, str]) -> None:
    first = client.get("/memory/?x=1")
    token = csrf_from(client.get(first.headers["Location"]))
    response = client.post(
        "/login", data={"csrf_token": token, "username": ADMIN, "password": PASSWORD, "next": "/memory/?x=1"}
    )
    assert response.status_code == 302 and response.headers["Location"] == "/memory/?x=1"
    assert client.get("/memory/").status_code == 200


@pytest.mark.parametrize(
    "target", ["//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:x"]
)
def test_sign_in_never_redirects_off_site(client: FlaskClient, admin: tuple[str, str], target: str) -> None:
    token = csrf_from(client.get("/login"))
    response = client.post(
        "/login", data={"csrf_token": token, "username": ADMIN, "password": PASSWORD, "next": target}
    )
    assert response.headers["Location"] == "/"


def test_failures_lock_the_account_for_this_address_until_the_window_passes(
    client: FlaskClient, admin: tuple[str, str], clock: FakeClock
) -> None:
    for _ in range(accounts.MAX_FAILURES_PER_ACCOUNT):
        assert LOGIN_ERROR in page_text(sign_in(client, ADMIN, "wrong password here"))
    blocked = sign_in(client, ADMIN, PASSWORD)
    assert blocked.status_code == 429
    assert "Too many failed sign-ins. Try again in 15 minutes." in page_text(blocked)
    assert client.get("/").status_code == 302, "a blocked sign-in must not open a session"
    clock.advance(14 * 60)
    assert "Try again in 1 minute." in page_text(sign_in(client, ADMIN, PASSWORD))
    clock.advance(61)
    assert sign_in(client, ADMIN, PASSWORD).status_code == 302
    assert client.get("/").status_code == 200


def test_the_limit_counts_case_variants_and_other_addresses_separately(
    app: Flask, admin: tuple[str, str]
) -> None:
    attacker = app.test_client()
    for variant in ["admin", "Admin", "ADMIN", "aDmin", "admiN"]:
        sign_in(attacker, variant, "wrong password here")
    assert sign_in(attacker, ADMIN, PASSWORD).status_code == 429
    colleague = app.test_client()
    colleague.environ_base["REMOTE_ADDR"] = "10.0.0.7"
    assert sign_in(colleague, ADMIN, PASSWORD).status_code == 302


def test_one_address_guessing_many_names_is_limited_too(app: Flask, admin: tuple[str, str]) -> None:
    client = app.test_client()
    for number in range(accounts.MAX_FAILURES_PER_ADDRESS):
        sign_in(client, f"user{number}", "wrong password here")
    assert sign_in(client, ADMIN, PASSWORD).status_code == 429


def test_the_limit_holds_across_app_instances(make_app: Callable[..., Flask], admin: tuple[str, str]) -> None:
    # Two apps on one instance folder stand for two gunicorn workers.
    first, second = make_app(), make_app()
    for _ in range(accounts.MAX_FAILURES_PER_ACCOUNT):
        sign_in(first.test_client(), ADMIN, "wrong password here")
    assert sign_in(second.test_client(), ADMIN, PASSWORD).status_code == 429


@pytest.mark.parametrize("token", [None, "", "forged-token"])
def test_sign_in_needs_the_form_token(client: FlaskClient, admin: tuple[str, str], token: str | None) -> None:
    client.get("/login")
    form = {"username": ADMIN, "password": PASSWORD}
    if token is not None:
        form["csrf_token"] = token
    response = client.post("/login", data=form)
    assert response.status_code == 400
    assert client.get("/").status_code == 302


def test_sign_out_needs_the_form_token(signed_in: FlaskClient) -> None:
    assert signed_in.post("/logout", data={}).status_code == 400
    assert signed_in.post("/logout", data={"csrf_token": "forged"}).status_code == 400
    assert signed_in.get("/").status_code == 200, "a forged sign-out must not end the session"


def test_after_sign_out_the_old_cookie_no_longer_works(app: Flask, signed_in: FlaskClient) -> None:
    cookie = signed_in.get_cookie(app.config["SESSION_COOKIE_NAME"])
    assert cookie is not None
    token = csrf_from(signed_in.get("/"))
    response = signed_in.post("/logout", data={"csrf_token": token})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    replay = app.test_client()
    replay.set_cookie(cookie.key, cookie.value)
    assert replay.get("/").status_code == 302
    assert replay.get("/conversations/").headers["Location"].startswith("/login")


def test_an_idle_session_ends(signed_in: FlaskClient, clock: FakeClock) -> None:
    clock.advance(accounts.SESSION_IDLE_SECONDS - 60)
    assert signed_in.get("/").status_code == 200
    clock.advance(accounts.SESSION_IDLE_SECONDS + 1)
    assert signed_in.get("/").status_code == 302


def test_a_session_ends_after_its_maximum_age_even_when_used(
    signed_in: FlaskClient, clock: FakeClock
) -> None:
    for _ in range(accounts.SESSION_MAX_SECONDS // 3600):
        clock.advance(3600)
        assert signed_in.get("/settings").status_code == 200
    clock.advance(3600)
    assert signed_in.get("/settings").status_code == 302


def test_the_session_cookie_is_httponly_and_samesite_lax(client: FlaskClient, admin: tuple[str, str]) -> None:
    header = sign_in(client).headers["Set-Cookie"]
    assert "HttpOnly" in header and "SameSite=Lax" in header and "Secure" not in header


def test_the_session_cookie_is_secure_over_https(client: FlaskClient, admin: tuple[str, str]) -> None:
    token = csrf_from(client.get("https://localhost/login"))
    response = client.post(
        "https://localhost/login", data={"csrf_token": token, "username": ADMIN, "password": PASSWORD}
    )
    assert "Secure" in response.headers["Set-Cookie"]


def test_forwarded_headers_count_only_behind_a_trusted_proxy(
    make_app: Callable[..., Flask], admin: tuple[str, str]
) -> None:
    direct = make_app().test_client()
    for _ in range(accounts.MAX_FAILURES_PER_ACCOUNT):
        direct.environ_base["HTTP_X_FORWARDED_FOR"] = f"203.0.113.{_}"  # a forged, changing address
        sign_in(direct, ADMIN, "wrong password here")
    assert sign_in(direct, ADMIN, PASSWORD).status_code == 429, "forged addresses must not dodge the limit"
    proxied = make_app(TRUSTED_PROXIES=1).test_client()
    proxied.environ_base.update(HTTP_X_FORWARDED_FOR="198.51.100.9", HTTP_X_FORWARDED_PROTO="https")
    response = sign_in(proxied, ADMIN, PASSWORD)
    assert response.status_code == 302 and "Secure" in response.headers["Set-Cookie"]


def test_the_secret_key_is_made_once_with_mode_0600(make_app: Callable[..., Flask]) -> None:
    first, second = make_app(), make_app()
    key_file = Path(first.instance_path) / "secret_key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert first.config["SECRET_KEY"] == second.config["SECRET_KEY"] == key_file.read_text()
    assert len(first.config["SECRET_KEY"]) >= 32


def test_a_configured_secret_key_is_used_as_is(make_app: Callable[..., Flask]) -> None:
    app = make_app(SECRET_KEY="k" * 40)
    assert app.config["SECRET_KEY"] == "k" * 40
    assert not (Path(app.instance_path) / "secret_key").exists()


def test_passwords_are_kept_only_as_argon2id_hashes_outside_the_data_tables(
    app: Flask, admin: tuple[str, str]
) -> None:
    accounts_db = Path(app.instance_path) / "dashboard.db"
    assert PASSWORD.encode() not in accounts_db.read_bytes()
    with app.app_context():
        stored = accounts.db.session.scalar(sa.select(accounts.Admin.password_hash))
        data_tables = set(sa.inspect(state.engine()).get_table_names())
    assert stored.startswith("$argon2id$")
    assert not any(name.startswith("dashboard_") for name in data_tables)


def test_the_accounts_database_lives_in_the_instance_folder_with_mode_0600(app: Flask) -> None:
    accounts_db = Path(app.instance_path) / "dashboard.db"
    assert app.config["SQLALCHEMY_DATABASE_URI"] == f"sqlite:///{accounts_db}"
    assert stat.S_IMODE(os.stat(accounts_db).st_mode) == 0o600


# -- the CLI -----------------------------------------------------------------------------------


def test_create_admin_prompts_twice_and_refuses_short_or_taken_names(app: Flask) -> None:
    runner = app.test_cli_runner()
    result = runner.invoke(args=["claw", "create-admin", "ops"], input=f"{PASSWORD}\n{PASSWORD}\n")
    assert result.exit_code == 0 and "created dashboard admin 'ops'" in result.output
    assert PASSWORD not in result.output.split("Repeat for confirmation:")[-1]
    short = runner.invoke(args=["claw", "create-admin", "ops2"], input="short\nshort\n")
    assert short.exit_code == 1 and "at least 12 characters" in short.output
    taken = runner.invoke(args=["claw", "create-admin", "ops"], input=f"{PASSWORD}\n{PASSWORD}\n")
    assert taken.exit_code == 1 and "already exists" in taken.output
    assert sign_in(app.test_client(), "ops", PASSWORD).status_code == 302


def test_first_run_generates_a_password_once(app: Flask) -> None:
    runner = app.test_cli_runner()
    first = runner.invoke(args=["claw", "create-admin", "--generate", "--if-none"])
    assert first.exit_code == 0
    lines = first.output.splitlines()
    password = next(line.split(": ", 1)[1] for line in lines if line.startswith("password: "))
    assert len(password) >= 20
    again = runner.invoke(args=["claw", "create-admin", "--generate", "--if-none"])
    assert again.exit_code == 0 and "An admin account exists" in again.output
    assert password not in again.output
    assert sign_in(app.test_client(), "admin", password).status_code == 302


def test_set_password_changes_it_and_ends_every_session(app: Flask, signed_in: FlaskClient) -> None:
    new_password = "another long passphrase"
    result = app.test_cli_runner().invoke(
        args=["claw", "set-password", ADMIN], input=f"{new_password}\n{new_password}\n"
    )
    assert result.exit_code == 0, result.output
    assert signed_in.get("/").status_code == 302
    assert LOGIN_ERROR in page_text(sign_in(app.test_client(), ADMIN, PASSWORD))
    assert sign_in(app.test_client(), ADMIN, new_password).status_code == 302


def test_set_password_of_an_unknown_admin_fails(app: Flask) -> None:
    result = app.test_cli_runner().invoke(args=["claw", "set-password", "ghost", "--generate"])
    assert result.exit_code == 1 and "no admin named 'ghost'" in result.output
