"""`nicfleetctl trace NODE RESOURCE`, `nicfleetctl trace --pod NS/NAME` and `nicfleetctl
resources`: the chain trace (a node's, or one pod's own) and the per-resource view, from
/api/v1/trace, /api/v1/trace/pods/NS/NAME and /api/v1/resources.

HTTP goes through `client.AggregatorClient`; drawing is here (rich). The first line of
`trace` is the API's verdict (ok / degraded / broken / unknown) and its reason; it exits 1
when the verdict is broken, so scripts can gate on it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Final

import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from aggregator.ctl.client import AggregatorClient, ApiError, BadInput
from aggregator.ctl.render import console_for
from proto.http import Link, PodTrace, ResourceSummary, Trace
from proto.runtime.cliopts import output_option
from proto.subjects import InvalidNodeName, validate_node_name

TRACE_EPILOG: Final = """\b
Exit codes:
  0  nothing is broken: the verdict (first line; -o json: "verdict") is ok, degraded
     (fewer adapters, named) or unknown (some link not judged, e.g. without a cluster)
  1  a link is broken, or the aggregator answered with an error (unknown node/resource/pod)
  2  usage error or bad input (invalid node or resource name, option)
  3  the aggregator could not be reached (check --server / NICFLEET_SERVER)"""
RESOURCES_EPILOG: Final = TRACE_EPILOG.replace(
    'nothing is broken: the verdict (first line; -o json: "verdict") is ok, degraded\n'
    "     (fewer adapters, named) or unknown (some link not judged, e.g. without a cluster)",
    "success",
).replace("a link is broken, or the", "the")
_MARK: Final = {
    "ok": ("✔", "green"),
    "degraded": ("!", "dark_orange"),
    "broken": ("✘", "red"),
    "unknown": ("?", "yellow"),
}
_VERDICT_STYLE: Final = {"degraded": "bold dark_orange", "unknown": "yellow"}
_RESOURCE: Final = re.compile(r"[^/\s]+/[^/\s]+")
_POD: Final = re.compile(r"[a-z0-9][-a-z0-9]*/[a-z0-9][-a-z0-9.]*")
NONE: Final = "-"


class _ChainClient(AggregatorClient):
    def trace(self, node: str, resource: str) -> dict[str, Any]:
        return self._get("/api/v1/trace", {"node": node, "resource": resource})

    def trace_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._get(f"/api/v1/trace/pods/{namespace}/{name}", {})

    def resources(self, *, node: str | None, name: str | None) -> dict[str, Any]:
        params = {k: v for k, v in (("node", node), ("name", name)) if v is not None}
        return self._get("/api/v1/resources", params)


@click.command(epilog=TRACE_EPILOG)
@click.argument("node", required=False)
@click.argument("resource", required=False)
@click.option(
    "--pod",
    metavar="NS/NAME",
    help="Trace this pod's own chain instead: its node (or why it is not scheduled), the "
    "resources it requests and each one's chain there, and each DRA claim's chain (claim, "
    "slice published, device healthy, claim allocated, prepared, pod). Takes no NODE or "
    "RESOURCE.",
)
@output_option(
    "table", "wide", "json", help="The chain (wide: with every link's evidence), or the API's JSON."
)
@click.pass_context
def trace(
    ctx: click.Context, node: str | None, resource: str | None, pod: str | None, output: str
) -> None:
    """Why RESOURCE (e.g. rdma/hca_shared) on NODE is or is not usable, link by link: the
    cluster components on the node, adapter, driver/firmware, RDMA ports, char devices,
    device plugin, advertised count, node allocatable, the pods requesting it, why
    pending ones are not scheduled, their network attachments and IP pools; with --pod, one
    pod's chain end to end."""
    if pod is not None:
        if node is not None or resource is not None:
            raise BadInput("--pod takes no NODE or RESOURCE: the pod's node and requests are used")
        _trace_pod(ctx, pod, output)
        return
    if node is None or resource is None:
        raise BadInput("give NODE and RESOURCE, or --pod NS/NAME")
    _check_node(node)
    if not _RESOURCE.fullmatch(resource):
        raise BadInput(f"resource must be a full name such as rdma/hca_shared, got {resource!r}")
    client = _ChainClient(ctx.obj)
    with client:
        body = client.trace(node, resource)
    result: Trace = _typed(body, Trace, "trace")
    if output == "json":
        _print_json(body)
    else:
        _render_trace(_console(), result, wide=output == "wide")
    ctx.exit(1 if result.verdict == "broken" else 0)


def _trace_pod(ctx: click.Context, pod: str, output: str) -> None:
    if not _POD.fullmatch(pod):
        raise BadInput(f"--pod must be NAMESPACE/NAME such as training/worker-0, got {pod!r}")
    client = _ChainClient(ctx.obj)
    with client:
        body = client.trace_pod(*pod.split("/", 1))
    result: PodTrace = _typed(body, PodTrace, "pod trace")
    if output == "json":
        _print_json(body)
    else:
        _render_pod_trace(_console(), result, wide=output == "wide")
    ctx.exit(0 if result.ok else 1)


@click.command(epilog=RESOURCES_EPILOG)
@click.option("--node", help="Only this node's share of each resource.")
@click.option("--name", help="Only this resource (full name, rdma/...).")
@output_option(
    "table",
    "wide",
    "json",
    help="Table, wide (zero/stale nodes and a per-node table), or the API's JSON.",
)
@click.pass_obj
def resources(server: str, node: str | None, name: str | None, output: str) -> None:
    """Every RDMA resource in the fleet: nodes advertising it, capacity, health, allocatable
    and the selected nodes that advertise nothing."""
    if node is not None:
        _check_node(node)
    client = _ChainClient(server)
    with client:
        body = client.resources(node=node, name=name)
    if output == "json":
        _print_json(body)
        return
    items: tuple[ResourceSummary, ...] = _typed(
        body.get("items"), tuple[ResourceSummary, ...], "resource list"
    )
    if not items:
        click.echo("No resources found.", err=True)
        return
    _render_resources(_console(), items, wide=output == "wide")


def _render_trace(console: Console, result: Trace, *, wide: bool) -> None:
    if result.verdict == "ok":
        verdict = Text("chain ok", style="green")
    elif result.verdict != "broken":
        style = _VERDICT_STYLE.get(result.verdict, "yellow")
        verdict = Text(f"{result.verdict}: {result.verdict_reason}", style=style)
    elif result.first_broken is None:
        verdict = Text("broken at the node's components", style="bold red")
    else:
        verdict = Text(f"broken at link {result.first_broken} ({_first(result)})", style="bold red")
    # A pending pod's claim chain has no node yet ("").
    where = f" on {result.node}" if result.node else ""
    console.print(Text.assemble(f"{result.resource}{where}: ", verdict))
    if result.components is not None:
        _render_link(console, result.components, label="components", wide=wide)
    width = max((len(link.name) for link in result.links), default=0)
    for index, link in enumerate(result.links):
        mark, style = _MARK.get(link.status, ("?", "yellow"))
        first = index == result.first_broken
        line = Text.assemble(
            (f" {mark} ", style),
            (f"{index} {link.name:<{width}}", f"bold {style}" if first else style),
            (f" {link.status}", style),
        )
        if first:
            line.append("  <- first broken link", style="bold red")
        console.print(line)
        if link.status in ("broken", "degraded"):
            _print_cause(console, link, strong=first)
        if wide or (link.status != "ok" and link.evidence):
            console.print(Text(f"     evidence: {_evidence(link)}", style="dim"))


def _render_link(console: Console, link: Link, *, label: str, wide: bool) -> None:
    """A link outside the numbered chain (components, a pod's scheduling)."""
    mark, style = _MARK.get(link.status, ("?", "yellow"))
    console.print(Text.assemble((f" {mark} ", style), (f"{label} {link.status}", style)))
    if link.status in ("broken", "degraded"):
        _print_cause(console, link, strong=True)
    if wide or (link.status != "ok" and link.evidence):
        console.print(Text(f"     evidence: {_evidence(link)}", style="dim"))


def _print_cause(console: Console, link: Link, *, strong: bool) -> None:
    """Cause and fix of a broken or degraded link; a link without them says so (never None)."""
    cause = link.cause or "no cause given"
    fix = link.fix or "no fix known: see the evidence"
    console.print(Text(f"     cause: {cause}", style="bold red" if strong else ""))
    console.print(Text(f"     fix:   {fix}", style="bold" if strong else ""))


def _render_pod_trace(console: Console, result: PodTrace, *, wide: bool) -> None:
    where = f"on {result.node}" if result.node is not None else "not scheduled"
    requests = ", ".join(f"{r}={n}" for r, n in sorted(result.requests.items())) or "no resource"
    claims = [c.resource.removeprefix("claim/") for c in result.claims]
    claimed = f", claims {', '.join(claims)}" if claims else ""
    verdict = Text("ok", style="green") if result.ok else Text("broken", style="bold red")
    console.print(
        Text.assemble(
            f"pod {result.namespace}/{result.name} {where} ({result.phase or '?'}), "
            f"requests {requests}{claimed}: ",
            verdict,
        )
    )
    _render_link(console, result.scheduling, label="scheduling", wide=wide)
    if result.no_chain:
        console.print(Text(f" - no RDMA chain: {result.no_chain}", style="yellow"))
    for resource, why in sorted(result.untraced.items()):
        console.print(Text(f" - {resource} not traced: {why}", style="dim"))
    for item in (*result.traces, *result.claims):  # a DRA claim's chain reads the same
        console.print()
        _render_trace(console, item, wide=wide)


def _first(result: Trace) -> str:
    return result.links[result.first_broken].name if result.first_broken is not None else NONE


def _evidence(link: Link) -> str:
    return json.dumps(link.evidence, sort_keys=True, separators=(", ", ": "))


def _render_resources(console: Console, items: tuple[ResourceSummary, ...], *, wide: bool) -> None:
    columns = ["RESOURCE", "NODES", "CAPACITY", "HEALTHY", "ALLOCATABLE", "ZERO", "UNHEALTHY"]
    extra = ["ZERO-NODES", "UNHEALTHY-NODES", "STALE-NODES"]
    table = _table([*columns, *extra] if wide else columns)
    for r in items:
        row = [
            r.name,
            f"{r.nodes_advertising}/{r.nodes_selected}",
            str(r.capacity),
            Text(str(r.healthy), style="" if r.healthy else "red"),
            NONE if r.allocatable is None else str(r.allocatable),
            Text(str(len(r.zero_nodes)), style="red" if r.zero_nodes else ""),
            Text(str(len(r.unhealthy_nodes)), style="red" if r.unhealthy_nodes else ""),
        ]
        if wide:
            row += [
                ",".join(names) or NONE
                for names in (r.zero_nodes, r.unhealthy_nodes, r.stale_nodes)
            ]
        table.add_row(*row)
    console.print(table)
    _print_config_notes(console, items)
    if not wide:
        return
    console.print()
    per_node = _table(["RESOURCE", "NODE", "STATE", "ADVERTISED", "HEALTHY", "ALLOCATABLE", "REG"])
    for r in items:
        for n in r.nodes:
            per_node.add_row(
                r.name,
                n.node,
                n.state or "no-agent",
                _opt(n.advertised),
                _opt(n.healthy),
                _opt(n.allocatable),
                n.registration or NONE,
            )
    console.print(per_node)


def _print_config_notes(console: Console, items: tuple[ResourceSummary, ...]) -> None:
    """One line per node that leaves a resource out of its config (it serves the others),
    and per node where every device is Unhealthy for a node-wide reason (netns-exclusive)."""
    for r in items:
        for n in r.nodes:
            if n.config_error is not None or n.config_path is not None:
                where = n.config_path or "the entry"
                why = n.config_error or "no reason given"
                text = f"note: {r.name} on {n.node} is not served: {where}: {why}"
                console.print(Text(text, style="yellow"))
            if n.unhealthy_reason is not None:
                text = f"note: {r.name} on {n.node}: every device unhealthy: {n.unhealthy_reason}"
                console.print(Text(text, style="yellow"))


def _table(columns: list[str]) -> _PlainTable:
    table = _PlainTable(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True)
    return table


class _PlainTable(Table):
    """String cells are literal text: names that come from agents are never markup."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(Text(c) if isinstance(c, str) else c for c in cells), **kwargs)


def _opt(value: int | None) -> str:
    return NONE if value is None else str(value)


def _typed(value: object, type_: Any, what: str) -> Any:
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        raise ApiError(f"unexpected {what} from the aggregator: {exc}") from exc


def _check_node(node: str) -> None:
    try:
        validate_node_name(node)
    except InvalidNodeName as exc:
        raise BadInput(str(exc)) from exc


def _print_json(body: object) -> None:
    click.echo(json.dumps(body, indent=2, sort_keys=True))


def _console() -> Console:
    return console_for(sys.stdout, os.environ)
