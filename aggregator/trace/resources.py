"""Per-resource view of the fleet: who advertises `rdma/x`, how much, how healthy, and
which selected nodes advertise nothing.

Pure: from the agents' device-plugin status, the policies selecting each node and, when a
cluster is present, node allocatable. Stale nodes are listed but not counted in totals.
No I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping

from aggregator.cluster import ClusterView, policies_by_node
from aggregator.fleet.servable import Unusable, unusable
from aggregator.fleet.state import NodeRecord
from aggregator.fleet.views import node_state
from proto.dpconfig import resource_full_name
from proto.http import ResourceOnNode, ResourceSummary
from proto.policy import Policy


def summarize_resources(
    *,
    fleet: Mapping[str, NodeRecord],
    cluster: ClusterView,
    policies: tuple[Policy, ...],
    now: float,
    stale_after: float,
    node: str | None = None,
    name: str | None = None,
) -> tuple[ResourceSummary, ...]:
    """One summary per resource name, sorted; `node`/`name` narrow the result."""
    selecting = policies_by_node(policies, fleet.keys(), cluster)
    rows: dict[str, list[ResourceOnNode]] = {}
    # resource -> node -> why unusable: resource-zero's own definition (fleet.servable).
    why: dict[str, dict[str, Unusable]] = {}
    for node_name in sorted({*fleet, *selecting}):
        if node is not None and node_name != node:
            continue
        record = fleet.get(node_name)
        for row_name, row in _rows(node_name, record, selecting, cluster, now, stale_after):
            if name is None or row_name == name:
                rows.setdefault(row_name, []).append(row)
                reason = unusable(record.device_plugin if record else None, row_name)
                if reason is not None:
                    why.setdefault(row_name, {})[node_name] = reason
    return tuple(_summary(n, tuple(rows[n]), why.get(n, {}), cluster.present) for n in sorted(rows))


def _rows(
    node: str,
    record: NodeRecord | None,
    selecting: Mapping[str, tuple[Policy, ...]],
    cluster: ClusterView,
    now: float,
    stale_after: float,
) -> list[tuple[str, ResourceOnNode]]:
    configured = {
        resource_full_name(c)
        for p in selecting.get(node, ())
        if p.spec.rdma_shared_device_plugin is not None
        for c in p.spec.rdma_shared_device_plugin.config_list
    }
    plugin = record.device_plugin if record is not None else None
    served = {r.name: r for r in plugin.resources} if plugin is not None else {}
    state = node_state(record, now, stale_after) if record is not None else None
    cluster_node = cluster.nodes.get(node) if cluster.present else None
    result = []
    for resource in sorted({*configured, *served}):
        status = served.get(resource)
        raw = cluster_node.allocatable.get(resource) if cluster_node is not None else None
        result.append(
            (
                resource,
                ResourceOnNode(
                    node=node,
                    state=state,
                    configured=resource in configured,
                    advertised=status.advertised if status is not None else None,
                    healthy=status.healthy if status is not None else None,
                    registration=status.registration if status is not None else None,
                    allocatable=allocatable_count(raw),
                    config_path=status.config_path if status is not None else None,
                    config_error=status.config_error if status is not None else None,
                    unhealthy_reason=status.unhealthy_reason if status is not None else None,
                ),
            )
        )
    return result


def allocatable_count(raw: str | None) -> int | None:
    """An extended resource's allocatable ("8"); None when absent or not a whole number."""
    if raw is None or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def _summary(
    name: str, rows: tuple[ResourceOnNode, ...], why: Mapping[str, Unusable], cluster: bool
) -> ResourceSummary:
    live = [r for r in rows if r.state != "stale"]
    return ResourceSummary(
        name=name,
        nodes_selected=len(rows),
        nodes_advertising=sum((r.advertised or 0) > 0 for r in live),
        capacity=sum(r.advertised or 0 for r in live),
        healthy=sum(r.healthy or 0 for r in live),
        allocatable=sum(r.allocatable or 0 for r in rows) if cluster else None,
        zero_nodes=tuple(n for n, w in why.items() if w != "no-healthy"),
        unhealthy_nodes=tuple(n for n, w in why.items() if w == "no-healthy"),
        stale_nodes=tuple(r.node for r in rows if r.state == "stale"),
        nodes=rows,
    )
