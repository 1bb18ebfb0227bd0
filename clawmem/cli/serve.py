"""``mcp``: the site's memory served to MCP clients on stdio, or over streamable HTTP with
``--http HOST:PORT`` (extra ``clawmem[mcp]``).

On stdio, standard output carries the protocol and nothing else: logs and warnings go to
standard error. Over HTTP every request needs an access token (``clawmem tokens create``),
whose scope the server applies; the server listens on loopback unless ``--allow-remote``.
The server deletes nothing; forgetting, flushing and erasing stay with the other commands.
"""

from __future__ import annotations

import ipaddress

import click

from clawmem.cli import current_site
from clawmem.cli.audit import EXPECTED_FAILURES, describe_failure
from clawmem.cli.common import check_namespace, check_text
from clawmem.sites import operations


def _check_address(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (for example 127.0.0.1:8765)", ctx, param)
    return host, int(port)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@click.command("mcp")
@click.option(
    "--namespace",
    metavar="NS",
    callback=check_namespace,
    help="Read and write only this namespace (and the subject's own); recall reads it.",
)
@click.option(
    "--subject",
    metavar="USER_ID",
    callback=check_text,
    help="Bind recall and remember to this subject's namespace (CLAW_SUBJECT_NAMESPACE).",
)
@click.option("--read-only", is_flag=True, help="Offer no remember tool: read and recall only.")
@click.option(
    "--http",
    "http",
    metavar="HOST:PORT",
    callback=_check_address,
    help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio; tokens give the scope.",
)
@click.option("--allow-remote", is_flag=True, help="With --http: allow a HOST other than loopback.")
@click.option(
    "--allow-origin",
    "origins",
    metavar="ORIGIN",
    multiple=True,
    help="With --http: a browser Origin to accept besides loopback ones (https://app.example:*).",
)
def mcp(
    namespace: str | None,
    subject: str | None,
    read_only: bool,
    http: tuple[str, int] | None,
    allow_remote: bool,
    origins: tuple[str, ...],
) -> None:
    """Serve memory over the Model Context Protocol on stdio, or over HTTP with --http.

    Tools: recall, remember, get, list_namespaces, list_keys and search; none deletes. Unless
    --read-only, the site's tables are created first when the memory driver is sql (as init-db
    does). Over HTTP each request needs a token (clawmem tokens create), whose namespace,
    subject and read-only scope apply instead of --namespace, --subject and --read-only; put TLS
    in front of any address other than loopback. Needs the mcp extra: pip install 'clawmem[mcp]'.
    """
    if http is None and (allow_remote or origins):
        raise click.UsageError("--allow-remote and --allow-origin go with --http")
    if http is not None:
        if namespace is not None or subject is not None or read_only:
            raise click.UsageError(
                "over --http the scope is each token's: make one with clawmem tokens create "
                "--namespace/--subject/--read-only"
            )
        if not allow_remote and not _loopback(http[0]):
            raise click.UsageError(
                f"--http {http[0]} listens beyond this machine: add --allow-remote, and put TLS in front"
            )
    try:
        from clawmem.integrations.mcp import asgi_app, server
    except ModuleNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        site = current_site()
        if not read_only and site.settings.memory_driver == "sql":
            _, added = operations.init_db(site)
            for change in added:  # on stderr: stdout is the protocol's
                click.echo(f"init-db: {change}", err=True)
        if http is not None:
            app = asgi_app(site.settings, clock=site.clock, allowed_origins=origins)
        else:
            app = server(
                site.settings, namespace=namespace, subject=subject, read_only=read_only, clock=site.clock
            )
    except EXPECTED_FAILURES as exc:
        raise click.ClickException(describe_failure(exc)) from None
    if http is None:
        app.run("stdio")
        return
    import uvicorn

    click.echo(f"serving MCP at http://{_shown_host(http[0])}:{http[1]}/mcp", err=True)
    uvicorn.run(app, host=http[0], port=http[1], log_level="warning", access_log=False)


COMMANDS = [mcp]
