"""`nicfleetctl audit nicclusterpolicy`: what the NVIDIA network operator's policy would do
on the fleet — per node and resource, whether the upstream RDMA shared device plugin starts
and what it advertises, where nicfleet would differ, and the policy's other sections.

Owns reading the policy file (YAML or JSON, one or more documents, a List too), the
snapshots (files, or the live fleet from the API), rendering and exit codes; the audit is
proto.nicclusterpolicy's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import click
import msgspec
import yaml

from aggregator.ctl.check import CheckInputError, load_snapshots
from aggregator.ctl.client import AggregatorClient, parse_detail
from proto.inventory import NodeSnapshot
from proto.nicclusterpolicy import AuditReport, PolicyAudit, audit, node_selector_of
from proto.runtime.cliopts import output_option

KINDS: Final = ("NicClusterPolicy", "NicNodePolicy")
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"  # on every Node: the kubelet sets it
MAX_POLICY: Final = 4 * 1024 * 1024
AUDIT_EPILOG: Final = """\b
Exit codes:
  0  upstream starts and advertises every resource on every node; nothing to act on
  1  a finding: upstream would not start, the webhook refuses, a resource advertises 0,
     nicfleet would differ, or a section (ofedDriver, ...) does not fit the fleet
  2  usage error or bad input (unreadable policy or snapshot, no NicClusterPolicy in FILE)

\b
Without --snapshot the nodes come from the aggregator (--server), and a NicNodePolicy's
nodeSelector picks its nodes by their labels; snapshot files carry no labels, so a node
policy is then audited against every node given (the output says so)."""


@click.group()
def audit_group() -> None:
    """Audit another project's configuration against the fleet."""


@audit_group.command("nicclusterpolicy", epilog=AUDIT_EPILOG)
@click.option(
    "-f",
    "--filename",
    "path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="NicClusterPolicy / NicNodePolicy YAML or JSON (`-` for stdin); several documents "
    "or a List are fine.",
)
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="A snapshot JSON file as `nicfleet-agent snapshot` prints it (repeatable). "
    "Default: every node of the live fleet.",
)
@output_option("text", "json", help="Output format.")
@click.pass_obj
def nicclusterpolicy(server: str, path: Path, snapshots: tuple[Path, ...], output: str) -> None:
    """Predict what the upstream RDMA shared device plugin does with the policy's config on
    each node ("would not start", "advertises 0 for X: why", "advertises N"), where nicfleet
    would advertise otherwise, and audit ofedDriver, secondaryNetwork, nvIpam,
    sriovDevicePlugin and the policy's status."""
    objs = load_policy_objects(path)
    snaps = load_snapshots(snapshots) if snapshots else live_snapshots(server)
    selected = None if snapshots else live_selections(server, objs)
    report = audit(objs, {s.node: s for s in snaps}, selected=selected)
    if output == "json":
        click.echo(json.dumps(msgspec.to_builtins(report), indent=2, sort_keys=True))
    else:
        click.echo(render_text(report), nl=False)
    if report.worst in ("critical", "warning"):
        sys.exit(1)


def load_policy_objects(path: Path) -> list[dict[str, Any]]:
    try:
        text = sys.stdin.read() if str(path) == "-" else _read(path)
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise CheckInputError(f"{path}: not YAML or JSON: {exc}") from exc
    objs: list[dict[str, Any]] = []
    for doc in docs:
        items = (
            doc.get("items")
            if isinstance(doc, dict) and doc.get("kind", "").endswith("List")
            else [doc]
        )
        for i, obj in enumerate(items or ()):
            if not isinstance(obj, dict):
                raise CheckInputError(f"{path}: document {i}: not an object")
            if obj.get("kind") in KINDS:
                objs.append(obj)
    if not objs:
        raise CheckInputError(f"{path}: kind: no NicClusterPolicy or NicNodePolicy in the file")
    return objs


def _read(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_POLICY:
            raise CheckInputError(f"{path}: policy larger than {MAX_POLICY} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckInputError(f"{path}: cannot read the policy: {exc}") from exc


def live_snapshots(server: str) -> list[NodeSnapshot]:
    with AggregatorClient(server) as client:
        snaps = []
        for name in client.node_names():
            detail = parse_detail(client.get_node(name))
            if detail.snapshot is not None:
                snaps.append(detail.snapshot)
        return snaps


def live_selections(server: str, objs: list[dict[str, Any]]) -> dict[str, frozenset[str]]:
    """NicNodePolicy name -> the live fleet's nodes its nodeSelector matches, by the API's
    `label` filter (the aggregator reads the nodes' labels from the cluster); an empty
    nodeSelector selects every node, as the operator's webhook lists them for its overlap
    check. {} when the aggregator knows no labels (no cluster: not one node has
    kubernetes.io/hostname)."""
    found: dict[str, frozenset[str]] = {}
    wanted = [o for o in objs if o.get("kind") == "NicNodePolicy"]
    if not wanted:
        return found
    with AggregatorClient(server) as client:
        labelled = client.get_fleet(
            "/api/v1/nodes", {"label": HOSTNAME_LABEL}, key=lambda item: str(item.get("name"))
        )
        if not labelled["items"]:
            return found
        every = frozenset(str(item.get("name")) for item in labelled["items"])
        for obj in wanted:
            selector = node_selector_of(obj)
            if not selector:
                found[str((obj.get("metadata") or {}).get("name") or "")] = every
                continue
            query = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            body = client.get_fleet(
                "/api/v1/nodes", {"label": query}, key=lambda item: str(item.get("name"))
            )
            name = str((obj.get("metadata") or {}).get("name") or "")
            found[name] = frozenset(str(item.get("name")) for item in body["items"])
    return found


def render_text(report: AuditReport) -> str:
    lines: list[str] = []
    for policy in report.policies:
        lines.extend(_policy_lines(policy))
    return "\n".join(lines) + "\n"


def _policy_lines(policy: PolicyAudit) -> list[str]:
    lines = [f"{policy.kind}/{policy.name}"]
    if policy.nicfleet_refuses:
        lines.append(f"  nicfleet refuses the whole config: {policy.nicfleet_refuses}")
    lines.extend(f"  nicfleet leaves out: {bad}" for bad in policy.nicfleet_invalid)
    if not policy.nodes and policy.start_failure is None:
        lines.append("  rdmaSharedDevicePlugin: no config, or no nodes to audit")
    for verdict in policy.nodes:
        if verdict.verdict != "advertises":
            lines.append(f"  {verdict.node}: {verdict.sentence}")
            continue
        if verdict.netns_caveat:
            lines.append(f"  {verdict.node}: {verdict.netns_caveat}")
        for r in verdict.resources:
            said = f"upstream advertises {r.advertised} for {r.resource}"
            if r.advertised == 0 and r.why:
                said += f": {r.why}"
            elif r.selected:
                shown = ", ".join(r.selected[:4]) + (", …" if len(r.selected) > 4 else "")
                said += f" ({len(r.selected)} adapter{_s(r.selected)}: {shown})"
            lines.append(f"  {verdict.node}: {said}")
            if r.nicfleet is not None:
                lines.append(f"    {r.nicfleet_why or f'nicfleet would advertise {r.nicfleet}'}")
    for note in policy.notes:
        where = f" [{note.node}]" if note.node else ""
        lines.append(f"  {note.severity} {note.section}{where}: {note.path}: {note.message}")
    return lines


def _s(items: tuple[str, ...]) -> str:
    return "" if len(items) == 1 else "s"
