"""The chain's first link, `components`: what the rest of the chain needs from the cluster
on this node — Node conditions (Ready, NetworkUnavailable, node-problem-detector's), the
DaemonSets of the driver, Multus, NV-IPAM, whereabouts and CNI plugins with a ready pod
here wherever their controller would run one (`aggregator.placement`), no upstream
k8s-rdma-shared-dev-plugin beside nicfleet's, and the NicClusterPolicy's
`status.state`/`appliedStates`.

Pure: a function of the chain context (the cluster view holds what the API server said);
no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from aggregator.cluster import ClusterNode, DaemonSetState, NodeCondition, OperatorStatus
from aggregator.placement import Fit, daemon_fit
from aggregator.trace.host import ChainContext, link_broken, link_ok, link_unknown
from proto.http import Link

COMPONENTS_LINK: Final = "components"
NIC_CLUSTER_POLICY: Final = "nic-cluster-policy"
# NicClusterPolicy status.state values (network-operator api/v1alpha1): ready, notReady,
# ignore, error. Only `error` breaks a node's chain: `notReady` while any node anywhere
# rolls out would otherwise break every node's; this node's own DaemonSet pods say more.
BROKEN_OPERATOR_STATES: Final = frozenset({"error"})
_ROLE_TEXT: Final[Mapping[str, str]] = {
    "driver": "OFED/DOCA driver",
    "multus": "Multus",
    "nv-ipam": "NV-IPAM node",
    "whereabouts": "whereabouts",
    "cni-plugins": "CNI plugins",
    "rdma-shared-dp": "k8s-rdma-shared-dev-plugin",
}

Problem = tuple[str, str]  # (cause, fix)


def components_link(ctx: ChainContext) -> Link:
    """ok when nothing the chain needs is missing on the node; broken at the first thing
    that is (every problem is in the evidence); unknown without a cluster."""
    if not ctx.cluster.present:
        return link_unknown(COMPONENTS_LINK, cluster="no cluster")
    node = ctx.cluster.nodes.get(ctx.node)
    if node is None:
        return link_unknown(COMPONENTS_LINK, reason=f"{ctx.node} is not a node of the cluster")
    sets = ctx.cluster.daemonsets
    operator = ctx.cluster.nic_cluster_policy
    plugin_serves = ctx.status is not None  # nicfleet's device plugin serves the resource
    problems = [
        *condition_problems(node),
        *daemonset_problems(node, sets, plugin_serves=plugin_serves),
        *operator_problems(operator),
    ]
    evidence: dict[str, Any] = {
        "conditions": {c.type: c.status for c in node.conditions},
        "daemonsets": [_daemonset_evidence(ds, node, ctx.cluster.nodes) for ds in sets],
        "nic_cluster_policy": None if operator is None else msgspec.to_builtins(operator),
    }
    if not problems:
        return link_ok(COMPONENTS_LINK, **evidence)
    (cause, fix), rest = problems[0], problems[1:]
    return link_broken(COMPONENTS_LINK, cause, fix, also=[c for c, _ in rest], **evidence)


def condition_problems(node: ClusterNode) -> list[Problem]:
    """Ready must be True; every other condition (pressure, NetworkUnavailable,
    node-problem-detector's KernelDeadlock, ReadonlyFilesystem, ...) False."""
    found = []
    for c in node.conditions:
        if c.type == "Ready" and c.status != "True":
            found.append(
                (
                    f"node {node.name} is not Ready ({c.status}{_why(c)})",
                    f"check the kubelet on {node.name} (systemctl status kubelet; "
                    "journalctl -u kubelet) and its network to the API server",
                )
            )
        elif c.type != "Ready" and c.status == "True":
            fix = (
                f"the primary CNI has not configured {node.name}'s network: check its pod "
                f"there (kubectl get pods -A -o wide --field-selector spec.nodeName={node.name})"
                if c.type == "NetworkUnavailable"
                else f"clear the {c.type} condition on {node.name} (kubectl describe node "
                f"{node.name}; node-problem-detector or the kubelet set it)"
            )
            found.append((f"node {node.name} has {c.type}=True{_why(c)}", fix))
    return found


def daemonset_problems(
    node: ClusterNode, sets: tuple[DaemonSetState, ...], *, plugin_serves: bool
) -> list[Problem]:
    """A needed DaemonSet that selects the node but has no ready pod there; an upstream
    rdma-shared-dev-plugin pod on a node where nicfleet's plugin serves the resource."""
    found = []
    for ds in sets:
        where = (
            f"kubectl -n {ds.namespace} get pods -o wide --field-selector spec.nodeName={node.name}"
        )
        what = f"{_ROLE_TEXT[ds.role]} DaemonSet {ds.namespace}/{ds.name}"
        if ds.role == "rdma-shared-dp":
            if plugin_serves and node.name in (*ds.ready_nodes, *ds.unready_nodes):
                found.append(
                    (
                        f"{what} still runs on {node.name} beside nicfleet's device plugin: "
                        "both register the same resource names and the kubelet keeps whichever "
                        "registered last",
                        "remove spec.rdmaSharedDevicePlugin from the NicClusterPolicy (or delete "
                        "the DaemonSet); see docs/migrate-from-rdma-shared-dev-plugin.md",
                    )
                )
            continue
        fit = _fit(ds, node)
        if node.name in ds.ready_nodes or not fit.selected:
            continue  # ready here, or not meant for the node (another OS's driver, say)
        if not fit.runs and node.name not in ds.unready_nodes:  # a pod there predates the taint
            found.append(
                (
                    f"{what} is meant for {node.name} but {fit.why}, so the controller "
                    "runs no pod there",
                    f"add a toleration for {fit.taints[0]} to the DaemonSet (for the Network "
                    "Operator's: the NicClusterPolicy's tolerations) or remove the taint "
                    f"(kubectl taint node {node.name} {fit.taints[0]}-)",
                )
            )
            continue
        counts = f"{ds.ready}/{ds.desired} ready cluster-wide"
        if node.name in ds.unready_nodes:
            cause = f"the pod of {what} on {node.name} is not Ready ({counts})"
            fix = f"read that pod's events and log ({where})"
        else:
            # It should run here by its selector, affinity and tolerations: the controller
            # has not created the pod, or the pod was deleted (kubelet admission, eviction).
            cause = f"{what} has no pod on {node.name} ({counts})"
            fix = (
                f"read the DaemonSet's events (kubectl -n {ds.namespace} describe daemonset "
                f"{ds.name}) and the node's capacity for its pod (kubectl describe node "
                f"{node.name})"
            )
        found.append((cause, fix))
    return found


def operator_problems(operator: OperatorStatus | None) -> list[Problem]:
    if operator is None or operator.state not in BROKEN_OPERATOR_STATES:
        return []
    failing = [a for a in operator.applied if a.state in ("error", "notReady")]
    detail = "; ".join(
        f"{a.name} {a.state}" + (f": {a.message}" if a.message else "") for a in failing
    )
    return [
        (
            f"NicClusterPolicy {NIC_CLUSTER_POLICY} is in state {operator.state}"
            + (f" ({detail})" if detail else f" ({operator.reason})" if operator.reason else ""),
            f"kubectl describe nicclusterpolicy {NIC_CLUSTER_POLICY}, then the network-operator's "
            "log and the pods of the failing states",
        )
    ]


def _fit(ds: DaemonSetState, node: ClusterNode) -> Fit:
    """Whether the DaemonSet controller runs a pod of `ds` on the node: its template's
    nodeName, nodeSelector and required node affinity, and the node's NoSchedule/NoExecute
    taints against its tolerations plus the controller's own."""
    return daemon_fit(
        node_name=node.name, labels=node.labels, taints=node.taints,
        template_node=ds.template_node, node_selector=ds.node_selector,
        affinity=ds.affinity, tolerations=ds.tolerations, host_network=ds.host_network,
    )  # fmt: skip


def _daemonset_evidence(
    ds: DaemonSetState, node: ClusterNode, nodes: Mapping[str, ClusterNode]
) -> dict[str, Any]:
    fit = _fit(ds, node)
    here = (
        "ready"
        if node.name in ds.ready_nodes
        else "not ready"
        if node.name in ds.unready_nodes
        else "none"
    )
    return {
        "name": f"{ds.namespace}/{ds.name}",
        "role": ds.role,
        "desired": ds.desired,
        "ready": ds.ready,
        "available": ds.available,
        "updated": ds.updated,
        "selects_node": fit.runs,
        **({"not_here": fit.why} if not fit.runs else {}),
        "pod_here": here,
        # Which nodes lack it: where the controller would run it, no Ready pod there.
        "nodes_lacking": sorted(
            n.name for n in nodes.values() if n.name not in ds.ready_nodes and _fit(ds, n).runs
        ),
    }


def _why(c: NodeCondition) -> str:
    text = ": ".join(x for x in (c.reason, c.message) if x)
    return f", {text}" if text else ""
