"""`nicfleetctl`: the operator CLI; it talks only to the aggregator's HTTP API.

Owns argument parsing, output selection (table / wide / json) and exit codes; HTTP lives
in `client`, drawing in `render`. Never reads NATS or KV directly.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Final, Literal

import click
from rich.console import Console

from aggregator.ctl.client import (
    DEFAULT_SERVER,
    TOKEN_META_KEY,
    AggregatorClient,
    BadInput,
    parse_detail,
    parse_summaries,
    read_token_file,
)
from aggregator.ctl.render import console_for, render_node, render_nodes
from aggregator.fleet import NODE_STATES
from proto.subjects import InvalidNodeName, validate_node_name

Output = Literal["table", "json", "wide"]
EPILOG: Final = """\b
Exit codes:
  0  success
  1  the aggregator answered with an error (unknown node, server failure)
  2  usage error or bad input (invalid option, node name or server URL)
  3  the aggregator could not be reached (check --server / NICFLEET_SERVER)
  4  authentication refused: no, unknown or read-only token (check --token-file)"""

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json", "wide"]),
    default="table",
    show_default=True,
    help="Table, wide table (more columns), or the API's JSON.",
)


def _check_server(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
        raise click.BadParameter(f"{value!r} is not an http:// or https:// URL", ctx, param)
    return value


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--server",
    envvar="NICFLEET_SERVER",
    default=DEFAULT_SERVER,
    show_default=True,
    show_envvar=True,
    callback=_check_server,
    help="Base URL of the nicfleet aggregator API.",
)
@click.option(
    "--token-file",
    envvar="NICFLEET_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False),
    help="File holding the API bearer token (aggregator --api-token-file). Default: none.",
)
@click.version_option(package_name="nicfleet", prog_name="nicfleetctl")
@click.pass_context
def cli(ctx: click.Context, server: str, token_file: str | None) -> None:
    """Inspect the RDMA network path of a GPU fleet through the nicfleet aggregator."""
    ctx.obj = server
    if token_file is not None:
        ctx.meta[TOKEN_META_KEY] = read_token_file(token_file)


@cli.command(epilog=EPILOG)
@click.option("--state", type=click.Choice(NODE_STATES), help="Only nodes in this state.")
@output_option
@click.pass_obj
def nodes(server: str, state: str | None, output: Output) -> None:
    """List every node the aggregator knows, sorted by name."""
    with AggregatorClient(server) as client:
        body = client.list_nodes(state=state)
    if output == "json":
        _print_json(body)
        return
    summaries = parse_summaries(body)
    if not summaries:
        click.echo("No nodes found.", err=True)
        return
    render_nodes(_console(), summaries, wide=output == "wide")


@cli.command(epilog=EPILOG)
@click.argument("name")
@output_option
@click.pass_obj
def node(server: str, name: str, output: Output) -> None:
    """Show one node: its RDMA devices and ports, live port states and recent link events."""
    try:
        validate_node_name(name)
    except InvalidNodeName as exc:
        raise BadInput(str(exc)) from exc
    with AggregatorClient(server) as client:
        body = client.get_node(name)
    if output == "json":
        _print_json(body)
        return
    render_node(_console(), parse_detail(body), wide=output == "wide")


def _print_json(body: dict[str, Any]) -> None:
    click.echo(json.dumps(body, indent=2, sort_keys=True))


def _console() -> Console:
    return console_for(sys.stdout, os.environ)


def main() -> None:
    cli(prog_name="nicfleetctl")


from aggregator.ctl.demo import demo  # noqa: E402

cli.add_command(demo)

from aggregator.ctl.check import check  # noqa: E402

cli.add_command(check)

from aggregator.ctl.chain import resources, trace  # noqa: E402

cli.add_command(trace)
cli.add_command(resources)

from aggregator.ctl.alerts import alerts, findings  # noqa: E402

cli.add_command(alerts)
cli.add_command(findings)

from aggregator.ctl.validate import validate  # noqa: E402

cli.add_command(validate)
