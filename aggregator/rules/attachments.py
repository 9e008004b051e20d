"""Rules on pods' secondary networks: a NetworkAttachmentDefinition whose `resourceName`
annotation names another resource than its pods request (`nad-resource-mismatch`), one whose
master is no netdev of the adapters the resource selects on a node
(`nad-master-not-selected`), and IP pools with no (`ip-pool-exhausted`) or few
(`ip-pool-low`) addresses left for a node — before pods fail with "no free IP".

Pure. Reads the cluster view's pods, NADs and IP pools (judged by `aggregator.podnetworks`,
as the trace's links are) and the node's snapshot and device-plugin status. Findings are
per node: a pod, a NAD or a pool matters where the resource's pods run.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Final

from aggregator import podnetworks
from aggregator.cluster import NetworkAttachment
from aggregator.fleet.state import NodeRecord
from aggregator.rules.descriptor import Rule, RuleInput
from aggregator.rules.finding import Finding
from proto.inventory import Device

MISMATCH: Final = "nad-resource-mismatch"
MASTER: Final = "nad-master-not-selected"
EXHAUSTED: Final = "ip-pool-exhausted"
LOW: Final = "ip-pool-low"
ANNOTATION: Final = "k8s.v1.cni.cncf.io/resourceName"


def check_nad_resource_mismatch(given: RuleInput) -> list[Finding]:
    by_key = {f"{a.namespace}/{a.name}": a for a in given.cluster.attachments}
    found: dict[tuple[str, str], Finding] = {}
    for pod in given.cluster.pods:
        node = pod.node
        if node is None or node not in given.fleet:
            continue
        for key in pod.networks:
            nad = by_key.get(key)
            if nad is None or nad.resource_name is None or nad.resource_name in pod.requests:
                continue
            asked = ", ".join(sorted(pod.requests))
            if asked:
                what = (
                    f"requests {asked}: Multus attaches a device of {nad.resource_name}; "
                    "set the annotation to the resource the pods request."
                )
            else:
                what = (
                    f"requests no device-plugin resource, so no device of "
                    f"{nad.resource_name} is allocated to it: request "
                    f"{nad.resource_name} in the pod (network-resources-injector adds it "
                    "automatically where it is installed)."
                )
            found.setdefault((node, key), Finding(
                rule=MISMATCH, severity="warning", node=node, subject=f"nad/{key}",
                message=f"NetworkAttachmentDefinition {key} is annotated {ANNOTATION}="
                f"{nad.resource_name}, but pod {pod.namespace}/{pod.name} on {node} {what}",
                evidence={"annotation": nad.resource_name, "requests": asked,
                          "pod": f"{pod.namespace}/{pod.name}"},
            ))  # fmt: skip
    return [found[k] for k in sorted(found)]


def check_nad_master_not_selected(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    by_node = podnetworks.pods_by_node(given.cluster.pods)
    for node, resource, devices in _served(given):
        pods = podnetworks.requesting(resource, None, by_node.get(node, ()))
        seen: set[str] = set()
        for use in podnetworks.nad_uses(resource, pods, given.cluster):
            nad = use.attachment
            if nad is None or use.key in seen or not _rdma(nad, resource):
                continue
            if podnetworks.master_selected(nad, devices) is not False:
                continue
            seen.add(use.key)
            netdevs = sorted(podnetworks.selected_netdevs(devices))
            what = nad.master if nad.pci_address is None else nad.pci_address
            found.append(Finding(
                rule=MASTER, severity="critical", node=node, subject=f"nad/{use.key}",
                message=f"NetworkAttachmentDefinition {use.key} attaches {what}, not a netdev "
                f"of the adapters {resource} selects on {node} ({', '.join(netdevs) or 'none'})"
                ": its pods get another adapter's interface or none; fix its master or the "
                "resource's selectors.",
                evidence={"resource": resource, "master": what, "netdevs": ", ".join(netdevs),
                          "annotated": nad.resource_name == resource},
            ))  # fmt: skip
    return found


def check_ip_pool_exhausted(given: RuleInput) -> list[Finding]:
    return [f for f in _pool_findings(given) if f.rule == EXHAUSTED]


def check_ip_pool_low(given: RuleInput) -> list[Finding]:
    return [f for f in _pool_findings(given) if f.rule == LOW]


def _pool_findings(given: RuleInput) -> Iterator[Finding]:
    low = given.thresholds.param(LOW, "lowFree")
    by_node = podnetworks.pods_by_node(given.cluster.pods)
    held_by_node = podnetworks.held_by_node(given.cluster.held_addresses)
    for node in sorted(given.fleet):
        here = by_node.get(node, [])
        held = held_by_node.get(node, [])
        nads: dict[str, NetworkAttachment] = {}
        resources = {r for p in here for r in p.requests}
        resources |= {r for n, r, _ in _served(given, only=node)}
        for resource in sorted(resources):
            pods = podnetworks.requesting(resource, None, here)
            for nad_use in podnetworks.nad_uses(resource, pods, given.cluster):
                if nad_use.attachment is not None:
                    nads.setdefault(nad_use.key, nad_use.attachment)
        seen: set[str] = set()
        for key in sorted(nads):
            for use in podnetworks.pool_uses(nads[key], node, given.cluster, here, held):
                subject = f"pool/{use.pool or use.nad}"
                blocked = use.state in podnetworks.NO_ADDRESS_STATES
                if (use.free is None and not blocked) or subject in seen:
                    continue
                evidence: dict[str, str | int | float | bool | None] = {
                    "nad": use.nad, "ipam": use.ipam, "block": use.block,
                    "capacity": use.capacity, "used": use.used, "free": use.free,
                    "counted": use.counted, "state": use.state,
                }  # fmt: skip
                if blocked:
                    seen.add(subject)
                    yield Finding(
                        rule=EXHAUSTED, severity="critical", node=node, subject=subject,
                        message=f"{use.detail}: the next pod of {use.nad} on {node} gets no "
                        f"address; {_BLOCKED_REMEDY[use.state]}.",
                        evidence=evidence,
                    )  # fmt: skip
                elif use.state == "exhausted":
                    seen.add(subject)
                    where = f"block {use.block}" if use.block else "range"
                    yield Finding(
                        rule=EXHAUSTED, severity="critical", node=node, subject=subject,
                        message=f"{use.pool or use.nad}: {where} has 0 of {use.capacity} "
                        f"addresses free on {node}: the next pod of {use.nad} there fails "
                        "with \"no free IP\"; enlarge the pool or free addresses.",
                        evidence=evidence,
                    )  # fmt: skip
                elif use.free is not None and use.free <= low:
                    seen.add(subject)
                    # NV-IPAM's count is a lower bound on use: free is at most this.
                    bound = "at most " if use.counted == "network-status" else ""
                    yield Finding(
                        rule=LOW, severity="warning", node=node, subject=subject,
                        message=f"{use.pool or use.nad} has {bound}{use.free} of {use.capacity} "
                        f"addresses left for pods of {use.nad} on {node} (warning at "
                        f"{low:g}); enlarge the pool before pods fail with \"no free IP\".",
                        evidence=evidence | {"low_free": low},
                    )  # fmt: skip


_BLOCKED_REMEDY: Final = {
    "no-block": "enlarge the pool (more or smaller blocks/slices) or free a node's block",
    "not-selected": "select the node in the pool's nodeSelector, or give the NAD a pool "
    "that selects it",
    "invalid": "fix the pool's (or the NAD's ipam) configuration",
}


def _served(
    given: RuleInput, only: str | None = None
) -> Iterator[tuple[str, str, tuple[Device, ...]]]:
    """(node, resource, the adapters it selects there) of every served resource."""
    for node in sorted(given.fleet) if only is None else [only]:
        record: NodeRecord | None = given.fleet.get(node)
        if record is None or record.snapshot is None or record.device_plugin is None:
            continue
        for status in record.device_plugin.resources:
            chosen = set(status.devices)
            devices = tuple(d for d in record.snapshot.devices if d.name in chosen)
            if devices:
                yield node, status.name, devices


def _rdma(nad: NetworkAttachment, resource: str) -> bool:
    return nad.cni_type in podnetworks.RDMA_CNI_TYPES or nad.resource_name == resource


_READS: Final = frozenset({"snapshot", "device_plugin"})
RULES: Final[tuple[Rule, ...]] = (
    Rule(id=MISMATCH, family="fleet", severity="warning", check=check_nad_resource_mismatch,
         reads=frozenset(), reads_cluster=True),
    Rule(id=MASTER, family="fleet", severity="critical", check=check_nad_master_not_selected,
         reads=_READS, reads_cluster=True),
    Rule(id=EXHAUSTED, family="fleet", severity="critical", check=check_ip_pool_exhausted,
         reads=_READS, reads_cluster=True),
    Rule(id=LOW, family="fleet", severity="warning", check=check_ip_pool_low, reads=_READS,
         reads_cluster=True, params=MappingProxyType({"lowFree": 2.0})),
)  # fmt: skip
