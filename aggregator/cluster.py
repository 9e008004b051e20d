"""What the aggregator knows of the Kubernetes cluster, as plain data, and which nodes
each policy selects.

Pure: `aggregator.kube.client` fills a `ClusterView` from the API server; planners, rules and
the trace read it. Without a cluster (`present=False`) every node the fleet knows is
selected by every policy — there are no labels to select by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from proto.policy import LabelSelector, Policy


class ClusterNode(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # status.allocatable / status.capacity as the API server reports them ("8", "1Gi").
    allocatable: dict[str, str] = msgspec.field(default_factory=dict)
    capacity: dict[str, str] = msgspec.field(default_factory=dict)


class PodRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A pod that requests an extended resource, and the networks it attaches."""

    namespace: str
    name: str
    node: str | None = None  # spec.nodeName; None while pending
    phase: str | None = None
    requests: dict[str, int] = msgspec.field(default_factory=dict)  # resource -> count
    networks: tuple[str, ...] = ()  # "ns/name" from k8s.v1.cni.cncf.io/networks


class NetworkAttachment(msgspec.Struct, frozen=True, kw_only=True):
    """A NetworkAttachmentDefinition and what it binds to."""

    namespace: str
    name: str
    resource_name: str | None = None  # annotation k8s.v1.cni.cncf.io/resourceName
    master: str | None = None  # "master" of the CNI config, when it has one


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    present: bool = False  # False: no API server (policy from --policy FILE)
    nodes: dict[str, ClusterNode] = msgspec.field(default_factory=dict)
    pods: tuple[PodRequest, ...] = ()
    attachments: tuple[NetworkAttachment, ...] = ()


NO_CLUSTER = ClusterView()


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: every matchLabels pair and every expression."""
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        value = labels.get(requirement.key)
        if requirement.operator == "In" and value not in requirement.values:
            return False
        if requirement.operator == "NotIn" and present and value in requirement.values:
            return False
        if requirement.operator == "Exists" and not present:
            return False
        if requirement.operator == "DoesNotExist" and present:
            return False
    return True


def selected_nodes(policy: Policy, fleet_nodes: Iterable[str], cluster: ClusterView) -> set[str]:
    """The nodes `policy` covers: by labels in a cluster, every known node without one."""
    names = set(fleet_nodes)
    if not cluster.present:
        return names
    return {
        name
        for name, node in cluster.nodes.items()
        if selector_matches(policy.spec.node_selector, node.labels)
    }


def policies_by_node(
    policies: Iterable[Policy], fleet_nodes: Iterable[str], cluster: ClusterView
) -> dict[str, tuple[Policy, ...]]:
    """node -> every policy selecting it (more than one is a conflict, never merged)."""
    names = list(fleet_nodes)
    result: dict[str, list[Policy]] = {}
    for policy in policies:
        for node in selected_nodes(policy, names, cluster):
            result.setdefault(node, []).append(policy)
    return {node: tuple(found) for node, found in result.items()}
