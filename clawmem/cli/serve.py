"""``mcp``: the site's memory served to MCP clients on stdio (extra ``clawmem[mcp]``).

Standard output carries the protocol and nothing else: logs and warnings go to standard error.
The server deletes nothing; forgetting, flushing and erasing stay with the other commands.
"""

from __future__ import annotations

import click

from clawmem import operations
from clawmem.cli import current_site
from clawmem.cli.audit import EXPECTED_FAILURES, describe_failure
from clawmem.cli.common import check_namespace, check_text


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
def mcp(namespace: str | None, subject: str | None, read_only: bool) -> None:
    """Serve memory over the Model Context Protocol on stdio.

    Tools: recall, remember, get, list_namespaces, list_keys and search; none deletes. Unless
    --read-only, the site's tables are created first when the memory driver is sql (as init-db
    does). Needs the mcp extra: pip install 'clawmem[mcp]'.
    """
    try:
        from clawmem.integrations.mcp import server
    except ModuleNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        site = current_site()
        if not read_only and site.settings.memory_driver == "sql":
            _, added = operations.init_db(site)
            for change in added:  # on stderr: stdout is the protocol's
                click.echo(f"init-db: {change}", err=True)
        app = server(
            site.settings, namespace=namespace, subject=subject, read_only=read_only, clock=site.clock
        )
    except EXPECTED_FAILURES as exc:
        raise click.ClickException(describe_failure(exc)) from None
    app.run("stdio")


COMMANDS = [mcp]
