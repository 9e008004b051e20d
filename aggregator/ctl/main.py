"""`nicfleetctl`: the operator CLI; it talks only to the aggregator's HTTP API.

Owns the command tree, output selection and exit codes; the global options and where the
server and token come from are `globalopts` (flag > env > context file > default, see
`config`), typo-proof filters `names`, HTTP `client`, drawing `render`/`topology`. Never
reads NATS or KV directly.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from typing import Any, Final, Literal

import click
from rich.console import Console

from aggregator.ctl import names
from aggregator.ctl.client import (
    AggregatorClient,
    BadInput,
    CtlError,
    current_settings,
    fail_if_partial,
    parse_detail,
    parse_summaries,
)
from aggregator.ctl.completion import attach_node_completion, complete_node_names, completion
from aggregator.ctl.contexts import config_group
from aggregator.ctl.globalopts import add_global_options, group_options, leaves
from aggregator.ctl.names import add_name_checks
from aggregator.ctl.render import console_for, render_node, render_nodes
from aggregator.ctl.topology import build_matrix, render_matrix, snapshot_of
from aggregator.ctl.watch import add_watch, add_yaml
from proto.http import NODE_STATES
from proto.runtime import cliopts
from proto.subjects import InvalidNodeName, validate_node_name

Output = Literal["table", "json", "wide"]
EPILOG: Final = """\b
Exit codes:
  0  success
  1  the aggregator answered with an error (unknown node, server failure)
  2  usage error or bad input (invalid option, node name, server URL or context file)
  3  the aggregator could not be reached (check --server / NICFLEET_SERVER / context)
  4  authentication refused: no, unknown or read-only token (check --token-file)"""
# Commands that never talk to the aggregator: a broken context file must not stop them.
OFFLINE: Final = frozenset({"check", "demo", "completion", "config"})

output_option = cliopts.output_option(
    "table", "json", "wide", help="Table, wide table (more columns), or the API's JSON."
)


@click.group(
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
    params=group_options(),
)
@click.version_option(package_name="nicfleet", prog_name="nicfleetctl")
def cli() -> None:
    """Inspect the RDMA network path of a GPU fleet through the nicfleet aggregator.

    The options below are global: they go before the command or after it
    (`nicfleetctl nodes --server URL`), the later one winning. Server and token file come
    from the flag, else NICFLEET_SERVER / NICFLEET_TOKEN_FILE, else the context file, else
    the default."""


@cli.command(epilog=EPILOG)
@click.option("--state", type=click.Choice(NODE_STATES), help="Only nodes in this state.")
@output_option
@click.pass_obj
def nodes(server: str, state: str | None, output: Output) -> None:
    """List every node the aggregator knows, sorted by name.

    Against a replica of a sharded aggregator, every replica's share (exit 1 naming any
    replica that could not be read)."""
    with AggregatorClient(server) as client:
        body = client.list_nodes(state=state)
    if output == "json":
        _print_json(body)
    elif summaries := parse_summaries(body):
        render_nodes(_console(), summaries, wide=output == "wide")
    elif not body.get("missing"):
        click.echo(_empty_fleet(server, state), err=True)
    fail_if_partial(body)


def _empty_fleet(server: str, state: str | None) -> str:
    if state is not None:
        return f"No nodes found. None is in state {state} (`nicfleetctl nodes` lists every state)."
    return (
        f"No nodes found. The aggregator at {server} has heard from no agent yet. Check:\n"
        "  - are the agents running? (kubectl -n nicfleet get pods -l "
        "app.kubernetes.io/name=nicfleet-agent; logs: kubectl -n nicfleet logs ds/nicfleet-agent)\n"
        "  - do they use this aggregator's NATS URL (nicfleet-agent run --nats-url) and "
        "credentials (--nats-nkey-seed-file)? A refused agent logs it.\n"
        "  - is this the right aggregator? (--server, NICFLEET_SERVER, "
        "`nicfleetctl config get-contexts`)\n"
        "  - vet a node without any server: nicfleet-agent snapshot > node.json; "
        "nicfleetctl check --snapshot node.json"
    )


@cli.command(epilog=EPILOG)
@click.argument("name", shell_complete=complete_node_names)
@output_option
@click.pass_obj
def node(server: str, name: str, output: Output) -> None:
    """Show one node: its RDMA devices and ports, live port states and recent link events."""
    body = _get_node(server, name)
    if output == "json":
        _print_json(body)
        return
    render_node(_console(), parse_detail(body), wide=output == "wide")


@cli.command(epilog=EPILOG)
@click.argument("name", shell_complete=complete_node_names)
@output_option
@click.pass_obj
def topology(server: str, name: str, output: Output) -> None:
    """The GPU × NIC PCIe matrix of node NAME, as `nvidia-smi topo -m` shows it: PIX/PXB
    (green) allow GPUDirect RDMA, PHB/NODE (yellow) and SYS (red) do not by default; `*`
    marks each GPU's best NIC. wide: NIC PCI addresses, NUMA nodes and link layers."""
    matrix = build_matrix(snapshot_of(_get_node(server, name), name))
    if output == "json":
        _print_json(matrix.to_builtins())
        return
    render_matrix(_console(), matrix, wide=output == "wide")


@cli.command()
@cliopts.output_option(
    "table", "json", help="Lines, or JSON {client, server, server_url, server_error}."
)
@click.pass_obj
def version(server: str, output: str) -> None:
    """Print nicfleetctl's version and, if it answers, the aggregator's."""
    mine = importlib.metadata.version("nicfleet")
    theirs: str | None = None
    error: str | None = None
    try:
        with AggregatorClient(server, timeout=3.0) as client:
            theirs = client.version()
    except CtlError as exc:
        error = exc.format_message()
    if output == "json":
        doc = {"client": mine, "server": theirs, "server_url": server, "server_error": error}
        _print_json(doc)
        return
    settings = current_settings()
    origin = f", from {settings.server_source}" if settings else ""
    click.echo(f"Client: nicfleetctl {mine}")
    click.echo(f"Server: {theirs or 'unknown'} ({server}{origin})")
    if error is not None:
        click.echo(f"        {error}", err=True)


def _get_node(server: str, name: str) -> dict[str, Any]:
    try:
        validate_node_name(name)
    except InvalidNodeName as exc:
        raise BadInput(str(exc)) from exc
    with AggregatorClient(server) as client:
        return client.get_node(name)


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

cli.add_command(config_group)
cli.add_command(completion)
# Every list/get command prints YAML too; list commands can --watch; node arguments and
# --node options complete from the aggregator's node list.
for _command in (nodes, node, topology, version, resources, findings, alerts, trace, validate):
    add_yaml(_command)
for _command in (nodes, resources, findings, alerts):
    add_watch(_command)
for _command in (trace, resources, findings, alerts, validate):
    attach_node_completion(_command, "node", "nodes")

from aggregator.ctl.audit import audit_group  # noqa: E402

cli.add_command(audit_group, name="audit")

from aggregator.ctl.claim import claim  # noqa: E402

cli.add_command(claim)
# Typo-proof filters: an unknown node, rule or resource is exit 1 with close matches.
add_name_checks(findings, names.FINDINGS)
add_name_checks(alerts, names.ALERTS)
add_name_checks(resources, names.RESOURCES)
# Last, so they wrap everything above: global options after the command, then settings.
for _name, _group in ((n, cli.commands[n]) for n in sorted(cli.commands) if n != "config"):
    for _command in leaves(_group):
        add_global_options(_command, offline=_name in OFFLINE)
